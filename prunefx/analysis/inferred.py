"""Channel maps of ops that have no rule, inferred by probing the op on real values.

An op nobody wrote a rule for (a library's new activation, a user's ``torch.fx.wrap``-ed function, an ATen op) used
to freeze every channel it touched. Here it is run on seeded random inputs of the shapes it was captured with:
position ``k`` of each labeled input dim is perturbed alone, and the output positions that change say where it
goes. Only the structures the hand-written rules produce are accepted, per input dim:

- ``identity`` / ``permutation``: position k reaches exactly one output position along one output dim, one to one;
- ``split``: the dim is ``b`` blocks and position k reaches output position ``k mod (n / b)`` (a GLU-like halving;
  the blocks' channels are coupled);
- ``reduced``: every position reaches the same outputs (a sum over the dim): the channels are consumed there.

Then the op is run once more on inputs with a quarter of those channels removed, and must equal its output on the
inputs with them zeroed, kept positions only: the pruning an inferred map allows is tried on the op itself. A dim
whose positions mix (a matmul, an FFT, a norm over the dim) or an op that fails on fewer channels freezes its
channels as before, the probe's finding in the reason. Accepted maps are recorded as inferred (the analysis
summary and graph.json name the op), cached per op and shape signature, and the oracle still has the last word on
every plan that uses them. Ops with parameters of their own, integer inputs, several outputs or random outputs
are not probed.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch
import torch.fx as fx

from prunefx.analysis.labels import Lab, instances
from prunefx.analysis.rules._context import Ctx

MAX_POSITIONS = 2048  # positions probed per input dim (one forward of the op each)
MAX_ELEMENTS = 1 << 23  # elements of the op's inputs and output together: larger ops are not probed
MAX_WORK = 3 * 10**8  # positions x elements probed per input dim (about a second of element-wise work)
_RTOL = 1e-4


@dataclass(frozen=True)
class DimMap:
    """Where input ``arg``'s dim ``dim`` goes: ``out`` (None: reduced), and each position's output index."""

    arg: int
    dim: int
    kind: str  # "identity", "permutation", "split", "reduced"
    out: int | None = None
    index: tuple[int, ...] = ()  # output position of each input position (identity / permutation / split)


@dataclass(frozen=True)
class Inference:
    """An op's inferred channel map, or why there is none: ``maps`` accepted, ``refused`` (arg, dim, finding)."""

    maps: tuple[DimMap, ...]
    refused: tuple[tuple[int, int, str], ...] = ()
    failure: str = ""  # the op was not probed at all, or the removal test failed: every channel freezes

    def describe(self) -> str:
        parts = [f"input {m.arg} dim {m.dim} {m.kind}" + (f" -> dim {m.out}" if m.out is not None else "")
                 for m in self.maps]
        return ", ".join(parts) or "nothing"


_CACHE: dict[tuple, Inference] = {}


def infer(ctx: Ctx, describe: str) -> tuple[Lab, Inference] | tuple[None, Inference]:
    """The output label of ``ctx``'s node by a probed channel map, with the inference; (None, why) when refused."""
    node = ctx.node
    out = ctx.out
    inputs = [a for a in instances((node.args, dict(node.kwargs)), fx.Node) if isinstance(ctx.value(a), torch.Tensor)]
    labs = [ctx.lab(a) for a in inputs]
    shapes = [ctx.value(a).shape for a in inputs] + ([out.shape] if isinstance(out, torch.Tensor) else [])
    if any(type(n) is not int for shape in shapes for n in shape):  # export's SymInt after nonzero, x[x > 0]
        return None, Inference((), failure="a size that depends on the data: no concrete shape to probe with")
    key = _key(ctx, describe, inputs, labs)
    found = _CACHE.get(key) if key is not None else None
    if found is None:
        found = _probe(ctx, inputs, labs, out)
        if key is not None:
            _CACHE[key] = found
    if found.failure or not found.maps:
        return None, found
    return _apply(ctx, found, labs, out), found


