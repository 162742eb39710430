"""Layers with weights: producers (conv, linear, embedding) and per-channel layers (norms, PReLU)."""

from __future__ import annotations

import numpy as np
from torch import nn

from prunefx.analysis.labels import Lab
from prunefx.analysis.roles import CHANNEL, IN, OUT, Normalized
from prunefx.analysis.rules._context import Ctx
from prunefx.analysis.rules._registry import register_rule


def _freeze_dims(ctx: Ctx, lab: Lab, dims: range | list[int], why: str) -> None:
    for d in dims:
        if lab.dims[d] is not None:
            ctx.freeze(lab.dims[d], why)


def pin(ctx: Ctx, qualname: str, dim: int, width: int) -> None:
    """Record dim ``dim`` of a parameter as no channel (-1): this call's input cannot be sliced, so another call
    of the same layer (a layer applied twice, once to the model's input) cannot prune those positions either."""
    ctx.param(qualname, dim, np.full(width, -1, dtype=np.int64))


def couple_blocks(ctx: Ctx, atoms: np.ndarray, blocks: int, what: str) -> np.ndarray:
    """Merge position i of every block (grouped convs, GroupNorm): each block keeps the same positions,
    so per-block counts stay equal and ``groups`` stays valid. Returns the labels of one block."""
    grid = atoms.reshape(blocks, -1)
    if blocks > 1:
        ctx.union(grid, np.broadcast_to(grid[:1], grid.shape))
        ctx.note(atoms, f"same positions kept in each of the {blocks} {what} of {ctx.name}")
    return grid[0]


def _conv_like(ctx: Ctx, transposed: bool) -> Lab:
    m, lab = ctx.module, ctx.lab(ctx.args[0])
    if lab.ndim == m.weight.dim() - 1:  # unbatched (C, *spatial): channels are dim 0
        out = _conv_batched(ctx, m, Lab((None, *lab.dims)), transposed)
        return Lab(out.dims[1:])
    return _conv_batched(ctx, m, lab, transposed)


def _conv_batched(ctx: Ctx, m, lab: Lab, transposed: bool) -> Lab:
    name, g = ctx.name, m.groups
    _freeze_dims(ctx, lab, range(2, lab.ndim), "a convolution slides over this channel dim")
    xin = lab.dims[1] if lab.ndim > 1 else None
    out = ctx.fresh(m.out_channels)
    w_in, w_out = (0, 1) if transposed else (1, 0)
    if xin is None:
        pin(ctx, f"{name}.weight", w_in, m.weight.shape[w_in])
    if g == 1:
        if xin is not None:
            ctx.member(IN, xin)
            ctx.param(f"{name}.weight", w_in, xin)
        ctx.param(f"{name}.weight", w_out, out)
    else:
        ki, ko = m.in_channels // g, m.out_channels // g
        if ki == 1:  # depthwise: input channel b feeds exactly its ko outputs, pruned together
            if xin is None:
                ctx.freeze(out, "depthwise conv over channels that cannot be pruned")
            else:
                ctx.union(out.reshape(g, ko), np.broadcast_to(xin[:, None], (g, ko)))
                ctx.member(IN, xin)
                ctx.note(xin, f"depthwise {name}: groups follow the channel count")
                if transposed:
                    ctx.param(f"{name}.weight", 0, xin)
                else:
                    ctx.param(f"{name}.weight", 0, out)
        else:
            block_out = couple_blocks(ctx, out, g, "conv groups")
            if xin is not None:
                block_in = couple_blocks(ctx, xin, g, "conv groups")
                ctx.member(IN, xin)
                ctx.param(f"{name}.weight", w_in, xin if transposed else block_in)
            ctx.param(f"{name}.weight", w_out, block_out if transposed else out)
    ctx.member(OUT, out)
    if m.bias is not None:
        ctx.param(f"{name}.bias", 0, out)
    return Lab((lab.dims[0], out, *([None] * (lab.ndim - 2))))


