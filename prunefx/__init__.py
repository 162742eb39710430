"""prunefx: structured pruning for PyTorch driven by torch.fx channel-dependency analysis."""

from .analysis import DependencyGraph, Group, Member, analyze
from .errors import PrunefxError
from .rules import register_rule
from .trace import register_leaf, trace

__all__ = ["trace", "analyze", "register_leaf", "register_rule", "DependencyGraph", "Group", "Member", "PrunefxError"]
__version__ = "0.1.0"
