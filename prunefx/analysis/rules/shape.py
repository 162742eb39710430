"""Ops that move, split, join or index dims, and the size queries whose results feed them."""

from __future__ import annotations

import builtins

import numpy as np
import torch
import torch.fx as fx
from torch import nn

from prunefx.analysis.labels import Lab, SizeRef
from prunefx.analysis.rules._algebra import check_size, norm_dim, op_name, reshape, size_args
from prunefx.analysis.rules._context import Ctx
from prunefx.analysis.rules._registry import register_rule


# ---- sizes -------------------------------------------------------------------------------------------
def _size_refs(lab: Lab, shape: torch.Size) -> tuple[SizeRef, ...]:
    return tuple(
        SizeRef(n, (lab.dims[d],) if lab.dims[d] is not None else (), exact=True) for d, n in enumerate(shape)
    )


@register_rule(builtins.getattr)
def get_attribute(ctx: Ctx):
    obj, attr = ctx.args[0], ctx.args[1]
    if ctx.is_tensor(obj) and attr == "shape":
        return _size_refs(ctx.lab(obj), ctx.value(obj).shape)
    if ctx.is_tensor(obj) and attr in ("mT", "T"):
        lab = ctx.lab(obj)
        return Lab(tuple(reversed(lab.dims))) if attr == "T" else Lab((*lab.dims[:-2], lab.dims[-1], lab.dims[-2]))
    if ctx.is_tensor(obj) and attr in ("dtype", "device", "is_cuda", "ndim", "requires_grad"):
        return ctx.out
    if not ctx.is_tensor(obj) and isinstance(ctx.out, torch.Tensor):
        value, labs = ctx.value(obj), ctx.aval(obj)
        if isinstance(value, tuple) and isinstance(labs, (tuple, list)) and len(labs) == len(value):
            # a field of torch's named results (x.max(dim).values, qr(x).Q): the element it is, found by identity
            hit = [k for k, v in enumerate(value) if v is getattr(value, attr, None)]
            if len(hit) == 1:
                return labs[hit[0]]
        ctx.freeze(labs, f"unknown attribute .{attr} of {type(value).__name__}")  # every label inside it
        return Lab.none(ctx.out.dim())
    if isinstance(ctx.out, torch.Tensor):  # e.g. .data, .real: an unknown view of the tensor
        ctx.freeze(ctx.lab(obj), f"unknown tensor attribute .{attr}")
        return Lab.none(ctx.out.dim())
    return ctx.out


@register_rule("size")
def size(ctx: Ctx):
    refs = _size_refs(ctx.lab(ctx.args[0]), ctx.value(ctx.args[0]).shape)
    d = ctx.arg(1, "dim")
    return refs if d is None else refs[d]


@register_rule("dim", "ndimension", "numel", "nelement", torch.numel, "element_size", "get_device", "is_contiguous")
def plain_value(ctx: Ctx):
    if ctx.node.target in ("numel", "nelement", torch.numel):
        lab = ctx.lab(ctx.args[0])
        return SizeRef(ctx.out, tuple(a for a in lab.dims if a is not None), exact=False)
    return ctx.out


# ---- reshapes --------------------------------------------------------------------------------------------
@register_rule("view", "reshape", torch.reshape)
def view(ctx: Ctx) -> Lab:
    first = 1
    if ctx.node.target == "view" and len(ctx.args) == 2 and isinstance(ctx.value(ctx.args[1]), torch.dtype):
        return ctx.lab(ctx.args[0])  # view(dtype)
    if ctx.node.target is torch.reshape and "shape" in ctx.kwargs:
        return reshape(ctx, ctx.args[0], tuple(ctx.out.shape), None)
    return reshape(ctx, ctx.args[0], tuple(ctx.out.shape), size_args(ctx, first))


@register_rule("reshape_as", "view_as")
def reshape_as(ctx: Ctx) -> Lab:
    """x.reshape_as(y): y's shape; where y's dims carry channels, x's matching dims must be the same ones."""
    x, y = ctx.args[0], ctx.args[1]
    res = reshape(ctx, x, tuple(ctx.out.shape), None)
    ly = ctx.lab(y)
    dims = list(res.dims)
    for d, (a, b) in enumerate(zip(res.dims, ly.dims, strict=True)):
        if a is not None and b is not None:
            ctx.union(a, b)
        elif a is not None or b is not None:
            ctx.freeze(a if a is not None else b, "reshaped to another tensor's shape whose dim cannot be sliced")
            dims[d] = None
    return Lab(tuple(dims))


