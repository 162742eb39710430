"""The controls stage: the uniformly narrower model and the pruned architecture trained from scratch."""

from __future__ import annotations

from dataclasses import replace
from typing import Any

import numpy as np
import torch
from torch import nn

from prunefx.pipeline.job import ModelRole, StageContext, Start, saved_plans
from prunefx.pipeline.records import (
    ControlRun,
    ControlsDone,
    NarrowControl,
    Skipped,
)
from prunefx.pipeline.run_config import PruneSpec, StageSpec
from prunefx.plan import PlanConfig, PruningPlan
from prunefx.plan.config import TARGETS

NARROW_TOLERANCE = 0.03  # the narrow control's MACs match the pruned model's within this fraction


def control_runs(spec: PruneSpec, baseline_epochs: int) -> list[tuple[ModelRole, Start, int]]:
    """The control trainings of ``spec``: (role, start, epochs); total = baseline + sparsity + fine-tune epochs."""
    total = baseline_epochs + spec.sparsity.epochs + spec.finetune.epochs
    runs: list[tuple[ModelRole, Start, int]] = []
    if "narrow" in spec.controls:
        runs.append(("narrow", "narrow_init", total))
        if spec.finetune.epochs:
            runs.append(("narrow_ft", "narrow_init", spec.finetune.epochs))
    if "scratch" in spec.controls:
        runs.append(("scratch", "scratch_init", total))
    return runs


def narrow_model(fresh: nn.Module, inputs: tuple[torch.Tensor, ...], macs_goal: int,
                 base: PlanConfig) -> tuple[nn.Module, PruningPlan, int]:
    """``fresh`` made uniformly narrower (every prunable group keeps one common fraction) until its MACs are
    ``macs_goal`` within NARROW_TOLERANCE; returns the model, its plan and its MACs (the closest found).

    The fraction is bisected against measured MACs (the planner's estimate ignores rounding and frozen groups).
    With ``base.round_to`` > 1 one common fraction may not reach the goal (a 64-wide stem moves in 12.5% steps);
    then widths are kept exact (round_to 1), which a uniform width multiple needs to match a budget.
    """
    best: tuple[nn.Module, PruningPlan, int] | None = None
    for round_to in dict.fromkeys((base.round_to, 1)):
        found = _bisect_uniform(fresh, inputs, macs_goal, replace(base, round_to=round_to))
        if best is None or abs(found[2] / macs_goal - 1) < abs(best[2] / macs_goal - 1):
            best = found
        if abs(best[2] / macs_goal - 1) <= NARROW_TOLERANCE:
            break
    assert best is not None
    return best


def _bisect_uniform(fresh: nn.Module, inputs: tuple[torch.Tensor, ...], macs_goal: int,
                    base: PlanConfig) -> tuple[nn.Module, PruningPlan, int]:
    import copy

    from prunefx import prune
    from prunefx.metrics import measure

    lo, hi, target = 0.0, 1.0, macs_goal / measure(fresh, inputs).macs
    best: tuple[nn.Module, PruningPlan, int] | None = None
    for _ in range(10):  # bisection on the planner's FLOPs knob against measured MACs (monotone in the knob)
        config = replace(base, **{**dict.fromkeys(TARGETS), "flops": min(1.0, max(1e-3, target))}, scope="local",
                         max_ratio=max(base.max_ratio, 0.95))
        result = prune(copy.deepcopy(fresh), inputs, config, criterion="l1", check=False, bias_compensation=False)
        macs = measure(result.model, inputs).macs
        if best is None or abs(macs / macs_goal - 1) < abs(best[2] / macs_goal - 1):
            best = (result.model, result.plan, macs)
        if abs(macs / macs_goal - 1) <= NARROW_TOLERANCE / 3:
            break
        lo, hi = (lo, target) if macs > macs_goal else (target, hi)
        if hi - lo < 0.01:  # the knob's steps are coarser than this: rounding decides, not the knob
            break
        target = (lo + hi) / 2
    assert best is not None
    return best


def controls_stage(ctx: StageContext) -> ControlsDone | Skipped:
    from prunefx import analyze
    from prunefx.metrics import measure
    from prunefx.transform import apply_plan

    spec, b = ctx.job.prune, ctx.backend
    if not spec.controls:
        return Skipped(skipped="prune.controls is empty")
    runs = control_runs(spec, b.baseline_epochs)
    x = b.example_inputs()
    goal, narrow, off = None, None, ()
    if b.dist.is_main:  # the controls' untrained starts, saved for every rank (and for the record)
        pruned = b.load("pruned")
        plan = saved_plans(ctx.root)
        plan = plan[-1] if isinstance(plan, list) else plan  # the width plan, after a depth cut too
        goal = measure(pruned, x).macs
        if "narrow" in spec.controls:
            model, narrow_plan, macs = narrow_model(b.fresh(), x, goal, spec.plan)
            b.save(model, "narrow_init", narrow_plan)
            kept = [g.after / g.before for g in narrow_plan.groups if g.before]
            narrow = NarrowControl(macs=macs, macs_vs_pruned=macs / goal,
                                   kept_fraction=float(np.median(kept)) if kept else 1.0)
            if abs(macs / goal - 1) > NARROW_TOLERANCE:
                off = (f"the narrow control's MACs are {macs / goal - 1:+.1%} off the pruned model's "
                       f"(rounding: round_to={spec.plan.round_to}); the verdict compares unequal budgets",)
        if "scratch" in spec.controls:
            fresh = b.fresh()
            dg = analyze(fresh, tuple(torch.zeros(s) for s in plan.input_shapes))
            b.save(apply_plan(fresh, dg, plan), "scratch_init", plan)
    results: dict[str, ControlRun] = {}
    for role, start, epochs in runs:
        ctx.log(f"  control {role}: from scratch ({start}) for {epochs} epochs")
        trained = b.train(role, start, StageSpec(epochs), None)
        metrics = b.evaluate(role, trained.model)
        results[role] = ControlRun(start=start, epochs=epochs, metrics=metrics, history=tuple(trained.history))
    return ControlsDone(pruned_macs=goal, narrow=narrow, warnings=off, runs=results)


_CONTROL_WHAT = {
    "narrow": "uniformly narrower, from scratch, total epochs",
    "narrow_ft": "uniformly narrower, from scratch, fine-tune epochs",
    "scratch": "pruned architecture re-initialised, from scratch, total epochs",
}


def control_rows(ctx: StageContext, x: tuple[torch.Tensor, ...]) -> dict[str, Any] | None:
    """The controls' block of the report: each trained control measured like the stages, with its metrics."""
    from prunefx.metrics import measure
    from prunefx.report import Stage

    done = ctx.done("controls")
    if not ctx.ran("controls") or not isinstance(done, ControlsDone) or not done.runs:
        return None
    b, spec = ctx.backend, ctx.job.prune
    rows = []
    for role, run in done.runs.items():
        model = b.load(role).cpu().eval()
        rows.append((role, _CONTROL_WHAT[role], run.epochs,
                     Stage(measure(model, x), None, {**run.metrics, **b.extra_costs(model)})))
    total = b.baseline_epochs + spec.sparsity.epochs + spec.finetune.epochs
    return {"metric": b.primary_metric, "total_epochs": total, "finetune_epochs": spec.finetune.epochs, "runs": rows,
            "chance": b.chance}


__all__ = ["NARROW_TOLERANCE", "control_rows", "control_runs", "controls_stage", "narrow_model"]
