"""Ops that create tensors from sizes: ``torch.zeros(b, c)``, ``x.new_empty(shape)``, ``torch.rand(...)``.

A dim whose size is read from a channel dim (``x.shape[1]``) *is* those channels: a constant-filled tensor with
fewer of them is the same tensor sliced, so it carries their labels. A size computed from channels
(``2 * c``) freezes them; literal sizes and sizes of dims that are never pruned give unlabeled dims.
``arange``/``linspace`` are not like this: their values are positions, which pruning would renumber.
"""

from __future__ import annotations

import numpy as np
import torch
import torch.fx as fx

from prunefx.analysis.labels import Lab, SizeRef
from prunefx.analysis.rules._context import Ctx
from prunefx.analysis.rules._registry import register_rule

# name -> index of the first size argument (after ``self`` for methods)
FACTORIES = {
    torch.zeros: 0, torch.ones: 0, torch.empty: 0, torch.full: 0, torch.rand: 0, torch.randn: 0,
    "new_zeros": 1, "new_ones": 1, "new_empty": 1, "new_full": 1,
}


def _sizes(ctx: Ctx, first: int) -> list:
    """Analysis values of the size arguments: ``f(a, b)``, ``f((a, b))`` or ``f(shape_node)``."""
    args = ctx.args[first:]
    if ctx.node.target in (torch.full, "new_full"):
        args = args[:1]  # (size, fill_value)
    if "size" in ctx.kwargs:
        args = (ctx.kwargs["size"],)
    if len(args) == 1:
        v = ctx.aval(args[0])
        if isinstance(v, (tuple, list)):
            return list(v)
    return [ctx.aval(a) for a in args]


@register_rule(*FACTORIES)
def factory(ctx: Ctx) -> Lab:
    out = ctx.out
    sizes = _sizes(ctx, FACTORIES[ctx.node.target])
    if len(sizes) != out.dim():
        ctx.freeze(sizes, "a tensor created with sizes prunefx cannot match to its dims")
        return Lab.none(out.dim())
    if ctx.node.target in (torch.full, "new_full"):  # the fill value is a number, not a size
        ctx.freeze_values((ctx.args[FACTORIES[ctx.node.target] + 1:], ctx.kwargs.get("fill_value")))
    dims: list[np.ndarray | None] = []
    for d, ref in enumerate(sizes):
        if isinstance(ref, SizeRef) and ref.sources:
            if ref.exact and len(ref.sources) == 1 and len(ref.sources[0]) == out.shape[d]:
                dims.append(ref.sources[0])  # this dim has one position per channel of the source
                continue
            ctx.freeze(np.concatenate(ref.sources), "a size computed from channels creates a tensor")
        dims.append(None)
    return Lab(tuple(dims))


@register_rule(torch.arange, torch.linspace, torch.logspace)
def positions(ctx: Ctx) -> Lab:
    """Position values: a channel count used as the end renumbers them after pruning, so it is frozen."""
    refs = [ctx.aval(a) for a in (*ctx.args, *ctx.kwargs.values()) if isinstance(a, fx.Node)]
    for ref in refs:
        if isinstance(ref, SizeRef) and ref.sources:
            ctx.freeze(np.concatenate(ref.sources), f"{ctx.node.target.__name__} counts up to a channel count")
    return Lab.none(ctx.out.dim())


@register_rule(torch.tensor, torch.as_tensor)
def from_data(ctx: Ctx) -> Lab:
    """``torch.tensor(data)``: a copy of a tensor keeps its labels; numbers (an empty KV cache's ``[]``) have none."""
    data = ctx.arg(0, "data")
    if ctx.is_tensor(data):
        return ctx.lab(data)
    # tensors inside a list become values of one new dim, and a channel count becomes a number: both must stay
    ctx.freeze([ctx.lab(t) for t in _tensor_nodes(ctx, data)], "tensors gathered into a new tensor's values")
    ctx.freeze_values(data)
    return Lab.none(ctx.out.dim())


def _tensor_nodes(ctx: Ctx, data) -> list:
    if isinstance(data, (list, tuple)):
        return [t for item in data for t in _tensor_nodes(ctx, item)]
    return [data] if ctx.is_tensor(data) else []
