"""Label algebra shared by the op rules: broadcasting, reshapes and size provenance."""

from __future__ import annotations

from typing import Any

import numpy as np
import torch.fx as fx

from prunefx.analysis.labels import Lab, SizeRef
from prunefx.analysis.rules._context import Ctx


def norm_dim(d: int, ndim: int) -> int:
    return d + ndim if d < 0 else d


def pointwise(ctx: Ctx, operands: list[Any] | None = None, out_shape: tuple[int, ...] | None = None) -> Lab:
    """Element-wise op: operands that span a dim with the output are sliced together along it."""
    operands = list(ctx.args) if operands is None else operands
    parts = [(ctx.lab(a), ctx.shape(a)) for a in operands if ctx.is_tensor(a)]
    out_shape = tuple(ctx.out.shape) if out_shape is None else out_shape
    return Lab(broadcast_merge(ctx, parts, out_shape, "element-wise with an operand whose channels cannot be sliced"))


def broadcast_merge(ctx: Ctx, parts: list[tuple[Lab, tuple[int, ...]]], out_shape: tuple[int, ...], why: str) -> tuple:
    """Labels of a broadcast result: per dim, merge the labels of every operand of full size there.

    An operand of full size with no labels (a model input, a constant) freezes the others (``why``);
    a labeled operand broadcast across a larger dim is frozen (its single channel cannot go).
    """
    nd = len(out_shape)
    dims: list[np.ndarray | None] = [None] * nd
    for d in range(nd):
        labeled, unlabeled = [], False
        for lab, shp in parts:
            k = d - (nd - len(shp))
            if k < 0:
                continue
            arr = lab.dims[k]
            if shp[k] != out_shape[d]:
                if arr is not None:
                    ctx.freeze(arr, "a single channel broadcast across many")
                continue
            if arr is None:
                unlabeled = True
            else:
                labeled.append(arr)
        if labeled:
            for other in labeled[1:]:
                ctx.union(labeled[0], other)
            if unlabeled:
                ctx.freeze(labeled[0], why)
            dims[d] = labeled[0]
    return tuple(dims)


def passthrough(ctx: Ctx) -> Lab:
    """Shape-preserving unary op (activations, dropout, casts): labels flow through unchanged."""
    return ctx.lab(ctx.args[0])


def check_size(
    ctx: Ctx, ref: Any, out_atoms: np.ndarray, own: np.ndarray | None, path: tuple, inner: bool | None = True
) -> None:
    """The size argument ``ref`` sets the length of a dim labeled ``out_atoms``; make that hold after pruning.

    ``inner``: the dim is the innermost piece of a split (``view(b, k, c // k)``), the outermost (False:
    ``view(b, c // k, k)``) or neither (None); it says how a ``c // k`` size lays its blocks out in ``c``."""
    if isinstance(ref, int) and not isinstance(ref, SizeRef) and path is not None and not isinstance(ref, bool):
        if ref != -1:
            ctx.constant(path, out_atoms)
        return
    if not isinstance(ref, SizeRef):
        ctx.freeze(out_atoms, "a size of unknown origin sets this channel count")
        return
    if ref.literal is not None and not ref.sources and _literal_factor(ctx, ref, out_atoms):
        return
    if not ref.sources:
        ctx.freeze(out_atoms, "a size read from a dim that is never pruned sets this channel count")
        return
    if all(s is own for s in ref.sources):
        return
    if ref.exact and len(ref.sources) == 1 and len(ref.sources[0]) == len(out_atoms):
        # The count must equal another tensor's: coupling position-wise guarantees equal counts.
        ctx.union(ref.sources[0], out_atoms)
        ctx.note(out_atoms, f"channel count tied to another tensor's size at {ctx.where()}")
        return
    if ref.div and inner is not None and len(ref.sources) == 1 and len(ref.sources[0]) == ref.div * len(out_atoms):
        # c // k sets this count: the k blocks of c, each as long as this dim (blocks[b, d]: offset d of block b)
        k, n = ref.div, len(out_atoms)
        blocks = ref.sources[0].reshape(k, n) if inner else ref.sources[0].reshape(n, k).T
        if ref.div_at is not None:  # k is a literal: same offsets per block, or whole blocks (decided later)
            ctx.divide(blocks, out_atoms, ref.div_at)
            return
        # pruning offset d here prunes offset d of each block, so c' // k stays the count kept here
        # (``reshape(b, n, heads, c // heads)`` with c the width of another tensor)
        ctx.union(blocks, np.broadcast_to(out_atoms, (k, n)))
        ctx.note(out_atoms, f"channel count is another tensor's width // {k} at {ctx.where()}")
        return
    ctx.freeze(np.concatenate([*ref.sources, out_atoms]), "a size computed from another tensor's channels")


