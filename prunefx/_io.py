"""Files prunefx writes and reads: atomic writes (a reader never sees a half-written file, a crash keeps the previous
version), JSON read back with errors that say what to do, and weights-only unpickling of files users hand us (full
unpickling runs whatever code the file holds)."""

from __future__ import annotations

import contextlib
import errno
import io
import json
import os
import pickle
import re
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from prunefx.errors import StorageError, TrustWarning, UntrustedFileError

_ELSEWHERE = "give project= (pipeline config) or --out (CLI) a directory"
# errno -> what it means and how to fix it; other OSErrors (a missing file, a name too long) keep their own text
_STORAGE = {
    errno.ENOSPC: ("no space left on the device", f"free space there, or {_ELSEWHERE} on a disk with room"),
    errno.EDQUOT: ("the disk quota is exceeded", f"free space there, or {_ELSEWHERE} on a disk with room"),
    errno.EROFS: ("the file system is read-only", f"{_ELSEWHERE} on a writable disk"),
    errno.EACCES: ("permission denied", f"fix its permissions, or {_ELSEWHERE} you can write"),
    errno.EPERM: ("operation not permitted", f"fix its permissions, or {_ELSEWHERE} you can write"),
}


def storage_error(exc: BaseException, path: str | os.PathLike[str] | None = None, *,
                  writing: bool = False) -> StorageError | None:
    """The one-line error, naming ``path`` (else the file ``exc`` names) and the fix, for a full, read-only or
    forbidden disk; None for any other error. ``writing``: it was a write (a denied permission may be a read)."""
    if isinstance(exc, StorageError):
        return exc
    if not isinstance(exc, OSError) or exc.errno not in _STORAGE:
        return None
    where = path if path is not None else exc.filename
    what, fix = _STORAGE[exc.errno]
    verb = "write" if writing or exc.errno not in (errno.EACCES, errno.EPERM) else "access"
    target = f" {where}" if where is not None else ""
    return StorageError(f"cannot {verb}{target}: {what}; {fix}", exc.errno, None if where is None else str(where))


def atomic_write(path: str | os.PathLike[str], data: bytes) -> Path:
    """Write ``data`` via a temp file in the same directory, then ``os.replace`` it onto ``path``."""
    # A failed write() or fsync() names no file: the StorageError names path.
    path = Path(path)
    try:
        return _atomic_write(path, data)
    except OSError as exc:
        error = storage_error(exc, path, writing=True)
        if error is None:
            raise
        raise error from exc


def _atomic_write(path: Path, data: bytes) -> Path:
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        _usual_mode(tmp)
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    return path


def read_json(path: str | os.PathLike[str], error: type[Exception], *, missing: str, what: str, fix: str) -> Any:
    """The JSON value in ``path``; ``error(missing)`` without the file, ``error("<path> <what> (<why>); <fix>")``
    when it is not JSON (a half-written or damaged file, or one that is not text)."""
    path = Path(path)
    try:
        return json.loads(path.read_text())
    except FileNotFoundError:
        raise error(missing) from None
    except ValueError as exc:  # JSONDecodeError, and UnicodeDecodeError for bytes that are not text
        raise error(f"{path} {what} ({exc}); {fix}") from exc


def _usual_mode(path: str | os.PathLike[str]) -> None:
    umask = os.umask(0)
    os.umask(umask)
    os.chmod(path, 0o666 & ~umask)  # mkstemp creates 0600; give the file the usual permissions


@contextlib.contextmanager
def atomic_path(path: str | os.PathLike[str]) -> Iterator[Path]:
    """A temp path beside ``path`` for a writer that takes a path, moved onto ``path`` when the block finishes."""
    path = Path(path)
    tmp: Path | None = None
    try:
        fd, name = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
        os.close(fd)
        tmp = Path(name)
        yield tmp
        _usual_mode(tmp)
        os.replace(tmp, path)
    except OSError as exc:
        error = storage_error(exc, path, writing=True)
        if error is None:
            raise
        raise error from exc
    finally:
        if tmp is not None:
            tmp.unlink(missing_ok=True)  # gone after os.replace; left by a failed write


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
