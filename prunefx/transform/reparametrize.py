"""Slice a parametrized tensor (weight_norm's weight) as the plain tensor it computes; its parametrization stays.

The kept rows of the computed tensor are handed to the parametrization's ``right_inverse``, which re-derives its
inputs from them (weight_norm: g and v), so the pruned module computes exactly the original's kept rows. The module
keeps its parametrization objects and class (removing and registering them again would edit the class that
copies of the module share).
"""

from __future__ import annotations

import torch
from torch import nn
from torch.nn.utils import parametrize

from prunefx.analysis.parametrized import parametrization_problem
from prunefx.plan import PlanError


def parametrized_names(model: nn.Module, names: list[str]) -> set[str]:
    """Which of ``names`` are parametrized tensors; PlanError (nothing changed) for one that cannot be re-derived."""
    found = set()
    for name in names:
        owner, _, attr = name.rpartition(".")
        try:
            module = model.get_submodule(owner)
        except AttributeError:
            continue
        if not parametrize.is_parametrized(module, attr):
            continue
        problem = parametrization_problem(module, attr)
        if problem is not None:
            raise PlanError(f"{name}: {problem}")
        found.add(name)
    return found


def slice_parametrized(model: nn.Module, slices: dict[str, list[tuple[int, torch.Tensor]]]) -> None:
    """Set each parametrized tensor of ``slices`` to the kept positions of what it computes, along each dim."""
    for name, dims in slices.items():
        owner, _, attr = name.rpartition(".")
        module = model.get_submodule(owner)
        with torch.no_grad():
            value = getattr(module, attr).detach()
            for dim, idx in dims:
                value = value.index_select(dim, idx.to(value.device))
            module.parametrizations[attr].right_inverse(value)  # its inputs re-derived, resized in place


__all__ = ["parametrized_names", "slice_parametrized"]