def _key(ctx: Ctx, describe: str, inputs: list[fx.Node], labs: list[Lab]) -> tuple | None:
    try:
        consts = repr(_substitute(ctx, (ctx.node.args, dict(ctx.node.kwargs)), {n: None for n in inputs}))
    except Exception:  # noqa: BLE001 - an argument without a stable repr: probe every time
        return None
    module = repr(ctx.module) if ctx.module is not None else ""
    shapes = tuple((tuple(ctx.value(a).shape), str(ctx.value(a).dtype)) for a in inputs)
    labeled = tuple(tuple(lab.labeled()) for lab in labs)
    out = tuple(ctx.out.shape) if isinstance(ctx.out, torch.Tensor) else None
    return describe, module, consts, shapes, labeled, out


def _substitute(ctx: Ctx, x: Any, given: dict[fx.Node, Any]) -> Any:
    """The node's arguments with ``given`` tensors for its tensor inputs and recorded values for the rest."""
    if isinstance(x, fx.Node):
        return given[x] if x in given else ctx.value(x)
    if isinstance(x, tuple):
        return tuple(_substitute(ctx, v, given) for v in x)
    if isinstance(x, list):
        return [_substitute(ctx, v, given) for v in x]
    if isinstance(x, dict):
        return {k: _substitute(ctx, v, given) for k, v in x.items()}
    return x


def _caller(ctx: Ctx, inputs: list[fx.Node]) -> Callable[[list[torch.Tensor]], Any] | str:
    """A function running the node's op on given tensors for its tensor inputs, or why the op cannot be probed."""
    node, module = ctx.node, ctx.module
    if node.op == "call_module":
        if module is None or next(module.parameters(), None) is not None or next(module.buffers(), None) is not None:
            return "a module with parameters or buffers of its own"
    consts = instances((node.args, dict(node.kwargs)), fx.Node)
    if any(not isinstance(ctx.value(n), (torch.Tensor, int, float, bool, type(None), str, torch.dtype,
                                         torch.Size, tuple, list)) for n in consts):
        return "an argument that is not a tensor or a plain value"

    def call(tensors: list[torch.Tensor], grad: bool = False) -> Any:
        given = dict(zip(inputs, tensors, strict=True))
        args = _substitute(ctx, node.args, given)
        kwargs = _substitute(ctx, dict(node.kwargs), given)
        with torch.set_grad_enabled(grad):
            if node.op == "call_module":
                return module(*args, **kwargs)
            if node.op == "call_method":
                return getattr(args[0], node.target)(*args[1:], **kwargs)
            return node.target(*args, **kwargs)

    return call


def _probe(ctx: Ctx, inputs: list[fx.Node], labs: list[Lab], out: Any) -> Inference:
    values = [ctx.value(a) for a in inputs]
    if not isinstance(out, torch.Tensor) or not out.dtype.is_floating_point:
        return Inference((), failure="its output is not one floating-point tensor")
    if not values or any(not v.dtype.is_floating_point for v in values):
        return Inference((), failure="an input is not a floating-point tensor (indices, masks)")
    if sum(v.numel() for v in values) + out.numel() > MAX_ELEMENTS:
        return Inference((), failure=f"its tensors hold more than {MAX_ELEMENTS} elements")
    call = _caller(ctx, inputs)
    if isinstance(call, str):
        return Inference((), failure=call)
    gen = torch.Generator().manual_seed(0)
    base = [torch.randn(tuple(v.shape), generator=gen) for v in values]
    try:
        y0, again = call([b.clone() for b in base]), call([b.clone() for b in base])
    except Exception as exc:  # noqa: BLE001 - the op itself refused random inputs of its shapes
        return Inference((), failure=f"probing it raised {type(exc).__name__}: {_first(exc)}")
    if not isinstance(y0, torch.Tensor) or tuple(y0.shape) != tuple(out.shape):
        return Inference((), failure="probing it gave an output of another shape than captured")
    if not _close(y0, again):
        return Inference((), failure="its output is not deterministic")
    maps: list[DimMap] = []
    refused: list[tuple[int, int, str]] = []
    for i, lab in enumerate(labs):
        for d in lab.labeled():
            n = base[i].shape[d]
            if n > MAX_POSITIONS or n * (sum(b.numel() for b in base) + y0.numel()) > MAX_WORK:
                refused.append((i, d, f"{n} positions of {tuple(base[i].shape)}: too large to probe"))
                continue
            found = _classify(call, base, y0, i, d, gen)
            (maps if isinstance(found, DimMap) else refused).append(found if isinstance(found, DimMap)
                                                                    else (i, d, found))
    if maps:
        problem = _removal_test(call, base, y0, maps, labs)
        if problem:
            return Inference((), tuple(refused), failure=problem)
    return Inference(tuple(maps), tuple(refused))


