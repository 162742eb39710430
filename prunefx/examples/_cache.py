"""Where the examples keep the models they train: state_dicts under ``$PRUNEFX_CACHE_DIR/examples``."""

from __future__ import annotations

import os
from collections.abc import Callable
from pathlib import Path

import torch
from torch import nn


def cached(model: nn.Module, key: str, train: Callable[[nn.Module], None]) -> nn.Module:
    """``model`` with the weights cached under ``key``, else trained by ``train(model)`` and cached; eval mode.

    The cache is ``$PRUNEFX_CACHE_DIR/examples`` (default ``.cache/examples`` in the working directory); a file is
    written whole or not at all (temp file, then rename), so a second process never reads half of one.
    """
    root = Path(os.environ.get("PRUNEFX_CACHE_DIR") or ".cache") / "examples"
    path = root / f"{key}.pt"
    if path.is_file():
        model.load_state_dict(torch.load(path, weights_only=True))
        return model.eval()
    model.train()
    train(model)
    root.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(".tmp")
    torch.save(model.state_dict(), tmp)
    tmp.replace(path)
    return model.eval()
