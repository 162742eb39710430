"""Rules for the ATen ops of a ``torch.export`` capture: mostly the torch-level rules, registered again.

ATen ops take their arguments positionally in schema order, which for the ops below is the order of the torch
function the shared rule reads. What differs: layers are functional (``aten.linear(x, weight, bias)``; the rules
record members under the module owning the weight), sizes are literals (export specialises every shape; ``-1``
survives), indexing is spelled ``slice`` / ``select`` / ``index``, and masks and positions are built from
``arange`` / ``new_ones`` / ``cumsum``.
"""

from __future__ import annotations

import numpy as np
import torch

from prunefx.analysis.labels import Lab
from prunefx.analysis.roles import IN, OUT
from prunefx.analysis.rules._algebra import norm_dim, op_name, pointwise, reshape, size_args, weight_owner
from prunefx.analysis.rules._context import Ctx
from prunefx.analysis.rules._registry import register_rule
from prunefx.analysis.rules.elementwise import glu
from prunefx.analysis.rules.index import constant_slice
from prunefx.analysis.rules.linalg import (
    _contract,
    _group_norm_fn,
    batch_norm_fn,
    conv_fn,
    einsum,
    linear_fn,
    matmul,
    norm_fn,
    sdpa,
)
from prunefx.analysis.rules.reduce import NORMS, REDUCTIONS, pad, reduction, softmax, spatial
from prunefx.analysis.rules.shape import (
    cat,
    expand,
    flatten,
    permute,
    positional,
    split,
    squeeze,
    stack,
    transpose,
    unbind,
    unflatten,
    unsqueeze,
)  # fmt: skip

aten = torch.ops.aten

# ---- element-wise: operands spanning a dim with the output are sliced together along it -------------------------
register_rule(
    aten.add.Tensor, aten.add.Scalar, aten.add_.Tensor, aten.sub.Tensor, aten.sub.Scalar, aten.rsub.Scalar,
    aten.mul.Tensor, aten.mul.Scalar, aten.mul_.Tensor, aten.div.Tensor, aten.div.Scalar, aten.div.Tensor_mode,
    aten.pow.Tensor_Scalar, aten.pow.Tensor_Tensor, aten.maximum.default, aten.minimum.default, aten.min.other,
    aten.max.other, aten.where.self, aten.where.ScalarOther, aten.where.ScalarSelf, aten.masked_fill.Scalar,
    aten.masked_fill.Tensor, aten.masked_fill_.Scalar, aten.eq.Tensor, aten.eq.Scalar, aten.ne.Tensor,
    aten.ne.Scalar, aten.lt.Tensor, aten.lt.Scalar, aten.le.Tensor, aten.le.Scalar, aten.gt.Tensor, aten.gt.Scalar,
    aten.ge.Tensor, aten.ge.Scalar, aten.__and__.Tensor, aten.__or__.Tensor, aten.logical_and.default,
    aten.logical_or.default, aten.logical_not.default, aten.bitwise_not.default, aten.fill_.Tensor,
    aten.fill_.Scalar, aten.lerp.Scalar, aten.addcmul.default, aten.clamp.default, aten.clamp_min.default,
    aten.clamp_max.default, aten.floor_divide.default, aten.remainder.Scalar,
    aten.neg.default, aten.rsqrt.default, aten.sqrt.default, aten.exp.default, aten.log.default, aten.abs.default,
    aten.sin.default, aten.cos.default, aten.tanh.default, aten.sigmoid.default, aten.relu.default,
    aten.relu_.default, aten.silu.default, aten.silu_.default, aten.gelu.default, aten.hardswish.default,
    aten.hardsigmoid.default, aten.leaky_relu.default, aten.elu.default, aten.softplus.default, aten.mish.default,
    aten.erf.default, aten.reciprocal.default, aten.sign.default, aten.square.default, aten.floor.default,
    aten.ceil.default, aten.round.default, aten.hardtanh.default, aten.nan_to_num.default,
    aten.dropout.default, aten.feature_dropout.default, aten.alpha_dropout.default, aten.dropout_.default,
    aten.feature_dropout_.default, aten.alpha_dropout_.default, aten.div_.Tensor, aten.div_.Scalar,
    aten.sub_.Tensor, aten.add_.Scalar, aten.mul_.Scalar,
    aten.to.dtype, aten.to.dtype_layout, aten.to.device, aten._to_copy.default, aten.alias.default,
    aten.contiguous.default, aten.clone.default, aten.detach.default, aten.zeros_like.default,
    aten.ones_like.default, aten.full_like.default, aten.empty_like.default, aten.lift_fresh_copy.default,
)(pointwise)  # fmt: skip

register_rule(aten.einsum.default)(einsum)  # (equation, [operands]): the torch-level rule reads both forms


@register_rule(aten.type_as.default)
def type_as(ctx: Ctx) -> Lab:
    return ctx.lab(ctx.args[0])


@register_rule(aten.arange.default, aten.arange.start, aten.arange.start_step, aten.scalar_tensor.default)
def creation(ctx: Ctx) -> Lab:
    """Positions or a scalar made from numbers alone: no input's channels flow into it."""
    return Lab.none(ctx.out.dim())


