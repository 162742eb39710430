"""Files prunefx writes and reads: atomic writes (a reader never sees a half-written file, a crash keeps the previous
version) that never follow a link out of their directory, JSON read back within limits and with errors that say what
to do, and weights-only unpickling of files users hand us (full unpickling runs whatever code the file holds).

A write is *confined* to a root (a run directory, a checkpoint's destination) when the caller names it
(``atomic_write(path, data, root=run)``) or while a :func:`confined` block for that root runs (a run's stages): every
directory below the root is then opened without following links (``O_NOFOLLOW``, one descriptor at a time), a
symbolic link on the way or as the file itself is refused, and so is a path whose name leaves the root. A run
directory may be shared (``project=/shared/runs``): a link planted there must never turn a write into one over a
user's file elsewhere.

    atomic_write(run / "weights" / "pruned.pt", data, root=run)
    shard = safe_name(index["weight_map"][key], where=f"{index_path} weight_map")   # one plain file name, or refused
    with atomic_path(dst / shard, root=dst) as tmp: save_file(tensors, tmp)
    fd = open_in(run, run / ".lock", os.O_RDWR | os.O_CREAT)                           # an in-place file, no link
    state = read_json(run / "state.json", RunError, missing=..., what="is corrupt", fix="start a new run")
"""

from __future__ import annotations

import contextlib
import errno
import io
import json
import os
import pickle
import re
import secrets
import stat
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from prunefx.errors import StorageError, TrustWarning, UnsafePathError, UntrustedFileError

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


def atomic_write(path: str | os.PathLike[str], data: bytes, *, root: str | os.PathLike[str] | None = None) -> Path:
    """Write ``data`` via a temp file in the same directory, then rename it onto ``path``; confined to ``root`` (or
    to the root of an enclosing :func:`confined` block) when there is one."""
    # A failed write() or fsync() names no file: the StorageError names path.
    path = Path(path)
    try:
        _refuse_directory(path)
        inside = confinement(path, root)
        if inside is None or not _DIR_FD:
            if inside is not None:
                _check_links(inside, path)
            return _atomic_write(path, data)
        parent, name = _open_parent(inside, path)
        try:
            tmp, fd = _temp_in(parent, name, path)
            try:
                with os.fdopen(fd, "wb") as f:
                    f.write(data)
                    f.flush()
                    os.fsync(f.fileno())
                os.rename(tmp, name, src_dir_fd=parent, dst_dir_fd=parent)
            except BaseException:
                with contextlib.suppress(OSError):
                    os.unlink(tmp, dir_fd=parent)
                raise
        finally:
            os.close(parent)
        return path
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


def _usual_mode(path: str | os.PathLike[str]) -> None:
    umask = os.umask(0)
    os.umask(umask)
    os.chmod(path, 0o666 & ~umask)  # mkstemp creates 0600; give the file the usual permissions


@contextlib.contextmanager
def atomic_path(path: str | os.PathLike[str], *, root: str | os.PathLike[str] | None = None) -> Iterator[Path]:
    """A temp path beside ``path`` for a writer that takes a path, moved onto ``path`` when the block finishes;
    confined to ``root`` as :func:`atomic_write` is (the writer opens the temp file by name: it is created first,
    in the directory opened without links, and only that directory's file is moved into place)."""
    path = Path(path)
    tmp: Path | None = None
    parent: int | None = None
    try:
        _refuse_directory(path)
        inside = confinement(path, root)
        if inside is None or not _DIR_FD:
            if inside is not None:
                _check_links(inside, path)
            fd, name = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
            os.close(fd)
            tmp = Path(name)
            yield tmp
            _usual_mode(tmp)
            os.replace(tmp, path)
        else:
            parent, final = _open_parent(inside, path)
            name, fd = _temp_in(parent, final, path)
            os.close(fd)
            tmp = path.parent / name
            yield tmp
            os.rename(tmp.name, final, src_dir_fd=parent, dst_dir_fd=parent)
    except OSError as exc:
        error = storage_error(exc, path, writing=True)
        if error is None:
            raise
        raise error from exc
    finally:
        if tmp is not None:  # gone after the rename; left by a failed write
            with contextlib.suppress(FileNotFoundError):
                os.unlink(tmp.name if parent is not None else tmp, dir_fd=parent)
        if parent is not None:
            os.close(parent)


