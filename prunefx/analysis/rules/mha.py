"""nn.MultiheadAttention: one pruning unit per head, the embedding dims as ordinary channels.

Head h owns rows ``h*head_dim:(h+1)*head_dim`` of each of the q, k and v projections (``in_proj_weight`` /
``in_proj_bias`` side by side, or ``q_proj_weight``, ``k_proj_weight``, ``v_proj_weight`` when key/value widths
differ), the same positions of ``bias_k`` / ``bias_v``, and those input columns of ``out_proj``. The query, key and
value embedding dims meet the projections' columns and the output is ``out_proj``'s rows, so the residual stream
around the layer is an ordinary group. The heads live only inside the module's forward: they are recorded with
``ctx.inside`` and the oracle masks them in the weights. The stock forward derives head_dim from embed_dim, so a
pruned layer runs as ``prunefx.transform.mha.PrunedMultiheadAttention`` (the rewrite swaps the class).

``F.multi_head_attention_forward`` called from a model's own forward (open_clip's ``AttentionPool2d``) gets the same
head units, bound to the graph's labels of the weights it is passed (packed ``in_proj_weight`` or the separate
``q/k/v_proj_weight``). Its head_dim is ``query.shape[-1] // num_heads`` and its q projection is square, so a head
can only leave with head_dim of the query's channels: query channel i goes with the head of row i, and the literal
``num_heads`` (and a literal ``embed_dim_to_check``) are recorded for the rewrite.
"""

from __future__ import annotations

import operator

import numpy as np
import torch.nn.functional as F
from torch import nn

from prunefx.analysis.labels import Lab, SizeRef
from prunefx.analysis.roles import CHANNEL, IN, OUT
from prunefx.analysis.rules._algebra import weight_owner
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


def _heads_blocked(ctx: Ctx, mask) -> str | None:
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


def _mixed_positions(ctx: Ctx, who: str, labs: list[Lab], masks: tuple) -> None:
    """Freeze every dim of q, k, v but the embedding (attention mixes positions) and every dim of the masks."""
    for lab in labs:  # batch rows stay; sequence positions are mixed by the attention
        ctx.freeze([d for d in lab.dims[:-1] if d is not None], f"{who} mixes sequence positions")
    for extra in masks:
        if extra is not None and ctx.is_tensor(extra):
            ctx.freeze(ctx.lab(extra), f"{who}: an attention mask indexes positions, not channels")


def _head_rows(ctx: Ctx, who: str, unit: str, out_proj: str, num_heads: int, hd: int, mask) -> np.ndarray:
    """One fresh unit per head (frozen when this call blocks removing heads); its label of the inner rows."""
    heads = ctx.fresh(num_heads)
    ctx.note(heads, f"one unit per head of {unit}: {hd} rows each of q, k, v and {hd} columns of {out_proj}")
    blocked = _heads_blocked(ctx, mask)
    if blocked is not None:
        ctx.freeze(heads, f"{who}: {blocked}")
    return np.repeat(heads, hd)  # head h: rows h*hd:(h+1)*hd of each projection


def _outputs(ctx: Ctx, res: np.ndarray | None) -> tuple:
    """Labels of the (attention output, attention weights) pair: the output's last dim is out_proj's rows."""
    first, weights = ctx.out
    return (Lab((*([None] * (first.dim() - 1)), res)), None if weights is None else Lab.none(weights.dim()))


def multihead_attention(ctx: Ctx, swappable: bool = True) -> tuple:
    """Rule for a call of nn.MultiheadAttention (``swappable``: the rewrite may give it the pruned forward)."""
    m, name = ctx.module, ctx.name
    who = f"nn.MultiheadAttention '{name}'"
    q, k, v = (ctx.arg(i, a) for i, a in enumerate(_ARGS[:3]))
    labs = [ctx.lab(x) for x in (q, k, v)]
    mask = ctx.arg(5, "attn_mask")
    _mixed_positions(ctx, who, labs, (ctx.arg(3, "key_padding_mask"), mask))
    out = ctx.out
    n_out = m.out_proj.weight.shape[0]
    if not swappable:  # a subclass keeps its own class: the stock forward needs embed_dim == heads x head_dim
        ctx.freeze([lab.dims[-1] for lab in labs],
                   f"{who} is a subclass ({type(m).__name__}): its widths are tied to its heads")
        return tuple(Lab.none(t.dim()) if t is not None else None for t in out)
    rows = _head_rows(ctx, who, name, "out_proj", m.num_heads, m.head_dim, mask)
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
    return _outputs(ctx, res)


