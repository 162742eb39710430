"""Depth pruning: find the residual blocks, score them on data, plan, remove, and prove the result.

``prunefx.prune_depth(model, x, remove=2)`` (or ``params=0.7``): blocks are found in the captured graph
(:mod:`prunefx.analysis.blocks`), scored by ``criterion``:

- ``"influence"`` (default; one pass over the calibration batches): 1 - cosine similarity of each block's input and
  output stream (ShortGPT's block influence), per token for ``(batch, tokens, channels)`` streams, per pixel for
  ``(batch, channels, h, w)``, per sample otherwise; a block that barely turns its stream matters least;
- ``"output"`` (one pass per block): the model's relative output error with that block alone removed, or with
  ``loss_fn`` the increase of the user's loss;

removed (:mod:`prunefx.transform.depth`), and checked by the oracle (:mod:`prunefx.verify.depth`): the pruned model
must equal the original with those blocks' branches zeroed. A model that fails the check gets its blocks back and
the call raises.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import astuple, dataclass, replace
from typing import Any

import torch
from torch import nn

from prunefx import _plugins
from prunefx.analysis import analyze
from prunefx.analysis.blocks import BlockSearch, ResidualBlock, candidate_paths, residual_blocks
from prunefx.analysis.outputs import default_free_outputs, output_leaves
from prunefx.capture.inputs import input_kinds, positional
from prunefx.capture.record import Capture
from prunefx.errors import PrunefxError, VerificationError
from prunefx.plan.depth import DepthPlan, plan_depth
from prunefx.sensitivity import calibration_batches
from prunefx.transform.depth import BlockCall, block_calls, remove_blocks
from prunefx.verify import VerifyResult
from prunefx.verify.depth import verify_depth

CRITERIA = ("influence", "output")


@dataclass(frozen=True)
class DepthResult:
    """What :func:`prune_depth` did: the model (blocks removed in place), the plan, the blocks and the check."""

    model: nn.Module
    plan: DepthPlan
    search: BlockSearch
    verified: VerifyResult | None
    warnings: tuple[str, ...] = ()  # what an integration warned about (a config that cannot say the new depth)


def _stream_dim(x: torch.Tensor) -> int | None:
    """The channel dim the cosine runs over: last for (B, T, C), 1 for (B, C, H, W), None (whole sample) else."""
    return {3: -1, 4: 1}.get(x.dim())


def _cosine_gap(x: torch.Tensor, y: torch.Tensor) -> tuple[float, int]:
    x, y = x.detach().double(), y.detach().double()
    dim = _stream_dim(x)
    if dim is None:
        x, y, dim = x.flatten(1), y.flatten(1), 1
    cos = torch.nn.functional.cosine_similarity(x, y, dim=dim, eps=1e-12)
    return float((1 - cos).sum()), cos.numel()


def _influence(model: nn.Module, blocks: Sequence[ResidualBlock], calls: dict[str, BlockCall],
               batches: list[tuple]) -> dict[str, float]:
    total = {b.path: [0.0, 0] for b in blocks}
    hooks = []
    for b in blocks:
        call = calls[b.path]

        def hook(m: nn.Module, args: tuple, kwargs: dict, out: Any, path: str = b.path, c: BlockCall = call) -> None:
            x = kwargs[c.param] if c.param in kwargs else args[c.position]
            y = out if c.out_index is None else out[c.out_index]
            gap, n = _cosine_gap(x, y)
            total[path][0] += gap
            total[path][1] += n

        hooks.append(model.get_submodule(b.path).register_forward_hook(hook, with_kwargs=True))
    try:
        with torch.no_grad():
            for inputs, _ in batches:
                model(*inputs)
    finally:
        for h in hooks:
            h.remove()
    return {p: s / max(n, 1) for p, (s, n) in total.items()}


def _output_error(ref: Any, got: Any, free: tuple[str, ...]) -> float:
    a = dict(output_leaves(ref, free))
    b = dict(output_leaves(got, free))
    num = den = 0.0
    for k, t in a.items():
        if isinstance(t, torch.Tensor) and t.is_floating_point() and isinstance(b.get(k), torch.Tensor):
            num += float((t.double() - b[k].double()).pow(2).sum())
            den += float(t.double().pow(2).sum())
    return math.sqrt(num / den) if den > 0 else float("inf")


def _removed_alone(model: nn.Module, blocks: Sequence[ResidualBlock], calls: dict[str, BlockCall],
                   batches: list[tuple], loss_fn: Callable | None) -> dict[str, float]:
    free = default_free_outputs(model)

    def measure() -> list[Any]:
        with torch.no_grad():
            outs = [model(*inputs) for inputs, _ in batches]
        if loss_fn is None:
            return outs
        return [float(loss_fn(o, t)) for o, (_, t) in zip(outs, batches, strict=True)]

    base = measure()
    scores = {}
    for b in blocks:
        undo = remove_blocks(model, [b], calls, compact=False)
        try:
            got = measure()
        finally:
            undo()
        if loss_fn is None:
            scores[b.path] = sum(_output_error(r, g, free) for r, g in zip(base, got, strict=True)) / len(batches)
        else:
            scores[b.path] = sum(g - r for r, g in zip(base, got, strict=True)) / len(batches)
    return scores


def score_blocks(model: nn.Module, blocks: Sequence[ResidualBlock], calls: dict[str, BlockCall],
                 batches: list[tuple], criterion: str = "influence", loss_fn: Callable | None = None
                 ) -> dict[str, float]:
    """Each block's score on ``batches`` (lower: less damage when removed); see the module doc for ``criterion``."""
    if criterion not in CRITERIA:
        raise PrunefxError(f"unknown depth criterion {criterion!r}: give one of {', '.join(CRITERIA)}")
    if loss_fn is not None and criterion != "output":
        raise PrunefxError("loss_fn scores blocks by the loss they cost when removed: use criterion='output'")
    was = model.training
    model.eval()
    try:
        if criterion == "influence":
            return _influence(model, blocks, calls, batches)
        return _removed_alone(model, blocks, calls, batches, loss_fn)
    finally:
        model.train(was)


