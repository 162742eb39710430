"""Model outputs: the one walk over their structures, the check that there is one, and per-model-type outputs
whose channel count may change.

Model outputs are frozen: a consumer outside the model expects their widths. Some libraries return extra tensors
only for their shapes (ultralytics' Detect returns ``feats``, the neck outputs, next to its predictions); their
plugins declare them here.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import torch
import torch.fx as fx
from torch import nn
from torch.utils._pytree import SUPPORTED_NODES, GetAttrKey, MappingKey, keystr, tree_flatten_with_path

from prunefx._registry import put
from prunefx.capture.values import VALUE_KEY
from prunefx.errors import PrunefxError

_FREE_OUTPUTS: dict[type, tuple[str, ...]] = {}


class OutputError(PrunefxError):
    """The model's forward returns no tensor, so nothing fixes which of its channels may be removed."""


def register_free_outputs(model_type: type, *keys: str, replace: bool = False) -> None:
    """Declare dict keys of ``model_type``'s outputs whose channels may be pruned."""
    put(_FREE_OUTPUTS, model_type, tuple(keys), what="register_free_outputs", replace=replace)


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


def output_leaves(out: Any, free: tuple[str, ...] = ()) -> list[tuple[str, Any]]:
    """(path such as ``out['logits'].feats``, leaf) of every leaf of a model output, without the ``free`` dict keys.

    One pytree walk: tuples, lists, dicts, namedtuples, registered types (Hugging Face's ModelOutput) by pytree;
    dataclasses pytree does not know by their fields, here, so nothing is registered globally for them."""
    leaves: list[tuple[str, Any]] = []

    def walk(x: Any, path: tuple) -> None:
        for sub, leaf in tree_flatten_with_path(x, is_leaf=_unregistered_dataclass)[0]:
            at = path + tuple(sub)
            if any(isinstance(k, MappingKey) and k.key in free for k in at):
                continue
            if _unregistered_dataclass(leaf):
                for f in dataclasses.fields(leaf):
                    walk(getattr(leaf, f.name), (*at, GetAttrKey(f.name)))
            else:
                leaves.append(("out" + keystr(at), leaf))

    walk(out, ())
    return leaves


def _unregistered_dataclass(x: Any) -> bool:
    return dataclasses.is_dataclass(x) and not isinstance(x, type) and type(x) not in SUPPORTED_NODES


def require_tensor_output(gm: fx.GraphModule, model_name: str) -> None:
    """Raise :class:`OutputError` when the captured forward returns no tensor (None, sizes, constants)."""
    node = next((n for n in reversed(gm.graph.nodes) if n.op == "output"), None)
    if node is None:
        return
    value = fx.node.map_arg(node.args[0], lambda n: n.meta.get(VALUE_KEY))
    leaves = [leaf for _, leaf in output_leaves(value)]
    if any(isinstance(leaf, torch.Tensor) for leaf in leaves):
        return
    # export's graphs return a flat tuple: a forward that returns None returns (None,) there
    what = "None" if all(leaf is None for leaf in leaves) else f"no tensor prunefx can reach ({_short(value)})"
    # Outputs are what freezes the last layers' widths: without one every channel would look prunable.
    raise OutputError(f"{model_name}'s forward returns {what}: there is no output to keep equal, so nothing can be "
                      "pruned or checked; return the model's output tensor(s) from forward (as they are, or in "
                      "tuples, lists, dicts, dataclasses or registered pytree types)")


def _short(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= 80 else text[:77] + "..."
