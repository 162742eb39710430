"""A searched architecture: depth and width mixed to one parameter budget, the candidates ranked by your score.

    result = pfx_hf.search(model, ids, params=0.5, score=lambda m: perplexity(m, held_out), calibration=batches)
    result.model              # the best candidate, pruned (the model you gave is left as it was)
    print(result.table())     # every candidate: layers removed, width target, parameters kept, score

Each candidate removes ``d`` decoder layers (:func:`~prunefx.integrations.transformers.depth.prune_depth`, by the
loss they cost alone when ``loss_fn`` is given, else by block influence) and cuts heads and MLP widths
(:func:`~prunefx.integrations.transformers.api.prune`) to reach the budget, for every ``d`` from 0 to the most the
budget allows (or the ``depths`` given). Each candidate is checked by the oracles of both cuts and must meet the
budget within ``tolerance``; it is scored by ``score(model)`` (lower is better; default: the relative logit error
against the unpruned model on the calibration batches) and the best one is returned.
"""

from __future__ import annotations

import copy
import math
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, replace
from typing import Any

import torch
from torch import nn

from prunefx.analysis.outputs import output_leaves
from prunefx.capture.inputs import positional
from prunefx.errors import PrunefxError
from prunefx.integrations.transformers.api import prune
from prunefx.integrations.transformers.budget import Budget
from prunefx.integrations.transformers.depth import prune_depth
from prunefx.plan import PlanConfig
from prunefx.sensitivity import calibration_batches


@dataclass(frozen=True)
class Candidate:
    """One architecture the search tried: layers removed, the width target after them, what it kept, its score."""

    layers_removed: int
    removed: tuple[str, ...]
    width_target: float | None  # the params fraction asked of the width cut after the depth cut (None: none)
    params_kept: float  # of the original's parameters (without embeddings when the budget counts them so)
    score: float
    kept: float | None = None  # of the search's budget (the parameters unless another budget was given)


@dataclass(frozen=True)
class SearchResult:
    """The best candidate's model and every candidate tried, in the order tried."""

    model: nn.Module
    best: Candidate
    candidates: tuple[Candidate, ...]
    skipped: tuple[tuple[int, str], ...] = ()  # (layers removed, why no candidate was scored there)
    budget: str = "params"  # what the budget counted, in words

    def table(self) -> str:
        """Every candidate as text, the best marked, then the depths skipped and why."""
        lines = [f"budget: {self.budget}", "  layers removed  width target  params kept  budget kept  score"]
        for c in self.candidates:
            mark = "*" if c == self.best else " "
            width = f"{c.width_target:.3f}" if c.width_target is not None else "-"
            kept = c.params_kept if c.kept is None else c.kept
            lines.append(f"{mark} {c.layers_removed:>14}  {width:>12}  {c.params_kept:>11.3f}  {kept:>11.3f}  "
                         f"{c.score:.5g}")
        lines += [f"  {d:>14}  skipped: {why}" for d, why in self.skipped]
        return "\n".join(lines)


def _logit_error(reference: list[Any]) -> Callable[[nn.Module, list[tuple]], float]:
    def error(model: nn.Module, batches: list[tuple]) -> float:
        num = den = 0.0
        with torch.no_grad():
            for (inputs, _), ref in zip(batches, reference, strict=True):
                got = dict(output_leaves(model(*inputs, use_cache=False)))
                for k, t in dict(output_leaves(ref)).items():
                    if isinstance(t, torch.Tensor) and t.is_floating_point() and k in got:
                        num += float((got[k].double() - t.double()).pow(2).sum())
                        den += float(t.double().pow(2).sum())
        return math.sqrt(num / den) if den else float("inf")

    return error