def _kinds_kept(search: BlockSearch, keep_one: Mapping[str, Sequence[str]], named: bool
                ) -> tuple[BlockSearch, list[set[str]]]:
    """``search`` without the blocks that are the only one of their kind (refused, with the reason; an error when
    ``named``: the caller asked for them), and the kinds whose blocks are all candidates (one of each must stay)."""
    paths = {b.path for b in search.blocks}
    last = {next(iter(g)): kind for kind, g in keep_one.items() if len(set(g)) == 1 and set(g) <= paths}
    if last and named:
        path, kind = next(iter(last.items()))
        raise PrunefxError(f"{path} cannot be removed: it is the only {kind}, which the model needs")
    if last:
        search = BlockSearch(tuple(b for b in search.blocks if b.path not in last),
                             (*((p, f"the only {k}, which the model needs") for p, k in last.items()), *search.refused))
    groups = [set(g) for g in keep_one.values() if len(set(g)) > 1 and set(g) <= paths]
    return search, groups


def _met(chosen: Sequence[str], own: dict[str, int], total: int, remove: int | None, params: float | None) -> bool:
    if remove is not None:
        return len(chosen) >= remove
    return params is not None and total - sum(own[p] for p in chosen) <= params * total


def _keeping_one(order: Sequence[str], groups: Sequence[set[str]]) -> list[str]:
    """``order`` less the blocks whose removal, after those before them, would take the last of a group."""
    left = [set(g) for g in groups]
    out = []
    for p in order:
        if any(g == {p} for g in left):
            continue
        for g in left:
            g.discard(p)
        out.append(p)
    return out


def _iterative(model: nn.Module, blocks: Sequence[ResidualBlock], calls: dict[str, BlockCall], batches: list[tuple],
               criterion: str, loss_fn: Callable | None, met: Callable[[list[str]], bool],
               groups: Sequence[set[str]] = ()) -> tuple[dict[str, float], list[str]]:
    """Blocks chosen one at a time, each the lowest-scored on the model without those chosen before it: each block's
    score when it was chosen (the others': their last), and the order (never the last block of a group)."""
    chosen: list[str] = []
    scores = {b.path: 0.0 for b in blocks}
    while not met(chosen):
        left = [b for b in blocks if b.path not in chosen and _keeping_one([*chosen, b.path], groups)[-1:] == [b.path]]
        if not left:
            break
        undo = remove_blocks(model, [b for b in blocks if b.path in chosen], calls, compact=False)
        try:
            now = score_blocks(model, left, calls, batches, criterion, loss_fn)
        finally:
            undo()
        scores.update(now)
        chosen.append(min(now, key=lambda p: (now[p], [b.path for b in blocks].index(p))))
    rest = sorted((p for p in scores if p not in chosen), key=lambda p: scores[p])
    return scores, _keeping_one(chosen + rest, groups)