def _classify(call: Callable, base: list[torch.Tensor], y0: torch.Tensor, i: int, d: int,
              gen: torch.Generator) -> DimMap | str:
    """Where position k of input ``i``'s dim ``d`` goes, for every k, as a DimMap or the finding that refuses it."""
    n = base[i].shape[d]
    reached: list[list[np.ndarray]] = []  # per position k, per output dim: the output indices that changed
    scale = float(y0.abs().max()) or 1.0
    for k in range(n):
        x = base[i].clone()
        x.select(d, k).add_(2.0 + torch.rand(x.select(d, k).shape, generator=gen) * 2.0)
        y = call([x if j == i else b.clone() for j, b in enumerate(base)])
        changed = (y - y0).abs() > _RTOL * scale
        if not changed.any():
            return f"position {k} does not reach the output"
        reached.append([changed.movedim(e, 0).reshape(y0.shape[e], -1).any(1).nonzero().flatten().numpy()
                        for e in range(y0.dim())])
    offset = y0.dim() - base[i].dim()
    order = sorted(range(y0.dim()), key=lambda e: (e != d + offset, e))  # the aligned dim first
    for e in order:
        if y0.shape[e] == 1 or not all(len(r[e]) == 1 for r in reached):
            continue  # a size-1 dim carries no channels: every position reaching it is a reduction
        index = np.array([int(r[e][0]) for r in reached])
        m = y0.shape[e]
        if m == n and len(set(index.tolist())) == n:
            kind = "identity" if (index == np.arange(n)).all() else "permutation"
            return DimMap(i, d, kind, e, tuple(index.tolist()))
        if m < n and n % m == 0 and (index == np.arange(n) % m).all():
            return DimMap(i, d, "split", e, tuple(index.tolist()))
    if all(all(np.array_equal(r[e], reached[0][e]) for r in reached) for e in range(y0.dim())):
        wide = [e for e in range(y0.dim()) if y0.shape[e] == n and len(reached[0][e]) == n]
        if not wide or d + offset not in wide:  # a dim of n positions all reached by each: a dense mix, not a sum
            return DimMap(i, d, "reduced")
        return f"mixes positions: every position reaches all {n} output positions along dim {d + offset}"
    e = next(e for e in range(y0.dim()) if any(not np.array_equal(r[e], reached[0][e]) for r in reached))
    k = next(k for k, r in enumerate(reached) if len(r[e]) != 1 or not np.array_equal(r[e], reached[0][e]))
    return (f"mixes positions: position {k} reaches {len(reached[k][e])} of {y0.shape[e]} output positions along "
            f"dim {e}")


