"""Indexing (``x[...]``): basic (ints, slices, None, Ellipsis) and advanced (tensor / list indices).

Advanced indexing follows PyTorch's rule: every index tensor (and every int beside them) is broadcast to one
shape B; B's dims replace the indexed dims where the advanced indices sit together, else they come first. An
output position along B is the input at the index value there, so B's dims carry the index tensors' labels
(pruning position b of an index buffer prunes position b of the result), while a dim that is indexed *by
value* cannot keep channel labels: its channels are frozen.
"""

from __future__ import annotations

import operator

import numpy as np
import torch
import torch.fx as fx

from prunefx.analysis.labels import Lab, SizeRef
from prunefx.analysis.rules._algebra import broadcast_merge, norm_dim
from prunefx.analysis.rules._context import Ctx
from prunefx.analysis.rules._registry import register_rule


@register_rule(operator.getitem)
def getitem(ctx: Ctx):
    obj, idx = ctx.args[0], ctx.args[1]
    if not ctx.is_tensor(obj):
        container = ctx.aval(obj)
        if isinstance(container, (tuple, list)) and not isinstance(idx, fx.Node):
            return container[idx]
        if isinstance(container, dict):
            return container[idx]
        return ctx.out
    items = list(idx) if isinstance(idx, tuple) else [idx]
    paths = [("args", 1, k) for k in range(len(items))] if isinstance(idx, tuple) else [("args", 1)]
    if any(_advanced(ctx, i) for i in items):
        return _advanced_index(ctx, obj, items, paths)
    return _basic_index(ctx, obj, items, paths)


def _advanced(ctx: Ctx, it) -> bool:
    return isinstance(it, (list, torch.Tensor)) or (isinstance(it, fx.Node) and ctx.is_tensor(it))


def _consumed(ctx: Ctx, it) -> int:
    """How many input dims an index item uses up."""
    if it is None:
        return 0
    if isinstance(it, fx.Node) and ctx.is_tensor(it) and ctx.value(it).dtype == torch.bool:
        return ctx.value(it).dim()
    return 1


def _expand_ellipsis(ctx: Ctx, items: list, paths: list, ndim: int) -> tuple[list, list]:
    """Items with ``...`` replaced by full slices, and each item's path in the node's arguments (None if made here)."""
    if Ellipsis not in items:
        return items, paths
    k = items.index(Ellipsis)
    used = sum(_consumed(ctx, i) for i in items if i is not Ellipsis)
    fill = ndim - used
    return [*items[:k], *[slice(None)] * fill, *items[k + 1 :]], [*paths[:k], *[None] * fill, *paths[k + 1 :]]


def _slice(ctx: Ctx, arr: np.ndarray | None, it: slice, n: int, path: tuple | None) -> np.ndarray | None:
    """Labels of ``dim[it]`` for a labeled dim of size ``n``; ``path``: where the slice sits in the node's args."""
    if arr is None:
        return None
    start, stop, step = it.start, it.stop, it.step
    if start in (None, 0) and step in (None, 1) and (stop is None or (isinstance(stop, int) and stop >= n)):
        return arr
    if _literal(start) and _literal(stop) and step in (None, 1) and path is not None:
        return constant_slice(ctx, arr, start, stop, n, ((*path, 0), (*path, 1)))
    ref = ctx.aval(stop) if isinstance(stop, fx.Node) else None
    if start in (None, 0) and step in (None, 1) and isinstance(ref, SizeRef) and ref.exact and len(ref.sources) == 1:
        src = ref.sources[0]
        if len(src) == ref.value <= n:
            # x[:, :y.shape[1]] (a position embedding cut to another tensor's width): the first positions follow
            # that tensor's channels one by one; the rewrite keeps the same ones here, the tail stays behind them.
            head = arr[: ref.value]
            ctx.union(head, src)
            ctx.note(head, f"cut to another tensor's width at {ctx.where()}")
            return head
    ctx.freeze(arr, "a constant slice of a channel dim")
    return None


def _literal(v) -> bool:
    return v is None or (isinstance(v, int) and not isinstance(v, bool))


def constant_slice(
    ctx, arr: np.ndarray, start: int | None, stop: int | None, n: int, paths: tuple
) -> np.ndarray | None:
    """``x[:, a:b]`` with literal bounds (DPN's residual / dense parts, a fused qkv cut at ``q_pos``): like a split,
    its channels are the source's channels a..b-1, and after pruning each bound is the number of kept channels
    before it (recorded as graph literals at ``paths``: the start's and the stop's)."""
    if (start is not None and start < 0) or (stop is not None and stop < 0):
        # counted from the end: the bound moves with channels pruned after it, which no kept count expresses
        ctx.freeze(arr, "a constant slice of a channel dim counted from its end")
        return None
    a, b = min(start or 0, n), n if stop is None else min(stop, n)
    if a >= b:  # an empty slice keeps no channel to follow
        ctx.freeze(arr, "an empty constant slice of a channel dim")
        return None
    if a > 0:
        ctx.constant(paths[0], arr[:a])
    if 0 < b < n:
        ctx.constant(paths[1], arr[:b])
    ctx.note(arr[a:b], f"channels {a}..{b - 1} of a constant slice at {ctx.where()}")
    return arr[a:b]