def atomic_torch_save(obj: Any, path: str | os.PathLike[str], *, root: str | os.PathLike[str] | None = None) -> Path:
    """``torch.save`` through :func:`atomic_write`."""
    import torch

    buffer = io.BytesIO()
    torch.save(obj, buffer)
    return atomic_write(path, buffer.getvalue(), root=root)


# ---- confinement: no write follows a link out of its root -------------------------------------------------------

_NOFOLLOW = getattr(os, "O_NOFOLLOW", 0)
_DIRECTORY = getattr(os, "O_DIRECTORY", 0)
# Walking a root one directory descriptor at a time needs *at() calls; elsewhere (Windows) links are checked by path.
_DIR_FD = {os.open, os.stat, os.unlink, os.rename} <= os.supports_dir_fd and bool(_NOFOLLOW)
_ROOTS: list[Path] = []  # the roots of the confined() blocks running now, innermost last


@contextlib.contextmanager
def confined(root: str | os.PathLike[str]) -> Iterator[None]:
    """While the block runs, every atomic write to a path under ``root`` is confined to it (a run's stages: the
    writers of weights, plans and checkpoints name their file, not the run)."""
    entry = Path(os.path.abspath(root))
    _ROOTS.append(entry)
    try:
        yield
    finally:
        _ROOTS.remove(entry)


def confinement(path: str | os.PathLike[str], root: str | os.PathLike[str] | None = None) -> Path | None:
    """The root a write to ``path`` is confined to: ``root``, else the innermost :func:`confined` root that holds
    ``path`` (None: no root, the write goes where the path leads, as the user named it)."""
    if root is not None:
        return Path(root)
    absolute = os.path.abspath(path)
    for entry in reversed(_ROOTS):
        if absolute.startswith(str(entry) + os.sep):
            return entry
    return None


def safe_name(name: Any, *, where: str, fix: str = "regenerate the file, or fix that entry") -> str:
    """``name`` (a file name read from a file: a shard in an index, a record's file) if it is one plain file name;
    else :class:`UnsafePathError` naming ``where`` it was read: a separator or ``..`` would lead out of the
    directory the file is written to or read from."""
    text = name if isinstance(name, str) else None
    seps = {"/", "\\", os.sep, os.altsep} - {None}
    if (
        text is None
        or not text.strip()
        or text in (".", "..")
        or any(sep in text for sep in seps)
        or "\0" in text
        or Path(text).is_absolute()
    ):
        raise UnsafePathError(f"{where}: {name!r} is not a plain file name (no '/', '\\', '..' or absolute path), so "
                              f"it could lead outside its directory; {fix}")
    return text


def open_in(root: str | os.PathLike[str], path: str | os.PathLike[str], flags: int, mode: int = 0o644) -> int:
    """``os.open(path, flags, mode)`` for a file updated in place under ``root`` (a lock file): no directory below
    ``root`` nor the file itself may be a link, and the file must be a regular one with no other hard link (an
    in-place write would change the file it is linked to)."""
    path = Path(path)
    if not _DIR_FD:
        _check_links(Path(root), path)
        fd = os.open(path, flags | _NOFOLLOW, mode)
    else:
        parent, name = _open_parent(Path(root), path)
        try:
            fd = os.open(name, flags | _NOFOLLOW, mode, dir_fd=parent)
        except OSError as exc:
            if exc.errno in (errno.ELOOP, errno.EISDIR, errno.ENOTDIR, errno.ENXIO):
                _refuse_entry(parent, name, path, Path(root))
            raise
        finally:
            os.close(parent)
    info = os.fstat(fd)
    why = ("it is not a regular file" if not stat.S_ISREG(info.st_mode)
           else "it has another hard link, which a write would change too" if info.st_nlink > 1 else None)
    if why is not None:
        os.close(fd)
        raise UnsafePathError(f"{path} cannot be written in place: {why}; remove it (prunefx creates it again)")
    return fd


