"""Element-wise ops: activations, dropout, casts (labels flow through) and arithmetic (labels merge)."""

from __future__ import annotations

import operator

import torch
import torch.nn.functional as F
from torch import nn

from prunefx.analysis.labels import Lab
from prunefx.analysis.rules._algebra import norm_dim, passthrough, pointwise
from prunefx.analysis.rules._context import Ctx
from prunefx.analysis.rules._registry import register_rule

# Shape-preserving ops of one tensor: removing a channel before them equals removing it after.
UNARY_MODULES = (
    nn.ReLU, nn.ReLU6, nn.SiLU, nn.GELU, nn.Hardswish, nn.Hardsigmoid, nn.Sigmoid, nn.Tanh, nn.LeakyReLU,
    nn.ELU, nn.SELU, nn.CELU, nn.Mish, nn.Softplus, nn.Softsign, nn.Hardtanh, nn.Tanhshrink, nn.Hardshrink,
    nn.Softshrink, nn.LogSigmoid, nn.Threshold, nn.RReLU, nn.Identity,
    nn.Dropout, nn.Dropout1d, nn.Dropout2d, nn.Dropout3d, nn.AlphaDropout, nn.FeatureAlphaDropout,
)
UNARY_FUNCTIONS = (
    F.relu, F.relu_, F.relu6, F.gelu, F.silu, F.hardswish, F.hardsigmoid, F.sigmoid, F.tanh, F.leaky_relu,
    F.elu, F.selu, F.celu, F.mish, F.softplus, F.softsign, F.hardtanh, F.logsigmoid, F.threshold, F.rrelu,
    F.dropout, F.dropout1d, F.dropout2d, F.dropout3d, F.alpha_dropout, F.feature_alpha_dropout,
    torch.relu, torch.relu_, torch.sigmoid, torch.tanh, torch.exp, torch.log, torch.abs, torch.neg, torch.sqrt,
    torch.rsqrt, torch.sin, torch.cos, torch.erf, torch.clamp, torch.clip, torch.sign, torch.square,
    torch.nan_to_num, torch.zeros_like, torch.ones_like, torch.empty_like, torch.rand_like, torch.randn_like,
    torch.full_like, torch.bernoulli, torch.floor, torch.ceil, torch.round, torch.reciprocal,
    operator.neg, operator.pos, operator.invert, torch.detach, torch.clone,
)
UNARY_METHODS = (
    "relu", "relu_", "sigmoid", "sigmoid_", "tanh", "tanh_", "exp", "exp_", "log", "abs", "neg", "sqrt",
    "rsqrt", "sin", "cos", "erf", "clamp", "clamp_", "clamp_min", "clamp_max", "clip", "sign", "square",
    "contiguous", "clone", "detach", "float", "half", "double", "bfloat16", "to", "type", "cpu", "cuda",
    "requires_grad_", "bernoulli_", "uniform_", "normal_", "zero_", "fill_", "floor", "ceil", "round",
    "reciprocal", "nan_to_num", "hardtanh", "hardtanh_",
)


@register_rule(*UNARY_MODULES, *UNARY_FUNCTIONS, *UNARY_METHODS)
def unary(ctx: Ctx) -> object:
    # clamp(x, max=c), full_like(x, c), fill_(c): a channel count in the other arguments is used as a number
    ctx.freeze_values((ctx.args[1:], dict(ctx.kwargs)))
    return passthrough(ctx)


# Arithmetic between tensors (and scalars): labels of operands spanning the same dim are merged.
BINARY = (
    operator.add, operator.sub, operator.mul, operator.truediv, operator.floordiv, operator.pow, operator.mod,
    operator.iadd, operator.isub, operator.imul, operator.itruediv, operator.eq, operator.ne, operator.lt,
    operator.le, operator.gt, operator.ge, operator.and_, operator.or_,
    torch.add, torch.sub, torch.subtract, torch.mul, torch.multiply, torch.div, torch.divide, torch.true_divide,
    torch.pow, torch.maximum, torch.minimum, torch.fmax, torch.fmin, torch.where, torch.lerp, torch.addcmul,
    torch.addcdiv, torch.atan2, torch.eq, torch.ne, torch.lt, torch.gt, torch.le, torch.ge, torch.logical_and,
    torch.logical_or, torch.masked_fill, torch.remainder, torch.fmod,
    "add", "add_", "sub", "sub_", "mul", "mul_", "div", "div_", "pow", "pow_", "maximum", "minimum",
    "masked_fill", "masked_fill_", "lerp", "lerp_", "addcmul", "addcmul_", "addcdiv", "eq", "ne", "lt", "gt",
    "le", "ge", "type_as", "expand_as", "where", "remainder", "fmod", "copy_",
)


@register_rule(*BINARY)
def binary(ctx: Ctx) -> object:
    if not isinstance(ctx.out, torch.Tensor):  # int arithmetic on sizes keeps provenance
        from prunefx.analysis.engine import size_arith

        return size_arith(ctx, ctx.out, [ctx.aval(a) for a in ctx.args])
    ctx.freeze_values((ctx.args, dict(ctx.kwargs)))  # x * x.size(1): a channel count used as a number
    if ctx.node.target in ("type_as",):
        return ctx.lab(ctx.args[0])
    if ctx.node.target == "expand_as":
        return pointwise(ctx, [ctx.args[0], ctx.args[1]])
    return pointwise(ctx, [*ctx.args, *ctx.kwargs.values()])


@register_rule(F.glu, torch.nn.functional.glu, nn.GLU, "glu")
def glu(ctx: Ctx) -> Lab:
    """glu(x, dim) = a * sigmoid(b) of x's halves along dim: channel i of a and of b make output channel i."""
    lab = ctx.lab(ctx.args[0])
    d = norm_dim(ctx.module.dim if isinstance(ctx.module, nn.GLU) else ctx.arg(1, "dim", -1), lab.ndim)
    arr = lab.dims[d]
    if arr is None:
        return lab
    half = len(arr) // 2  # glu refuses an odd size, so the capture already ran with an even one
    ctx.union(arr[:half], arr[half:], f"the two halves of glu(dim={d}) at {ctx.where()}")
    return lab.replace(d, arr[:half])
