"""Op rules: how each op labels, couples and freezes channels. Importing this package fills the registry."""

from . import elementwise, layers, linalg, reduce, shape, thirdparty  # noqa: F401  (registration side effects)
from .registry import RULES, OpRegistry, register_rule

__all__ = ["RULES", "OpRegistry", "register_rule"]
