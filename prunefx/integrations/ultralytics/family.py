"""The ultralytics model family: checkpoints ``YOLO(path)`` reads, ultralytics' ONNX exporter, its GFLOPs.

Registered by name in ``prunefx/integrations/__init__.py`` and imported on first use; imports nothing from
ultralytics until a method runs (``env.setup_offline()`` must come first).
"""

from __future__ import annotations

import os
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import torch
    from torch import nn

    from prunefx.onnx_export import Exported
    from prunefx.plan import PruningPlan


class UltralyticsFamily:
    """Ultralytics models (a model yaml or a checkpoint): see :class:`prunefx.family.ModelFamily`."""

    name = "ultralytics"

    def save(self, model: nn.Module, path: str | os.PathLike[str], plan: PruningPlan | None) -> Path:
        """An ordinary ultralytics checkpoint, the plan as plain data beside the module."""
        from prunefx.integrations.ultralytics.io import save_yolo

        return save_yolo(model, path, plan=plan)

    def load(self, path: str | os.PathLike[str], build: Callable[[], nn.Module], *,
             trust_checkpoint: bool = False) -> nn.Module:
        """The checkpoint's own module, weights-only unless trusted (the pruned shapes travel with it)."""
        from prunefx.integrations.ultralytics.io import load_yolo

        return load_yolo(path, trust_checkpoint=trust_checkpoint)

    def export_onnx(self, model: nn.Module, example_inputs: Sequence[torch.Tensor], path: str | os.PathLike[str], *,
                    opset: int | None = None, dynamic_batch: bool = False) -> Exported:
        """Ultralytics' own exporter at the inputs' image size; ``opset`` None lets ultralytics choose."""
        from prunefx.integrations.ultralytics.yolo_export import export_yolo

        return export_yolo(model, path, imgsz=int(example_inputs[0].shape[-1]), opset=opset,
                           dynamic_batch=dynamic_batch)

    def extra_costs(self, model: nn.Module, example_inputs: Sequence[torch.Tensor]) -> dict[str, float]:
        """GFLOPs as ultralytics prints them (at 640) and at the size the model runs at."""
        from prunefx.integrations.ultralytics.gflops import report_gflops

        return report_gflops(model, int(example_inputs[0].shape[-1]))

    def native_gflops(self, model: nn.Module, example_inputs: Sequence[torch.Tensor]) -> float | None:
        """Ultralytics' GFLOPs of one image of the inputs' height and width (its convention is per image)."""
        from prunefx.integrations.ultralytics.gflops import ultralytics_gflops

        return ultralytics_gflops(model, tuple(example_inputs[0].shape[-2:]))


FAMILY = UltralyticsFamily()

__all__ = ["FAMILY", "UltralyticsFamily"]
