"""Shared plumbing for the metrics: the error type, input normalisation and a forward that leaves no trace."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator, Mapping
from typing import Any

import torch
from torch import nn
from torch.utils._pytree import tree_flatten, tree_map_only

from prunefx._state import attributes_kept
from prunefx.capture.inputs import Inputs, positional
from prunefx.errors import PrunefxError


class MetricsError(PrunefxError, ValueError):
    """A model or its example inputs cannot be measured; the message names the problem and the fix."""


def check_model(model: Any, caller: str) -> None:
    """Raise a MetricsError saying what to pass unless ``model`` is an ``nn.Module``."""
    if not isinstance(model, nn.Module):
        raise MetricsError(
            f"{caller}() needs a torch.nn.Module, got {type(model).__name__}. "
            "Pass the model object itself, e.g. torchvision.models.resnet50(weights=None)."
        )


def as_args(example_inputs: Any, model: nn.Module | None = None) -> tuple[Any, ...]:
    """Normalise example inputs to the positional-argument tuple of ``model(*args)``.

    A tensor is one argument; a tuple or list is the argument list itself; a mapping or
    :class:`~prunefx.capture.inputs.Inputs` holds keyword inputs, bound by ``model``'s forward.
    """
    if isinstance(example_inputs, (Mapping, Inputs)):
        if model is None:
            raise MetricsError("keyword example inputs need the model to bind them to its forward's parameters")
        args = positional(model, example_inputs)
    else:
        args = tuple(example_inputs) if isinstance(example_inputs, (tuple, list)) else (example_inputs,)
    if not any(isinstance(t, torch.Tensor) for t in tree_flatten(args)[0]):
        raise MetricsError(
            f"example_inputs holds no tensor (got {type(example_inputs).__name__}). "
            "Pass a tensor or a tuple of the forward's positional arguments, e.g. torch.randn(1, 3, 224, 224)."
        )
    return args


def input_shapes(args: tuple[Any, ...]) -> tuple[tuple[int, ...], ...]:
    """Shapes of every tensor among ``args``, in order."""
    return tuple(tuple(t.shape) for t in tree_flatten(args)[0] if isinstance(t, torch.Tensor))


def batch_size(args: tuple[Any, ...]) -> int:
    """Leading dimension of the first tensor with one (1 for a scalar input)."""
    for t in tree_flatten(args)[0]:
        if isinstance(t, torch.Tensor) and t.dim() > 0:
            return int(t.shape[0])
    return 1


def rejected(exc: BaseException, args: tuple[Any, ...]) -> MetricsError:
    """A MetricsError for a forward that raised on the example inputs."""
    return MetricsError(
        f"the model rejected example inputs of shape {list(input_shapes(args))}: {type(exc).__name__}: {exc}. "
        "Pass inputs the model's forward accepts (batch, channels, image size, dtype and device)."
    )


def meta_forward(model: nn.Module, args: tuple[Any, ...]) -> Any:
    """Run ``model(*args)`` on meta tensors: shapes propagate, nothing is computed or allocated.

    ``functional_call`` swaps parameters and buffers for meta stand-ins only for the call, so the real
    weights and BatchNorm statistics cannot move. Raises whatever the forward raises when an op has
    no meta kernel or shapes depend on data; callers then fall back to a real forward.
    """
    state = {
        name: t.to("meta")
        for name, t in (*model.named_parameters(remove_duplicate=False), *model.named_buffers(remove_duplicate=False))
    }
    meta_args = tree_map_only(torch.Tensor, lambda t: t.to("meta"), args)
    return torch.func.functional_call(model, state, meta_args, strict=False, tie_weights=True)


@contextlib.contextmanager
def untouched(model: nn.Module) -> Iterator[None]:
    """Put ``model`` in eval mode for the block, then restore every module's attributes as they were
    (:func:`prunefx._state.attributes_kept`: cached anchors, flags, hooks installed by the forward)."""
    with attributes_kept(model):
        model.eval()
        yield
