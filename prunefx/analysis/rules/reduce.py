"""Ops that reduce, normalise or resample: pooling, interpolation, padding, reductions, softmax."""

from __future__ import annotations

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

from prunefx.analysis.labels import Lab
from prunefx.analysis.rules._algebra import norm_dim
from prunefx.analysis.rules._context import Ctx
from prunefx.analysis.rules._registry import register_rule

SPATIAL_MODULES = (
    nn.MaxPool1d, nn.MaxPool2d, nn.MaxPool3d, nn.AvgPool1d, nn.AvgPool2d, nn.AvgPool3d, nn.LPPool1d, nn.LPPool2d,
    nn.AdaptiveAvgPool1d, nn.AdaptiveAvgPool2d, nn.AdaptiveAvgPool3d, nn.AdaptiveMaxPool1d, nn.AdaptiveMaxPool2d,
    nn.AdaptiveMaxPool3d, nn.FractionalMaxPool2d, nn.Upsample, nn.UpsamplingNearest2d, nn.UpsamplingBilinear2d,
    nn.ZeroPad1d, nn.ZeroPad2d, nn.ZeroPad3d, nn.ConstantPad1d, nn.ConstantPad2d, nn.ConstantPad3d,
    nn.ReflectionPad1d, nn.ReflectionPad2d, nn.ReflectionPad3d, nn.ReplicationPad1d, nn.ReplicationPad2d,
    nn.ReplicationPad3d, nn.CircularPad1d, nn.CircularPad2d, nn.CircularPad3d,
)
SPATIAL_FUNCTIONS = (
    F.max_pool1d, F.max_pool2d, F.max_pool3d, F.avg_pool1d, F.avg_pool2d, F.avg_pool3d, F.lp_pool1d, F.lp_pool2d,
    F.adaptive_avg_pool1d, F.adaptive_avg_pool2d, F.adaptive_avg_pool3d, F.adaptive_max_pool1d,
    F.adaptive_max_pool2d, F.adaptive_max_pool3d, F.interpolate, F.upsample, F.upsample_nearest,
    F.upsample_bilinear, torch.max_pool2d, torch.avg_pool1d, torch.adaptive_avg_pool1d,
)


@register_rule(*SPATIAL_MODULES, *SPATIAL_FUNCTIONS)
def spatial(ctx: Ctx) -> Lab:
    """(N, C, *spatial) -> (N, C, *spatial'): channels pass, positions are resampled."""
    lab = ctx.lab(ctx.args[0])
    out = ctx.out[0] if isinstance(ctx.out, tuple) else ctx.out  # return_indices=True
    if out.dim() != lab.ndim:  # unbatched input: the channel dim is the first
        ctx.freeze(lab, "unbatched pooling input")
        return Lab.none(out.dim())
    for d in range(2, lab.ndim):
        if lab.dims[d] is not None:
            ctx.freeze(lab.dims[d], "pooling/resampling over a channel-labeled dim")
    res = Lab((lab.dims[0], lab.dims[1], *([None] * (lab.ndim - 2))))
    return (res, res) if isinstance(ctx.out, tuple) else res


