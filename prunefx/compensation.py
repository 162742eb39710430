"""Whether ``prunefx.prune`` compensates biases: measured on held-out calibration batches, else from the scores.

Bias compensation folds the removed channels' mean contribution into their consumers. It is exact for a channel a
small BatchNorm gamma left near-constant (``act(beta)``), and the evidence for it is a BatchNorm classifier. On a
trained net without BatchNorm, where ``bn_scale`` falls back to ``l2``, it moved the outputs further from the
unpruned model: 24-69 points of the task metric on two BN-free references (issue 48). So, unless the caller says
``bias_compensation=True`` / ``False``:

* **with calibration data** (and no re-fit, which replaces compensation), the cut is made twice on copies, once
  with every pruned group compensated (means over the example inputs and the fitting batches) and once without,
  and both are run on held-out batches (the last fifth, at least one; a single batch is held out whole, the means
  then come from the example inputs alone). The relative output error against the unpruned model,
  ``||y_cut - y|| / ||y||`` over every comparable output (:func:`prunefx.sensitivity` measures damage the same
  way), decides: compensation is kept only when it is lower. Kept, it is applied with means over every batch.
  Costs two deep copies, two rewrites and ``2 x held-out + 1 x fitting + 1`` forwards over the batches;
* **without data** only the groups whose scores came from the criterion itself (``bn_scale``: a BatchNorm's
  gammas; not a fallback to ``l2``) are compensated, with means over the example inputs: a BN-free net gets none.

The decision is recorded in :class:`prunefx.transform.Compensation` (``applied``, ``why``, the measured errors).
"""

from __future__ import annotations

import copy
import math
from collections.abc import Sequence
from dataclasses import dataclass, replace
from typing import Any

from torch import nn

from prunefx.analysis import DependencyGraph
from prunefx.capture.trace import training_mode
from prunefx.importance import Scores, compensates
from prunefx.plan import PlanError, PruningPlan
from prunefx.sensitivity import _damage, _run
from prunefx.transform import Compensation, apply_plan, compensate

HOLD_OUT = 0.2  # share of the calibration batches the choice is measured on (at least one)


@dataclass(frozen=True)
class Intent:
    """What compensation a cut gets: which groups, the batches its means come from, why, and what was measured."""

    groups: tuple[int, ...] | None  # None: every pruned group
    batches: tuple[tuple, ...]  # calibration batches (positional inputs) the means are taken over, besides the example
    why: str
    measure: bool  # with data and no explicit choice: to be decided by :func:`decide` once the plan is final
    on: bool = True  # False: decided against (``why``)
    error_with: float | None = None  # held-out relative output error, compensated (measured)
    error_without: float | None = None  # the same, uncompensated
    held_out: int = 0  # batches they were measured on


def intent(criterion: str, bias_compensation: bool | None, refit: bool, scores: Scores,
           batches: Sequence[tuple] | None) -> Intent | None:
    """The compensation a cut is checked with (None: none at all): the caller's choice, else the module's rule."""
    if refit or bias_compensation is False or (bias_compensation is None and not compensates(criterion)):
        return None
    data = tuple(batches or ())
    if bias_compensation:
        return Intent(None, data, "asked for (bias_compensation=True)", False)
    if data:
        return Intent(None, data, "to be measured on held-out calibration batches", True)
    own = tuple(sorted(g for g, used in scores.used.items() if used == criterion))
    return Intent(own, (), f"no calibration data: applied only to the group(s) scored by {criterion} itself, "
                           "means over the example inputs (pass calibration=[x, ...] to re-fit the cut instead)",
                  False)


def apply(model: nn.Module, dg: DependencyGraph, plan: PruningPlan, example_inputs: Sequence[Any],
          chosen: Intent | None) -> Compensation | None:
    """Compensate ``model`` as ``chosen`` says, in place (None: not at all); the record of what was decided."""
    if chosen is None:
        return None
    measured = {"error_with": chosen.error_with, "error_without": chosen.error_without, "held_out": chosen.held_out}
    if not chosen.on:
        return Compensation((), (), applied=False, why=chosen.why, groups=(), **measured)
    pruned = {gp.group for gp in plan.pruned}
    groups = None if chosen.groups is None else tuple(g for g in chosen.groups if g in pruned)
    if groups is not None and not groups:
        return Compensation((), (), applied=False, groups=(), why=(
            "no pruned group was scored by BatchNorm statistics (the criterion fell back to another score for every "
            "one), and compensating such channels made trained BN-free nets worse; pass calibration=[x, ...] to "
            "re-fit the cut, or bias_compensation=True to force it"))
    done = compensate(model, dg, plan, example_inputs, calibration=chosen.batches, groups=groups)
    return replace(done, why=chosen.why, **measured)


def decide(model: nn.Module, dg: DependencyGraph, plan: PruningPlan, example_inputs: Sequence[Any],
           chosen: Intent, graph_rewrite: bool = False) -> Intent:
    """``chosen`` measured on held-out batches (see the module): on only when it lowered the output error.
    ``model`` is never modified."""
    batches = list(chosen.batches)
    held = max(1, round(HOLD_OUT * len(batches)))
    fit, test = batches[:-held], [(inputs, None) for inputs in batches[-held:]]
    with training_mode(model, False):
        reference = _run(model, test, None)
    try:
        with_, without = (_error(model, dg, plan, example_inputs, fit if on else None, test, reference, graph_rewrite)
                          for on in (True, False))
    except PlanError as exc:  # no output keeps its shape: nothing to compare, so no evidence for it
        return replace(chosen, measure=False, on=False, why=f"could not be measured ({exc}), so not applied")
    said = (f"held-out relative output error {with_:.4g} with it vs {without:.4g} without, on {len(test)} "
            f"calibration batch(es)")
    on = math.isfinite(with_) and with_ < without
    return replace(chosen, measure=False, on=on, why=f"it {'lowered' if on else 'did not lower'} the {said}",
                   error_with=with_, error_without=without, held_out=len(test))


def _error(model: nn.Module, dg: DependencyGraph, plan: PruningPlan, example_inputs: Sequence[Any],
           fit: list[tuple] | None, test: list[tuple], reference: list, graph_rewrite: bool) -> float:
    """The cut's relative output error on ``test`` against ``reference`` (the unpruned model's outputs),
    compensated with means over ``fit`` and the example inputs, or uncompensated (``fit`` None)."""
    work, gm = copy.deepcopy((model, dg.gm))  # one memo: the copied graph shares the copied modules
    work_dg = replace(dg, gm=gm)
    if fit is not None:
        compensate(work, work_dg, plan, example_inputs, calibration=fit)
    return _damage(reference, _run(apply_plan(work, work_dg, plan, graph_rewrite=graph_rewrite), test, None), False)


__all__ = ["Intent", "apply", "decide", "intent"]
