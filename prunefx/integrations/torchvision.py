"""torchvision plugin: ops that torchvision hides from fx with ``torch.fx.wrap`` (they appear as one call)."""

from __future__ import annotations

from torchvision.ops import batched_nms, nms
from torchvision.ops.stochastic_depth import stochastic_depth

from prunefx.analysis.rules import register_rule, register_train_only
from prunefx.analysis.rules._algebra import passthrough
from prunefx.capture.semantics import register_discrete
from prunefx.integrations import swin  # noqa: F401 - Swin attention heads: rules, fixer, pruned forward

# Drops whole samples (rows) at random and rescales: every channel is treated alike; identity in eval mode.
register_rule(stochastic_depth)(passthrough)
register_train_only(stochastic_depth)

# Non-maximum suppression keeps or drops boxes by thresholds: the oracle compares its inputs, then replays it.
register_discrete(nms, batched_nms)
