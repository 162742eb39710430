"""Model families: how the library that owns a model saves, reads back, exports and costs it.

A SPEC resolves to a model and its family (:func:`prunefx.spec.load_spec`); the pipeline and the command line then
call the family instead of asking where the model came from. Plain torch models are :data:`TORCH`; an integration
registers its own by name, imported on first use, as ultralytics does in ``prunefx/integrations/__init__.py``::

    register_family("ultralytics", "prunefx.integrations.ultralytics.family:FAMILY")
    get_family("ultralytics").save(model, "pruned.pt", plan)
"""

from __future__ import annotations

import importlib
import os
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Protocol, runtime_checkable

from prunefx._registry import put

if TYPE_CHECKING:
    import torch
    from torch import nn

    from prunefx.onnx_export import Exported
    from prunefx.plan import PruningPlan


@runtime_checkable
class ModelFamily(Protocol):
    """What the pipeline and the command line need from the library a model belongs to."""

    name: str  # the registry key

    def save(self, model: nn.Module, path: str | os.PathLike[str], plan: PruningPlan | None) -> Path:
        """Write a (pruned) model to ``path`` as this family's files are written, atomically."""

    def load(self, path: str | os.PathLike[str], build: Callable[[], nn.Module], *,
             trust_checkpoint: bool = False) -> nn.Module:
        """Read back a file :meth:`save` wrote, weights-only unless ``trust_checkpoint``; ``build`` makes the base."""

    def export_onnx(self, model: nn.Module, example_inputs: Sequence[torch.Tensor], path: str | os.PathLike[str], *,
                    opset: int | None = None, dynamic_batch: bool = False) -> Exported:
        """Write ``model`` as ONNX to ``path``, checked against the model with ONNX Runtime."""

    def extra_costs(self, model: nn.Module, example_inputs: Sequence[torch.Tensor]) -> dict[str, float]:
        """Costs in the family's own conventions, for the report (empty when it has none)."""

    def native_gflops(self, model: nn.Module, example_inputs: Sequence[torch.Tensor]) -> float | None:
        """GFLOPs of one image as the family's library counts them, or None when it has no count of its own."""


class TorchFamily:
    """Plain torch modules: ``prunefx.save`` files, torch.onnx export with BatchNorm folded, no extra costs."""

    name = "torch"

    def save(self, model: nn.Module, path: str | os.PathLike[str], plan: PruningPlan | None) -> Path:
        """A ``prunefx.save`` file: the plan and the state_dict."""
        from prunefx.checkpoint import save

        return save(model, plan, path)

    def load(self, path: str | os.PathLike[str], build: Callable[[], nn.Module], *,
             trust_checkpoint: bool = False) -> nn.Module:
        """``prunefx.load``: always weights-only (a prunefx.save file is tensors and plain data)."""
        from prunefx.checkpoint import load

        return load(path, build)

    def export_onnx(self, model: nn.Module, example_inputs: Sequence[torch.Tensor], path: str | os.PathLike[str], *,
                    opset: int | None = None, dynamic_batch: bool = False) -> Exported:
        """:func:`prunefx.onnx_export.export_onnx` at ``opset`` (default ONNX_OPSET)."""
        from prunefx._defaults import ONNX_OPSET
        from prunefx.onnx_export import export_onnx

        return export_onnx(model, tuple(example_inputs), path, opset=opset or ONNX_OPSET, dynamic_batch=dynamic_batch)

    def extra_costs(self, model: nn.Module, example_inputs: Sequence[torch.Tensor]) -> dict[str, float]:
        """None: the report's own MACs, parameters and size are the whole story."""
        return {}

    def native_gflops(self, model: nn.Module, example_inputs: Sequence[torch.Tensor]) -> float | None:
        """None: torch has no GFLOPs convention of its own."""
        return None


TORCH = TorchFamily()
_FAMILIES: dict[str, ModelFamily | str] = {}  # name -> family, or "module:attribute" not yet imported


def register_family(name: str, family: ModelFamily | str, *, replace: bool = False) -> None:
    """Register ``family`` under ``name``: an object, or ``"module:attribute"`` imported on first :func:`get_family`."""
    put(_FAMILIES, name, family, what="register_family", replace=replace)


register_family(TORCH.name, TORCH)


def get_family(name: str) -> ModelFamily:
    """The family registered as ``name``; KeyError names the registered ones."""
    try:
        family = _FAMILIES[name]
    except KeyError:
        raise KeyError(f"no model family {name!r} (registered: {', '.join(sorted(_FAMILIES))})") from None
    if isinstance(family, str):
        module, _, attr = family.partition(":")
        family = _FAMILIES[name] = getattr(importlib.import_module(module), attr)
    return family


__all__ = ["TORCH", "ModelFamily", "TorchFamily", "get_family", "register_family"]
