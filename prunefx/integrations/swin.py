"""torchvision Swin (V1, V2 and the video Swin3D) attention heads: a rule for the fx-wrapped
``shifted_window_attention`` (and ``shifted_window_attention_3d``), a fixer, and a forward that takes the inner width
from the weights.

Head h owns rows ``h*head_dim:(h+1)*head_dim`` of each of q, k and v in ``qkv.weight`` / ``qkv.bias``, those input
columns of ``proj.weight``, column h of ``relative_position_bias_table`` (V1) or row h of ``cpb_mlp``'s last layer
and of ``logit_scale`` (V2). torchvision's function reads C from the input and splits qkv into
``(3, num_heads, C // num_heads)``, so a layer whose heads were pruned runs as a ``PrunedShiftedWindowAttention``
(or ``...V2``), whose forward calls :func:`pruned_shifted_window_attention`: the same computation with the inner
width read from ``qkv_weight`` and the output width from ``proj_weight``; Swin3D's layers likewise run as a
``PrunedShiftedWindowAttention3d``.
"""

from __future__ import annotations

import math

import numpy as np
import torch
import torch.fx
import torch.nn.functional as F
from torch import Tensor
from torchvision.models import swin_transformer as tv_swin
from torchvision.models.swin_transformer import ShiftedWindowAttention, ShiftedWindowAttentionV2
from torchvision.models.video import swin_transformer as tv_swin3d
from torchvision.models.video.swin_transformer import ShiftedWindowAttention3d

from prunefx.analysis.labels import Lab
from prunefx.analysis.roles import CHANNEL, IN, OUT
from prunefx.analysis.rules import register_rule
from prunefx.analysis.rules._algebra import weight_owner
from prunefx.analysis.rules._context import Ctx
from prunefx.transform.fixers import register_fixer


