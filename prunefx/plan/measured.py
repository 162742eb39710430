"""Plan against a deployment's measured latency: time the model, plan on its latency table, measure, re-plan.

    plan, outcome, lat = plan_for_latency(model, dg, scores, PlanConfig(latency=0.5), inputs, apply=apply_plan)

A latency target is met end to end: each plan is applied to a fresh copy of the model, timed against the
original, and re-planned while it misses (:func:`prunefx.plan.latency.meet_latency`). ``round_to="auto"``
with another target needs only the table: one plan, not measured.
"""

from __future__ import annotations

import copy
import os
from collections.abc import Callable, Mapping, Sequence
from dataclasses import replace
from typing import Any

import numpy as np
from torch import nn

from prunefx.analysis import Capture, DependencyGraph, analyze
from prunefx.importance import Scores
from prunefx.metrics import Deployment, compare_latency
from prunefx.metrics.latency_table import LatencyTable
from prunefx.plan.config import PlanConfig
from prunefx.plan.cost import CostModel
from prunefx.plan.latency import LatencyModel, LatencyOutcome, meet_latency
from prunefx.plan.plan import PruningPlan
from prunefx.plan.sensitivity import SensitivityCurves
from prunefx.plan.solve import make_plan

BUDGET_S = 15.0  # seconds of timed forwards per model per latency measurement (fewer repeats for slow models)


def plan_for_latency(
    model: nn.Module,
    dg: DependencyGraph,
    scores: Scores | Mapping[int, np.ndarray],
    config: PlanConfig,
    example_inputs: Sequence[Any],
    *,
    apply: Callable[..., nn.Module],
    capture: Capture = "auto",
    deployment: Deployment | None = None,
    cache: str | os.PathLike[str] | None = "default",
    cost: CostModel | None = None,
    owned_constants: frozenset[str] = frozenset(),
    sensitivity: SensitivityCurves | None = None,
) -> tuple[PruningPlan, LatencyOutcome | None, LatencyModel]:
    """The plan for ``config`` on ``deployment``'s measured latency, how a latency target was met, and the model.

    ``apply`` is ``prunefx.apply_plan`` (passed in: the transform sits above the plan); it prunes the copies
    that are measured, never ``model``. ``capture`` is how those copies are analysed, as ``dg`` was.
    ``deployment`` defaults to torch on the CPU; ``cache`` is the latency table's folder
    (:mod:`prunefx.metrics.latency_table`). The outcome is None without a latency target. ``sensitivity``: the
    measured curves ``scope="sensitivity"`` plans on (each plan's widths from them, costed by the latency model).
    """
    dep = (deployment or Deployment()).resolve(example_inputs)
    pristine = copy.deepcopy(model)  # timed as it is now, and the source of every measured copy
    base_ms = compare_latency({"base": pristine}, example_inputs, dep, budget_s=BUDGET_S)["base"].median_ms
    lat = LatencyModel(model, dg, LatencyTable(dep, cache), base_ms=base_ms, config=config)
    kind, goal = config.target

    def plan_for(fraction: float) -> PruningPlan:
        cfg = replace(config, latency=fraction) if kind == "latency" else config
        return make_plan(dg, scores, cfg, cost=cost, latency=lat, owned_constants=owned_constants,
                         sensitivity=sensitivity)

    def measure(candidate: PruningPlan) -> tuple[float, str | None]:
        work = copy.deepcopy(pristine)
        work_dg = analyze(work, example_inputs, capture=capture)
        pruned = apply(work, work_dg, candidate, graph_rewrite=config.graph_rewrite)
        t = compare_latency({"base": pristine, "pruned": pruned}, example_inputs, dep, budget_s=BUDGET_S)
        return t["pruned"].median_ms / t["base"].median_ms, t["pruned"].noise or t["base"].noise

    if kind != "latency":  # round_to="auto" with another target: one plan on the table, not measured
        return plan_for(0.0), None, lat
    plan, outcome = meet_latency(plan_for, measure, goal)
    return plan, outcome, lat
