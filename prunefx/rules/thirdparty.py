"""Rules for functions that libraries hide from fx with ``torch.fx.wrap`` (they appear as one call)."""

from __future__ import annotations

from torchvision.ops.stochastic_depth import stochastic_depth

from .common import passthrough
from .registry import register_rule

# Drops whole samples (rows) at random and rescales: every channel is treated alike.
register_rule(stochastic_depth)(passthrough)
