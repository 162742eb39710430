"""nn.MultiheadAttention: one pruning unit per head, the embedding dims as ordinary channels.

Head h owns rows ``h*head_dim:(h+1)*head_dim`` of each of the q, k and v projections (``in_proj_weight`` /
``in_proj_bias`` side by side, or ``q_proj_weight``, ``k_proj_weight``, ``v_proj_weight`` when key/value widths
differ), the same positions of ``bias_k`` / ``bias_v``, and those input columns of ``out_proj``. The query, key and
value embedding dims meet the projections' columns and the output is ``out_proj``'s rows, so the residual stream
around the layer is an ordinary group. The heads live only inside the module's forward: they are recorded with
``ctx.inside`` and the oracle masks them in the weights. The stock forward derives head_dim from embed_dim, so a
pruned layer runs as ``prunefx.transform.mha.PrunedMultiheadAttention`` (the rewrite swaps the class).
"""

from __future__ import annotations

import operator

import numpy as np
from torch import nn

from prunefx.analysis.labels import Lab
from prunefx.analysis.roles import CHANNEL, IN, OUT
from prunefx.analysis.rules._context import Ctx
from prunefx.analysis.rules._registry import register_rule
from prunefx.analysis.rules.layers import pin

_ARGS = ("query", "key", "value", "key_padding_mask", "need_weights", "attn_mask", "average_attn_weights", "is_causal")


def _weights_used(node) -> bool:
    """The attention-weights output (item 1 of the returned pair) reaches some op."""
    for user in node.users:
        if user.op == "call_function" and user.target is operator.getitem and len(user.args) > 1:
            if user.args[1] == 0:
                continue
            if user.args[1] in (1, -1) and not user.users:
                continue
        return True  # item 1 read, or the pair passed on whole
    return False


def _heads_blocked(ctx: Ctx, m: nn.MultiheadAttention, mask) -> str | None:
    """Why the heads of this call cannot be removed exactly, or None."""
    out = ctx.out
    if isinstance(out, (tuple, list)) and out[1] is not None and _weights_used(ctx.node):
        return "its attention weights are used (need_weights=True): they average over every head"
    if mask is not None and ctx.is_tensor(mask) and ctx.value(mask).dim() == 3:
        return "a 3-D attn_mask holds one mask per head of the original head count"
    return None


def _columns(ctx: Ctx, param: str, atoms: np.ndarray | None, width: int) -> None:
    """The input columns of a projection: the input's channels, or pinned when this call's input cannot be sliced."""
    if atoms is None:
        pin(ctx, param, 1, width)
    else:
        ctx.param(param, 1, atoms)


def multihead_attention(ctx: Ctx, swappable: bool = True) -> tuple:
    """Rule for a call of nn.MultiheadAttention (``swappable``: the rewrite may give it the pruned forward)."""
    m, name = ctx.module, ctx.name
    who = f"nn.MultiheadAttention '{name}'"
    q, k, v = (ctx.arg(i, a) for i, a in enumerate(_ARGS[:3]))
    labs = [ctx.lab(x) for x in (q, k, v)]
    for lab in labs:  # batch rows stay; sequence positions are mixed by the attention
        ctx.freeze([d for d in lab.dims[:-1] if d is not None], f"{who} mixes sequence positions")
    kpm, mask = ctx.arg(3, "key_padding_mask"), ctx.arg(5, "attn_mask")
    for extra in (kpm, mask):
        if extra is not None and ctx.is_tensor(extra):
            ctx.freeze(ctx.lab(extra), f"{who}: an attention mask indexes positions, not channels")
    out = ctx.out
    n_out = m.out_proj.weight.shape[0]
    if not swappable:  # a subclass keeps its own class: the stock forward needs embed_dim == heads x head_dim
        ctx.freeze([lab.dims[-1] for lab in labs],
                   f"{who} is a subclass ({type(m).__name__}): its widths are tied to its heads")
        return tuple(Lab.none(t.dim()) if t is not None else None for t in out)
    heads, hd = ctx.fresh(m.num_heads), m.head_dim
    rows = np.repeat(heads, hd)  # head h: rows h*hd:(h+1)*hd of each projection
    ctx.note(heads, f"one unit per head of {name}: {hd} rows each of q, k, v and {hd} columns of out_proj")
    blocked = _heads_blocked(ctx, m, mask)
    if blocked is not None:
        ctx.freeze(heads, f"{who}: {blocked}")
    ins = [lab.dims[-1] for lab in labs]
    if m._qkv_same_embed_dim:
        ctx.inside(f"{name}.in_proj_weight", 0, np.tile(rows, 3))
        given = [a for a in ins if a is not None]
        if len(given) < 3:  # one weight's columns serve q, k and v: all of them or none
            ctx.freeze(given, f"{who}: query, key and value share in_proj_weight's columns and one cannot be pruned")
        for a in given[1:]:
            ctx.union(given[0], a, f"{who}: query, key and value share in_proj_weight's columns")
        _columns(ctx, f"{name}.in_proj_weight", given[0] if len(given) == 3 else None, m.in_proj_weight.shape[1])
    else:
        for proj, a in zip(("q_proj_weight", "k_proj_weight", "v_proj_weight"), ins, strict=True):
            ctx.inside(f"{name}.{proj}", 0, rows)
            _columns(ctx, f"{name}.{proj}", a, getattr(m, proj).shape[1])
    if ins[0] is not None:
        ctx.member(IN, ins[0])
    if m.in_proj_bias is not None:
        ctx.inside(f"{name}.in_proj_bias", 0, np.tile(rows, 3))
    for b in ("bias_k", "bias_v"):
        if getattr(m, b) is not None:
            ctx.inside(f"{name}.{b}", 2, rows)
    ctx.inside(f"{name}.out_proj.weight", 1, rows)
    ctx.member(IN, rows, name=f"{name}.out_proj")  # first: it names the group
    ctx.member(CHANNEL, rows)  # the inner width: the layer's MACs scale with its heads (plan.cost)
    res = ctx.fresh(n_out)
    ctx.param(f"{name}.out_proj.weight", 0, res)
    if m.out_proj.bias is not None:
        ctx.param(f"{name}.out_proj.bias", 0, res)
    ctx.member(OUT, res, name=f"{name}.out_proj")
    ctx.member(OUT, res)
    first = out[0]
    return (Lab((*([None] * (first.dim() - 1)), res)), None if out[1] is None else Lab.none(out[1].dim()))


@register_rule(nn.MultiheadAttention)
def _stock(ctx: Ctx) -> tuple:
    # a subclass that kept the stock forward cannot take the pruned one without losing its class
    return multihead_attention(ctx, swappable=type(ctx.module) is nn.MultiheadAttention)