def search(
    model: nn.Module,
    example_inputs: Any,
    *,
    params: float | None = None,
    keep: float | None = None,
    budget: Budget | str = "params",
    score: Callable[[nn.Module], float] | None = None,
    calibration: Iterable[Any] | None = None,
    loss_fn: Callable | None = None,
    depths: Sequence[int] | None = None,
    criterion: str = "l2",
    tolerance: float = 0.02,
    embeddings: bool = True,
    language_model_only: bool = False,
    **prune_kwargs: Any,
) -> SearchResult:
    """Mix depth and width to keep a fraction of a budget; return the candidate ``score`` ranks best.

    ``params=f`` keeps ``f`` of the parameters (``embeddings=False``: without the input embedding and the output
    head, which neither cut touches); ``keep=f, budget=...`` keeps ``f`` of another :class:`Budget`
    (``"active_params"``, ``Budget("memory", batch=, context=)``: weights + KV cache), the width cut bisected on
    the measured budget. ``language_model_only``: a VLM's vision tower and projector are left as they are.
    ``criterion`` and ``prune_kwargs`` (``refit=True``, ``normalize=``...) go to the width
    cut, ``calibration`` and ``loss_fn`` to both cuts. See the module doc."""
    if (params is None) == (keep is None):
        raise PrunefxError("give one of params=f (a fraction of the parameters) or keep=f with budget=...")
    keep = params if keep is None else keep
    budget = Budget(budget) if isinstance(budget, str) else budget
    if not embeddings and budget.measure == "params":
        budget = replace(budget, measure="params_no_embeddings")
    if not 0 < keep < 1:
        raise PrunefxError(f"{'params' if params is not None else 'keep'}={keep} is no fraction of the "
                           f"{budget.describe()} to keep: give a value in (0, 1)")
    one = [list(positional(model, example_inputs))]  # a list: positional inputs, never read as (inputs, targets)
    batches = calibration_batches(one if calibration is None else calibration, loss_fn, model)
    model.eval()
    if score is None:
        with torch.no_grad():
            reference = [model(*inputs, use_cache=False) for inputs, _ in batches]
        error = _logit_error(reference)

        def score(m: nn.Module) -> float:
            return error(m, batches)

    base = budget.of(model)
    all_params = Budget("params").of(model)
    cal = [list(b) if t is None else (list(b), t) for b, t in batches]  # a list: positional inputs, never (x, y)
    scope = {"language_model_only": language_model_only}
    depth_kwargs = {**scope, **({"criterion": "output", "loss_fn": loss_fn} if loss_fn is not None else {})}
    width_kwargs = {**scope, "calibration": cal, **({"loss_fn": loss_fn} if loss_fn is not None else {}),
                    **prune_kwargs}
    text = model.config.get_text_config() if hasattr(model.config, "get_text_config") else model.config
    layers = getattr(text, "num_hidden_layers", None)
    if depths is None:
        if not isinstance(layers, int):
            raise PrunefxError(f"{type(model).__name__}'s config has no num_hidden_layers: give depths=[...]")
        depths = range(layers)
    what = budget.describe()
    tried, skipped, best, best_model = [], [], None, None
    for d in depths:
        candidate = copy.deepcopy(model)
        removed: tuple[str, ...] = ()
        if d:
            try:
                removed = prune_depth(candidate, example_inputs, remove=d, calibration=cal, **depth_kwargs).plan.remove
            except PrunefxError as exc:  # more layers than the model can lose
                skipped.append((d, str(exc).split("\n")[0]))
                continue
        left = budget.of(candidate) / base
        if left < keep * (1 - tolerance):
            skipped.append((d, f"removing {d} layers alone keeps {left:.3f} of the {what}, under the budget"))
            break  # more layers only more so
        width = None
        if left > keep * (1 + tolerance):  # PlanConfig(params=) counts every parameter of the model it cuts
            width = _width_target(candidate, example_inputs, keep * base, budget, tolerance, criterion, width_kwargs)
            try:
                prune(candidate, example_inputs, PlanConfig(params=width), criterion=criterion, **width_kwargs)
            except PrunefxError as exc:  # this candidate's cut failed its check: the others may still hold
                skipped.append((d, f"the width cut failed: {str(exc).splitlines()[0]}"))
                continue
        kept = budget.of(candidate) / base
        if abs(kept - keep) > tolerance * keep:  # allowed head counts and uniform layers move in steps
            skipped.append((d, f"the width cut kept {kept:.3f} of the {what}, not {keep:.3f} +- {tolerance:.0%}"))
            continue
        params_kept = kept if budget.measure == "params_no_embeddings" else Budget("params").of(candidate) / all_params
        c = Candidate(d, tuple(removed), width, round(params_kept, 4), float(score(candidate.eval())), round(kept, 4))
        tried.append(c)
        if best is None or c.score < best.score:
            best, best_model = c, candidate
    if best is None:
        why = "; ".join(f"{d} layers: {w}" for d, w in skipped[:3])
        raise PrunefxError(f"no candidate keeps {keep:.1%} of the {what} within {tolerance:.0%} ({why}): give "
                           "another target or a larger tolerance")
    return SearchResult(best_model, best, tuple(tried), tuple(skipped), what)


def _width_target(model: nn.Module, example_inputs: Any, goal: float, budget: Budget, tolerance: float,
                  criterion: str, width_kwargs: dict[str, Any]) -> float:
    """The ``PlanConfig(params=)`` fraction whose width cut leaves ``goal`` of ``budget`` in ``model``.

    Parameter budgets have it in closed form (the embeddings are a fixed part); any other is bisected on trial cuts
    of copies (unchecked and not re-fitted: only the widths they land on are read)."""
    total = Budget("params").of(model)
    if budget.measure in ("params", "params_no_embeddings"):
        fixed = total - budget.of(model)
        return (goal + fixed) / total
    trial_kwargs = {**{k: v for k, v in width_kwargs.items() if k != "refit"}, "refit": False}  # data: no re-fit
    lo, hi, w = 0.0, 1.0, min(0.99, goal / budget.of(model))
    best = (math.inf, w)
    for _ in range(10):
        trial = copy.deepcopy(model)
        prune(trial, example_inputs, PlanConfig(params=w), criterion=criterion, check=False, **trial_kwargs)
        got = budget.of(trial)
        best = min(best, (abs(got / goal - 1), w))
        if best[0] <= tolerance / 2:
            break
        lo, hi = (lo, w) if got > goal else (w, hi)
        w = (lo + hi) / 2
    return best[1]