def _literal_factor(ctx: Ctx, ref: SizeRef, out_atoms: np.ndarray) -> bool:
    """``b * num_heads`` sets a dim of ``b`` copies of ``num_heads`` channels: the literal follows their kept count."""
    name, path, owner, k = ref.literal
    n = len(out_atoms)
    if n % k:
        return False
    rows = out_atoms.reshape(n // k, k)
    if not (rows == rows[0]).all():
        return False
    ctx.constant(path, rows[0], at=(name, owner))
    return True


def _product_follows(ctx: Ctx, ref: Any, merged: list[np.ndarray]) -> bool:
    """``reshape(b, h * c, ...)`` with ``h``, ``c`` read from the dims it merges (or dims tied to them): the size is
    the product of their kept counts by construction. Each source is tied to the merged dim it was read from."""
    if not (isinstance(ref, SizeRef) and ref.product and len(ref.sources) == len(merged)):
        return False
    left = list(ref.sources)
    pairs = []
    for arr in merged:
        pick = next((s for s in left if s is arr), None)
        pick = pick if pick is not None else next((s for s in left if len(s) == len(arr)), None)
        if pick is None:
            return False
        left = [s for s in left if s is not pick]
        pairs.append((pick, arr))
    for s, arr in pairs:
        if s is not arr:
            ctx.union(s, arr)
    return True


def _pair_dims(a: tuple[int, ...], b: tuple[int, ...]) -> list[tuple[list[int], list[int]]]:
    """Group dims of two shapes with equal element counts into chunks a reshape maps onto each other."""
    chunks, i, j = [], 0, 0
    while i < len(a) or j < len(b):
        ii, jj = [], []
        pa = pb = 1
        if i < len(a):
            ii.append(i)
            pa = a[i]
            i += 1
        if j < len(b):
            jj.append(j)
            pb = b[j]
            j += 1
        while pa != pb:
            if pa < pb and i < len(a):
                ii.append(i)
                pa *= a[i]
                i += 1
            elif j < len(b):
                jj.append(j)
                pb *= b[j]
                j += 1
            else:
                ii.append(i)
                pa *= a[i]
                i += 1
        # trailing size-1 dims join the current chunk
        chunks.append((ii, jj))
    return chunks


def reshape(ctx: Ctx, x: Any, out_shape: tuple[int, ...], sizes: list[tuple[Any, tuple | None]] | None) -> Lab:
    """Labels after view/reshape/flatten/unflatten.

    ``sizes``: per output dim, (size argument as traced, path of a literal in the node's args) or None when
    the op derives its sizes itself (flatten). A labeled dim split into several pieces that vary
    (``view(b, n, heads, head_dim)``, ``view(b, g, c/g, h, w)``) gives each piece fresh labels and records a
    product; several labeled dims merged into one (``reshape(b, n, heads * head_dim)``) are the same product seen
    from the other side. After the walk one piece of each product becomes the unit (whole heads, or the same
    offsets in every group) and the others are frozen (:mod:`prunefx.analysis.products`).
    """
    lab = ctx.lab(x)
    in_shape = ctx.shape(x)
    dims: list[np.ndarray | None] = [None] * len(out_shape)
    for ii, jj in _pair_dims(in_shape, tuple(out_shape)):
        labeled = [i for i in ii if lab.dims[i] is not None]
        if not labeled:
            continue
        if not jj:
            ctx.freeze(np.concatenate([lab.dims[i] for i in labeled]), "a reshape drops a channel dim")
            continue
        if len(labeled) > 1:
            if len(jj) != 1:
                ctx.freeze(np.concatenate([lab.dims[i] for i in labeled]), "a reshape merges two channel dims")
                continue
            (j,) = jj
            merged = ctx.fresh(out_shape[j])
            grid = merged.reshape([in_shape[i] for i in ii])
            ctx.product(grid, [(ii.index(i), lab.dims[i]) for i in labeled], [False] * len(labeled))
            dims[j] = merged
            if sizes is not None and not _product_follows(ctx, sizes[j][0], [lab.dims[i] for i in labeled]):
                check_size(ctx, sizes[j][0], merged, None, sizes[j][1])
            continue
        (i0,) = labeled
        own = lab.dims[i0]
        view = [1] * len(ii)
        view[ii.index(i0)] = len(own)
        full = np.broadcast_to(own.reshape(view), [in_shape[i] for i in ii]).reshape([out_shape[j] for j in jj])
        varying = [p for p in range(len(jj)) if full.shape[p] > 1 and not (full == full.take([0], axis=p)).all()]
        if not varying:  # one class spans the whole chunk: any piece can carry it
            varying = [max(range(len(jj)), key=lambda p: (full.shape[p], p))]
        if len(varying) == 1:
            (p,) = varying
            line = np.ascontiguousarray(full[tuple(slice(None) if q == p else 0 for q in range(full.ndim))])
            picked = {p: own if (len(ii) == 1 and len(jj) == 1) else line}
        else:
            picked = {p: ctx.fresh(full.shape[p]) for p in varying}
            literal = [_is_literal(sizes[jj[p]][0]) if sizes is not None else True for p in varying]
            ctx.product(np.ascontiguousarray(full), [(p, picked[p]) for p in varying], literal)
            ctx.note(own, f"whole units of one dim of the reshape into {tuple(full.shape)} at {ctx.where()}")
        for p, arr in picked.items():
            dims[jj[p]] = arr
            if sizes is not None:
                inner = True if p == max(varying) else False if p == min(varying) else None
                check_size(ctx, sizes[jj[p]][0], arr, own, sizes[jj[p]][1], inner)
    if sizes is not None:
        for j, (ref, _) in enumerate(sizes):
            if dims[j] is None:
                fixed_size(ctx, ref)
    return Lab(tuple(dims))


def _is_literal(ref: Any) -> bool:
    """A size written as a number (changing it needs a rewrite); -1 and sizes read from tensors follow pruning."""
    return isinstance(ref, int) and not isinstance(ref, bool) and ref != -1


def op_name(target: Any) -> str:
    """``"split"`` for the method name, ``torch.split`` and ``aten.split.Tensor`` alike."""
    if isinstance(target, str):
        return target
    packet = getattr(target, "overloadpacket", None)
    return packet.__name__ if packet is not None else target.__name__


def weight_owner(ctx: Ctx, w: Any) -> str | None:
    """The module whose parameter the ``get_attr`` node ``w`` reads, or None.

    The node's own module (innermost ``nn_module_stack`` entry) when the tensor is one of its parameters or buffers
    (a tied weight is read under one name by two modules), else the module named by the path (``a.b.weight``).
    Functional layers (``F.linear`` in a custom forward, every layer of a torch.export graph) record their members
    under it, so its fixer re-derives its attributes and plans and scores name it.
    """
    if getattr(w, "op", None) != "get_attr" or str(w.target) not in ctx.engine.tensors:
        return None
    tensor = ctx.engine.gm.get_parameter(w.target) if _is_param(ctx.engine.gm, w.target) else None
    here = ctx.engine.modules.get(ctx.owner())
    if tensor is not None and here is not None and any(p is tensor for p in here.parameters(recurse=False)):
        return ctx.owner()
    owner = str(w.target).rpartition(".")[0]
    return owner if owner in ctx.engine.modules else None


def _is_param(gm: Any, target: str) -> bool:
    module, _, name = target.rpartition(".")
    try:
        return name in gm.get_submodule(module)._parameters
    except AttributeError:
        return False


def fixed_size(ctx: Ctx, ref: Any) -> None:
    """A size read from channel dims sets a dim that is never sliced: those channels must stay."""
    if isinstance(ref, SizeRef) and ref.sources:
        ctx.freeze(np.concatenate(ref.sources), "its channel count sizes a dim that is not pruned")


def size_args(ctx: Ctx, first: int) -> list[tuple[Any, tuple | None]]:
    """Per output dim: (traced size value, path of the literal) for ``view(*sizes)`` / ``view(sizes)``."""
    args = ctx.args[first:]
    if len(args) == 1 and isinstance(args[0], fx.Node) and isinstance(ctx.aval(args[0]), (list, tuple)):
        return [(v, None) for v in ctx.aval(args[0])]  # view(shape) with the shape computed in forward
    if len(args) == 1 and isinstance(args[0], (list, tuple)):
        raw, base = args[0], ("args", first)
    else:
        raw, base = args, None
    out = []
    for k, a in enumerate(raw):
        path = (*base, k) if base else ("args", first + k)
        out.append((ctx.aval(a), path if not isinstance(a, fx.Node) else None))
    return out
