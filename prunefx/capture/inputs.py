"""Example inputs of a call ``model(*args, **kwargs)``, bound to the forward's positional parameters.

Every stage (capture, analysis, FLOPs, latency, verify, export, re-fit) runs ``model(*inputs)``, so keyword
inputs are bound once, here, by the forward's signature: ``{"input_ids": ids, "pixel_values": px}`` becomes the
positional tuple with each parameter between them at its default (``None`` for an HF model's unused inputs)::

    prunefx.prune(model, {"input_ids": ids, "attention_mask": mask})      # a mapping: keyword inputs
    prunefx.prune(model, prunefx.Inputs(x, mask=m))                        # positional and keyword together

A parameter that cannot be given by position (keyword-only, or caught by ``**kwargs``) is refused with a line
that says so: the graph takes positional inputs.
"""

from __future__ import annotations

import inspect
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import torch
from torch import nn
from torch.fx._lazy_graph_module import _LazyGraphModule

from prunefx.errors import PrunefxError

_POSITIONAL = (inspect.Parameter.POSITIONAL_ONLY, inspect.Parameter.POSITIONAL_OR_KEYWORD)


@dataclass(frozen=True, init=False, eq=False)
class Inputs:
    """Positional and keyword example inputs together: ``Inputs(x, attention_mask=m)``."""

    args: tuple[Any, ...]
    kwargs: dict[str, Any]

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        object.__setattr__(self, "args", tuple(args))  # frozen: set once, here
        object.__setattr__(self, "kwargs", dict(kwargs))

    def __repr__(self) -> str:
        parts = [_brief(a) for a in self.args] + [f"{k}={_brief(v)}" for k, v in self.kwargs.items()]
        return f"Inputs({', '.join(parts)})"


def _brief(x: Any) -> str:
    if isinstance(x, torch.Tensor):
        return f"tensor({'x'.join(map(str, x.shape)) or 'scalar'}, {str(x.dtype).removeprefix('torch.')})"
    return repr(x)


def structured(example_inputs: Sequence[Any]) -> bool:
    """Some input is a container (list, tuple, dict) or None: the graph's placeholders are the inputs' tensor leaves
    (None has none: forward sees None itself and takes the branch the model takes without that input)."""
    return any(x is None or isinstance(x, (list, tuple, dict)) for x in example_inputs)


def input_kinds(inputs: Sequence[Any]) -> tuple[str, ...]:
    """Each positional input's kind: a tensor's dtype (``"int64"``), ``"none"``, or ``"other"``."""
    return tuple("none" if x is None else str(x.dtype).removeprefix("torch.") if isinstance(x, torch.Tensor)
                 else "other" for x in inputs)


def rebuilt(shapes: Sequence[Sequence[int]], kinds: Sequence[str]) -> tuple[Any, ...] | None:
    """Zero inputs of the recorded shapes and kinds (integer zeros are valid token ids); None when some input
    was not a plain tensor or None, so it cannot be rebuilt from the record."""
    if not kinds or "other" in kinds or sum(k != "none" for k in kinds) != len(shapes):
        return None
    it = iter(shapes)
    return tuple(None if k == "none" else torch.zeros(tuple(next(it)), dtype=getattr(torch, k)) for k in kinds)


def positional(model: nn.Module, example_inputs: Any) -> tuple[Any, ...]:
    """``example_inputs`` as the positional tuple of ``model(*inputs)``.

    A tensor is one input; a list or tuple is the positional inputs (a dict inside it is one input, e.g. a batch
    mapping); a mapping or :class:`Inputs` holds keyword inputs, bound by ``model.forward``'s signature.
    """
    if isinstance(example_inputs, torch.Tensor):
        return (example_inputs,)
    if isinstance(example_inputs, Inputs):
        return bind(model, example_inputs.args, example_inputs.kwargs)
    if isinstance(example_inputs, Mapping):
        return bind(model, (), example_inputs)
    if isinstance(example_inputs, (list, tuple)):
        return tuple(example_inputs)
    return (example_inputs,)


def bind(model: nn.Module, args: tuple[Any, ...], kwargs: Mapping[str, Any]) -> tuple[Any, ...]:
    """``model(*args, **kwargs)``'s inputs as positional ones: each parameter up to the last given keyword is
    filled, from the keywords or with its default. PrunefxError names a keyword that cannot be placed."""
    args = tuple(args)
    if not kwargs:
        return args
    name = type(model).__name__
    _LazyGraphModule.force_recompile(model)  # a lazily built GraphModule's forward is a stub until its first call
    try:
        params = list(inspect.signature(model.forward).parameters.values())
    except (TypeError, ValueError) as exc:
        raise PrunefxError(f"{name}.forward has no readable signature ({exc}); pass the inputs by position") from None
    slots = [p for p in params if p.kind in _POSITIONAL]
    index = {p.name: i for i, p in enumerate(slots)}
    for key in kwargs:
        i = index.get(key)
        if i is None:
            if any(p.name == key and p.kind is p.KEYWORD_ONLY for p in params) or any(
                    p.kind is p.VAR_KEYWORD for p in params):
                raise PrunefxError(
                    f"keyword input {key!r} cannot be given by position to {name}.forward (keyword-only, or taken "
                    "by **kwargs) and prunefx captures positional inputs; wrap the model in a module whose forward "
                    "takes it positionally")
            raise PrunefxError(f"keyword input {key!r} is not a parameter of {name}.forward "
                               f"({', '.join(index) or 'none'}); name the inputs as forward does")
        if i < len(args):
            raise PrunefxError(f"keyword input {key!r} is {name}.forward's positional input {i}, which the "
                               "positional inputs already give; give it once")
    last = max(index[k] for k in kwargs)
    out = list(args)
    for p in slots[len(args): last + 1]:
        if p.name in kwargs:
            out.append(kwargs[p.name])
        elif p.default is not p.empty:
            out.append(p.default)
        else:
            raise PrunefxError(f"{name}.forward needs {p.name!r} (it has no default) before the keyword inputs "
                               f"{', '.join(map(repr, kwargs))}; give it too")
    return tuple(out)


__all__ = ["Inputs", "bind", "input_kinds", "positional", "rebuilt", "structured"]
