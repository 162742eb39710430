"""Per-model-type defaults for outputs whose channel count may change.

Model outputs are frozen: a consumer outside the model expects their widths. Some libraries return
extra tensors only for their shapes: ultralytics' Detect returns ``feats`` (the neck outputs) next to
its predictions, and the loss and decoder read only their spatial sizes.
"""

from __future__ import annotations

import sys

from torch import nn

_FREE_OUTPUTS: dict[type, tuple[str, ...]] = {}


def register_free_outputs(model_type: type, *keys: str) -> None:
    """Declare dict keys of ``model_type``'s outputs whose channels may be pruned."""
    _FREE_OUTPUTS[model_type] = tuple(keys)


def default_free_outputs(model: nn.Module) -> tuple[str, ...]:
    # Looked up lazily: importing ultralytics here would run before prunefx's setup_offline(); a model
    # that is an ultralytics model means ultralytics is already imported.
    tasks = sys.modules.get("ultralytics.nn.tasks")
    if tasks is not None:
        _FREE_OUTPUTS.setdefault(tasks.BaseModel, ("feats",))
    for cls in type(model).__mro__:
        if cls in _FREE_OUTPUTS:
            return _FREE_OUTPUTS[cls]
    return ()
