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
from prunefx.analysis.rules._context import Ctx
from prunefx.analysis.rules._registry import RULES, TRAIN_ONLY, OpRegistry, Rule, register_rule, register_train_only

RULES.mark_builtin()  # what the modules above registered; replacing one later warns unless replace=True

__all__ = ["RULES", "TRAIN_ONLY", "Ctx", "OpRegistry", "Rule", "register_rule", "register_train_only"]
