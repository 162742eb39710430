"""Output shapes of the hottest ops on meta tensors, without running torch's meta kernels.

The shape pass gives every node a meta tensor. For elementwise ops, ``cat`` and adaptive average pooling torch's meta
kernels are Python decompositions (type promotion, stride and broadcast checks) that cost 50-250 us a call: a third
of an EfficientNet's analysis. The answers are simple, so :func:`fast_value` computes them for the cases it can state
exactly (all tensors on meta, one floating dtype, Python numbers beside them) and returns None for every other call,
which then runs torch's kernel as before. Results are contiguous: the analysis reads shapes and dtypes, not strides.
A size mismatch raises as the kernel would (``torch.broadcast_shapes``, the checks of ``cat``).
"""

from __future__ import annotations

import operator
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

_BINARY: set[Any] = {
    operator.add, operator.sub, operator.mul, operator.truediv, torch.add, torch.sub, torch.mul, torch.div,
    torch.maximum, torch.minimum,
}
_UNARY: set[Any] = {
    torch.relu, torch.sigmoid, torch.tanh, torch.neg, torch.exp, torch.abs, operator.neg,
    F.relu, F.relu6, F.silu, F.gelu, F.hardswish, F.hardsigmoid, F.leaky_relu, F.elu, F.mish, F.softplus,
}
_BINARY_METHODS = {"add", "sub", "mul", "div", "__add__", "__sub__", "__mul__", "__truediv__", "__radd__",
                   "__rmul__"}  # fmt: skip
_UNARY_METHODS = {"relu", "sigmoid", "tanh", "neg", "exp", "abs", "contiguous", "float"}
_ADAPTIVE_AVG = {F.adaptive_avg_pool1d: 1, F.adaptive_avg_pool2d: 2, F.adaptive_avg_pool3d: 3}
_ADAPTIVE_AVG_MODULES = {nn.AdaptiveAvgPool1d: 1, nn.AdaptiveAvgPool2d: 2, nn.AdaptiveAvgPool3d: 3}
_NUMBER = (int, float, bool)  # Python scalars never change a floating tensor's dtype


def _dtype(tensors: list[torch.Tensor]) -> torch.dtype | None:
    """The one floating dtype of these meta tensors; None when they are not all meta tensors of one such dtype."""
    dtype = tensors[0].dtype
    if not dtype.is_floating_point:
        return None
    for t in tensors:
        if t.device.type != "meta" or t.dtype != dtype:
            return None
    return dtype


def _elementwise(operands: tuple, options: dict) -> torch.Tensor | None:
    tensors = [a for a in operands if isinstance(a, torch.Tensor)]
    if not tensors or len(tensors) + sum(isinstance(a, _NUMBER) for a in operands) != len(operands):
        return None
    if any(k not in ("alpha", "inplace", "negative_slope", "approximate", "beta", "threshold") or
           (k == "inplace" and v) for k, v in options.items()):
        return None  # out=, rounding_mode=, an in-place call: the kernel's business
    dtype = _dtype(tensors)
    if dtype is None:
        return None
    shape = tensors[0].shape if len(tensors) == 1 else torch.broadcast_shapes(*(t.shape for t in tensors))
    return torch.empty(shape, dtype=dtype, device="meta")


def _cat(tensors: Any, dim: int = 0) -> torch.Tensor | None:
    if not isinstance(tensors, (list, tuple)) or not tensors or not all(isinstance(t, torch.Tensor) for t in tensors):
        return None
    dtype = _dtype(list(tensors))
    ndim = tensors[0].dim()
    if dtype is None or ndim == 0 or any(t.dim() != ndim for t in tensors):
        return None  # legacy 1-d empty tensors, 0-d errors: the kernel's business
    d = dim + ndim if dim < 0 else dim
    if not 0 <= d < ndim:
        raise IndexError(f"Dimension out of range (expected to be in range of [{-ndim}, {ndim - 1}], but got {dim})")
    shape = list(tensors[0].shape)
    for t in tensors[1:]:
        for i, (a, b) in enumerate(zip(shape, t.shape, strict=True)):
            if i != d and a != b:
                raise RuntimeError(f"Sizes of tensors must match except in dimension {d}. Expected size {a} but got "
                                   f"size {b} for tensor number {list(tensors).index(t)} in the list.")
        shape[d] += t.shape[d]
    return torch.empty(shape, dtype=dtype, device="meta")


def _adaptive_avg(x: Any, output_size: Any, k: int) -> torch.Tensor | None:
    if not isinstance(x, torch.Tensor) or x.dim() not in (k + 1, k + 2) or _dtype([x]) is None:
        return None
    size = [output_size] * k if isinstance(output_size, int) else list(output_size or ())
    if len(size) != k or not all((s is None and k > 1) or (isinstance(s, int) and s >= 0) for s in size):
        return None  # None keeps a dim in 2-d and 3-d pooling only
    spatial = x.shape[x.dim() - k :]
    if any(n == 0 for n in spatial):
        return None
    out = [n if s is None else s for n, s in zip(spatial, size, strict=True)]
    return torch.empty((*x.shape[: x.dim() - k], *out), dtype=x.dtype, device="meta")


def fast_function(target: Any, args: tuple, kwargs: dict) -> torch.Tensor | None:
    """``target(*args, **kwargs)``'s meta result when it is one this module states exactly, else None."""
    try:
        if target in _BINARY and len(args) == 2:
            return _elementwise(args, kwargs)
        if target in _UNARY and len(args) == 1:
            return _elementwise(args, kwargs)
        if (target is torch.cat or target is torch.concat) and len(args) + len(kwargs) <= 2:
            if set(kwargs) - {"tensors", "dim"}:
                return None
            return _cat(kwargs.get("tensors", args[0] if args else None),
                        kwargs.get("dim", args[1] if len(args) > 1 else 0))
        k = _ADAPTIVE_AVG.get(target)
        if k is not None and len(args) + len(kwargs) == 2 and set(kwargs) <= {"output_size"}:
            return _adaptive_avg(args[0], kwargs.get("output_size", args[1] if len(args) > 1 else None), k)
    except TypeError:  # an unhashable target
        return None
    return None


def fast_method(name: str, args: tuple, kwargs: dict) -> torch.Tensor | None:
    """``args[0].name(*args[1:], **kwargs)``'s meta result when this module states it exactly, else None."""
    if name in _BINARY_METHODS and len(args) == 2:
        return _elementwise(args, kwargs)
    if name in _UNARY_METHODS and len(args) == 1 and not kwargs:
        if name == "float" and (not isinstance(args[0], torch.Tensor) or args[0].dtype != torch.float32):
            return None
        return _elementwise(args, kwargs)
    return None


def fast_module(module: nn.Module, args: tuple, kwargs: dict) -> torch.Tensor | None:
    """``module(*args)``'s meta result for the built-in modules this module states exactly, else None."""
    k = _ADAPTIVE_AVG_MODULES.get(type(module))
    if k is not None and len(args) == 1 and not kwargs:
        return _adaptive_avg(args[0], module.output_size, k)
    return None


__all__ = ["fast_function", "fast_method", "fast_module"]