def _relative(root: Path, path: Path) -> tuple[str, ...]:
    """``path``'s components below ``root``, or :class:`UnsafePathError` when its name leaves ``root``."""
    absolute = Path(os.path.abspath(path))  # '..' resolved by name: the walk below never follows a link
    for base in (Path(os.path.abspath(root)), Path(os.path.realpath(root))):
        try:
            parts = absolute.relative_to(base).parts
        except ValueError:
            continue
        if parts:
            return parts
    raise UnsafePathError(f"{path} is not inside {root}, where this write belongs; prunefx writes there only")


def _open_parent(root: Path, path: Path) -> tuple[int, str]:
    """A descriptor of ``path``'s directory, opened from ``root`` one component at a time without following a link,
    and ``path``'s name in it; the name must not be a link or a directory."""
    parts = _relative(root, path)
    fd = os.open(root, os.O_RDONLY | _DIRECTORY)
    try:
        for i, part in enumerate(parts[:-1]):
            try:
                below = os.open(part, os.O_RDONLY | _DIRECTORY | _NOFOLLOW, dir_fd=fd)
            except OSError as exc:
                if exc.errno in (errno.ELOOP, errno.ENOTDIR):
                    _refuse_entry(fd, part, root.joinpath(*parts[: i + 1]), root)
                raise OSError(exc.errno, exc.strerror, str(root.joinpath(*parts[: i + 1]))) from None
            os.close(fd)
            fd = below
        name = parts[-1]
        with contextlib.suppress(FileNotFoundError):
            info = os.stat(name, dir_fd=fd, follow_symlinks=False)
            if stat.S_ISLNK(info.st_mode) or stat.S_ISDIR(info.st_mode):
                _refuse_entry(fd, name, path, root)
        return fd, name
    except BaseException:
        os.close(fd)
        raise


def _refuse_entry(parent: int, name: str, path: Path, root: Path) -> None:
    """Raise the one-line error for ``name`` in directory ``parent`` when it is a link or a directory."""
    try:
        info = os.stat(name, dir_fd=parent, follow_symlinks=False)
    except OSError:
        return
    if stat.S_ISLNK(info.st_mode):
        raise UnsafePathError(
            f"{path} is a symbolic link (to {os.readlink(name, dir_fd=parent)}); prunefx does not write through "
            f"links inside {root}: remove the link"
        )
    if stat.S_ISDIR(info.st_mode) and path.name == name:
        raise UnsafePathError(f"{path} is a directory, where prunefx writes a file; remove it or give another path")


def _check_links(root: Path, path: Path) -> None:
    """Without *at() calls: the same refusals, checked by path (a link planted between check and write wins)."""
    parts = _relative(root, path)
    for i in range(1, len(parts) + 1):
        here = root.joinpath(*parts[:i])
        if here.is_symlink():
            raise UnsafePathError(f"{here} is a symbolic link (to {os.readlink(here)}); prunefx does not write "
                                  f"through links inside {root}: remove the link")


def _temp_in(parent: int, name: str, path: Path) -> tuple[str, int]:
    """A new, empty temp file beside ``name`` in directory ``parent``, created exclusively (never an existing file or
    link, whatever was planted): its name and a descriptor open for writing."""
    for _ in range(100):
        tmp = f".{name}.{secrets.token_hex(4)}.tmp"
        try:
            return tmp, os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | _NOFOLLOW, 0o666, dir_fd=parent)
        except FileExistsError:
            continue
    raise FileExistsError(errno.EEXIST, "no free temp file name", str(path.parent))


def _refuse_directory(path: Path) -> None:
    """A directory where a file is to be written: one line naming it (the rename would name its temp file)."""
    if path.is_dir() and not path.is_symlink():
        raise StorageError(f"cannot write {path}: it is a directory; give the path of a file (a new name, or one "
                           "inside that directory)", errno.EISDIR, str(path))


# ---- JSON: the one reader of every JSON file prunefx reads --------------------------------------------------------

# Generous for any file prunefx writes, small enough that a planted file cannot exhaust memory or the stack: a report
# or graph of the largest models is a few MiB and nests under 10 deep, and no count prunefx records has 30 digits.
MAX_JSON_BYTES = 256 * 2**20
MAX_JSON_DEPTH = 512
MAX_JSON_DIGITS = 100


