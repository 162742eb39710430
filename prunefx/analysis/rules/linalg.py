"""Contractions and functional layers: matmul, F.linear / F.conv*, functional norms, attention."""

from __future__ import annotations

import operator
from typing import Any

import numpy as np
import torch
import torch.fx as fx
import torch.nn.functional as F

from prunefx.analysis.labels import Lab
from prunefx.analysis.roles import CHANNEL, IN, OUT, Normalized
from prunefx.analysis.rules._algebra import broadcast_merge, weight_owner
from prunefx.analysis.rules._context import Ctx
from prunefx.analysis.rules._registry import register_rule
from prunefx.analysis.rules.layers import couple_blocks


def _contract(ctx: Ctx, a: np.ndarray | None, b: np.ndarray | None) -> None:
    """The summed-over dim of a product: removing index i from both sides removes its term exactly."""
    if a is not None and b is not None:
        ctx.union(a, b)
    elif a is not None or b is not None:
        ctx.freeze(a if a is not None else b, "contracted with a dim that cannot be sliced")


@register_rule(torch.matmul, operator.matmul, torch.bmm, torch.mm, "matmul", "bmm", "mm", "__matmul__")
def matmul(ctx: Ctx) -> Lab:
    x, y = ctx.args[0], ctx.args[1]
    lx, ly = ctx.lab(x), ctx.lab(y)
    if lx.ndim < 2 or ly.ndim < 2:
        ctx.freeze([lx, ly], "matmul with a vector")
        return Lab.none(ctx.out.dim())
    _contract(ctx, lx.dims[-1], ly.dims[-2])
    out_nd = ctx.out.dim()
    batch_x = Lab(lx.dims[:-2])
    batch_y = Lab(ly.dims[:-2])
    batch_shape = tuple(ctx.out.shape[:-2])
    # Batch dims broadcast like an element-wise op; reuse it on the batch part of each operand.
    parts = [(batch_x, ctx.shape(x)[:-2]), (batch_y, ctx.shape(y)[:-2])]
    batch = broadcast_merge(ctx, parts, batch_shape, "batched matmul against unsliceable batch dims")
    for b in batch:  # per-slice products (attention heads): a reshape that made these dims prefers them as units
        ctx.tag_batch(b)
    dims = (*batch, lx.dims[-2], ly.dims[-1])
    assert len(dims) == out_nd
    return Lab(dims)


_GROUPED_MM = tuple(op for op in (getattr(F, "grouped_mm", None), getattr(torch, "_grouped_mm", None),
                                  getattr(torch.ops.aten, "_grouped_mm", None)) if op is not None)


@register_rule(*_GROUPED_MM)
def grouped_mm(ctx: Ctx) -> Lab:
    """``grouped_mm(x (S, K), w (E, K, N), offs)``: the rows of x sorted by group, row s multiplied by its group's
    ``w[e]`` (a mixture of experts' dispatch); K is summed over (x's columns with w's dim 1), N is w's dim 2 (the
    bias ``(E, N)`` with it). The group dim is no channel here (experts leave by :func:`prune_experts`)."""
    x, w = ctx.args[0], ctx.args[1]
    bias = ctx.arg(3, "bias")
    lx, lw = ctx.lab(x), ctx.lab(w)
    if lx.ndim != 2 or lw.ndim != 3:  # the batched and K-grouped forms: not yet
        ctx.freeze([lx, lw], f"grouped matmul of a {lx.ndim}-D by a {lw.ndim}-D operand")
        return Lab.none(ctx.out.dim())
    _contract(ctx, lx.dims[1], lw.dims[1])
    if lw.dims[0] is not None:
        ctx.freeze(lw.dims[0], "the group (expert) dim of a grouped matmul")
    out = lw.dims[2]
    if bias is not None and ctx.is_tensor(bias):
        lb = ctx.lab(bias)
        if lb.dims[0] is not None:
            ctx.freeze(lb.dims[0], "the group (expert) dim of a grouped matmul")
        _contract(ctx, out, lb.dims[1])
    return Lab((lx.dims[0], out))


