"""Op rules: how each op labels, couples and freezes channels. Importing this package fills the registry."""

from prunefx.analysis.rules import (  # noqa: F401 - registration side effects
    aten,
    create,
    elementwise,
    index,
    layers,
    linalg,
    mha,
    reduce,
    shape,
)
from prunefx.analysis.rules._registry import RULES, TRAIN_ONLY, OpRegistry, register_rule, register_train_only

__all__ = ["RULES", "TRAIN_ONLY", "OpRegistry", "register_rule", "register_train_only"]
