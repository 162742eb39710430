"""Per-model-type outputs whose channel count may change.

Model outputs are frozen: a consumer outside the model expects their widths. Some libraries return extra tensors
only for their shapes (ultralytics' Detect returns ``feats``, the neck outputs, next to its predictions); their
plugins declare them here.
"""

from __future__ import annotations

from typing import Any

from torch import nn

_FREE_OUTPUTS: dict[type, tuple[str, ...]] = {}


def register_free_outputs(model_type: type, *keys: str) -> None:
    """Declare dict keys of ``model_type``'s outputs whose channels may be pruned."""
    _FREE_OUTPUTS[model_type] = tuple(keys)


def default_free_outputs(model: nn.Module) -> tuple[str, ...]:
    """The free output keys registered for the model's type or its nearest registered base class."""
    for cls in type(model).__mro__:
        if cls in _FREE_OUTPUTS:
            return _FREE_OUTPUTS[cls]
    return ()


def drop_keys(out: Any, keys: tuple[str, ...]) -> Any:
    """The output structure without dict entries named in ``keys`` (outputs whose width is free)."""
    if isinstance(out, dict):
        return {k: drop_keys(v, keys) for k, v in out.items() if k not in keys}
    if isinstance(out, (list, tuple)):
        return [drop_keys(v, keys) for v in out]
    return out