@register_rule(F.linear)
def linear_fn(ctx: Ctx) -> Lab:
    x, w, b = ctx.arg(0, "input"), ctx.arg(1, "weight"), ctx.arg(2, "bias")
    lx, lw = ctx.lab(x), ctx.lab(w)
    _contract(ctx, lx.dims[-1], lw.dims[1] if lw.ndim == 2 else None)
    out = lw.dims[0] if lw.ndim == 2 else None
    if b is not None and ctx.is_tensor(b):
        lb = ctx.lab(b)
        if out is not None and lb.dims[0] is not None:
            ctx.union(out, lb.dims[0])
        elif (out is None) != (lb.dims[0] is None):
            ctx.freeze([lw, lb], "F.linear weight and bias sliced differently")
            out = None
    if lw.ndim == 2:
        _members(ctx, w, (IN, lw.dims[1]), (OUT, lw.dims[0]))
    return lx.replace(lx.ndim - 1, out)


def _members(ctx: Ctx, param, *roles: tuple) -> None:
    """Record the members of the module that owns ``param`` (a functional layer's module, see weight_owner)."""
    owner = weight_owner(ctx, param)
    if owner is not None:
        for role, atoms in roles:
            if atoms is not None:
                ctx.member(role, atoms, name=owner)


@register_rule(F.conv1d, F.conv2d, F.conv3d)
def conv_fn(ctx: Ctx) -> Lab:
    x, w, b = ctx.arg(0, "input"), ctx.arg(1, "weight"), ctx.arg(2, "bias")
    groups = ctx.arg(6, "groups", 1)
    lx, lw = ctx.lab(x), ctx.lab(w)
    if groups != 1 and _depthwise(ctx, x, w, groups):
        return _depthwise_fn(ctx, lx, lw, b, groups)
    if groups != 1 and isinstance(groups, int) and lw.ndim == lx.ndim and lx.ndim > 2:
        return _grouped_fn(ctx, lx, lw, b, groups)
    if groups != 1:
        lb = ctx.lab(b) if b is not None and ctx.is_tensor(b) else None
        ctx.freeze([lx, lw, lb], "functional grouped convolution")
        return Lab.none(ctx.out.dim())
    _contract(ctx, lx.dims[1], lw.dims[1])
    for d in range(2, lw.ndim):  # kernel taps are not channels
        if lw.dims[d] is not None:
            ctx.freeze(lw.dims[d], "convolution kernel dims")
    out = lw.dims[0]
    if b is not None and ctx.is_tensor(b):
        _contract(ctx, out, ctx.lab(b).dims[0])
    _conv_owner(ctx, w, lw.dims[1], out)
    for d in range(2, lx.ndim):
        if lx.dims[d] is not None:
            ctx.freeze(lx.dims[d], "a convolution slides over this channel dim")
    return Lab((lx.dims[0], out, *([None] * (lx.ndim - 2))))


def _depthwise(ctx: Ctx, x, w, groups: Any) -> bool:
    """One input channel per group (``groups`` = the input's channels), ``groups`` a positional literal."""
    return (isinstance(groups, int) and len(ctx.args) > 6 and ctx.args[6] == groups and ctx.shape(w)[1] == 1
            and len(ctx.shape(x)) > 1 and ctx.shape(x)[1] == groups)


def _depthwise_fn(ctx: Ctx, lx: Lab, lw: Lab, b: Any, groups: int) -> Lab:
    """Depthwise ``conv(x, w, b, stride, padding, dilation, groups=C)``: input channel c feeds exactly its ``k``
    outputs (weight rows ``c*k .. c*k+k-1``), so they are pruned together and ``groups`` counts the kept channels."""
    xin, out = lx.dims[1], lw.dims[0]
    for d in range(1, lw.ndim):  # the single input position and the kernel taps are not channels
        if lw.dims[d] is not None:
            ctx.freeze(lw.dims[d], "convolution kernel dims")
    bias = ctx.lab(b).dims[0] if b is not None and ctx.is_tensor(b) else None
    if out is not None and bias is not None:
        _contract(ctx, out, bias)
    if xin is None or out is None:
        ctx.freeze([a for a in (xin, out) if a is not None], "depthwise conv over channels that cannot be pruned")
        return Lab((lx.dims[0], None, *([None] * (lx.ndim - 2))))
    k = len(out) // groups
    ctx.union(out.reshape(groups, k), np.broadcast_to(xin[:, None], (groups, k)))
    ctx.constant(("args", 6), xin)  # the groups literal follows the kept input channels
    _conv_owner(ctx, ctx.arg(1, "weight"), xin, out)
    for d in range(2, lx.ndim):
        if lx.dims[d] is not None:
            ctx.freeze(lx.dims[d], "a convolution slides over this channel dim")
    return Lab((lx.dims[0], out, *([None] * (lx.ndim - 2))))


