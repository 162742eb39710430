"""Iterative pruning: reach a target in k cuts, re-analysing and re-scoring the pruned model between them.

    result = prunefx.prune(model, x, PlanConfig(flops=0.5), steps=3)  # three cuts, each verified by the oracle
    result.plan   # the whole cut as one plan of the ORIGINAL model: prunefx.save / prunefx.load re-apply it
    result.steps  # each cut's own PruneResult

The schedule is geometric in what is kept, always measured against the original model: after cut i of k,
a flops / params target keeps ``goal ** (i/k)`` of the original's MACs / parameters (each cut's relative target
is that over the current model's, as the cost model measures both); a ratio target keeps ``(1 - r) ** (i/k)`` of
the original's prunable channels, i.e. of the channels of the groups ``make_plan`` considers on the original
(prunable, not ignored, not hard-coded without graph_rewrite, wider than min_channels), the removed fraction
``prunefx.prune`` reports for one cut; a local ratio cuts every group by ``1 - (1 - r) ** (1/k)`` per cut (and so
each override), and ``max_ratio`` is split the same way so no group loses more of its original width than one cut
would allow. The last cut targets the original goal exactly. A latency target is refused: its single cut is
already measured end to end and re-planned (``steps=1``).

The cuts compose into one plan when each re-analysis of the pruned model has the groups of the analysis before
it: same count, same members (kind, name, role), as many channels as the previous plan kept. Then a group's kept
original channels are the previous ones indexed by this cut's ``keep``. The composed plan is applied to a copy of
the original and must rebuild the stepped model (same state_dict keys and shapes; with neither bias compensation
nor re-fit, which change weights between cuts, the oracle also checks the whole cut against the masked original)
before the original is pruned in place; otherwise ``model`` is left untouched.
"""

from __future__ import annotations

import copy
import math
import warnings
from collections.abc import Callable, Sequence
from dataclasses import replace
from typing import Any

import numpy as np
import torch
from torch import nn

from prunefx.analysis import DependencyGraph, analyze
from prunefx.capture.inputs import positional
from prunefx.errors import VerificationError
from prunefx.plan import CostModel, GroupPlan, PlanConfig, PlanError, PruningPlan
from prunefx.plan.solve import _eligible
from prunefx.transform import apply_plan, owned_modules
from prunefx.verify import VerifyResult, verify

_FIXES = "prune in one cut (steps=1)"


def check_steps(steps: Any) -> int:
    """``steps`` as a count of cuts, or PlanError: a positive integer."""
    if isinstance(steps, bool) or not isinstance(steps, int) or steps < 1:
        raise PlanError(f"steps must be an integer >= 1 (the number of cuts that reach the target), got {steps!r}; "
                        "steps=1 prunes in one cut")
    return steps


def prune_in_steps(
    one_shot: Callable[..., Any],
    model: nn.Module,
    example_inputs: Sequence[Any] | torch.Tensor,
    config: PlanConfig,
    steps: int,
    **prune_kwargs: Any,
) -> Any:
    """Prune ``model`` in place to ``config``'s target in ``steps`` cuts, each one call of ``one_shot``.

    ``one_shot`` is ``prunefx.prune`` (passed in, so this module sits below the API); ``prune_kwargs`` go to
    every call unchanged. Returns ``one_shot``'s PruneResult for the whole cut: the composed plan relative to
    the original model, the original's analysis and first scores, and ``steps``: each cut's result.
    """
    steps = check_steps(steps)
    inputs = positional(model, example_inputs)
    kind, goal = config.target
    if kind == "latency":
        raise PlanError(f"steps={steps} with a latency target: a latency cut is measured end to end and re-planned "
                        "until it meets the target, which a schedule of cuts cannot split; "
                        f"{_FIXES}, or give a flops target with steps")
    capture = prune_kwargs.get("capture", "auto")
    dg0 = analyze(model, inputs, capture=capture)
    cost0 = CostModel(model, dg0, inputs)
    eligible0 = _considered(dg0, config, owned_modules(model))
    channels0 = sum(dg0.groups[g].channels for g in eligible0)
    work = copy.deepcopy(model)  # the original stays untouched until every cut passed and the plans composed
    kept: dict[int, tuple[int, ...]] = {}  # group id -> original channel indices still kept (absent: all)
    widths: dict[int, list[int]] = {}  # group id -> its width after each cut that planned it
    results: list[Any] = []
    for i in range(1, steps + 1):
        cut = _step_config(config, i, steps, work, inputs, capture, cost0, eligible0, channels0)
        result = one_shot(work, inputs, cut, **prune_kwargs)
        prev_dg, prev_plan = (dg0, None) if not results else (results[-1].graph, results[-1].plan)
        _check_matches(prev_dg, prev_plan, result.graph, i)
        for gp in result.plan.groups:
            before = kept.get(gp.group, tuple(range(gp.before)))
            kept[gp.group] = tuple(before[j] for j in gp.keep)
            widths.setdefault(gp.group, [dg0.groups[gp.group].channels]).append(gp.after)
        work = result.model  # itself, or the rewritten GraphModule (graph_rewrite)
        results.append(result)
    plan = _composed(dg0, cost0, config, steps, results, kept, widths)
    pruned, whole = _rebuild(model, dg0, plan, work, inputs, config, results, prune_kwargs)
    said = tuple(dict.fromkeys(w for r in results for w in r.warnings))
    check = whole if whole is not None else results[-1].verified
    return replace(
        results[-1], model=pruned, plan=plan, graph=dg0.with_frozen(plan.frozen), scores=results[0].scores,
        verified=check, latency=None, frozen_by_check=plan.frozen, warnings=said,
        steps=tuple(replace(r, model=pruned) for r in results),  # each cut pruned the same module further
    )