@register_rule(nn.MultiheadAttention)
def _stock(ctx: Ctx) -> tuple:
    # a subclass that kept the stock forward cannot take the pruned one without losing its class
    return multihead_attention(ctx, swappable=type(ctx.module) is nn.MultiheadAttention)


# F.multi_head_attention_forward's parameters in order, and the defaults of those that have one
_F_ARGS = ("query", "key", "value", "embed_dim_to_check", "num_heads", "in_proj_weight", "in_proj_bias", "bias_k",
           "bias_v", "add_zero_attn", "dropout_p", "out_proj_weight", "out_proj_bias", "training", "key_padding_mask",
           "need_weights", "attn_mask", "use_separate_proj_weight", "q_proj_weight", "k_proj_weight", "v_proj_weight",
           "static_k", "static_v", "average_attn_weights", "is_causal")
_F_DEFAULTS = {"training": True, "need_weights": True, "use_separate_proj_weight": False, "average_attn_weights": True,
               "is_causal": False}


def _fn_arg(ctx: Ctx, name: str):
    """The argument ``name`` of this call as traced (a node or a literal), positional or keyword."""
    i = _F_ARGS.index(name)
    return ctx.args[i] if len(ctx.args) > i else ctx.kwargs.get(name, _F_DEFAULTS.get(name))


def _literal_at(ctx: Ctx, name: str) -> tuple | None:
    """``("args", i)`` when argument ``name`` is a literal int at position i of the node, else None."""
    # torch's dispatch (handle_torch_function) passes the 13 leading parameters by position, so fx records them so
    i = _F_ARGS.index(name)
    return ("args", i) if len(ctx.args) > i and type(ctx.args[i]) is int else None


def _join(ctx: Ctx, a: np.ndarray | None, b: np.ndarray | None, why: str) -> None:
    """``a`` and ``b`` index the same channels: coupled, or frozen when one side cannot be sliced."""
    if a is not None and b is not None:
        ctx.union(a, b)
    elif a is not None or b is not None:
        ctx.freeze(a if a is not None else b, why)


def _unsupported(ctx: Ctx) -> str | None:
    """The form of this call the rule does not map, or None."""
    if _fn_arg(ctx, "add_zero_attn") is not False:
        return "add_zero_attn is not False"
    for name in ("bias_k", "bias_v", "static_k", "static_v"):
        if _fn_arg(ctx, name) is not None:
            return f"{name} is given"
    if type(_fn_arg(ctx, "use_separate_proj_weight")) is not bool:
        return "use_separate_proj_weight is not a literal of the traced call"
    if _literal_at(ctx, "num_heads") is None:
        return "num_heads is not a literal int of the traced call"
    return None


def _linear_members(ctx: Ctx, w, rows: np.ndarray | None, cols: np.ndarray | None) -> None:
    """The nn.Linear whose weight this is (read, not called) follows it: its in/out_features are re-derived."""
    owner = weight_owner(ctx, w)
    if owner is not None and isinstance(ctx.engine.modules.get(owner), nn.Linear):
        for role, atoms in ((OUT, rows), (IN, cols)):
            if atoms is not None:
                ctx.member(role, atoms, name=owner)