@register_rule(F.pad)
def pad(ctx: Ctx) -> Lab:
    lab = ctx.lab(ctx.args[0])
    pads = ctx.arg(1, "pad")
    touched = {lab.ndim - 1 - k // 2 for k, p in enumerate(pads) if p != 0}
    for d in touched:
        if lab.dims[d] is not None:
            ctx.freeze(lab.dims[d], "padding along a channel dim")
    return Lab(tuple(None if d in touched else a for d, a in enumerate(lab.dims)))


# Reductions: summing over channels equals summing over the kept ones (a masked channel is zero);
# every other reduction over channels depends on how many there are.
REDUCTIONS = {
    "sum": True, torch.sum: True, "nansum": True, torch.nansum: True,
    "mean": False, torch.mean: False, "amax": False, torch.amax: False, "amin": False, torch.amin: False,
    "std": False, torch.std: False, "var": False, torch.var: False, "norm": False, torch.norm: False,
    "logsumexp": False, torch.logsumexp: False, "prod": False, torch.prod: False, "max": False,
    torch.max: False, "min": False, torch.min: False, "argmax": False, torch.argmax: False, "argmin": False,
    torch.argmin: False, "any": False, "all": False, torch.linalg.vector_norm: False,
}
# Norms take their order before the dims: (x, p / ord, dim, keepdim); the aten module adds its vector_norm.
NORMS = {"norm", torch.norm, torch.linalg.vector_norm}


@register_rule(*REDUCTIONS)
def reduction(ctx: Ctx):
    lab = ctx.lab(ctx.args[0])
    separable = REDUCTIONS[ctx.node.target]
    at = 2 if ctx.node.target in NORMS else 1
    dim = ctx.arg(at, "dim")
    if isinstance(dim, torch.Tensor) or (
        ctx.node.target in ("max", "min", torch.max, torch.min) and ctx.is_tensor(dim)
    ):
        from prunefx.analysis.rules.elementwise import binary  # max(a, b) is element-wise

        return binary(ctx)
    keepdim = bool(ctx.arg(at + 1, "keepdim", False))
    dims = (
        range(lab.ndim)
        if dim is None
        else [norm_dim(d, lab.ndim) for d in (dim if isinstance(dim, (list, tuple)) else [dim])]
    )
    for d in dims:
        if lab.dims[d] is not None and not separable:
            ctx.inexact(
                lab.dims[d],
                f"{getattr(ctx.node.target, '__name__', ctx.node.target)} over channels depends on their number",
            )
    kept = (
        [None if d in dims else a for d, a in enumerate(lab.dims)]
        if keepdim
        else [a for d, a in enumerate(lab.dims) if d not in dims]
    )
    res = Lab(tuple(kept))
    if isinstance(ctx.out, tuple):  # (values, indices)
        return tuple(res for _ in ctx.out)
    return (
        res
        if isinstance(ctx.out, torch.Tensor) and ctx.out.dim() == res.ndim
        else Lab.none(getattr(ctx.out, "ndim", 0))
    )


def _softmax_like(ctx: Ctx, dim) -> Lab:
    lab = ctx.lab(ctx.args[0])
    d = norm_dim(dim if dim is not None else -1, lab.ndim)
    if lab.dims[d] is not None:
        ctx.inexact(lab.dims[d], "softmax/normalisation over channels depends on their number")
    return lab


@register_rule(F.softmax, F.log_softmax, torch.softmax, torch.log_softmax, "softmax", "log_softmax", F.normalize)
def softmax(ctx: Ctx) -> Lab:
    return _softmax_like(ctx, ctx.arg(1, "dim", 1 if ctx.node.target is F.normalize else None))


@register_rule(nn.Softmax, nn.LogSoftmax, nn.Softmin, nn.Softmax2d)
def softmax_module(ctx: Ctx) -> Lab:
    return _softmax_like(ctx, -3 if isinstance(ctx.module, nn.Softmax2d) else ctx.module.dim)


@register_rule(nn.PixelShuffle, nn.PixelUnshuffle, F.pixel_shuffle, F.pixel_unshuffle)
def pixel_shuffle(ctx: Ctx) -> Lab:
    ctx.freeze(ctx.lab(ctx.args[0]), "pixel (un)shuffle moves channels into space")
    return Lab.none(ctx.out.dim())


@register_rule(nn.ChannelShuffle, F.channel_shuffle, torch.channel_shuffle, torch.native_channel_shuffle)
def channel_shuffle(ctx: Ctx) -> Lab:
    from prunefx.analysis.rules.layers import couple_blocks

    lab = ctx.lab(ctx.args[0])
    g = ctx.module.groups if ctx.module is not None else ctx.arg(1, "groups")
    if lab.dims[1] is None:
        return lab
    block = couple_blocks(ctx, lab.dims[1], g, "shuffle groups")
    return lab.replace(1, np.repeat(block, g))


# Running ops along a dim. A prefix sum over channels skips a zeroed channel exactly as it skips a removed one
# (and the removed channel's own output position goes with it); products, maxima and log-sum-exp do not.
CUMULATIVE = {
    "cumsum": True, torch.cumsum: True, "cumsum_": True,
    "cumprod": False, torch.cumprod: False, "cummax": False, torch.cummax: False, "cummin": False,
    torch.cummin: False, "logcumsumexp": False, torch.logcumsumexp: False,
}


@register_rule(*CUMULATIVE)
def cumulative(ctx: Ctx):
    lab = ctx.lab(ctx.args[0])
    d = norm_dim(ctx.arg(1, "dim"), lab.ndim)
    if lab.dims[d] is not None and not CUMULATIVE[ctx.node.target]:
        name = ctx.node.target if isinstance(ctx.node.target, str) else ctx.node.target.__name__
        ctx.freeze(lab.dims[d], f"{name} along a channel dim depends on every channel before")
        lab = lab.replace(d, None)
    return (lab, lab) if isinstance(ctx.out, tuple) else lab


@register_rule(torch.diff, "diff", torch.ops.aten.diff.default)
def diff(ctx: Ctx) -> Lab:
    """diff(x, n, dim, prepend, append): differences of neighbours along ``dim``; every other dim as it is."""
    lab = ctx.lab(ctx.args[0])
    d = norm_dim(ctx.arg(2, "dim", -1), lab.ndim)  # dim is the third argument: the second is n
    ends = [e for e in (ctx.arg(3, "prepend"), ctx.arg(4, "append")) if ctx.is_tensor(e)]
    if ends:  # extra rows along dim whose other dims must match x's: rare enough to keep whole
        for t in (ctx.args[0], *ends):
            ctx.freeze(ctx.lab(t), "diff with prepend / append")
        return Lab.none(ctx.out.dim())
    if lab.dims[d] is not None:
        ctx.freeze(lab.dims[d], "diff along a channel dim mixes neighbouring channels")
    return lab.replace(d, None)