@register_rule("unfold")
def unfold(ctx: Ctx) -> Lab:
    """x.unfold(dim, size, step): sliding windows along ``dim`` (positions, never channels) in a new last dim."""
    lab = ctx.lab(ctx.args[0])
    d = norm_dim(ctx.arg(1, "dimension"), lab.ndim)
    if lab.dims[d] is not None:
        ctx.freeze(lab.dims[d], "sliding windows (unfold) along a channel dim")
    return Lab((*lab.dims[:d], None, *lab.dims[d + 1 :], None))


@register_rule("repeat_interleave", torch.repeat_interleave)
def repeat_interleave(ctx: Ctx) -> Lab:
    """Each position repeated r times in place: a channel's copies are pruned with it (like ``repeat``)."""
    lab = ctx.lab(ctx.args[0])
    reps, dim = ctx.arg(1, "repeats"), ctx.arg(2, "dim")
    if dim is None or not isinstance(reps, int) or not ctx.is_tensor(ctx.args[0]):
        ctx.freeze(lab, "repeat_interleave with tensor repeats or without a dim")
        return Lab.none(ctx.out.dim())
    d = norm_dim(dim, lab.ndim)
    arr = lab.dims[d]
    return lab.replace(d, np.repeat(arr, reps) if arr is not None else None)


@register_rule("flatten", torch.flatten, nn.Flatten, "ravel", torch.ravel)
def flatten(ctx: Ctx) -> Lab:
    return reshape(ctx, ctx.args[0], tuple(ctx.out.shape), None)


@register_rule("unflatten", torch.unflatten, nn.Unflatten)
def unflatten(ctx: Ctx) -> Lab:
    x = ctx.args[0]
    out_shape = tuple(ctx.out.shape)
    if ctx.module is not None:  # sizes live in module attributes: a changed size cannot be rewritten
        sizes = [(n, None) for n in out_shape]
        return reshape(ctx, x, out_shape, [(SizeRef(n), None) for n, _ in sizes])
    dim = norm_dim(ctx.arg(1, "dim"), len(ctx.shape(x)))
    given = ctx.arg(2, "sizes")
    sizes: list = [(SizeRef(n, (), True), None) for n in out_shape]
    for k, s in enumerate(given):
        sizes[dim + k] = (ctx.aval(s), ("args", 2, k) if not isinstance(s, fx.Node) else None)
    for d in range(len(out_shape)):
        if not (dim <= d < dim + len(given)):
            sizes[d] = (-1, None)  # untouched dims keep their size by construction
    return reshape(ctx, x, out_shape, sizes)


@register_rule("permute", torch.permute)
def permute(ctx: Ctx) -> Lab:
    lab = ctx.lab(ctx.args[0])
    order = ctx.args[1:] if ctx.node.op == "call_method" else ctx.arg(1, "dims")
    if len(order) == 1 and isinstance(order[0], (list, tuple)):
        order = order[0]
    return Lab(tuple(lab.dims[norm_dim(int(d), lab.ndim)] for d in order))


@register_rule(
    "transpose", torch.transpose, "swapaxes", "swapdims", torch.swapaxes, "movedim", torch.movedim, "t", torch.t
)
def transpose(ctx: Ctx) -> Lab:
    lab = ctx.lab(ctx.args[0])
    dims = list(lab.dims)
    if ctx.node.target in ("t", torch.t):
        return Lab(tuple(reversed(dims)))
    a, b = norm_dim(ctx.arg(1, "dim0"), lab.ndim), norm_dim(ctx.arg(2, "dim1"), lab.ndim)
    if ctx.node.target in ("movedim", torch.movedim):
        dims.insert(b, dims.pop(a))
    else:
        dims[a], dims[b] = dims[b], dims[a]
    return Lab(tuple(dims))


@register_rule("unsqueeze", torch.unsqueeze)
def unsqueeze(ctx: Ctx) -> Lab:
    lab = ctx.lab(ctx.args[0])
    d = norm_dim(ctx.arg(1, "dim"), lab.ndim + 1)
    return Lab((*lab.dims[:d], None, *lab.dims[d:]))


@register_rule("squeeze", torch.squeeze)
def squeeze(ctx: Ctx) -> Lab:
    lab, shape = ctx.lab(ctx.args[0]), ctx.shape(ctx.args[0])
    d = ctx.arg(1, "dim")
    drop = (
        {i for i, n in enumerate(shape) if n == 1}
        if d is None
        else {
            norm_dim(x, len(shape))
            for x in (d if isinstance(d, (tuple, list)) else (d,))
            if shape[norm_dim(x, len(shape))] == 1
        }
    )
    for i in drop:  # a channel dim of width 1 vanishing: its single channel must stay
        if lab.dims[i] is not None:
            ctx.freeze(lab.dims[i], "squeeze of a one-channel dim")
    return Lab(tuple(a for i, a in enumerate(lab.dims) if i not in drop))


