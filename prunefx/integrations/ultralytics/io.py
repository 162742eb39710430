"""Write a pruned ultralytics model as an ordinary ultralytics checkpoint, so ``YOLO(path)`` works.

Ultralytics checkpoints pickle the whole (fp16) module; the pruned shapes travel with it and the
model keeps its native classes, so ``YOLO("pruned.pt")`` validates, predicts and exports it. Training
from such a file with ``YOLO(path).train()`` would rebuild the unpruned yaml: fine-tune with
``prunefx.integrations.ultralytics.train`` instead (it hands the module to the trainer).
"""

from __future__ import annotations

import os
from copy import deepcopy
from datetime import datetime
from pathlib import Path
from typing import Any

import torch
from torch import nn

from prunefx._io import atomic_torch_save
from prunefx.plan import PruningPlan


def save_yolo(model: nn.Module, path: str | os.PathLike, *, plan: PruningPlan | None = None,
              train_args: dict[str, Any] | None = None, extra: dict[str, Any] | None = None) -> Path:
    """Save ``model`` (an ultralytics BaseModel) in ultralytics' checkpoint layout, atomically."""
    from ultralytics import __version__

    path = Path(path)
    snapshot = deepcopy(model).half().to(memory_format=torch.contiguous_format)
    if hasattr(snapshot, "criterion"):
        snapshot.criterion = None  # training-only state, as ultralytics strips it
    args = (
        train_args if train_args is not None else (model.args if isinstance(getattr(model, "args", None), dict) else {})
    )
    ckpt = {
        "epoch": -1,
        "best_fitness": None,
        "model": None,
        "ema": snapshot,
        "updates": None,
        "optimizer": None,  # a pruned model's old optimizer state no longer matches its shapes
        "train_args": dict(args),
        "date": datetime.now().astimezone().isoformat(),
        "version": __version__,
        "prunefx_plan": plan.to_dict() if plan is not None else None,
        **(extra or {}),
    }
    atomic_torch_save(ckpt, path)
    return path