def _grouped_fn(ctx: Ctx, lx: Lab, lw: Lab, b: Any, groups: int) -> Lab:
    """Grouped ``conv(x, w, ..., groups=g)`` (g > 1, several input channels per group): as the module rule does, each
    group keeps the same positions (so ``groups`` stays valid and unchanged); weight columns are one group's inputs."""
    xin, out, w_in = lx.dims[1], lw.dims[0], lw.dims[1]
    for d in range(2, lw.ndim):
        if lw.dims[d] is not None:
            ctx.freeze(lw.dims[d], "convolution kernel dims")
    bias = ctx.lab(b).dims[0] if b is not None and ctx.is_tensor(b) else None
    if out is not None and bias is not None:
        _contract(ctx, out, bias)
    if out is not None:
        couple_blocks(ctx, out, groups, "conv groups")
    if xin is not None:
        block_in = couple_blocks(ctx, xin, groups, "conv groups")
        if w_in is not None:
            _contract(ctx, block_in, w_in)
    elif w_in is not None:
        ctx.freeze(w_in, "grouped conv over channels that cannot be pruned")
    _conv_owner(ctx, ctx.arg(1, "weight"), xin, out)
    for d in range(2, lx.ndim):
        if lx.dims[d] is not None:
            ctx.freeze(lx.dims[d], "a convolution slides over this channel dim")
    return Lab((lx.dims[0], out, *([None] * (lx.ndim - 2))))


def _conv_owner(ctx: Ctx, w: Any, xin: Any, out: Any) -> None:
    """Record a functional conv's input and output channels under the module that owns (or computes) its weight."""
    owner = weight_owner(ctx, w)
    if owner is None:  # a weight computed in forward (timm's ScaledStdConv2d standardises its own): that module's
        here = ctx.engine.modules.get(ctx.owner())
        mine = getattr(here, "weight", None)
        if isinstance(mine, torch.Tensor) and tuple(mine.shape) == ctx.shape(w):
            owner = ctx.owner()
    if owner:  # its fixer re-derives in/out channels and groups (the root is no conv layer: nothing to record)
        for role, atoms in ((IN, xin), (OUT, out)):
            if atoms is not None:
                ctx.member(role, atoms, name=owner)


def _statistics_dims(ctx: Ctx, ndim: int) -> list[int]:
    """Dims a functional norm takes its statistics over (beside the channel dim 1): instance norm always over the
    spatial dims; batch norm over batch and spatial dims when it has no running statistics to use."""
    target, aten = ctx.node.target, torch.ops.aten
    if target is F.instance_norm or target is aten.instance_norm.default:
        return list(range(2, ndim))
    running = {F.batch_norm: (1, "running_mean"), aten.batch_norm.default: (3, "running_mean")}.get(target)
    if running is not None and ctx.arg(*running) is None:
        return [0, *range(2, ndim)]
    return []


@register_rule(F.batch_norm, F.instance_norm)
def batch_norm_fn(ctx: Ctx) -> Lab:
    lx = ctx.lab(ctx.args[0])
    for d in _statistics_dims(ctx, lx.ndim):
        # timm's ScaledStdConv2d standardises its weight with batch_norm over (1, out, in*k*k): the input channels'
        # positions share one mean and variance, so removing some changes the rest (as LayerNorm over channels)
        if lx.dims[d] is not None:
            ctx.inexact(lx.dims[d], "normalisation statistics are taken over this channel dim")
    stats = [a for a in (*ctx.args[1:], *ctx.kwargs.values()) if ctx.is_tensor(a)]
    for s in stats:
        _contract(ctx, lx.dims[1], ctx.lab(s).dims[0])
    if stats and lx.ndim > 1:
        _members(ctx, stats[0], (CHANNEL, lx.dims[1]))
    return lx