def _removal_test(call: Callable, base: list[torch.Tensor], y0: torch.Tensor, maps: list[DimMap],
                  labs: list[Lab]) -> str:
    """'' when the op on inputs with some mapped channels removed equals it on them zeroed (kept outputs only)."""
    drop_out: dict[int, np.ndarray] = {}  # output dim -> output positions removed
    for m in maps:
        if m.out is not None and m.out not in drop_out:
            size = y0.shape[m.out]
            drop_out[m.out] = np.arange(size)[np.arange(size) % 4 == 1] if size > 1 else np.arange(0)
    zeroed, removed = [b.clone() for b in base], [b.clone() for b in base]
    kept: dict[int, list[tuple[int, torch.Tensor]]] = {}  # input -> (dim, kept positions)
    for i in range(len(base)):
        for m in (m for m in maps if m.arg == i):
            n = base[i].shape[m.dim]
            if m.out is None:
                drop = np.arange(n)[np.arange(n) % 3 == 2]
            else:
                drop = np.nonzero(np.isin(np.array(m.index), drop_out[m.out]))[0]
            keep = torch.as_tensor(np.setdiff1d(np.arange(n), drop))
            zeroed[i].index_fill_(m.dim, torch.as_tensor(drop, dtype=torch.long), 0.0)
            removed[i] = removed[i].index_select(m.dim, keep)
            kept.setdefault(i, []).append((m.dim, keep))
    for t in (*zeroed, *removed):
        t.requires_grad_(True)
    try:
        want, got = call(zeroed, grad=True), call(removed, grad=True)
    except Exception as exc:  # noqa: BLE001 - the op does not run on fewer channels
        return f"it fails on fewer channels ({type(exc).__name__}: {_first(exc)})"
    for e, drop in drop_out.items():
        keep = torch.as_tensor(np.setdiff1d(np.arange(y0.shape[e]), drop))
        want = want.index_select(e, keep)
    if not isinstance(got, torch.Tensor) or got.shape != want.shape:
        return "on fewer channels its output has another shape than the kept channels"
    if not _close(got.detach(), want.detach()):
        return "on fewer channels its output differs from the kept channels of its output"
    return _backward_test(zeroed, removed, want, got, kept)


def _backward_test(zeroed: list[torch.Tensor], removed: list[torch.Tensor], want: torch.Tensor, got: torch.Tensor,
                   kept: dict[int, list[tuple[int, torch.Tensor]]]) -> str:
    """'' when the gradients reaching the kept inputs are the same on fewer channels (a training step after the cut
    runs the op's backward, e.g. a custom autograd.Function's); ops without a backward are not checked."""
    if not (want.requires_grad and got.requires_grad):
        return ""
    weights = torch.randn(got.shape, generator=torch.Generator().manual_seed(1))
    try:
        g_want = torch.autograd.grad((want * weights).sum(), zeroed, allow_unused=True)
    except Exception:  # noqa: BLE001 - no usable backward at all: nothing to compare
        return ""
    try:
        g_got = torch.autograd.grad((got * weights).sum(), removed, allow_unused=True)
    except Exception as exc:  # noqa: BLE001 - the backward does not run on fewer channels
        return f"its backward fails on fewer channels ({type(exc).__name__}: {_first(exc)})"
    for i, (a, b) in enumerate(zip(g_want, g_got, strict=True)):
        if a is None or b is None:
            if (a is None) != (b is None):
                return "on fewer channels its backward reaches other inputs"
            continue
        for d, keep in kept.get(i, []):
            a = a.index_select(d, keep)
        if not _close(b, a):
            return "on fewer channels its gradients differ from the kept channels' gradients"
    return ""


def _apply(ctx: Ctx, found: Inference, labs: list[Lab], out: torch.Tensor) -> Lab:
    """Couple the mapped channels and label the output; refused dims freeze with the probe's finding."""
    dims: list[np.ndarray | None] = [None] * out.dim()
    where = ctx.where()
    for m in found.maps:
        arr = labs[m.arg].dims[m.dim]
        if m.kind == "reduced":
            continue
        size = out.shape[m.out]
        if m.kind == "split":
            blocks = len(arr) // size
            for t in range(1, blocks):
                ctx.union(arr[:size], arr[t * size:(t + 1) * size],
                          f"the {blocks} blocks of an inferred split at {where}")
            target = arr[:size]
        else:
            target = np.empty_like(arr)
            target[np.array(m.index)] = arr
        if dims[m.out] is None:
            dims[m.out] = target
        else:
            ctx.union(dims[m.out], target, f"channels that meet in an inferred element-wise op at {where}")
    for i, d, finding in found.refused:
        ctx.freeze(labs[i].dims[d], f"probed op: {finding}")
    return Lab(tuple(dims))


def _close(a: torch.Tensor, b: torch.Tensor) -> bool:
    scale = max(float(a.abs().max()) if a.numel() else 0.0, 1e-12)
    return a.shape == b.shape and bool(((a - b).abs() <= _RTOL * scale + 1e-12).all())


def _first(exc: BaseException) -> str:
    return (str(exc).strip().splitlines() or [""])[0][:160]


__all__ = ["DimMap", "Inference", "MAX_ELEMENTS", "MAX_POSITIONS", "infer"]
