"""What each finished stage wrote, by sha256, so that a resumed run proves its inputs are the ones it made.

A stage's entry in ``state.json`` carries ``files`` (the sha256 of every file the stage wrote or replaced in the
run directory: ``plan.json``, the weights, the graph) and ``record`` (the sha256 of its own results). On
``resume=true`` the runner checks them before any stage runs: a plan edited between stop and resume, a weights file
swapped, a stage record changed by hand is refused in one line naming it, instead of a fine-tune that trains one
model and saves it with another plan.

    before = snapshot(root)
    ...  # the stage runs and writes its files
    info.update(stamp(root, before, info))
    verify(root, state)                        # on resume: RunError naming the first file that no longer matches
"""

from __future__ import annotations

import hashlib
import json
import os
import stat
from collections.abc import Mapping
from pathlib import Path, PurePosixPath
from typing import Any

from prunefx.pipeline.rundir import CONFIG, LOCK, STATE, RunError

FILES = "files"  # the keys this module adds to a stage's entry
RECORD = "record"
# Not a stage's output: the run's own bookkeeping, a training stage's resumable checkpoint (it changes until its
# stage finishes), the trainer's and validator's working directories (ultralytics: train/, val/)
_SKIP_NAMES = frozenset({STATE, CONFIG, LOCK, "finetune_recover"})
_SKIP_TOP = frozenset({"train", "val"})
_CHUNK = 1 << 20
_BOOKKEEPING = ("seconds", "finished", FILES, RECORD)  # what an entry holds beside the stage's own results

Snapshot = dict[str, tuple[int, int, int]]  # relative path -> (size, mtime_ns, inode)


def snapshot(root: Path) -> Snapshot:
    """Every output file under ``root`` with what tells a rewrite apart (size, modification time, inode)."""
    found: Snapshot = {}
    for top, dirs, files in os.walk(root):
        rel_top = Path(top).relative_to(root)
        dirs[:] = [d for d in dirs if not _skipped(rel_top / d)]  # os.walk does not follow linked directories
        for name in files:
            rel = rel_top / name
            if _skipped(rel):
                continue
            try:
                st = (root / rel).stat()
            except OSError:  # a dangling link, or a file removed while walking
                continue
            found[rel.as_posix()] = (st.st_size, st.st_mtime_ns, st.st_ino)
    return found


def stamp(root: Path, before: Snapshot, results: Mapping[str, Any]) -> dict[str, Any]:
    """The ``files`` and ``record`` of a stage that ran between ``before`` and now and returned ``results``."""
    now = snapshot(root)
    written = sorted(p for p, key in now.items() if before.get(p) != key)
    return {FILES: {p: sha256(root / p) for p in written}, RECORD: record_digest(results)}


def record_digest(entry: Mapping[str, Any]) -> str:
    """The sha256 of a stage's results as state.json holds them (its bookkeeping keys aside)."""
    own = {k: v for k, v in entry.items() if k not in _BOOKKEEPING}
    return hashlib.sha256(json.dumps(own, sort_keys=True, default=str).encode()).hexdigest()


def sha256(path: Path) -> str:
    """The file's sha256; a FIFO or device planted in its place is refused, never read (a read would block)."""
    digest = hashlib.sha256()
    with os.fdopen(os.open(path, os.O_RDONLY | getattr(os, "O_NONBLOCK", 0)), "rb") as f:
        if not stat.S_ISREG(os.fstat(f.fileno()).st_mode):
            raise RunError(f"{path} is not a regular file, so it is not what its stage wrote; remove it, or start a "
                           "new run (drop resume=true)")
        while chunk := f.read(_CHUNK):
            digest.update(chunk)
    return digest.hexdigest()


def verify(root: Path, state: Mapping[str, Any]) -> None:
    """Refuse (:class:`RunError`, one line) a run whose finished stages' records or files changed since written."""
    fix = "restore it, or start a new run (drop resume=true)"
    latest: dict[str, tuple[str, str]] = {}  # path -> (digest, stage): the last stage that wrote it owns it
    for stage, entry in state["stages"].items():
        if not isinstance(entry, dict):
            raise RunError(f"cannot resume {root}: {STATE} records stage {stage!r} as a {type(entry).__name__}, "
                           f"not the stage's results; {STATE} was damaged: start a new run (drop resume=true)")
        if RECORD in entry and entry[RECORD] != record_digest(entry):
            raise RunError(f"cannot resume {root}: the {stage} stage's record in {STATE} was changed since the stage "
                           f"saved it; {fix}")
        files = entry.get(FILES, {})
        if not isinstance(files, dict) or not all(isinstance(d, str) for d in files.values()):
            raise RunError(f"cannot resume {root}: the {stage} stage's {FILES} in {STATE} are damaged; start a new "
                           "run (drop resume=true)")
        for rel, digest in files.items():
            latest[_inside(root, rel)] = (digest, stage)
    for rel, (digest, stage) in latest.items():
        path = root / rel
        if not path.is_file():  # missing, or replaced by something that is not a file (a FIFO is never opened)
            raise RunError(f"cannot resume {root}: {rel}, written by the {stage} stage, is missing; {fix}")
        if sha256(path) != digest:
            raise RunError(f"cannot resume {root}: {rel} changed since the {stage} stage wrote it (its sha256 "
                           f"differs from the one {STATE} records); {fix}")


def _inside(root: Path, rel: Any) -> str:
    """A recorded path, checked to be a plain relative path inside the run (state.json is data, not a pointer)."""
    parts = PurePosixPath(str(rel)).parts
    if not parts or PurePosixPath(str(rel)).is_absolute() or ".." in parts:
        raise RunError(f"cannot resume {root}: {STATE} records the file {rel!r}, which is not inside the run; "
                       f"{STATE} was damaged: start a new run (drop resume=true)")
    return str(rel)


def _skipped(rel: Path) -> bool:
    parts = rel.parts
    return (not parts or parts[0] in _SKIP_TOP or any(p in _SKIP_NAMES or p.startswith(".") for p in parts)
            or rel.name == "__pycache__")


__all__ = ["FILES", "RECORD", "Snapshot", "record_digest", "sha256", "snapshot", "stamp", "verify"]
