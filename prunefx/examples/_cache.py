"""Where the examples keep the models they train: state_dicts under ``$PRUNEFX_CACHE_DIR/examples``."""

from __future__ import annotations

import contextlib
import os
from collections.abc import Callable, Iterator
from pathlib import Path

import torch
from torch import nn

from prunefx._io import atomic_torch_save


def cached(model: nn.Module, key: str, train: Callable[[nn.Module], None]) -> nn.Module:
    """``model`` with the weights cached under ``key``, else trained by ``train(model)`` and cached; eval mode.

    The cache is ``$PRUNEFX_CACHE_DIR/examples`` (default ``.cache/examples`` in the working directory); a file is
    written whole or not at all (temp file, then rename), so a second process never reads half of one, and a
    process that finds another one training the same key waits for its file instead of training it again.
    """
    root = Path(os.environ.get("PRUNEFX_CACHE_DIR") or ".cache") / "examples"
    path = root / f"{key}.pt"
    if not path.is_file():
        root.mkdir(parents=True, exist_ok=True)
        with _key_lock(root / f".{key}.lock"):
            if not path.is_file():  # another process may have written it while this one waited
                model.train()
                train(model)
                atomic_torch_save(model.state_dict(), path)
                return model.eval()
    model.load_state_dict(torch.load(path, weights_only=True))
    return model.eval()


@contextlib.contextmanager
def _key_lock(path: Path) -> Iterator[None]:
    """An exclusive ``flock`` on ``path`` while the block runs (no lock where there is no ``fcntl``)."""
    try:
        import fcntl
    except ImportError:  # not POSIX: two processes may both train a key; the atomic write keeps the file whole
        yield
        return
    with open(path, "a") as f:
        fcntl.flock(f, fcntl.LOCK_EX)  # released when the file closes (or its process exits)
        yield
