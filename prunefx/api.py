"""One call from model to pruned model: analyze -> score -> plan -> apply.

    result = prunefx.prune(model, torch.randn(1, 3, 224, 224), PlanConfig(flops=0.5), criterion="bn_scale")
    print(result.plan.summary())

Each step is public on its own (``analyze``, ``importance.score``, ``make_plan``, ``apply_plan``,
``verify``) so research code can swap in its own criterion or plan.
"""

from __future__ import annotations

import copy
import os
from collections.abc import Sequence
from dataclasses import dataclass, replace
from typing import Any

import torch
from torch import nn

from prunefx.analysis import DependencyGraph, analyze
from prunefx.importance import Scores, score
from prunefx.metrics import Deployment, compare_latency
from prunefx.metrics.latency_table import LatencyTable
from prunefx.plan import CostModel, PlanConfig, PruningPlan, make_plan
from prunefx.plan.latency import LatencyModel, LatencyOutcome, meet_latency
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
    latency: LatencyOutcome | None = None  # a latency target's rounds: planned vs measured, re-plans


def prune(
    model: nn.Module,
    example_inputs: Sequence[Any] | torch.Tensor,
    config: PlanConfig | None = None,
    *,
    criterion: str = "bn_scale",
    check: bool = True,
    bias_compensation: bool | None = None,
    deployment: Deployment | None = None,
    latency_cache: str | os.PathLike[str] | None = "default",
    **score_kwargs: Any,
) -> PruneResult:
    """Prune ``model`` in place to ``config``'s target and (with ``check``) verify it against the masked original.

    ``config`` defaults to ``PlanConfig()``: keep half the FLOPs.

    ``bias_compensation`` (default: on for ``bn_scale``) folds the removed channels' mean contribution
    into their consumers first; the oracle then checks against the equally compensated original.
    A latency target (``PlanConfig(latency=0.5)``) or ``round_to="auto"`` is measured on ``deployment``
    (default: torch on the CPU with torch's threads, the example's batch): the model's layers are timed at
    candidate widths into a latency table cached under ``latency_cache`` (None: not cached; see
    :mod:`prunefx.metrics.latency_table`), the plan is solved against it, and for a latency target the
    pruned model is measured end to end against the original and re-planned while it misses by more than
    5% (at most 4 plans; ``PruneResult.latency`` says how it went).
    ``score_kwargs`` go to :func:`prunefx.importance.score` (``fallback``, ``calibration``, ``loss_fn``, ``seed``).
    """
    if isinstance(example_inputs, torch.Tensor):
        example_inputs = (example_inputs,)
    config = config or PlanConfig()  # its default target: plan.config.DEFAULT_TARGET
    dg = analyze(model, example_inputs)
    scores = score(model, dg, criterion, **score_kwargs)
    needs_cost = config.flops is not None or config.params is not None
    cost = CostModel(model, dg, example_inputs) if needs_cost or check else None
    outcome = None
    if config.latency is not None or config.round_to == "auto":
        dep = (deployment or Deployment()).resolve(example_inputs)
        pristine = copy.deepcopy(model)
        base_ms = compare_latency({"base": pristine}, example_inputs, dep, budget_s=_BUDGET_S)["base"].median_ms
        table = LatencyTable(dep, latency_cache)
        lat = LatencyModel(model, dg, table, base_ms=base_ms, config=config)

        def plan_for(fraction: float) -> PruningPlan:
            cfg = replace(config, latency=fraction) if config.latency is not None else config
            return make_plan(dg, scores, cfg, cost=cost, latency=lat)

        def measure(candidate: PruningPlan) -> tuple[float, str | None]:
            work = copy.deepcopy(pristine)
            pruned = apply_plan(work, analyze(work, example_inputs), candidate, graph_rewrite=config.graph_rewrite)
            t = compare_latency({"base": pristine, "pruned": pruned}, example_inputs, dep, budget_s=_BUDGET_S)
            return t["pruned"].median_ms / t["base"].median_ms, t["pruned"].noise or t["base"].noise

        if config.latency is not None:
            plan, outcome = meet_latency(plan_for, measure, config.latency)
        else:
            plan = plan_for(0.0)
        plan = replace(plan, target={**plan.target, "deployment": dep.describe(), "latency_table": table.name})
    else:
        plan = make_plan(dg, scores, config, cost=cost)
    if bias_compensation is None:
        bias_compensation = criterion == "bn_scale"
    compensation = compensate(model, dg, plan, example_inputs) if bias_compensation else None
    original = copy.deepcopy(model) if check else None  # after compensation: values, not shapes, changed
    pruned = apply_plan(model, dg, plan, graph_rewrite=config.graph_rewrite)
    verified = verify(original, pruned, plan, example_inputs) if check else None
    return PruneResult(pruned, plan, dg, scores, verified, compensation, outcome)


_BUDGET_S = 15.0  # seconds of timed forwards per model per latency measurement (fewer repeats for slow models)