@register_rule(F.multi_head_attention_forward)
def multi_head_attention_forward(ctx: Ctx) -> tuple:
    """Rule for ``F.multi_head_attention_forward``: the heads of nn.MultiheadAttention, bound to the weights passed."""
    who = f"F.multi_head_attention_forward in '{ctx.owner() or 'the model'}'"
    q, k, v = (_fn_arg(ctx, a) for a in _F_ARGS[:3])
    labs = [ctx.lab(x) for x in (q, k, v)]
    refused = _unsupported(ctx)
    if refused is not None:  # every channel the call touches stays
        inputs = [_fn_arg(ctx, a) for a in _F_ARGS]
        ctx.freeze([ctx.lab(a) for a in inputs if ctx.is_tensor(a)], f"{who}: not supported: {refused}")
        return tuple(None if t is None else Lab.none(t.dim()) for t in ctx.out)
    mask = _fn_arg(ctx, "attn_mask")
    _mixed_positions(ctx, who, labs, (_fn_arg(ctx, "key_padding_mask"), mask))
    num_heads, embed = ctx.value(_fn_arg(ctx, "num_heads")), ctx.shape(q)[-1]
    unit = ctx.owner() or ctx.node.name
    out_w = _fn_arg(ctx, "out_proj_weight")
    hd = embed // num_heads
    rows = _head_rows(ctx, who, unit, "out_proj_weight", num_heads, hd, mask)
    ctx.constant(_literal_at(ctx, "num_heads"), rows[::hd])  # the head count the forward passes
    ins = [lab.dims[-1] for lab in labs]
    # head_dim = query.shape[-1] // num_heads and q's projection is square: a head leaves with as many query channels
    _join(ctx, ins[0], rows, f"{who}: head_dim is the query's width // num_heads and the query cannot be sliced")
    check = _fn_arg(ctx, "embed_dim_to_check")
    if ins[0] is not None:
        size = ctx.aval(check)
        if _literal_at(ctx, "embed_dim_to_check") is not None:
            ctx.constant(_literal_at(ctx, "embed_dim_to_check"), ins[0])
        elif isinstance(size, SizeRef) and size.exact and len(size.sources) == 1:
            _join(ctx, ins[0], size.sources[0], f"{who}: embed_dim_to_check")  # read from a dim of that width
        else:
            ctx.freeze(ins[0], f"{who}: embed_dim_to_check is neither a literal nor a size of one dim")
    if _fn_arg(ctx, "use_separate_proj_weight"):
        for name, a in zip(("q_proj_weight", "k_proj_weight", "v_proj_weight"), ins, strict=True):
            w = _fn_arg(ctx, name)
            lw = ctx.lab(w)
            _join(ctx, lw.dims[0], rows, f"{who}: {name}'s rows cannot be sliced per head")
            _join(ctx, lw.dims[1], a, f"{who}: {name}'s columns meet an input that cannot be sliced")
            _linear_members(ctx, w, rows if lw.dims[0] is not None else None, lw.dims[1])
    else:
        w = _fn_arg(ctx, "in_proj_weight")
        lw = ctx.lab(w)
        _join(ctx, lw.dims[0], np.tile(rows, 3), f"{who}: in_proj_weight's rows cannot be sliced per head")
        for a in ins:  # one weight's columns serve q, k and v
            _join(ctx, lw.dims[1], a, f"{who}: query, key and value share in_proj_weight's columns")
        _linear_members(ctx, w, np.tile(rows, 3) if lw.dims[0] is not None else None, lw.dims[1])
    bias = _fn_arg(ctx, "in_proj_bias")
    if bias is not None and ctx.is_tensor(bias):
        _join(ctx, ctx.lab(bias).dims[0], np.tile(rows, 3), f"{who}: in_proj_bias cannot be sliced per head")
    lo = ctx.lab(out_w)
    _join(ctx, lo.dims[1], rows, f"{who}: out_proj_weight's columns cannot be sliced per head")
    res = lo.dims[0]
    out_b = _fn_arg(ctx, "out_proj_bias")
    if out_b is not None and ctx.is_tensor(out_b):
        lb = ctx.lab(out_b).dims[0]
        _join(ctx, res, lb, f"{who}: out_proj_weight and out_proj_bias sliced differently")
        res = res if lb is not None else None
    _linear_members(ctx, out_w, res, lo.dims[1])
    return _outputs(ctx, res)