# constant-filled factories -> index of their size list
FILLED = {
    aten.zeros.default: 0, aten.ones.default: 0, aten.full.default: 0, aten.empty.memory_format: 0,
    aten.new_zeros.default: 1, aten.new_ones.default: 1, aten.new_full.default: 1, aten.new_empty.default: 1,
}  # fmt: skip


@register_rule(*FILLED)
def filled(ctx: Ctx) -> Lab:
    """A constant-filled tensor of literal sizes: each dim longer than one gets channels counted by its literal."""
    # export specialises torch.zeros(b, x.shape[1]) to literals; the fx rule (create.factory) reads the coupling from
    # the size's provenance. Here an element-wise op couples the dim to the channels it meets (a scan's zero state
    # times x): a slice of a constant fill is the same fill, so the literal follows the kept count. Channels that
    # meet nothing sliceable are frozen by the op that meets them; a literal left in no group is dropped.
    i = FILLED[ctx.node.target]
    ctx.freeze_values(ctx.args[i + 1 :])  # full's fill value: a number
    dims: list[np.ndarray | None] = []
    for d, size in enumerate(ctx.args[i]):
        if isinstance(size, int) and not isinstance(size, bool) and size > 1:
            dims.append(ctx.fresh(size))
            ctx.constant(("args", i, d), dims[-1])
        else:
            dims.append(None)
    return Lab(tuple(dims))


@register_rule(aten._assert_tensor_metadata.default, aten._assert_scalar.default)
def assertion(ctx: Ctx) -> None:
    """Export's runtime checks: no output."""
    return None


# ---- layers (the shared rules record members under the module owning the weight) ---------------------------------
register_rule(aten.linear.default)(linear_fn)
register_rule(aten.layer_norm.default)(norm_fn)


@register_rule(aten.group_norm.default)
def group_norm(ctx: Ctx) -> Lab:
    """aten.group_norm(x, num_groups, weight, bias, eps, cudnn_enabled): F.group_norm's arguments, same rule."""
    return _group_norm_fn(ctx, ctx.lab(ctx.args[0]), [a for a in ctx.args[2:4] if ctx.is_tensor(a)])


register_rule(aten.batch_norm.default, aten.instance_norm.default)(batch_norm_fn)  # per-channel weight and stats
register_rule(aten.conv1d.default, aten.conv2d.default, aten.conv3d.default,  # .padding: padding="same" or "valid"
              aten.conv1d.padding, aten.conv2d.padding, aten.conv3d.padding)(conv_fn)
register_rule(aten.matmul.default, aten.mm.default, aten.bmm.default)(matmul)
register_rule(aten.scaled_dot_product_attention.default)(sdpa)


@register_rule(aten.addmm.default)
def addmm(ctx: Ctx) -> Lab:
    """``bias + x @ w`` with ``w`` stored (in, out): Hugging Face's ``Conv1D`` (GPT-2)."""
    b, x, w = ctx.args[0], ctx.args[1], ctx.args[2]
    lb, lx, lw = ctx.lab(b), ctx.lab(x), ctx.lab(w)
    _contract(ctx, lx.dims[-1], lw.dims[0])
    out = lw.dims[1]
    bias = lb.dims[-1] if lb.ndim else None
    if out is not None and bias is not None:
        ctx.union(out, bias)
    elif (out is None) != (bias is None) and ctx.shape(b)[-1:] == ctx.out.shape[-1:]:
        ctx.freeze([lw, lb], "addmm weight and bias sliced differently")
        out = None
    if lx.dims[0] is not None:
        ctx.freeze(lx.dims[0], "rows of an addmm")
    owner = weight_owner(ctx, w)
    if owner is not None:
        for role, atoms in ((IN, lw.dims[0]), (OUT, out)):
            if atoms is not None:
                ctx.member(role, atoms, name=owner)
    return Lab((None, out))


@register_rule(aten.embedding.default)
def embedding(ctx: Ctx) -> Lab:
    """``embedding(weight, ids)``: rows are looked up by id (frozen), columns are the channels produced."""
    w, ids = ctx.args[0], ctx.args[1]
    lw = ctx.lab(w)
    if lw.dims[0] is not None:
        ctx.freeze(lw.dims[0], "embedding rows are looked up by token id")
    ctx.freeze(ctx.lab(ids), "used as indices into an embedding")
    owner = weight_owner(ctx, w)
    if owner is not None and lw.dims[1] is not None:
        ctx.member(OUT, lw.dims[1], name=owner)
    return Lab((*([None] * ctx.value(ids).dim()), lw.dims[1]))


# ---- shapes -----------------------------------------------------------------------------------------------------
@register_rule(aten.view.default, aten.reshape.default, aten._unsafe_view.default)
def view(ctx: Ctx) -> Lab:
    return reshape(ctx, ctx.args[0], tuple(ctx.out.shape), size_args(ctx, 1))


