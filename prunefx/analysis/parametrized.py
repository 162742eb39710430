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
    if module is None or not parametrize.is_parametrized(module, attr):
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


__all__ = ["parametrization_problem"]