@register_rule(nn.Conv1d, nn.Conv2d, nn.Conv3d)
def conv(ctx: Ctx) -> Lab:
    return _conv_like(ctx, transposed=False)


@register_rule(nn.ConvTranspose1d, nn.ConvTranspose2d, nn.ConvTranspose3d)
def conv_transpose(ctx: Ctx) -> Lab:
    return _conv_like(ctx, transposed=True)


@register_rule(nn.Linear, nn.LazyLinear)
def linear(ctx: Ctx) -> Lab:
    m, lab = ctx.module, ctx.lab(ctx.args[0])
    xin = lab.dims[-1]
    if xin is not None:
        ctx.member(IN, xin)
        ctx.param(f"{ctx.name}.weight", 1, xin)
    else:
        pin(ctx, f"{ctx.name}.weight", 1, m.in_features)
    out = ctx.fresh(m.out_features)
    ctx.member(OUT, out)
    ctx.param(f"{ctx.name}.weight", 0, out)
    if m.bias is not None:
        ctx.param(f"{ctx.name}.bias", 0, out)
    return lab.replace(lab.ndim - 1, out)


@register_rule(nn.Embedding)
def embedding(ctx: Ctx) -> Lab:
    lab = ctx.lab(ctx.args[0])
    out = ctx.fresh(ctx.module.embedding_dim)
    ctx.member(OUT, out)
    ctx.param(f"{ctx.name}.weight", 1, out)
    return Lab((*lab.dims, out))


def _per_channel(ctx: Ctx, lab: Lab, dim: int, params: tuple[str, ...]) -> None:
    atoms = lab.dims[dim] if lab.ndim > dim else None
    if atoms is None:
        return
    ctx.member(CHANNEL, atoms)
    for p in params:
        if getattr(ctx.module, p, None) is not None:
            ctx.param(f"{ctx.name}.{p}", 0, atoms)


@register_rule(nn.BatchNorm1d, nn.BatchNorm2d, nn.BatchNorm3d, nn.SyncBatchNorm,
               nn.InstanceNorm1d, nn.InstanceNorm2d, nn.InstanceNorm3d)
def batch_norm(ctx: Ctx) -> Lab:
    lab = ctx.lab(ctx.args[0])
    _per_channel(ctx, lab, 1, ("weight", "bias", "running_mean", "running_var"))
    return lab


@register_rule(nn.GroupNorm)
def group_norm(ctx: Ctx) -> Lab:
    lab = ctx.lab(ctx.args[0])
    atoms = lab.dims[1]
    if atoms is not None:
        couple_blocks(ctx, atoms, ctx.module.num_groups, "norm groups")
        ctx.inexact(atoms, "GroupNorm statistics mix the channels of a group")
        _per_channel(ctx, lab, 1, ("weight", "bias"))
    return lab


@register_rule(nn.LayerNorm, nn.RMSNorm)
def layer_norm(ctx: Ctx) -> Lab:
    lab = ctx.lab(ctx.args[0])
    k = len(ctx.module.normalized_shape)
    for j, d in enumerate(range(lab.ndim - k, lab.ndim)):
        atoms = lab.dims[d]
        if atoms is None:
            continue
        ctx.inexact(atoms, f"{type(ctx.module).__name__} statistics mix channels")
        ctx.member(Normalized(j), atoms)
        for p in ("weight", "bias"):
            if getattr(ctx.module, p, None) is not None:
                ctx.param(f"{ctx.name}.{p}", j, atoms)
    return lab


@register_rule(nn.LocalResponseNorm, nn.CrossMapLRN2d)
def local_response_norm(ctx: Ctx) -> Lab:
    lab = ctx.lab(ctx.args[0])
    if lab.dims[1] is not None:
        ctx.freeze(lab.dims[1], "LocalResponseNorm mixes neighbouring channels by position")
    return lab


@register_rule(nn.PReLU)
def prelu(ctx: Ctx) -> Lab:
    lab = ctx.lab(ctx.args[0])
    if ctx.module.num_parameters > 1:
        _per_channel(ctx, lab, 1, ("weight",))
    return lab
