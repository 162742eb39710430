"""Parametrized tensors (``torch.nn.utils.parametrize``: weight_norm, a user's own): which a rewrite can re-derive.

A pruned module's parametrized weight is sliced as the plain tensor it computes and its parametrizations are
registered again on the slice (each ``right_inverse`` re-derives its inputs, e.g. weight_norm's g and v), so the
pruned weight equals the original's kept rows exactly. That needs parametrizations without state of their own
sized by the tensor (spectral_norm's power-iteration vectors are) and with a ``right_inverse``.
"""

from __future__ import annotations

import itertools

from torch import nn
from torch.nn.utils import parametrize


def parametrization_problem(module: nn.Module | None, attr: str) -> str | None:
    """Why ``module.attr``'s parametrizations cannot be registered again on a slice of it; None when they can."""
    # parametrize keeps a module's parametrizations in a child named "parametrizations": looking for that child
    # first spares nn.Module.__getattr__'s AttributeError on every parameter of every other module (hot: per record)
    if module is None or "parametrizations" not in module._modules or not parametrize.is_parametrized(module, attr):
        return None
    for p in module.parametrizations[attr]:
        state = [n for n, _ in itertools.chain(p.named_parameters(), p.named_buffers())]
        if state:
            return (f"{attr} is parametrized by {type(p).__name__}, whose own state ({', '.join(state)}) is sized by "
                    "the tensor; remove it before pruning (torch.nn.utils.parametrize.remove_parametrizations)")
        if getattr(type(p), "right_inverse", None) is None:
            return (f"{attr} is parametrized by {type(p).__name__}, which has no right_inverse to re-derive its "
                    "inputs from a sliced tensor; give it one or remove it before pruning")
    return None


def read_problem(modules: dict[str, nn.Module], qualname: str) -> str | None:
    """The problem of the parametrization a tensor ``M.parametrizations.attr...`` belongs to (its inputs and state,
    which a torch.export graph reads in place of ``M.attr``); None for any other tensor."""
    parts = qualname.split(".")
    if "parametrizations" not in parts[:-1]:
        return None
    i = len(parts) - 1 - parts[::-1].index("parametrizations")
    return parametrization_problem(modules.get(".".join(parts[:i])), parts[i + 1]) if i + 1 < len(parts) else None


__all__ = ["parametrization_problem", "read_problem"]
