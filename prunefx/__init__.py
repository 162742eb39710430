"""prunefx: structured pruning for PyTorch driven by torch.fx channel-dependency analysis.

    import prunefx
    dg = prunefx.analyze(model, x)                              # groups of coupled channels
    result = prunefx.prune(model, x, prunefx.PlanConfig(flops=0.5))  # score -> plan -> rewrite -> verify
"""

from prunefx import integrations  # noqa: F401 - names the built-in plugins; imports none of them
from prunefx.analysis import DependencyGraph, Group, Member, analyze
from prunefx.analysis.rules import register_rule
from prunefx.api import PruneResult, prune
from prunefx.capture import register_leaf, trace
from prunefx.checkpoint import load, save
from prunefx.errors import PrunefxError, VerificationError
from prunefx.importance import Scores, register_criterion, score
from prunefx.plan import CostModel, PlanConfig, PlanError, PruningPlan, make_plan
from prunefx.transform import apply_plan, register_fixer
from prunefx.verify import VerifyResult, verify

__all__ = [
    "trace", "analyze", "score", "make_plan", "apply_plan", "verify", "prune", "save", "load",
    "register_leaf", "register_rule", "register_criterion", "register_fixer",
    "DependencyGraph", "Group", "Member", "Scores", "PlanConfig", "PruningPlan", "CostModel", "PruneResult",
    "VerifyResult", "PrunefxError", "PlanError", "VerificationError",
]
__version__ = "0.1.0"