@register_rule(F.layer_norm, F.group_norm, F.rms_norm)
def norm_fn(ctx: Ctx) -> Lab:
    lx = ctx.lab(ctx.args[0])
    tensors = [a for a in (*ctx.args[1:], *ctx.kwargs.values()) if ctx.is_tensor(a)]
    if ctx.node.target is F.group_norm:
        return _group_norm_fn(ctx, lx, tensors)
    shape = ctx.arg(1, "normalized_shape")
    k = len(shape)
    for j, d in enumerate(range(lx.ndim - k, lx.ndim)):
        if lx.dims[d] is None:
            continue
        ctx.inexact(lx.dims[d], "layer_norm statistics mix channels")
        if isinstance(shape, (list, tuple)) and not isinstance(shape[j], fx.Node):
            ctx.constant(("args", 1, j), lx.dims[d])  # the literal normalized_shape follows the width
        else:
            ctx.freeze(lx.dims[d], "layer_norm with a computed normalized_shape")
    for t in tensors:
        lt = ctx.lab(t)
        for j in range(lt.ndim):
            _contract(ctx, lx.dims[lx.ndim - lt.ndim + j], lt.dims[j])
    if tensors:
        _members(ctx, tensors[0], *((Normalized(j), lx.dims[d]) for j, d in enumerate(range(lx.ndim - k, lx.ndim))))
    return lx


def _group_norm_fn(ctx: Ctx, lx: Lab, tensors: list) -> Lab:
    """F.group_norm(x, g, weight, bias), as nn.GroupNorm: equal positions kept in every group, statistics
    over a group inexact, weight and bias sliced with the channels."""
    from prunefx.analysis.rules.layers import couple_blocks

    g, atoms = ctx.arg(1, "num_groups"), lx.dims[1] if lx.ndim > 1 else None
    if atoms is not None:
        if isinstance(g, int) and len(atoms) % g == 0:
            couple_blocks(ctx, atoms, g, "norm groups")
            ctx.inexact(atoms, "group_norm statistics mix the channels of a group")
        else:
            ctx.freeze(atoms, "group_norm with a computed number of groups")
    for t in tensors:
        _contract(ctx, atoms, ctx.lab(t).dims[0])
    return lx


@register_rule(F.embedding)
def embedding_fn(ctx: Ctx) -> Lab:
    """F.embedding(ids, weight): rows are looked up by value (never pruned), columns are the output channels."""
    li, lw = ctx.lab(ctx.arg(0, "input")), ctx.lab(ctx.arg(1, "weight"))
    if li.atoms().size:
        ctx.freeze(li, "embedding indices")
    if lw.dims[0] is not None:
        ctx.freeze(lw.dims[0], "embedding rows are looked up by index")
    return Lab((*li.dims, lw.dims[1]))


@register_rule(F.scaled_dot_product_attention)
def sdpa(ctx: Ctx) -> Lab:
    q, k, v = ctx.args[0], ctx.args[1], ctx.args[2]
    lq, lk, lv = ctx.lab(q), ctx.lab(k), ctx.lab(v)
    if ctx.kwargs.get("scale") is None and (lq.dims[-1] is not None or lk.dims[-1] is not None):
        # Its default scale is 1/sqrt(E) with E read from q: pruning E would change every score.
        ctx.freeze([lq.dims[-1], lk.dims[-1]], "scaled_dot_product_attention derives its scale from the head dim")
    else:
        _contract(ctx, lq.dims[-1], lk.dims[-1])
    _contract(ctx, lk.dims[-2], lv.dims[-2])
    sq, sk, sv = ctx.shape(q), ctx.shape(k), ctx.shape(v)
    if ctx.kwargs.get("enable_gqa") and len(sq) >= 3 and len(sk) >= 3 and sq[-3] != sk[-3]:
        # Query head h reads key/value head h // (Hq / Hkv): a KV head goes with its group of query heads.
        rep = sq[-3] // sk[-3]
        lk, lv = (lab.replace(lab.ndim - 3, None if lab.dims[-3] is None else np.repeat(lab.dims[-3], rep))
                  for lab in (lk, lv))
        sk, sv = (*sk[:-3], sq[-3], *sk[-2:]), (*sv[:-3], sq[-3], *sv[-2:])
    parts = [(Lab(lq.dims[:-2]), sq[:-2]), (Lab(lk.dims[:-2]), sk[:-2]), (Lab(lv.dims[:-2]), sv[:-2])]
    mask = ctx.arg(3, "attn_mask")
    if mask is not None and ctx.is_tensor(mask):  # added to the (..., heads, Lq, Lk) scores: a per-head bias
        lm = ctx.lab(mask)
        parts.append((Lab(lm.dims[:-2]), ctx.shape(mask)[:-2]))
        ctx.freeze([d for d in lm.dims[-2:] if d is not None], "attention mask over query/key positions")
    batch = broadcast_merge(ctx, parts, tuple(ctx.out.shape[:-2]), "attention over unsliceable batch dims")
    for b in batch:
        ctx.tag_batch(b)
    return Lab((*batch, lq.dims[-2], lv.dims[-1]))


