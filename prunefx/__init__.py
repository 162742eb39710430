"""prunefx: structured pruning for PyTorch driven by torch.fx channel-dependency analysis.

    import prunefx
    dg = prunefx.analyze(model, x)                              # groups of coupled channels
    result = prunefx.prune(model, x, prunefx.PlanConfig(flops=0.5))  # score -> plan -> rewrite -> verify
"""

from .analysis import DependencyGraph, Group, Member, analyze
from .api import PruneResult, prune
from .checkpoint import load, save
from .errors import PrunefxError
from .importance import Scores, register_criterion, score
from .plan import CostModel, PlanConfig, PlanError, PruningPlan, make_plan
from .rewrite import apply_plan, register_fixer
from .rules import register_rule
from .trace import register_leaf, trace
from .verify import VerifyResult, verify

__all__ = [
    "trace", "analyze", "score", "make_plan", "apply_plan", "verify", "prune", "save", "load",
    "register_leaf", "register_rule", "register_criterion", "register_fixer",
    "DependencyGraph", "Group", "Member", "Scores", "PlanConfig", "PruningPlan", "CostModel", "PruneResult",
    "VerifyResult", "PrunefxError", "PlanError",
]
__version__ = "0.1.0"
