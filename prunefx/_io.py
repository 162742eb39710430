"""Files prunefx writes and reads: atomic writes (a reader never sees a half-written file, a crash keeps the previous
version) and weights-only unpickling of files users hand us (full unpickling runs whatever code the file holds)."""

from __future__ import annotations

import io
import os
import pickle
import re
import tempfile
from pathlib import Path
from typing import Any

from prunefx.errors import TrustWarning, UntrustedFileError


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


TRUST_HINT = (
    "if you made the file or trust its source, pass --trust-checkpoint (CLI), trust_checkpoint: true (pipeline "
    "config) or trust_checkpoint=True (Python)"
)


def load_torch_file(path: str | os.PathLike[str], *, trust_checkpoint: bool = False) -> Any:
    """``torch.load`` onto the CPU: weights-only, or (``trust_checkpoint``) full unpickling with a TrustWarning.

    A weights-only refusal raises :class:`UntrustedFileError` naming what the file wanted to run; other failures
    (missing, empty, truncated file) propagate for the caller to phrase.
    """
    import torch

    if trust_checkpoint:
        warn_trusted(path)
    try:
        return torch.load(path, map_location="cpu", weights_only=not trust_checkpoint)
    except pickle.UnpicklingError as exc:
        if trust_checkpoint or not refused_by_weights_only(path, exc):
            raise
        raise untrusted_error(path, exc) from exc


def refused_by_weights_only(path: str | os.PathLike[str], exc: BaseException) -> bool:
    """Whether ``exc`` is weights-only unpickling refusing a well-formed file (not a damaged one).

    Either it names the global it refused, or the file is a ``torch.save`` zip archive whose pickle it rejected.
    """
    if refused_global(exc) is not None:
        return True
    import zipfile

    chain, text = exc, ""
    while chain is not None:
        text += str(chain)
        chain = chain.__cause__ or chain.__context__
    return "weights only load failed" in text.lower() and zipfile.is_zipfile(path)


def untrusted_error(path: str | os.PathLike[str], exc: BaseException) -> UntrustedFileError:
    """The error for a file that weights-only unpickling refused (``exc`` or its causes name the refused global)."""
    refused = refused_global(exc)
    what = f"it needs the global {refused}" if refused else "it holds objects beyond tensors and plain data"
    return UntrustedFileError(
        f"{path} was not loaded: {what}, and unpickling it could run any code it holds (prunefx loads files "
        f"weights-only); {TRUST_HINT}"
    )


def refused_global(exc: BaseException | None) -> str | None:
    """The global a weights-only unpickler refused, from torch's message in ``exc`` or its causes."""
    while exc is not None:
        found = re.search(r"GLOBAL ([\w.]+) was not an allowed global", str(exc))
        if found:
            return found.group(1)
        exc = exc.__cause__ or exc.__context__
    return None


def warn_trusted(path: str | os.PathLike[str]) -> None:
    """Say, naming the file, that it is being fully unpickled (trusted): whatever code it holds runs now."""
    import warnings

    warnings.warn(
        f"loading {path} with full unpickling (trust_checkpoint): any code the file holds runs now",
        TrustWarning,
        stacklevel=3,
    )