def _basic_index(ctx: Ctx, obj, items: list, paths: list) -> Lab:
    lab, shape = ctx.lab(obj), ctx.shape(obj)
    items, paths = _expand_ellipsis(ctx, items, paths, len(shape))
    out, d = [], 0
    for it, path in zip(items, paths, strict=True):
        if it is None:
            out.append(None)
            continue
        arr = lab.dims[d]
        if isinstance(it, slice):
            out.append(_slice(ctx, arr, it, shape[d], path))
        elif arr is not None:  # an int (or a traced int)
            ctx.freeze(arr, "indexing picks a single channel")
        d += 1
    out.extend(lab.dims[d:])
    return Lab(tuple(out))


def _advanced_index(ctx: Ctx, obj, items: list, paths: list) -> Lab:
    lab, shape = ctx.lab(obj), ctx.shape(obj)
    items, paths = _expand_ellipsis(ctx, items, paths, len(shape))
    before, after, parts, adv_pos = [], [], [], []
    d = 0
    for k, it in enumerate(items):
        if it is None:
            (after if adv_pos else before).append(None)
            continue
        n = _consumed(ctx, it)
        picked = [lab.dims[j] for j in range(d, d + n) if lab.dims[j] is not None]
        if _advanced(ctx, it) or isinstance(it, int) or isinstance(it, fx.Node):
            adv_pos.append(k)
            if picked:  # positions chosen by value: which channel lands where depends on the index values
                ctx.freeze(np.concatenate(picked), "advanced indexing selects along a channel dim")
            if isinstance(it, fx.Node) and ctx.is_tensor(it):
                t = ctx.value(it)
                if t.dtype == torch.bool:  # a mask: one output dim of data-dependent length
                    ctx.freeze(ctx.lab(it), "a boolean mask index")
                    parts.append(None)
                else:
                    parts.append((ctx.lab(it), tuple(t.shape)))
            elif isinstance(it, (list, torch.Tensor)):
                parts.append((Lab.none(np.ndim(it)), tuple(np.shape(it))))
            else:  # an int beside tensor indices broadcasts as a 0-d index
                parts.append((Lab.none(0), ()))
        else:
            (after if adv_pos else before).append(_slice(ctx, lab.dims[d], it, shape[d], paths[k]))
        d += n
    rest = list(lab.dims[d:])
    together = adv_pos == list(range(adv_pos[0], adv_pos[0] + len(adv_pos)))
    if any(p is None for p in parts):
        bdims: tuple = (None,)
    else:
        bshape = tuple(torch.broadcast_shapes(*(s for _, s in parts)))
        bdims = broadcast_merge(ctx, parts, bshape, "an index tensor broadcast against positions that cannot be sliced")
    dims = [*before, *bdims, *after, *rest] if together else [*bdims, *before, *after, *rest]
    if len(dims) != ctx.out.dim():  # an indexing form not modelled above: freeze what it touches
        ctx.freeze([lab, *[p[0] for p in parts if p is not None]], "an indexing form prunefx does not model")
        return Lab.none(ctx.out.dim())
    return Lab(tuple(dims))


@register_rule(torch.gather, "gather", torch.take_along_dim, "take_along_dim")
def gather(ctx: Ctx) -> Lab:
    """out[..., k, ...] = x[..., index[..., k, ...], ...] along ``dim``: positions along ``dim`` follow the index;
    every other dim is shared by x, index and the output, position by position."""
    x, index = ctx.args[0], ctx.arg(2, "index")
    lx, li = ctx.lab(x), ctx.lab(index)
    d = norm_dim(ctx.arg(1, "dim"), lx.ndim)
    if lx.dims[d] is not None:
        ctx.freeze(lx.dims[d], "gather picks along a channel dim by value")
    sx, si = ctx.shape(x), ctx.shape(index)
    dims: list = []
    for j in range(lx.ndim):
        a, b = lx.dims[j], li.dims[j]
        if j == d:
            dims.append(b)
        elif sx[j] == si[j] and a is not None and b is not None:
            ctx.union(a, b)
            dims.append(a)
        elif a is not None or b is not None:
            ctx.freeze([a, b], "gathered with a tensor whose dim cannot be sliced alike")
            dims.append(None)
        else:
            dims.append(None)
    return Lab(tuple(dims))
