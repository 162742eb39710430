"""Ultralytics checkpoints: write a pruned model as an ordinary one (``YOLO(path)`` works), read any safely.

Ultralytics checkpoints pickle the whole (fp16) module; the pruned shapes travel with it and the model keeps its
native classes, so ``YOLO("pruned.pt")`` validates, predicts and exports it. Training from such a file with
``YOLO(path).train()`` would rebuild the unpruned yaml: fine-tune with ``prunefx.integrations.ultralytics.train``
instead (it hands the module to the trainer).

Reading is weights-only: ultralytics' restricted loader (``torch.load(weights_only=True)`` plus an allow-list of
its own and torch's model classes) rebuilds stock and pruned checkpoints but runs no code a file carries. A file
that needs more (its own classes, or a payload) loads only with ``trust_checkpoint=True``, which warns naming it.
:func:`ultralytics_loading` applies the same rule to the loads and model builds ultralytics makes by itself
(``YOLO(path).val()``, trainers building a model yaml).

    save_yolo(model, "pruned.pt", plan=result.plan)
    model = load_yolo("pruned.pt")                     # float32, train mode, pruned widths
"""

from __future__ import annotations

import contextlib
import os
import re
from collections.abc import Iterator
from copy import deepcopy
from datetime import datetime
from pathlib import Path
from typing import Any

import torch
from torch import nn

from prunefx._io import TRUST_HINT, atomic_torch_save, refused_by_weights_only, refused_global, warn_trusted
from prunefx.errors import PrunefxError, UntrustedFileError
from prunefx.plan import PruningPlan


def save_yolo(model: nn.Module, path: str | os.PathLike, *, plan: PruningPlan | None = None,
              train_args: dict[str, Any] | None = None, extra: dict[str, Any] | None = None) -> Path:
    """Save ``model`` (an ultralytics BaseModel) in ultralytics' checkpoint layout, atomically.

    Everything besides the module is plain data (the plan as a dict), so the file loads weights-only.
    """
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


def load_yolo(path: str | os.PathLike, *, trust_checkpoint: bool = False) -> nn.Module:
    """The float32 model of an ultralytics checkpoint (pruned shapes included), in train mode.

    Weights-only (see the module docstring); ``trust_checkpoint`` unpickles fully, with a TrustWarning naming the
    file. Raises :class:`UntrustedFileError` for a file that needs trust, :class:`PrunefxError` for an unreadable one.
    """
    import zipfile

    path = Path(path)
    if not path.is_file():
        raise PrunefxError(f"checkpoint {path} does not exist; give the path of a .pt file written by ultralytics")
    if not zipfile.is_zipfile(path):  # every torch.save file since torch 1.6 is a zip archive
        what = "is empty" if path.stat().st_size == 0 else "is not a torch.save archive (truncated, or another file)"
        raise PrunefxError(f"cannot load checkpoint {path}: it {what}; give a .pt written by ultralytics (train's "
                           "best.pt or last.pt, YOLO.save()) or by prunefx")
    from prunefx.integrations.ultralytics.env import setup_offline

    setup_offline()
    from ultralytics.nn.tasks import load_checkpoint

    if trust_checkpoint:
        warn_trusted(path)
    try:
        # An absolute path: ultralytics re-downloads a corrupt file whose bare name is one of its assets.
        with ultralytics_loading(trust_checkpoint=trust_checkpoint):
            model, _ = load_checkpoint(str(path.resolve()))
    except Exception as exc:  # a truncated file, a non-ultralytics pickle, a refused global, ...
        if not trust_checkpoint and refused_by_weights_only(path, exc):  # a format question, not damage
            refused = refused_global(exc)
            what = f"it needs the global {refused}" if refused else "it needs types beyond ultralytics' and torch's"
            raise UntrustedFileError(
                f"checkpoint {path} was not loaded: {what}, and unpickling it could run any code it holds "
                f"(prunefx loads checkpoints weights-only); {TRUST_HINT}"
            ) from exc
        # ultralytics' messages open with "ERROR ❌️" and end with a pointer to its hub models: keep the reason.
        lines = str(exc).strip().splitlines()
        detail = re.sub(r"^ERROR\W+", "", lines[0]).rstrip(".") if lines else type(exc).__name__
        if "outside the supported Ultralytics checkpoint format" in detail:  # loaded, but no model module in it
            detail = "it holds no ultralytics model (no 'ema' or 'model' module; a state_dict or prunefx.save file?)"
        raise PrunefxError(
            f"cannot load checkpoint {path}: {detail}; give a .pt written by ultralytics (train's best.pt or "
            "last.pt, YOLO.save()) or by prunefx"
        ) from exc
    return model.float().train()


@contextlib.contextmanager
def ultralytics_loading(*, trust_checkpoint: bool = False) -> Iterator[None]:
    """Within the block, ultralytics' own checkpoint loads and model-yaml builds are restricted, unless trusted.

    Restricted is ultralytics' ``ULTRALYTICS_SAFE_LOAD`` mode: weights-only loads against its allow-list, model yamls
    built without ``eval`` (known layers only, activations as ``nn.Name(literal args)``). The flag is process-wide
    (ultralytics reads one module global), so a trusted block also relaxes loads other threads make meanwhile.
    """
    from ultralytics.nn import tasks

    supported = getattr(getattr(tasks, "_SafeLoad", None), "SUPPORTED", False)
    if not trust_checkpoint and not supported:
        raise PrunefxError(
            f"torch {torch.__version__} cannot load ultralytics checkpoints weights-only (ultralytics' restricted "
            f"loading needs torch >= 2.6); upgrade torch, or {TRUST_HINT}"
        )
    saved = tasks.SAFE_LOAD
    tasks.SAFE_LOAD = not trust_checkpoint
    try:
        yield
    finally:
        tasks.SAFE_LOAD = saved