@register_rule("expand", "broadcast_to", torch.broadcast_to)
def expand(ctx: Ctx) -> Lab:
    lab, shape = ctx.lab(ctx.args[0]), ctx.shape(ctx.args[0])
    out = tuple(ctx.out.shape)
    lead = len(out) - len(shape)
    dims = [None] * lead + list(lab.dims)
    sizes = size_args(ctx, 1)
    for d in range(len(out)):
        ref = sizes[d][0] if d < len(sizes) else None
        if dims[d] is None and isinstance(ref, SizeRef) and ref.exact and len(ref.sources) == 1:
            if len(ref.sources[0]) == out[d] and (d < lead or shape[d - lead] == 1):
                dims[d] = ref.sources[0]  # a broadcast to another tensor's width: one copy per channel of it
            continue
        if d >= lead and dims[d] is not None:
            if shape[d - lead] != out[d]:
                ctx.freeze(dims[d], "a single channel expanded across many")
                dims[d] = None
            elif d < len(sizes):
                ref, path = sizes[d]
                if not (isinstance(ref, int) and ref == -1):
                    check_size(ctx, ref, dims[d], dims[d], path)
    return Lab(tuple(dims))


@register_rule("repeat", "tile", torch.tile)
def repeat(ctx: Ctx) -> Lab:
    lab, shape = ctx.lab(ctx.args[0]), ctx.shape(ctx.args[0])
    out = tuple(ctx.out.shape)
    lead = len(out) - len(shape)
    dims: list = [None] * lead
    for d, arr in enumerate(lab.dims):
        times = out[d + lead] // max(shape[d], 1)
        dims.append(np.tile(arr, times) if arr is not None else None)
    return Lab(tuple(dims))


# ---- joins and splits ------------------------------------------------------------------------------------
@register_rule(torch.cat, torch.concat, torch.concatenate)
def cat(ctx: Ctx) -> Lab:
    out_shape = tuple(ctx.out.shape)
    # torch.cat skips 1-D empty tensors whatever the other pieces' rank (a KV cache starts as torch.tensor([]))
    tensors = [t for t in ctx.arg(0, "tensors") if ctx.is_tensor(t) and (len(out_shape) == 1 or ctx.shape(t) != (0,))]
    dim = norm_dim(ctx.arg(1, "dim", 0), len(out_shape))
    pieces = []
    for t in tensors:
        arr = ctx.lab(t).dims[dim]
        pieces.append(arr if arr is not None else np.full(ctx.shape(t)[dim], -1, dtype=np.int64))
    along = np.concatenate(pieces) if any((p >= 0).any() for p in pieces) else None
    # Other dims: all pieces must be sliced alike (shape of the cat dim differs, so compare per dim).
    others = [d for d in range(len(out_shape)) if d != dim]
    dims: list = [None] * len(out_shape)
    merged = _merge_other_dims(ctx, tensors, dim, out_shape)
    for d in others:
        dims[d] = merged[d]
    dims[dim] = along
    return Lab(tuple(dims))


def _merge_other_dims(ctx: Ctx, tensors, dim: int, out_shape) -> list:
    merged: list = [None] * len(out_shape)
    for d in range(len(out_shape)):
        if d == dim:
            continue
        labeled = [ctx.lab(t).dims[d] for t in tensors if ctx.lab(t).dims[d] is not None]
        if not labeled:
            continue
        for other in labeled[1:]:
            ctx.union(labeled[0], other)
        if len(labeled) < len(tensors):
            ctx.freeze(labeled[0], "joined with a tensor whose channels cannot be sliced")
        merged[d] = labeled[0]
    return merged


@register_rule(torch.stack)
def stack(ctx: Ctx) -> Lab:
    tensors = [t for t in ctx.arg(0, "tensors") if ctx.is_tensor(t)]
    out_nd = ctx.out.dim()
    dim = norm_dim(ctx.arg(1, "dim", 0), out_nd)
    merged = _merge_other_dims(ctx, tensors, -1, ctx.shape(tensors[0]))
    return Lab((*merged[:dim], None, *merged[dim:]))


