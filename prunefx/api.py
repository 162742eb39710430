"""One call from model to pruned model: analyze -> score -> plan -> apply.

    result = prunefx.prune(model, torch.randn(1, 3, 224, 224), PlanConfig(flops=0.5), criterion="bn_scale")
    print(result.plan.summary())

Each step is public on its own (``analyze``, ``importance.score``, ``make_plan``, ``apply_plan``,
``verify``) so research code can swap in its own criterion or plan.
"""

from __future__ import annotations

import copy
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import torch
from torch import nn

from prunefx.analysis import DependencyGraph, analyze
from prunefx.importance import Scores, score
from prunefx.plan import CostModel, PlanConfig, PruningPlan, make_plan
from prunefx.transform import Compensation, apply_plan, compensate
from prunefx.verify import VerifyResult, verify


@dataclass(frozen=True)
class PruneResult:
    """What :func:`prune` did: the plan, the analysis it was made from, the scores and the check."""

    model: nn.Module  # the module to use: the pruned model, or the rewritten GraphModule (graph_rewrite)
    plan: PruningPlan
    graph: DependencyGraph
    scores: Scores
    verified: VerifyResult | None
    compensation: Compensation | None = None


def prune(
    model: nn.Module,
    example_inputs: Sequence[Any] | torch.Tensor,
    config: PlanConfig | None = None,
    *,
    criterion: str = "bn_scale",
    check: bool = True,
    bias_compensation: bool | None = None,
    **score_kwargs: Any,
) -> PruneResult:
    """Prune ``model`` in place to ``config``'s target and (with ``check``) verify it against the masked original.

    ``bias_compensation`` (default: on for ``bn_scale``) folds the removed channels' mean contribution
    into their consumers first; the oracle then checks against the equally compensated original.
    ``score_kwargs`` go to :func:`prunefx.importance.score` (``fallback``, ``calibration``, ``loss_fn``, ``seed``).
    """
    if isinstance(example_inputs, torch.Tensor):
        example_inputs = (example_inputs,)
    config = config or PlanConfig(ratio=0.3)
    dg = analyze(model, example_inputs)
    scores = score(model, dg, criterion, **score_kwargs)
    needs_cost = config.flops is not None or config.params is not None
    cost = CostModel(model, dg, example_inputs) if needs_cost or check else None
    plan = make_plan(dg, scores, config, cost=cost)
    if bias_compensation is None:
        bias_compensation = criterion == "bn_scale"
    compensation = compensate(model, dg, plan, example_inputs) if bias_compensation else None
    original = copy.deepcopy(model) if check else None  # after compensation: values, not shapes, changed
    pruned = apply_plan(model, dg, plan, graph_rewrite=config.graph_rewrite)
    verified = verify(original, pruned, plan, example_inputs) if check else None
    return PruneResult(pruned, plan, dg, scores, verified, compensation)