register_rule(aten.flatten.using_ints)(flatten)
register_rule(aten.unflatten.int)(unflatten)
register_rule(aten.permute.default)(permute)
register_rule(aten.transpose.int)(transpose)
register_rule(aten.unsqueeze.default)(unsqueeze)
register_rule(aten.squeeze.dim, aten.squeeze.dims, aten.squeeze.default)(squeeze)
register_rule(aten.expand.default)(expand)
register_rule(aten.cat.default, aten.concat.default)(cat)
register_rule(aten.stack.default)(stack)
register_rule(aten.split.Tensor, aten.split_with_sizes.default, aten.chunk.default)(split)
register_rule(aten.unbind.int)(unbind)
register_rule(aten.roll.default, aten.flip.default, aten.select.int, aten.narrow.default)(positional)


@register_rule(aten.slice.Tensor)
def slice_(ctx: Ctx) -> Lab:
    """``aten.slice(x, dim, start, end, step)``: a slice keeping every position passes; literal bounds with step 1 cut
    the channels as ``x[:, a:b]`` does (the same rule); anything else freezes a channel dim."""
    lab, shape = ctx.lab(ctx.args[0]), ctx.shape(ctx.args[0])
    d = norm_dim(ctx.arg(1, "dim", 0), lab.ndim)
    if lab.dims[d] is None or ctx.out.shape[d] == shape[d]:
        return lab
    start, end, step = ctx.arg(2, "start"), ctx.arg(3, "end"), ctx.arg(4, "step", 1)
    if len(ctx.args) >= 4 and all(isinstance(v, int) and not isinstance(v, bool) for v in (start, end)) and step == 1:
        return lab.replace(d, constant_slice(ctx, lab.dims[d], start, end, shape[d], (("args", 2), ("args", 3))))
    ctx.freeze(lab.dims[d], "a constant slice of a channel dim")
    return lab.replace(d, None)


@register_rule(aten.index.Tensor)
def index(ctx: Ctx) -> Lab:
    """Advanced indexing: the indexed dims lose their channels (frozen); one run of indexed dims keeps the rest."""
    lab, idx = ctx.lab(ctx.args[0]), list(ctx.args[1])
    hit, d = [], 0
    for i in idx:  # a k-dim boolean mask indexes k dims (x[x > 0] all of them), any other index one
        v = None if i is None else ctx.value(i)
        k = v.dim() if isinstance(v, torch.Tensor) and v.dtype in (torch.bool, torch.uint8) else 1
        hit.extend(range(d, d + k) if i is not None else ())
        d += k
    for d in hit:
        if lab.dims[d] is not None:
            ctx.freeze(lab.dims[d], "advanced (tensor) indexing")
    out_nd = ctx.out.dim()
    if not hit or hit != list(range(hit[0], hit[-1] + 1)):
        ctx.freeze(lab, "advanced indexing that moves dims")
        return Lab.none(out_nd)
    lead, rest = lab.dims[: hit[0]], lab.dims[hit[-1] + 1 :]
    return Lab((*lead, *([None] * (out_nd - len(lead) - len(rest))), *rest))


@register_rule(aten.cumsum.default, aten.gather.default)  # aten.diff: reduce.diff (dim is its third argument)
def along_dim(ctx: Ctx) -> Lab:
    """Ops that mix positions along one dim: fine off the channel dims, frozen on them."""
    lab = ctx.lab(ctx.args[0])
    d = norm_dim(ctx.arg(1, "dim", -1), lab.ndim)
    if lab.dims[d] is not None:
        ctx.freeze(lab.dims[d], f"{op_name(ctx.node.target)} along a channel dim")
    if ctx.node.target is aten.gather.default:  # the index tensor picks positions in every dim
        ctx.freeze(lab, "gather")
        return Lab.none(ctx.out.dim())
    return lab.replace(d, None)


# ---- reductions, softmax, pooling, padding ----------------------------------------------------------------------
for _op, _separable in (
    (aten.sum.dim_IntList, True), (aten.sum.default, True), (aten.mean.dim, False), (aten.mean.default, False),
    (aten.amax.default, False), (aten.amin.default, False), (aten.var.correction, False),
    (aten.std.correction, False), (aten.logsumexp.default, False), (aten.argmax.default, False),
    (aten.linalg_vector_norm.default, False), (aten.max.dim, False), (aten.min.dim, False),
    (aten.max.default, False), (aten.min.default, False), (aten.argmin.default, False),
    (aten.prod.dim_int, False), (aten.any.dim, False), (aten.all.dim, False),
):  # fmt: skip
    REDUCTIONS[_op] = _separable
    register_rule(_op)(reduction)
NORMS.add(aten.linalg_vector_norm.default)  # (x, ord, dim, keepdim)
register_rule(aten.glu.default)(glu)
register_rule(aten.softmax.int, aten._softmax.default, aten.log_softmax.int, aten._log_softmax.default)(softmax)
register_rule(
    aten.adaptive_avg_pool1d.default, aten.adaptive_avg_pool2d.default, aten.avg_pool2d.default,
    aten.max_pool2d.default, aten.upsample_nearest2d.vec, aten.upsample_bilinear2d.vec, aten.upsample_bicubic2d.vec,
)(spatial)  # fmt: skip
register_rule(aten.pad.default, aten.constant_pad_nd.default)(pad)