@register_rule("split", torch.split, "chunk", torch.chunk, "split_with_sizes", "tensor_split", torch.tensor_split)
def split(ctx: Ctx) -> tuple:
    x = ctx.args[0]
    lab, nd = ctx.lab(x), len(ctx.shape(x))
    method = op_name(ctx.node.target)
    dim = norm_dim(ctx.arg(2, "dim", 0), nd)
    outs = ctx.out
    arr = lab.dims[dim]
    if arr is None:
        return tuple(Lab(lab.dims) for _ in outs)
    bounds = np.cumsum([0] + [o.shape[dim] for o in outs])
    segments = [arr[bounds[k] : bounds[k + 1]] for k in range(len(outs))]
    spec = ctx.arg(1, "split_size_or_sections" if method == "split" else "chunks")
    if method == "chunk" and len({len(s) for s in segments}) > 1 and len(segments) == spec:
        _uneven_chunk(ctx, segments, spec)
    elif method == "chunk" or (method == "split" and isinstance(spec, int)):
        if len({len(s) for s in segments}) > 1:
            # split(int) / a chunk into fewer pieces than asked recompute piece sizes from the total in a way
            # no kept count pattern survives: the channels stay.
            ctx.freeze(arr, f"{method}({spec}) into uneven pieces")
        elif len(segments) > 1:
            ctx.equal_count(segments, f"{method}({spec}) needs equal pieces")
        if method == "split":
            check_size(ctx, spec, segments[0], None, ("args", 1))
    elif method in ("split", "split_with_sizes") and isinstance(spec, (list, tuple)):
        for k, s in enumerate(spec):
            ref = ctx.aval(s)
            check_size(ctx, ref, segments[k], None, ("args", 1, k) if not isinstance(s, fx.Node) else None)
        literal = [s for s in spec if not isinstance(s, fx.Node)]
        if len(literal) == len(spec) > 1 and len(set(literal)) == 1:
            # equal literal sizes usually come from one attribute (C2PSA: split((c, c))): keep them equal
            ctx.equal_count(segments, f"split({list(spec)}) pieces sized by one value")
    else:
        ctx.freeze(arr, f"{method} with computed boundaries")
    return tuple(lab.replace(dim, seg) for seg in segments)


def _uneven_chunk(ctx: Ctx, segments: list[np.ndarray], n: int) -> None:
    """chunk(n) into pieces (p, ..., p, r), r < p: after pruning, chunk recomputes p' = ceil(C' / n).

    Position i < r is coupled across all n pieces (each piece keeps the same positions) and the last p - r
    positions of the full pieces are kept: every full piece then keeps m + p - r, the last m, C' = n m +
    (n - 1)(p - r), and since p - r < n, ceil(C' / n) = m + p - r: the same n pieces, sliced alike."""
    p, r = len(segments[0]), len(segments[-1])
    for seg in segments[1:]:
        ctx.union(segments[0][:r], seg[:r])
    tail = np.concatenate([seg[r:] for seg in segments[:-1]])
    ctx.freeze(tail, f"chunk({n}) into uneven pieces keeps the last {p - r} position(s) of each full piece")
    ctx.note(segments[0][:r], f"same positions kept in each of the {n} uneven chunks at {ctx.where()}")


@register_rule("unbind", torch.unbind)
def unbind(ctx: Ctx) -> tuple:
    lab = ctx.lab(ctx.args[0])
    dim = norm_dim(ctx.arg(1, "dim", 0), lab.ndim)
    if lab.dims[dim] is not None:
        ctx.freeze(lab.dims[dim], "unbind over a channel dim picks single channels")
    rest = Lab(lab.dims[:dim] + lab.dims[dim + 1 :])
    return tuple(rest for _ in ctx.out)


@register_rule("roll", torch.roll, "flip", torch.flip, "narrow", torch.narrow, "select", torch.select)
def positional(ctx: Ctx) -> Lab:
    """Ops that move or pick positions along a dim: fine off the channel dims, frozen on them."""
    # roll(x, shifts=x.size(1)), narrow(x, 2, 0, c): a channel count used as a shift or a bound would change with it
    ctx.freeze_values((ctx.args[1:], dict(ctx.kwargs)))
    lab = ctx.lab(ctx.args[0])
    target = op_name(ctx.node.target)
    pos, key = {"roll": (2, "dims"), "flip": (1, "dims"), "narrow": (1, "dim"), "select": (1, "dim")}[target]
    d = ctx.arg(pos, key)
    touched = d if isinstance(d, (list, tuple)) else ([d] if d is not None else range(lab.ndim))
    touched = {norm_dim(x, lab.ndim) for x in touched}
    for x in touched:
        if lab.dims[x] is not None:
            ctx.freeze(lab.dims[x], f"{target} along a channel dim")
    if target == "select":
        return Lab(tuple(a for i, a in enumerate(lab.dims) if i not in touched))
    if target == "narrow":
        return Lab(tuple(None if i in touched else a for i, a in enumerate(lab.dims)))
    return lab