def _considered(dg: DependencyGraph, config: PlanConfig, owned: frozenset[str]) -> list[int]:
    """The groups ``make_plan`` plans over for ``config`` (its warning on unused ignore patterns comes once, there)."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return _eligible(dg, config, owned)[0]


def _step_config(
    config: PlanConfig,
    i: int,
    k: int,
    work: nn.Module,
    inputs: tuple,
    capture: Any,
    cost0: CostModel,
    eligible0: list[int],
    channels0: int,
) -> PlanConfig:
    """Cut ``i`` of ``k``: the target relative to the current model that puts the cumulative cut on schedule."""
    kind, goal = config.target
    split = {  # per cut, so k cuts compound to the original limits
        "max_ratio": 1.0 - (1.0 - config.max_ratio) ** (1.0 / k),
        "overrides": tuple((p, 1.0 - (1.0 - r) ** (1.0 / k)) for p, r in config.overrides),
    }
    if kind == "ratio" and config.scope == "local":
        return replace(config, ratio=1.0 - (1.0 - goal) ** (1.0 / k), **split)
    dg = analyze(work, inputs, capture=capture)
    if kind == "ratio":
        now = _considered(dg, config, owned_modules(work))
        keep = sum(dg.groups[g].channels for g in eligible0)  # the original's prunable channels still kept
        want = channels0 * (1.0 - goal) ** (i / k)
        r = (keep - want) / max(sum(dg.groups[g].channels for g in now), 1)
        return replace(config, ratio=min(max(r, 0.0), math.nextafter(1.0, 0.0)), **split)
    cost = CostModel(work, dg, inputs)
    original, current = ((cost0.macs_total, cost.macs_total) if kind == "flops"
                         else (cost0.params_total, cost.params_total))
    rel = goal ** (i / k) * original / max(current, 1e-30)
    return replace(config, **{kind: min(max(rel, 1e-12), 1.0)}, **split)


def _members(dg: DependencyGraph, gid: int) -> tuple[tuple[str, str, str], ...]:
    return tuple(sorted((str(m.kind), m.name, str(m.role)) for m in dg.groups[gid].members))


def _check_matches(prev: DependencyGraph, plan: PruningPlan | None, now: DependencyGraph, i: int) -> None:
    """PlanError unless cut ``i``'s analysis has the previous analysis's groups, narrowed as its plan kept."""
    where = "the original model" if plan is None else f"cut {i - 1}'s result"
    if len(now.groups) != len(prev.groups):
        raise PlanError(f"cut {i}: the analysis of {where} has {len(now.groups)} channel groups, the one before "
                        f"{len(prev.groups)}, so the cuts cannot be described as one plan of the original model; "
                        f"{_FIXES}")
    after = {gp.group: gp.after for gp in plan.groups} if plan is not None else {}
    for g in prev.groups:
        width = after.get(g.id, g.channels)
        if _members(now, g.id) != _members(prev, g.id) or now.groups[g.id].channels != width:
            raise PlanError(f"cut {i}: group {g.id} ({g.label}) of {where} does not match the analysis before it "
                            f"(members or width: {now.groups[g.id].channels} channels, expected {width}), so the "
                            f"cuts cannot be described as one plan of the original model; {_FIXES}")


def _composed(
    dg0: DependencyGraph,
    cost0: CostModel,
    config: PlanConfig,
    k: int,
    results: list[Any],
    kept: dict[int, tuple[int, ...]],
    widths: dict[int, list[int]],
) -> PruningPlan:
    """The k cuts as one plan of the original model (its analysis ``dg0``)."""
    first: dict[int, GroupPlan] = {}
    last: dict[int, GroupPlan] = {}
    for r in results:
        for gp in r.plan.groups:
            first.setdefault(gp.group, gp)
            last[gp.group] = gp
    groups = []
    for gid in sorted(first):
        c0, keep = dg0.groups[gid].channels, kept[gid]
        trail = " -> ".join(map(str, widths[gid]))
        groups.append(replace(first[gid], before=c0, after=len(keep), keep=keep, label=dg0.groups[gid].label,
                              why=f"in {k} cuts: {trail} channels; last cut: {last[gid].why}"))
    # a group frozen by one cut's check but pruned by an earlier one stays pruned (that cut passed the oracle)
    frozen: dict[int, str] = {}
    for i, r in enumerate(results, 1):
        for gid, why in r.plan.frozen:
            if gid not in first:
                frozen.setdefault(gid, f"cut {i} of {k}: {why}")
    frozen_items = tuple(frozen.items())
    masks = {gid: np.isin(np.arange(dg0.groups[gid].channels), kept[gid]) for gid in first}
    kind, goal = config.target
    target = {**results[-1].plan.target, kind: goal, "max_ratio": config.max_ratio, "steps": k}
    return PruningPlan(
        model=dg0.model_name, fingerprint=dg0.with_frozen(frozen_items).fingerprint(),
        input_shapes=dg0.input_shapes, input_kinds=dg0.input_kinds, criterion=results[0].plan.criterion,
        target=target, groups=tuple(groups),
        skipped=tuple((g, why) for g, why in results[0].plan.skipped if g not in first),
        estimate={"macs_before": cost0.macs_total, "macs_after": cost0.macs(masks),
                  "params_before": cost0.params_total, "params_after": cost0.params(masks)},
        frozen=frozen_items,
    )


def _rebuild(
    model: nn.Module,
    dg0: DependencyGraph,
    plan: PruningPlan,
    stepped: nn.Module,
    inputs: tuple,
    config: PlanConfig,
    results: list[Any],
    prune_kwargs: dict[str, Any],
) -> tuple[nn.Module, VerifyResult | None]:
    """Prune ``model`` in place by the composed plan with the stepped weights, once a copy proved it rebuilds them.

    Returns the module to use and, when the cuts only sliced weights (no bias compensation, no re-fit) and were
    checked, the oracle's verdict on the whole cut against the masked original."""
    state = stepped.state_dict()
    trial, trial_gm = copy.deepcopy((model, dg0.gm))  # one memo: the copied graph shares the copied modules
    rebuilt = apply_plan(trial, replace(dg0, gm=trial_gm), plan, graph_rewrite=config.graph_rewrite)
    got = {n: tuple(t.shape) for n, t in rebuilt.state_dict().items()}
    want = {n: tuple(t.shape) for n, t in state.items()}
    if got != want:
        bad = sorted(n for n in got.keys() | want.keys() if got.get(n) != want.get(n))
        raise PlanError(f"the composed plan does not rebuild the model pruned in {len(results)} cuts ({bad[0]}: "
                        f"{got.get(bad[0])} vs {want.get(bad[0])}); the model was not changed; {_FIXES}")
    rebuilt.load_state_dict(state)
    whole = None
    sliced = all(r.compensation is None or not r.compensation.applied for r in results) and not prune_kwargs.get(
        "refit")
    if sliced and all(r.verified is not None for r in results):
        reference, ref_gm = copy.deepcopy((model, dg0.gm))
        whole = verify(reference, rebuilt, plan, inputs, dg=replace(dg0.with_frozen(plan.frozen), gm=ref_gm))
        if not whole.accepted:  # proven, or inexact by design as each cut was
            raise VerificationError(f"{dg0.model_name}: each of the {len(results)} cuts passed the check but "
                                    f"together they differ from the masked original ({whole.message}); the model "
                                    f"was not changed; {_FIXES}")
    pruned = apply_plan(model, dg0, plan, graph_rewrite=config.graph_rewrite)
    pruned.load_state_dict(state)
    return pruned, whole
