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
from dataclasses import dataclass
from typing import Any

import torch
from torch import nn

from prunefx.analysis.outputs import output_leaves
from prunefx.capture.inputs import positional
from prunefx.errors import PrunefxError
from prunefx.integrations.transformers.api import prune
from prunefx.integrations.transformers.depth import prune_depth
from prunefx.plan import PlanConfig
from prunefx.sensitivity import calibration_batches


@dataclass(frozen=True)
class Candidate:
    """One architecture the search tried: layers removed, the width target after them, what it kept, its score."""

    layers_removed: int
    removed: tuple[str, ...]
    width_target: float | None  # the params fraction asked of the width cut after the depth cut (None: none)
    params_kept: float  # of the original's parameters
    score: float


@dataclass(frozen=True)
class SearchResult:
    """The best candidate's model and every candidate tried, in the order tried."""

    model: nn.Module
    best: Candidate
    candidates: tuple[Candidate, ...]
    skipped: tuple[tuple[int, str], ...] = ()  # (layers removed, why no candidate was scored there)

    def table(self) -> str:
        """Every candidate as text, the best marked, then the depths skipped and why."""
        lines = ["  layers removed  width target  params kept  score"]
        for c in self.candidates:
            mark = "*" if c == self.best else " "
            width = f"{c.width_target:.3f}" if c.width_target is not None else "-"
            lines.append(f"{mark} {c.layers_removed:>14}  {width:>12}  {c.params_kept:>11.3f}  {c.score:.5g}")
        lines += [f"  {d:>14}  skipped: {why}" for d, why in self.skipped]
        return "\n".join(lines)


def _count(model: nn.Module, embeddings: bool = True) -> int:
    """Parameters of ``model``; without ``embeddings``, less the input embedding and the output head."""
    n = sum(p.numel() for p in model.parameters())
    if embeddings:
        return n
    tables = {id(p): p for m in (model.get_input_embeddings(), model.get_output_embeddings()) if m is not None
              for p in m.parameters()}
    return n - sum(p.numel() for p in tables.values())


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
    params: float,
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
    """Mix depth and width to keep ``params`` of the parameters; return the candidate ``score`` ranks best.

    ``embeddings=False``: the budget counts the parameters without the input embedding and the output head (which
    neither cut touches). ``language_model_only``: a VLM's vision tower and projector are left as they are.
    ``criterion`` and ``prune_kwargs`` (``refit=True``, ``normalize=``...) go to the width
    cut, ``calibration`` and ``loss_fn`` to both cuts. See the module doc."""
    if not 0 < params < 1:
        raise PrunefxError(f"params={params} is no fraction of the parameters to keep: give a value in (0, 1)")
    one = [list(positional(model, example_inputs))]  # a list: positional inputs, never read as (inputs, targets)
    batches = calibration_batches(one if calibration is None else calibration, loss_fn, model)
    model.eval()
    if score is None:
        with torch.no_grad():
            reference = [model(*inputs, use_cache=False) for inputs, _ in batches]
        error = _logit_error(reference)

        def score(m: nn.Module) -> float:
            return error(m, batches)

    total, fixed = _count(model, embeddings), _count(model) - _count(model, embeddings)
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
        left = _count(candidate, embeddings) / total
        if left < params * (1 - tolerance):
            skipped.append((d, f"removing {d} layers alone keeps {left:.3f}, under the budget"))
            break  # more layers only more so
        width = None
        if left > params * (1 + tolerance):  # PlanConfig(params=) counts every parameter of the model it cuts
            width = (params * total + fixed) / (left * total + fixed)
            prune(candidate, example_inputs, PlanConfig(params=width), criterion=criterion, **width_kwargs)
        kept = _count(candidate, embeddings) / total
        if abs(kept - params) > tolerance * params:  # allowed head counts and uniform layers move in steps
            skipped.append((d, f"the width cut kept {kept:.3f} of the parameters, not {params:.3f} +- {tolerance:.0%}"))
            continue
        c = Candidate(d, tuple(removed), width, round(kept, 4), float(score(candidate.eval())))
        tried.append(c)
        if best is None or c.score < best.score:
            best, best_model = c, candidate
    if best is None:
        why = "; ".join(f"{d} layers: {w}" for d, w in skipped[:3])
        raise PrunefxError(f"no candidate keeps {params:.1%} of the parameters within {tolerance:.0%} ({why}): give "
                           "another params target or a larger tolerance")
    return SearchResult(best_model, best, tuple(tried), tuple(skipped))
