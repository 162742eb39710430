"""prunefx: structured pruning for PyTorch driven by torch.fx channel-dependency analysis.

    import prunefx
    dg = prunefx.analyze(model, x)                              # groups of coupled channels
    result = prunefx.prune(model, x, prunefx.PlanConfig(flops=0.5))  # score -> plan -> rewrite -> verify

The public names below are imported on first use (PEP 562), so ``import prunefx.errors`` or the command line's
``--help`` does not pay for torch; ``import prunefx`` itself imports no optional framework.
"""

from __future__ import annotations

import importlib
import sys
import types
from typing import TYPE_CHECKING, Any

from prunefx import _renamed, integrations  # noqa: F401 - integrations names the built-in plugins; imports none

_renamed.install()  # modules renamed in a release stay importable under their old names, with a FutureWarning

# public name -> the module that defines it
_PUBLIC = {
    "Inputs": "prunefx.capture.inputs", "trace": "prunefx.capture", "register_leaf": "prunefx.capture",
    "analyze": "prunefx.analysis", "DependencyGraph": "prunefx.analysis", "Group": "prunefx.analysis",
    "Member": "prunefx.analysis", "register_rule": "prunefx.analysis.rules",
    "score": "prunefx.importance", "Scores": "prunefx.importance", "register_criterion": "prunefx.importance",
    "make_plan": "prunefx.plan", "PlanConfig": "prunefx.plan", "PlanError": "prunefx.plan",
    "PruningPlan": "prunefx.plan", "CostModel": "prunefx.plan",
    "apply_plan": "prunefx.transform", "register_fixer": "prunefx.transform",
    "verify": "prunefx.verify", "VerifyResult": "prunefx.verify",
    "prune": "prunefx.api", "PruneResult": "prunefx.api",
    "prune_depth": "prunefx.depth", "DepthResult": "prunefx.depth",
    "save": "prunefx.checkpoint", "load": "prunefx.checkpoint",
    "recover": "prunefx.train.recover", "RecoverConfig": "prunefx.train.recover",
    "quantize": "prunefx.deploy", "Quantized": "prunefx.deploy",
    "PrunefxError": "prunefx.errors", "VerificationError": "prunefx.errors", "ScoreScaleWarning": "prunefx.errors",
}  # fmt: skip
__all__ = [  # in pipeline order, as docs/api.md introduces them
    "Inputs", "trace", "register_leaf", "analyze", "DependencyGraph", "Group", "Member", "register_rule",
    "score", "Scores", "register_criterion", "make_plan", "PlanConfig", "PlanError", "PruningPlan", "CostModel",
    "apply_plan", "register_fixer", "verify", "VerifyResult", "prune", "PruneResult", "prune_depth", "DepthResult",
    "save", "load", "recover",
    "RecoverConfig", "quantize", "Quantized", "PrunefxError", "VerificationError", "ScoreScaleWarning",
]  # fmt: skip
__version__ = "0.1.0"


def __getattr__(name: str) -> Any:
    module = _PUBLIC.get(name)
    if module is None:
        raise AttributeError(f"module 'prunefx' has no attribute {name!r}")
    value = getattr(importlib.import_module(module), name)
    globals()[name] = value  # resolved once; later lookups are plain attribute reads
    return value


def __dir__() -> list[str]:
    return sorted({*globals(), *__all__})


class _Package(types.ModuleType):
    """The package, whose public names win over its same-named submodules (``prunefx.verify``)."""

    def __setattr__(self, name: str, value: Any) -> None:
        # Importing the submodule prunefx.verify binds it here as `verify`; the public name is its function.
        if name in _PUBLIC and isinstance(value, types.ModuleType) and value.__name__ == f"{__name__}.{name}":
            return
        super().__setattr__(name, value)


sys.modules[__name__].__class__ = _Package


if TYPE_CHECKING:  # what the names are, for type checkers and editors
    from prunefx.analysis import DependencyGraph, Group, Member, analyze
    from prunefx.analysis.rules import register_rule
    from prunefx.api import PruneResult, prune
    from prunefx.capture import register_leaf, trace
    from prunefx.capture.inputs import Inputs
    from prunefx.checkpoint import load, save
    from prunefx.deploy import Quantized, quantize
    from prunefx.errors import PrunefxError, ScoreScaleWarning
    from prunefx.importance import Scores, register_criterion, score
    from prunefx.plan import CostModel, PlanConfig, PlanError, PruningPlan, make_plan
    from prunefx.train.recover import RecoverConfig, recover
    from prunefx.transform import apply_plan, register_fixer
    from prunefx.verify import VerifyResult, verify