def pruned_shifted_window_attention(  # adapted from torchvision.models.swin_transformer (BSD-3-Clause)
    input: Tensor,
    qkv_weight: Tensor,
    proj_weight: Tensor,
    relative_position_bias: Tensor,
    window_size: list[int],
    num_heads: int,
    shift_size: list[int],
    attention_dropout: float = 0.0,
    dropout: float = 0.0,
    qkv_bias: Tensor | None = None,
    proj_bias: Tensor | None = None,
    logit_scale: Tensor | None = None,
    training: bool = True,
) -> Tensor:
    """torchvision's ``shifted_window_attention`` with head_dim = (qkv rows / 3) / num_heads instead of C / num_heads
    and the output width of ``proj_weight``; equal to it when nothing was pruned."""
    B, H, W, _ = input.shape
    inner, c_out = qkv_weight.shape[0] // 3, proj_weight.shape[0]
    head_dim = inner // num_heads
    pad_r = (window_size[1] - W % window_size[1]) % window_size[1]
    pad_b = (window_size[0] - H % window_size[0]) % window_size[0]
    x = F.pad(input, (0, 0, 0, pad_r, 0, pad_b))
    _, pad_H, pad_W, C = x.shape
    shift_size = shift_size.copy()
    if window_size[0] >= pad_H:
        shift_size[0] = 0
    if window_size[1] >= pad_W:
        shift_size[1] = 0
    if sum(shift_size) > 0:
        x = torch.roll(x, shifts=(-shift_size[0], -shift_size[1]), dims=(1, 2))
    num_windows = (pad_H // window_size[0]) * (pad_W // window_size[1])
    x = x.view(B, pad_H // window_size[0], window_size[0], pad_W // window_size[1], window_size[1], C)
    x = x.permute(0, 1, 3, 2, 4, 5).reshape(B * num_windows, window_size[0] * window_size[1], C)
    if logit_scale is not None and qkv_bias is not None:
        qkv_bias = qkv_bias.clone()
        length = qkv_bias.numel() // 3
        qkv_bias[length : 2 * length].zero_()
    qkv = F.linear(x, qkv_weight, qkv_bias)
    qkv = qkv.reshape(x.size(0), x.size(1), 3, num_heads, head_dim).permute(2, 0, 3, 1, 4)
    q, k, v = qkv[0], qkv[1], qkv[2]
    if logit_scale is not None:
        attn = F.normalize(q, dim=-1) @ F.normalize(k, dim=-1).transpose(-2, -1)
        attn = attn * torch.clamp(logit_scale, max=math.log(100.0)).exp()
    else:
        attn = (q * head_dim**-0.5).matmul(k.transpose(-2, -1))
    attn = attn + relative_position_bias
    if sum(shift_size) > 0:
        attn_mask = x.new_zeros((pad_H, pad_W))
        h_slices = ((0, -window_size[0]), (-window_size[0], -shift_size[0]), (-shift_size[0], None))
        w_slices = ((0, -window_size[1]), (-window_size[1], -shift_size[1]), (-shift_size[1], None))
        count = 0
        for h in h_slices:
            for w in w_slices:
                attn_mask[h[0] : h[1], w[0] : w[1]] = count
                count += 1
        attn_mask = attn_mask.view(pad_H // window_size[0], window_size[0], pad_W // window_size[1], window_size[1])
        attn_mask = attn_mask.permute(0, 2, 1, 3).reshape(num_windows, window_size[0] * window_size[1])
        attn_mask = attn_mask.unsqueeze(1) - attn_mask.unsqueeze(2)
        attn_mask = attn_mask.masked_fill(attn_mask != 0, (-100.0)).masked_fill(attn_mask == 0, 0.0)
        attn = attn.view(x.size(0) // num_windows, num_windows, num_heads, x.size(1), x.size(1))
        attn = attn + attn_mask.unsqueeze(1).unsqueeze(0)
        attn = attn.view(-1, num_heads, x.size(1), x.size(1))
    attn = F.softmax(attn, dim=-1)
    attn = F.dropout(attn, p=attention_dropout, training=training)
    x = attn.matmul(v).transpose(1, 2).reshape(x.size(0), x.size(1), inner)
    x = F.linear(x, proj_weight, proj_bias)
    x = F.dropout(x, p=dropout, training=training)
    x = x.view(B, pad_H // window_size[0], pad_W // window_size[1], window_size[0], window_size[1], c_out)
    x = x.permute(0, 1, 3, 2, 4, 5).reshape(B, pad_H, pad_W, c_out)
    if sum(shift_size) > 0:
        x = torch.roll(x, shifts=(shift_size[0], shift_size[1]), dims=(1, 2))
    return x[:, :H, :W, :].contiguous()


torch.fx.wrap("pruned_shifted_window_attention")  # one node in a trace, as torchvision's own


def pruned_shifted_window_attention_3d(  # adapted from torchvision.models.video.swin_transformer (BSD-3-Clause)
    input: Tensor,
    qkv_weight: Tensor,
    proj_weight: Tensor,
    relative_position_bias: Tensor,
    window_size: list[int],
    num_heads: int,
    shift_size: list[int],
    attention_dropout: float = 0.0,
    dropout: float = 0.0,
    qkv_bias: Tensor | None = None,
    proj_bias: Tensor | None = None,
    training: bool = True,
) -> Tensor:
    """torchvision's ``shifted_window_attention_3d`` with head_dim = (qkv rows / 3) / num_heads instead of
    C / num_heads and the output width of ``proj_weight``; equal to it when nothing was pruned."""
    b, t, h, w, _ = input.shape
    inner, c_out = qkv_weight.shape[0] // 3, proj_weight.shape[0]
    head_dim = inner // num_heads
    pad = tv_swin3d._compute_pad_size_3d((t, h, w), (window_size[0], window_size[1], window_size[2]))
    x = F.pad(input, (0, 0, 0, pad[2], 0, pad[1], 0, pad[0]))
    _, tp, hp, wp, c = x.shape
    n = (tp // window_size[0], hp // window_size[1], wp // window_size[2])
    if sum(shift_size) > 0:
        x = torch.roll(x, shifts=(-shift_size[0], -shift_size[1], -shift_size[2]), dims=(1, 2, 3))
    x = x.view(b, n[0], window_size[0], n[1], window_size[1], n[2], window_size[2], c)
    x = x.permute(0, 1, 3, 5, 2, 4, 6, 7).reshape(b * n[0] * n[1] * n[2], math.prod(window_size), c)
    qkv = F.linear(x, qkv_weight, qkv_bias)
    qkv = qkv.reshape(x.size(0), x.size(1), 3, num_heads, head_dim).permute(2, 0, 3, 1, 4)
    q, k, v = qkv[0], qkv[1], qkv[2]
    attn = (q * head_dim**-0.5).matmul(k.transpose(-2, -1)) + relative_position_bias
    if sum(shift_size) > 0:
        mask = tv_swin3d._compute_attention_mask_3d(x, (tp, hp, wp), tuple(window_size[:3]), tuple(shift_size[:3]))
        attn = attn.view(x.size(0) // mask.shape[0], mask.shape[0], num_heads, x.size(1), x.size(1))
        attn = (attn + mask.unsqueeze(1).unsqueeze(0)).view(-1, num_heads, x.size(1), x.size(1))
    attn = F.dropout(F.softmax(attn, dim=-1), p=attention_dropout, training=training)
    x = attn.matmul(v).transpose(1, 2).reshape(x.size(0), x.size(1), inner)
    x = F.dropout(F.linear(x, proj_weight, proj_bias), p=dropout, training=training)
    x = x.view(b, n[0], n[1], n[2], window_size[0], window_size[1], window_size[2], c_out)
    x = x.permute(0, 1, 4, 2, 5, 3, 6, 7).reshape(b, tp, hp, wp, c_out)
    if sum(shift_size) > 0:
        x = torch.roll(x, shifts=(shift_size[0], shift_size[1], shift_size[2]), dims=(1, 2, 3))
    return x[:, :t, :h, :w, :].contiguous()


torch.fx.wrap("pruned_shifted_window_attention_3d")


def _pruned_forward(m: ShiftedWindowAttention, x: Tensor, logit_scale: Tensor | None = None) -> Tensor:
    """A pruned Swin V1 or V2 (``logit_scale``) attention's forward: torchvision's call, the pruned function."""
    return pruned_shifted_window_attention(
        x, m.qkv.weight, m.proj.weight, m.get_relative_position_bias(), m.window_size,
        m.num_heads, shift_size=m.shift_size, attention_dropout=m.attention_dropout,
        dropout=m.dropout, qkv_bias=m.qkv.bias, proj_bias=m.proj.bias, logit_scale=logit_scale,
        training=m.training,
    )


class PrunedShiftedWindowAttention(ShiftedWindowAttention):
    """A Swin V1 attention whose heads were pruned (inner width != dim): the same parameters, the pruned forward."""

    def forward(self, x: Tensor) -> Tensor:
        return _pruned_forward(self, x)


class PrunedShiftedWindowAttentionV2(ShiftedWindowAttentionV2):
    """A Swin V2 attention whose heads were pruned: the same parameters, the pruned forward."""

    def forward(self, x: Tensor) -> Tensor:
        return _pruned_forward(self, x, self.logit_scale)


class PrunedShiftedWindowAttention3d(ShiftedWindowAttention3d):
    """A Swin3D attention whose heads were pruned: the same parameters, the pruned forward."""

    def forward(self, x: Tensor) -> Tensor:
        _, t, h, w, _ = x.shape
        window_size, shift_size = tv_swin3d._get_window_and_shift_size(
            self.shift_size.copy(), [t, h, w], self.window_size.copy())
        return pruned_shifted_window_attention_3d(
            x, self.qkv.weight, self.proj.weight, self.get_relative_position_bias(window_size), window_size,
            self.num_heads, shift_size=shift_size, attention_dropout=self.attention_dropout, dropout=self.dropout,
            qkv_bias=self.qkv.bias, proj_bias=self.proj.bias, training=self.training,
        )


def _join(ctx: Ctx, a: np.ndarray | None, b: np.ndarray | None, why: str) -> None:
    """``a`` and ``b`` index the same channels: coupled, or frozen when one side cannot be sliced."""
    if a is not None and b is not None:
        ctx.union(a, b)
    elif a is not None or b is not None:
        ctx.freeze(a if a is not None else b, why)


@register_rule(tv_swin.shifted_window_attention, pruned_shifted_window_attention,
               tv_swin3d.shifted_window_attention_3d, pruned_shifted_window_attention_3d)
def _window_attention(ctx: Ctx) -> Lab:
    x, wq, wp, rpb = (ctx.arg(i, n) for i, n in enumerate(("input", "qkv_weight", "proj_weight",
                                                             "relative_position_bias")))
    num_heads = ctx.arg(5, "num_heads")
    who = f"shifted_window_attention in '{ctx.owner()}'"
    lx, lq, lp = ctx.lab(x), ctx.lab(wq), ctx.lab(wp)
    ctx.freeze([d for d in lx.dims[:-1] if d is not None], f"{who} mixes window positions")
    _join(ctx, lx.dims[-1], lq.dims[1], f"{who}: qkv columns meet an input that cannot be sliced")
    heads = ctx.fresh(num_heads)
    hd = ctx.shape(wq)[0] // 3 // num_heads
    rows = np.repeat(heads, hd)  # head h: rows h*hd:(h+1)*hd of q, k and v
    ctx.note(heads, f"one unit per head of {ctx.owner()}: {hd} rows each of q, k, v and {hd} columns of proj")
    _join(ctx, lq.dims[0], np.tile(rows, 3), f"{who}: qkv rows cannot be sliced")
    _join(ctx, lp.dims[1], rows, f"{who}: proj columns cannot be sliced")
    out = lp.dims[0]
    for name, idx, atoms in (("qkv_bias", 9, np.tile(rows, 3)), ("proj_bias", 10, out)):
        b = ctx.arg(idx, name)
        if b is not None and ctx.is_tensor(b):
            _join(ctx, ctx.lab(b).dims[0], atoms, f"{who}: {name} cannot be sliced")
    lr = ctx.lab(rpb)  # (1, num_heads, N, N): one bias per head and pair of window positions
    ctx.freeze([d for i, d in enumerate(lr.dims) if i != lr.ndim - 3 and d is not None], f"{who}: position bias")
    _join(ctx, lr.dims[-3] if lr.ndim >= 3 else None, heads, f"{who}: the position bias is not sliced per head")
    if lr.ndim < 3:
        ctx.freeze(heads, f"{who}: the position bias is not sliced per head")
    logit = ctx.arg(11, "logit_scale")
    if logit is not None and ctx.is_tensor(logit):
        ll = ctx.lab(logit)
        _join(ctx, ll.dims[0], heads, f"{who}: logit_scale is not sliced per head")
    if len(ctx.args) > 5 and isinstance(ctx.args[5], int):
        ctx.constant(("args", 5), heads)  # follows the fixer's num_heads (owned literal)
    else:
        ctx.freeze(heads, f"{who}: num_heads is not a literal of the traced call")
    for w, lab in ((wq, lq), (wp, lp)):
        owner = weight_owner(ctx, w)
        if owner is not None and lab.ndim == 2:
            for role, atoms in ((OUT, lab.dims[0]), (IN, lab.dims[1])):
                if atoms is not None:
                    ctx.member(role, atoms, name=owner)
    if ctx.owner() in ctx.engine.modules:  # the attention module computes it all: its MACs scale with its heads
        for role, atoms in ((IN, lx.dims[-1]), (CHANNEL, rows), (OUT, out)):
            if atoms is not None:
                ctx.member(role, atoms, name=ctx.owner())
    return Lab((*([None] * (lx.ndim - 1)), out))


@register_rule(tv_swin._get_relative_position_bias, tv_swin3d._get_relative_position_bias)
def _relative_position_bias(ctx: Ctx) -> Lab:
    # table[index] -> (N, N, heads) -> (1, heads, N, N): the table's rows are looked up by relative position,
    # its columns are the heads
    table, index = ctx.lab(ctx.args[0]), ctx.lab(ctx.args[1])
    ctx.freeze([table.dims[0], *index.dims], "relative position bias rows are looked up by position")
    return Lab((None, table.dims[1], None, None))


@register_rule(tv_swin._patch_merging_pad)
def _patch_merging_pad(ctx: Ctx) -> Lab:
    # (..., H, W, C) padded to even H and W, then its four 2x2 phases concatenated on the last dim: (..., H/2, W/2, 4C);
    # every phase carries the same channels, and the sizes are read from the input, so nothing needs rewriting
    lx = ctx.lab(ctx.args[0])
    ctx.freeze([d for d in lx.dims[:-1] if d is not None], "patch merging takes 2x2 phases of positions")
    c = lx.dims[-1]
    return Lab((*([None] * (lx.ndim - 1)), None if c is None else np.tile(c, 4)))


@register_fixer(ShiftedWindowAttention, literals=True)
def _fix_window_attention(m: ShiftedWindowAttention, widths: dict) -> None:
    # forward passes self.num_heads (the literal recorded in its call); the widths come from the sliced weights
    v2 = isinstance(m, ShiftedWindowAttentionV2)
    m.num_heads = m.logit_scale.shape[0] if v2 else m.relative_position_bias_table.shape[1]
    inner, dim, out = m.qkv.weight.shape[0] // 3, m.qkv.weight.shape[1], m.proj.weight.shape[0]
    if type(m) in (ShiftedWindowAttention, ShiftedWindowAttentionV2) and not (inner == dim == out):
        m.__class__ = PrunedShiftedWindowAttentionV2 if v2 else PrunedShiftedWindowAttention


@register_fixer(ShiftedWindowAttention3d, literals=True)
def _fix_window_attention_3d(m: ShiftedWindowAttention3d, widths: dict) -> None:
    m.num_heads = m.relative_position_bias_table.shape[1]
    inner, dim, out = m.qkv.weight.shape[0] // 3, m.qkv.weight.shape[1], m.proj.weight.shape[0]
    if type(m) is ShiftedWindowAttention3d and not (inner == dim == out):
        m.__class__ = PrunedShiftedWindowAttention3d


__all__ = ["PrunedShiftedWindowAttention", "PrunedShiftedWindowAttention3d", "PrunedShiftedWindowAttentionV2",
           "pruned_shifted_window_attention", "pruned_shifted_window_attention_3d"]