class JSONRefused(ValueError):
    """What is wrong with a JSON text, in a few words (read_json puts the file and the fix around it)."""


def read_json(path: str | os.PathLike[str], error: type[Exception], *, missing: str, what: str, fix: str,
              expect: type | tuple[type, ...] = object) -> Any:
    """The JSON value in ``path``; ``error(missing)`` without the file, ``error("<path> <what> (<why>); <fix>")``
    when it cannot be read as JSON within limits: a half-written or damaged file, one that is not UTF-8 text or not a
    regular file, over :data:`MAX_JSON_BYTES`, nested over :data:`MAX_JSON_DEPTH` deep, holding an integer over
    :data:`MAX_JSON_DIGITS` digits, or whose top value is not of type ``expect``."""
    path = Path(path)
    try:
        return parse_json(_read_capped(path), expect)
    except FileNotFoundError:
        raise error(missing) from None
    except JSONRefused as exc:
        raise error(f"{path} {what} ({exc}); {fix}") from None


def parse_json(data: bytes | str, expect: type | tuple[type, ...] = object) -> Any:
    """``data`` parsed as JSON within :func:`read_json`'s limits, or :class:`JSONRefused` saying what is wrong."""
    if isinstance(data, bytes):
        try:
            data = data.decode("utf-8")
        except UnicodeDecodeError as exc:
            raise JSONRefused(f"not UTF-8 text: byte 0x{data[exc.start]:02x} at offset {exc.start}") from None
    try:
        value = json.loads(data, parse_int=_int)
    except RecursionError:  # the parser recurses per level: far below a deep file's depth, it stops here
        raise JSONRefused(f"nested deeper than the {MAX_JSON_DEPTH} levels prunefx reads") from None
    except JSONRefused:
        raise
    except ValueError as exc:  # JSONDecodeError
        raise JSONRefused(str(exc)) from None
    _check_depth(value)
    if not isinstance(value, expect):
        kinds = expect if isinstance(expect, tuple) else (expect,)
        names = " or ".join(_JSON_NAMES.get(t, t.__name__) for t in kinds)
        raise JSONRefused(f"expected {names}, got {_JSON_NAMES.get(type(value), type(value).__name__)}")
    return value


_JSON_NAMES = {dict: "an object", list: "a list", str: "a string", int: "an integer", float: "a number",
               bool: "true/false", type(None): "null"}


def _read_capped(path: Path) -> bytes:
    """``path``'s bytes, if it is a regular file of at most :data:`MAX_JSON_BYTES` (a FIFO would block for ever)."""
    try:
        fd = os.open(path, os.O_RDONLY | getattr(os, "O_NONBLOCK", 0))
    except IsADirectoryError:
        raise JSONRefused("it is a directory, not a file") from None
    info = os.fstat(fd)
    if not stat.S_ISREG(info.st_mode):
        os.close(fd)
        raise JSONRefused("it is a directory, not a file" if stat.S_ISDIR(info.st_mode) else "it is not a regular file")
    with os.fdopen(fd, "rb") as f:
        data = f.read(MAX_JSON_BYTES + 1)
    if len(data) > MAX_JSON_BYTES:
        raise JSONRefused(f"larger than the {MAX_JSON_BYTES // 2**20} MiB prunefx reads")
    return data


def _int(text: str) -> int:
    digits = len(text.lstrip("-"))
    if digits > MAX_JSON_DIGITS:
        raise JSONRefused(f"an integer of {digits} digits, more than the {MAX_JSON_DIGITS} prunefx reads")
    return int(text)


def _check_depth(value: Any) -> None:
    """Refuse a value nested over :data:`MAX_JSON_DEPTH` deep (code that walks it recursively would overflow)."""
    level: list[Any] = [value] if isinstance(value, (dict, list)) else []
    for _ in range(MAX_JSON_DEPTH):
        level = [v for x in level for v in (x.values() if isinstance(x, dict) else x) if isinstance(v, (dict, list))]
        if not level:
            return
    raise JSONRefused(f"nested deeper than the {MAX_JSON_DEPTH} levels prunefx reads")


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