def _einsum_terms(eq: str, ndims: list[int]) -> tuple[list[list[str]], list[str]] | None:
    """Per operand its dims as letters (``...`` expanded to fresh names, right-aligned as it broadcasts), and the
    output's; None for a form not modelled (a wrong count of operands)."""
    eq = eq.replace(" ", "")
    lhs, arrow, rhs = eq.partition("->")
    terms = lhs.split(",")
    if len(terms) != len(ndims):
        return None
    ell = max((n - len(t.replace("...", "")) for t, n in zip(terms, ndims, strict=True) if "..." in t), default=0)
    names = [f"...{k}" for k in range(ell)]

    def expand(term: str, nd: int | None) -> list[str]:
        if "..." not in term:
            return list(term)
        head, _, tail = term.partition("...")
        k = (nd - len(head) - len(tail)) if nd is not None else ell
        return [*head, *names[ell - k :], *tail]

    ins = [expand(t, n) for t, n in zip(terms, ndims, strict=True)]
    if arrow:
        out = expand(rhs, None)
    else:  # implicit output: the broadcast dims, then every letter used once, in alphabetical order
        letters = [c for t in ins for c in t if not c.startswith("...")]
        out = [*names, *sorted(c for c in set(letters) if letters.count(c) == 1)]
    return ins, out


@register_rule(torch.einsum, "einsum")
def einsum(ctx: Ctx) -> Lab:
    """``torch.einsum(eq, *operands)``: every letter is a dim shared by the operands that name it, position by
    position: removing index i of a letter from all of them removes exactly its terms (a contracted letter) or
    its output slice (a kept letter). Operands that name a letter with its full size are sliced together there;
    one that cannot be sliced there (an input, a constant) freezes the others, one broadcast from size 1 is
    frozen."""
    eq, *ops = ctx.args
    if len(ops) == 1 and isinstance(ops[0], (list, tuple)):
        ops = list(ops[0])
    tensors = [o for o in ops if ctx.is_tensor(o)]
    labs = [ctx.lab(t) for t in tensors]
    parsed = _einsum_terms(eq, [lab.ndim for lab in labs]) if isinstance(eq, str) else None
    if parsed is None or any(len(set(t)) != len(t) for t in parsed[0]) or len(set(parsed[1])) != len(parsed[1]):
        ctx.freeze(labs, "an einsum form prunefx does not model (repeated letters in one operand)")
        return Lab.none(ctx.out.dim())
    ins, out = parsed
    size = dict(zip(out, ctx.out.shape, strict=True))
    for t, term in zip(tensors, ins, strict=True):
        for c, n in zip(term, ctx.shape(t), strict=True):
            size[c] = max(size.get(c, 1), n)
    merged: dict[str, np.ndarray | None] = {}
    for c, n in size.items():
        parts = [(Lab((lab.dims[term.index(c)],)), (ctx.shape(t)[term.index(c)],))
                 for t, lab, term in zip(tensors, labs, ins, strict=True) if c in term]
        why = ("einsum contracts it with a dim that cannot be sliced" if c not in out
               else "einsum with an operand whose dim cannot be sliced")
        (merged[c],) = broadcast_merge(ctx, parts, (n,), why)
        if c in out and merged[c] is not None and len(parts) > 1:
            ctx.tag_batch(merged[c])  # a dim every product is taken per index of (attention heads)
    return Lab(tuple(merged[c] for c in out))