def prune_depth(
    model: nn.Module,
    example_inputs: Any,
    *,
    remove: int | None = None,
    params: float | None = None,
    criterion: str = "influence",
    calibration: Iterable[Any] | None = None,
    loss_fn: Callable | None = None,
    blocks: Sequence[str] | None = None,
    check: bool = True,
    rtol: float = 1e-4,
    capture: Capture = "auto",
    compact: bool = True,
    iterative: bool = False,
    under: str | None = None,
    keep_one: Mapping[str, Sequence[str]] | None = None,
    after: Callable[[nn.Module], str | None] | None = None,
) -> DepthResult:
    """Remove residual blocks of ``model`` in place: ``remove`` of them, or the fewest that leave at most ``params``
    of the parameters, lowest ``criterion`` score first (scored on ``calibration``, default the example inputs).

    ``blocks``: module paths to consider (default: every child of a ModuleList / Sequential the graph proves
    residual). ``iterative``: remove one block at a time, re-scoring the rest on the model without the ones chosen
    so far (blocks that only matter together are not removed together; cost: one scoring per removed block).
    ``under``: consider only the blocks inside that submodule (a VLM's language model).
    ``keep_one``: per kind of block (its name in words), the block paths of which at least one always stays (an
    integration's: the last layer of a kind its model's cache or masks need); the only one of its kind is refused
    before any compute. With ``check`` the result must equal the original with the removed blocks' branches zeroed,
    and ``after(model)`` (an integration's check of the pruned model: its default call) must return None; if not, the
    blocks are put back and :class:`~prunefx.errors.VerificationError` is raised.
    """
    _plugins.activate()
    inputs = positional(model, example_inputs)
    dg = analyze(model, inputs, capture=capture)
    if under is not None and blocks is None:
        model.get_submodule(under)  # an AttributeError naming the path when it is no submodule
        blocks_in = [p for p in candidate_paths(model) if p.startswith(under + ".")]
        search = residual_blocks(model, dg.gm, blocks_in)
    else:
        search = residual_blocks(model, dg.gm, blocks)
    if blocks is not None and search.refused:
        path, why = search.refused[0]
        raise PrunefxError(f"{path} cannot be removed: {why}")
    search, groups = _kinds_kept(search, keep_one or {}, blocks is not None)
    if not search.blocks:
        reason = f" ({search.refused[0][0]}: {search.refused[0][1]})" if search.refused else ""
        raise PrunefxError(f"{type(model).__name__} has no removable residual block{reason}; name blocks with blocks=")
    if remove is not None and remove > len(search.blocks) - len(groups):
        most = len(search.blocks) - len(groups)
        kinds = ", ".join(k for k, g in (keep_one or {}).items() if set(g) in groups)
        kept = f" (one of each kind stays: {kinds})" if groups else ""
        raise PrunefxError(f"remove={remove}, but the model has {most} removable blocks{kept}: give 0 to {most}")
    calls, failed = block_calls(model, dg.gm, search.blocks, inputs)
    if failed:  # its call could not be read (what it returns besides the stream): it cannot be bypassed
        search = BlockSearch(tuple(b for b in search.blocks if b.path not in failed),
                             (*search.refused, *failed.items()))
        if blocks is not None or not search.blocks:
            path, why = next(iter(failed.items()))
            raise PrunefxError(f"{path} cannot be removed: {why}")
    # the example inputs as one batch: a list is positional inputs (a 2-tuple would read as (inputs, targets))
    batches = calibration_batches([list(inputs)] if calibration is None else calibration, loss_fn, model)
    total = sum(p.numel() for p in model.parameters())
    own = {b.path: b.params for b in search.blocks}
    if iterative:
        scores, order = _iterative(model, search.blocks, calls, batches, criterion, loss_fn,
                                   lambda chosen: _met(chosen, own, total, remove, params), groups)
        plan = plan_depth(scores, own, total, f"{criterion}, iterative", remove=remove, keep_params=params,
                          order=order)
    else:
        scores = score_blocks(model, search.blocks, calls, batches, criterion, loss_fn)
        order = sorted(scores, key=lambda p: (scores[p], list(scores).index(p)))
        plan = plan_depth(scores, own, total, criterion, remove=remove, keep_params=params,
                          order=_keeping_one(order, groups))
    plan = replace(plan, model=type(model).__name__, input_shapes=dg.input_shapes, input_kinds=input_kinds(inputs),
                   calls=tuple((p, astuple(calls[p])) for p in plan.remove))
    chosen = [search.block(p) for p in plan.remove]
    undo = remove_blocks(model, chosen, calls, compact=compact)
    verified = None
    if check:
        verified = verify_depth(model, dg, model, chosen, inputs, rtol=rtol)
        why = verified.message if not verified.ok else after(model) if after is not None else None
        if why is not None:
            undo()
            raise VerificationError(f"depth pruning failed its check, the blocks are back: {why}")
    return DepthResult(model, plan, search, verified)

