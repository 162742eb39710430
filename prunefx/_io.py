"""Atomic file writes: a reader never sees a half-written file, and a crash keeps the previous version."""

from __future__ import annotations

import io
import os
import tempfile
from pathlib import Path
from typing import Any


def atomic_write(path: str | os.PathLike[str], data: bytes) -> Path:
    """Write ``data`` via a temp file in the same directory, then ``os.replace`` it onto ``path``."""
    path = Path(path)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        umask = os.umask(0)
        os.umask(umask)
        os.chmod(tmp, 0o666 & ~umask)  # mkstemp creates 0600; give the file the usual permissions
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    return path


def atomic_torch_save(obj: Any, path: str | os.PathLike[str]) -> Path:
    """``torch.save`` through :func:`atomic_write`."""
    import torch

    buffer = io.BytesIO()
    torch.save(obj, buffer)
    return atomic_write(path, buffer.getvalue())
