"""A pipeline run directory: resolved config, stage-by-stage state, resume, and the rules for where runs may go.

``<project>/<name>/state.json`` records every finished stage (its results and timing); a stage counts as done
only once its artefacts are written and its entry is saved, so an interrupted run resumes from the last finished
stage and never looks complete: ``status`` is ``complete`` only after the report, the last stage, is written.

A run directory is only ever created under ``project`` (``name`` is one path component); replacing one
(``exist_ok``) only ever removes a directory whose ``state.json`` says it is a prunefx run; and a run holds an
exclusive lock on its directory (``.lock``, with the owner's pid), so a second run on the same directory fails
instead of merging with the first. The OS releases the lock when its process ends, however it ends: a lock file
left by a killed run is stale and never blocks.

A run never says ``running`` once its process has stopped working on it: Ctrl-C and SIGTERM (a timeout, Slurm,
``docker stop``; turned into :class:`Terminated` while a run is open) record ``interrupted``, other errors
``failed``, and a process that ends with its run still open (stopped between two stages) records ``interrupted``
as it exits.

    run = RunDir.open(Path("runs/prune"), "yolo", config, resume=False, exist_ok=False)
    if not run.done("baseline"):
        with run.stage("baseline") as info:
            ...; info["metrics"] = {...}
    run.complete()
"""

from __future__ import annotations

import atexit
import contextlib
import datetime
import itertools
import json
import os
import shutil
import signal
import socket
import tempfile
import threading
import time
from collections.abc import Callable, Iterator, Mapping
from pathlib import Path
from typing import Any

from prunefx._config import load_yaml
from prunefx._io import atomic_write, confined, open_in, parse_json, read_json, storage_error
from prunefx.errors import UnsafePathError
from prunefx.pipeline.run_config import RUN_KEYS, ConfigError, dump_config

STATE = "state.json"
CONFIG = "config.yaml"
LOCK = ".lock"
SCHEMA = "prunefx.run/1"


class RunError(ConfigError):
    """A run directory cannot be created or resumed as asked."""


class Interrupted(KeyboardInterrupt):
    """The run was stopped from outside its code; state.json records it as ``interrupted``, like Ctrl-C."""


class Terminated(Interrupted):
    """The process got SIGTERM (a timeout, Slurm, ``docker stop``) while a run was open."""

    def __init__(self, signum: int = signal.SIGTERM) -> None:
        self.signum = int(signum)
        self.signal = signal.Signals(signum).name
        super().__init__(f"{self.signal} received: the process was told to stop (a timeout, Slurm, docker stop)")

    def __reduce__(self) -> tuple[type[Terminated], tuple[int]]:
        return type(self), (self.signum,)  # rebuilt from the signal, not the message (__init__ takes the number)


class RunDir:
    """One run directory and its ``state.json``; see the module docstring."""

    def __init__(self, root: Path, state: dict[str, Any]) -> None:
        self.root = root
        self.state = state

    @classmethod
    def open(cls, project: Path, name: str, config: Mapping[str, Any], *, resume: bool = False,
             exist_ok: bool = False, read_record: Callable[[str, dict[str, Any]], Any] | None = None) -> RunDir:
        """Create ``project/name`` (``name2``, ``name3``... when taken), replace it (``exist_ok``) or resume it;
        a resume refuses the run unless ``read_record(stage, entry)`` reads every finished stage's entry (it raises
        a RunError naming what is wrong: :func:`prunefx.pipeline.records.read`)."""
        root = run_root(project, name)
        if resume:
            return cls._resume(root, config, read_record)
        if exist_ok and root.is_dir() and _entries(root):
            check_replaceable(root)  # before the lock file is added to a directory that may not be a run
            with RunLock.acquire(root).held_until_error():
                check_replaceable(root)  # still a run now that no other run can be writing it
                for entry in _entries(root):
                    _remove(entry)
        else:
            root = _claim(root, reuse_empty=exist_ok)
            RunLock.acquire(root)
        state = {"schema": SCHEMA, "status": "running", "created": _now(), "stages": {}, "error": None}
        run = cls(root, state)
        with _OPEN.opening(run):
            atomic_write(root / CONFIG, dump_config(config).encode(), root=root)
            run._save()
        return run

    @classmethod
    def _resume(cls, root: Path, config: Mapping[str, Any], read_record: Callable[..., Any] | None) -> RunDir:
        if not (root / STATE).is_file():
            raise RunError(f"cannot resume {root}: it holds no {STATE} (no prunefx run was started there); "
                           "drop resume=true to start a new run, or give the run's name= and project=")
        with RunLock.acquire(root).held_until_error():
            return cls._resume_locked(root, config, read_record)

    @classmethod
    def _resume_locked(cls, root: Path, config: Mapping[str, Any], read_record: Callable[..., Any] | None) -> RunDir:
        state = read_state(root)
        for stage, entry in state["stages"].items() if read_record is not None else ():
            read_record(stage, entry)  # before the run is marked running: a refusal leaves state.json as it was
        import yaml

        try:
            saved = load_yaml((root / CONFIG).read_text(), str(root / CONFIG))
        except FileNotFoundError:
            raise RunError(f"cannot resume {root}: its {CONFIG} is missing, so the run's settings are unknown; "
                           "start a new run (drop resume=true)") from None
        except (yaml.YAMLError, ConfigError) as exc:  # prunefx writes it without aliases: an alias is damage
            raise RunError(f"cannot resume {root}: its {CONFIG} is corrupt ({_first_line(exc)}); "
                           "start a new run (drop resume=true)") from exc
        if not isinstance(saved, dict):
            raise RunError(f"cannot resume {root}: its {CONFIG} is not a mapping of keys (got "
                           f"{type(saved).__name__}); start a new run (drop resume=true)")
        changed = sorted(_diff(_strip(saved), _strip(config)))
        if changed:
            raise RunError(
                f"cannot resume {root}: the config differs from the run's config.yaml in {', '.join(changed)}; "
                "resume with the same config and overrides, or start a new run"
            )
        if state.get("status") == "complete":
            raise RunError(
                f"{root} is already complete; nothing to resume (start a new run, or exist_ok=true to redo it)"
            )
        check_confined(root)
        state["status"] = "running"
        state["error"] = None
        run = cls(root, state)
        with _OPEN.opening(run):
            run._save()
        return run

    def done(self, stage: str) -> dict[str, Any] | None:
        """The saved results of ``stage`` if it finished, else None."""
        return self.state["stages"].get(stage)

    @contextlib.contextmanager
    def stage(self, name: str) -> Iterator[dict[str, Any]]:
        """Run one stage: yields a dict to fill with results; saved as done only if the block finishes."""
        # One try around all of it: Ctrl-C while the stage's start or end is saved is recorded too.
        info: dict[str, Any] = {}
        start = time.perf_counter()
        held: int | None = None
        try:
            held = _SIGTERM.hold()  # a spawned rank runs its parent's run: SIGTERM is recorded there too
            check_confined(self.root)  # before the stage writes: a link planted since the last check is refused
            self.state["current"] = name
            self._save()
            with confined(self.root):  # every write the stage makes under the run goes through no link
                yield info
            info["seconds"] = round(time.perf_counter() - start, 2)
            info["finished"] = _now()
            self.state["stages"][name] = info
            self.state.pop("current", None)
            self._save()
        except BaseException as exc:
            self.fail(exc, stage=name)
            raise
        finally:
            _SIGTERM.release(held)

    @classmethod
    def reload(cls, root: Path) -> RunDir:
        """The run at ``root`` as its ``state.json`` says now (another process may have advanced it)."""
        run = cls(Path(root), read_state(root))
        if run.state.get("status") != "running":
            _OPEN.close(run.root)  # it ended elsewhere (spawned ranks): this process's handle on it is closed too
        return run

    def fail(self, exc: BaseException, *, stage: str | None) -> None:
        """Record that the run stopped with ``exc`` in ``stage`` (e.g. a failed worker, seen by the parent)."""
        self.state["status"] = "interrupted" if isinstance(exc, KeyboardInterrupt) else "failed"
        self.state["error"] = {"stage": stage, "type": type(exc).__name__, "message": str(exc)[:2000]}
        if isinstance(exc, Terminated):
            self.state["error"]["signal"] = exc.signal
        self.state.pop("finished", None)  # set by a complete() whose save did not land
        try:
            self._save()
        finally:
            # Closed only now: a second SIGTERM during the save still raises (and is recorded at exit) instead of
            # killing the process with state.json still saying running.
            _OPEN.close(self.root)

    def stopped(self, exc: BaseException, *, stage: str | None) -> None:
        """:meth:`fail`, unless state.json already records how the run ended (a stage recorded its own error)."""
        try:
            on_disk = read_state(self.root).get("status")
        except RunError:
            on_disk = None
        if on_disk in ("running", None):
            self.fail(exc, stage=stage)

    def complete(self) -> None:
        self.state["status"] = "complete"
        self.state["finished"] = _now()
        self._save()
        _OPEN.close(self.root)
        RunLock.release_root(self.root)  # whichever object of this process took it (spawned runs reload state)

    @property
    def is_complete(self) -> bool:
        return self.state.get("status") == "complete"

    def _save(self) -> None:
        atomic_write(self.root / STATE, json.dumps(self.state, indent=2, default=str).encode(), root=self.root)


# ---- where runs may go ------------------------------------------------------------------------------------------


def recovery_checkpoint(path: Path, *, writer: bool = True) -> bool:
    """Whether ``path`` (a stage's :func:`prunefx.recover` checkpoint inside the run) holds a run to continue; one cut
    before its first record has nothing to continue and is removed by the process that writes files (``writer``)."""
    from prunefx.train.recover import STATE_FILE

    if (path / STATE_FILE).is_file():
        return True
    if writer and path.exists():
        shutil.rmtree(path)  # the run's own directory, written by the stage that was cut
    return False


def run_root(project: str | os.PathLike[str], name: str) -> Path:
    """``project/name``, after checking ``name`` is one path component and ``project`` can hold directories."""
    text = str(name)
    if (
        not text.strip()
        or text in (".", "..")
        or "/" in text
        or (os.sep != "/" and os.sep in text)
        or (os.altsep is not None and os.altsep in text)
        or "\0" in text
        or Path(text).is_absolute()
    ):
        raise RunError(
            f"name={text!r} must be one directory name (no '/', '..' or absolute path): runs are created inside "
            "project=; give project= for another place (e.g. project=/data/runs name=exp1)"
        )
    project = Path(project)
    if project.exists() and not project.is_dir():
        raise RunError(f"project={project} is a file, not a directory; give project= a directory to hold the runs "
                       "(it is created when missing)")
    return project / text


def is_run(path: str | os.PathLike[str]) -> bool:
    """Whether ``path`` is a directory whose ``state.json`` says it is a prunefx run."""
    try:
        state = read_json(Path(path) / STATE, RunError, missing="", what="", fix="")
    except (OSError, RunError):
        return False
    return isinstance(state, dict) and state.get("schema") == SCHEMA


def check_replaceable(path: str | os.PathLike[str]) -> None:
    """Raise :class:`RunError` unless ``path`` is missing, empty (a lock file aside) or a prunefx run."""
    path = Path(path)
    if not path.exists() and not path.is_symlink():
        return
    if path.is_symlink() or not path.is_dir():
        raise RunError(f"{path} is not a directory; prunefx replaces only run directories. Pick another name/--out")
    if _entries(path) and not is_run(path):
        raise RunError(
            f"{path} is not a prunefx run (it has no {STATE} with schema {SCHEMA}), so exist_ok will not delete "
            "it; pick another name=/--out, or remove the directory yourself"
        )


def check_confined(root: str | os.PathLike[str]) -> None:
    """Raise :class:`RunError` if a symbolic link inside run directory ``root`` leads outside it."""
    # A run writes weights, plots and state through paths under root: through `weights -> /home/me/models` those
    # writes would land outside the run, over the user's files.
    root = Path(root)
    inside = root.resolve()
    for top, dirs, files in os.walk(root):  # os.walk does not descend into linked directories
        for entry in (*dirs, *files):
            path = Path(top) / entry
            if not path.is_symlink():
                continue
            try:
                target = path.resolve()
            except (OSError, RuntimeError):  # a loop of links: it leads nowhere inside either
                target = Path(os.readlink(path))
            if target != inside and inside not in target.parents:
                raise RunError(
                    f"{path} is a symbolic link to {target}, outside the run directory {root}; prunefx writes "
                    "only inside its run: remove the link (or start a new run)"
                )


def read_state(root: str | os.PathLike[str]) -> dict[str, Any]:
    """The run's ``state.json`` as a dict, or a :class:`RunError` saying what is wrong with it.

    Its fields are type-checked and every stage's entry must be an object; a resume also builds each stage's record
    back (``read_record``), so a damaged or edited entry is refused before any stage runs on it.
    """
    path = Path(root) / STATE
    state = read_json(path, RunError, missing=f"{root} holds no {STATE}: it is not a prunefx run directory",
                      what="is corrupt", fix="the run cannot be resumed or trusted: start a new run")
    if not isinstance(state, dict) or state.get("schema") != SCHEMA or not isinstance(state.get("stages"), dict):
        raise RunError(f"{path} is not a prunefx run state (expected a mapping with schema {SCHEMA} and "
                       "stages); start a new run")
    wrong = _wrong_field(state)
    if wrong:
        raise RunError(f"{path} is damaged: {wrong}; the run cannot be resumed or trusted: start a new run")
    return state


_STATUSES = ("running", "interrupted", "failed", "complete")


def _wrong_field(state: dict[str, Any]) -> str | None:
    """What in ``state`` (a mapping with stages) has the wrong type, or None."""
    if state.get("status") not in _STATUSES:
        return f"status is {str(state.get('status'))[:40]!r}, not one of {', '.join(_STATUSES)}"
    if not isinstance(state.get("error"), (dict, type(None))):
        return f"error is {type(state['error']).__name__}, not an object or null"
    if not isinstance(state.get("current"), (str, type(None))):
        return f"current is {type(state['current']).__name__}, not a stage name"
    for name, entry in state["stages"].items():
        if not isinstance(entry, dict):
            return f"stages.{name[:40]} is {type(entry).__name__}, not an object (a stage's record)"
    return None


def check_finished(root: str | os.PathLike[str]) -> None:
    """Refuse a run (a directory with a state.json) whose last stage has not finished."""
    if not (Path(root) / STATE).exists():
        return  # not a prunefx run: a report written by other means
    state = read_state(root)
    if state.get("status") != "complete":
        err = state.get("error") or {}
        detail = f"{err.get('type')}: {str(err.get('message', ''))[:200]}"
        where = f" in stage {err['stage']!r} ({detail})" if err.get("stage") else ""
        raise RunError(
            f"the run in {root} is not complete (status {state.get('status')!r}{where}); "
            "continue it with the same config plus resume=true"
        )


def install(tmp: str | os.PathLike[str], root: str | os.PathLike[str]) -> Path:
    """Move a run built in ``tmp`` (a sibling of ``root``) to ``root``, replacing the run there, if any.

    Only a prunefx run no process holds is replaced; both moves are renames, so ``root`` is at every moment
    either the old run or the new one.
    """
    tmp, root = Path(tmp), Path(root)
    if not root.exists():
        tmp.rename(root)
        return root
    check_replaceable(root)
    lock = RunLock.acquire(root)
    try:
        check_replaceable(root)
        trash = Path(tempfile.mkdtemp(dir=root.parent, prefix=f".{root.name}.old."))
        root.rename(trash / root.name)
        try:
            tmp.rename(root)
        except BaseException:
            (trash / root.name).rename(root)  # put the old run back
            raise
    finally:
        lock.release()
    shutil.rmtree(trash, ignore_errors=True)
    return root


def _claim(root: Path, *, reuse_empty: bool) -> Path:
    """Create ``root`` or, when it is taken, the first free ``root2``, ``root3``...; atomic against other runs."""
    try:
        root.parent.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise RunError(f"cannot create project directory {root.parent}: {exc.strerror or exc}; give project= a "
                       "directory you can write (it is created when missing)") from exc
    candidate, i = root, 1
    while True:
        try:
            candidate.mkdir()
            return candidate
        except FileExistsError:
            if reuse_empty and candidate == root and candidate.is_dir() and not _entries(candidate):
                return candidate
        except OSError as exc:  # a read-only or full project directory: say so, naming it
            error = storage_error(exc, candidate, writing=True)
            if error is None:
                raise
            raise error from exc
        i += 1
        candidate = root.with_name(f"{root.name}{i}")


def _entries(path: Path) -> list[Path]:
    """What a directory holds, its lock file aside."""
    return [p for p in path.iterdir() if p.name != LOCK]


def _remove(path: Path) -> None:
    if path.is_dir() and not path.is_symlink():
        shutil.rmtree(path)
    else:
        path.unlink()


# ---- stopping from outside: SIGTERM, and a process that ends with its run open ------------------------------------


class _Sigterm:
    """While held, SIGTERM raises :class:`Terminated` in this process; each hold's release gives back what it replaced.

    Holds nest and may end in any order. Each hold that installs the handler remembers the one it replaced; the
    last hold to end restores it, if the handler is still ours. A handler the caller set after a hold began is
    respected: the next hold takes it over and gives it back on release (a run left open, never closed, does not
    keep later runs from lending the caller's handler). Only the main thread may set handlers, so elsewhere holding
    it does nothing.
    """

    _OURS = object()  # a hold that found the handler already ours: it replaced nothing

    def __init__(self) -> None:
        self._holds: list[tuple[int, Any]] = []  # (token, the handler it replaced or _OURS), oldest first
        self._tokens = itertools.count(1)
        self._pid = os.getpid()  # the process that set the handler: its forked children (data loaders) do not raise

    def hold(self) -> int | None:
        """Hold it: a token for :meth:`release`, or None (nothing held) outside the main thread."""
        if threading.current_thread() is not threading.main_thread():
            return None
        replaced: Any = self._OURS
        if signal.getsignal(signal.SIGTERM) != self._raise:
            previous = signal.signal(signal.SIGTERM, self._raise)
            replaced = signal.SIG_DFL if previous is None else previous  # None: set outside Python
            self._pid = os.getpid()
        token = next(self._tokens)
        self._holds.append((token, replaced))
        return token

    def release(self, token: int | None) -> None:
        """End the hold ``token`` (None, or one already ended: a no-op)."""
        at = next((i for i, (t, _) in enumerate(self._holds) if t == token), None)
        if at is None or threading.current_thread() is not threading.main_thread():
            return
        _, replaced = self._holds.pop(at)
        if replaced is self._OURS:
            return
        if at < len(self._holds):  # a later hold is still on: it gives the handler back when it ends
            later, theirs = self._holds[at]
            if theirs is self._OURS:
                self._holds[at] = (later, replaced)
        elif signal.getsignal(signal.SIGTERM) == self._raise:  # not a handler set since
            signal.signal(signal.SIGTERM, replaced)

    def _raise(self, signum: int, frame: Any) -> None:
        if os.getpid() != self._pid:  # a forked child of the run's process: die of the signal, as it would have
            signal.signal(signum, signal.SIG_DFL)
            os.kill(os.getpid(), signum)
            return
        _OPEN.signalled = signum
        raise Terminated(signum)


_SIGTERM = _Sigterm()


class _OpenRuns:
    """The runs this process opened and has not closed (complete, failed, or seen ended on disk), by real path.

    Each holds :data:`_SIGTERM`; at exit, one still ``running`` on disk is recorded ``interrupted``, so Ctrl-C or
    SIGTERM between opening a run and its first stage (or between stages, outside the runner) is recorded too.
    """

    def __init__(self) -> None:
        self._runs: dict[str, tuple[Path, int, int | None]] = {}  # real path -> (root, opener's pid, hold)
        self.signalled: int | None = None  # the last signal turned into Terminated
        atexit.register(self._at_exit)

    @contextlib.contextmanager
    def opening(self, run: RunDir) -> Iterator[None]:
        """Count ``run`` open from here (before its first save); if the block raises, record that and re-raise."""
        self.close(run.root)  # re-opened (resumed in the same process): one hold per run
        self._runs[os.path.realpath(run.root)] = (run.root, os.getpid(), _SIGTERM.hold())
        try:
            yield
        except BaseException as exc:
            if not (run.root / STATE).is_file():  # nothing says running: nothing to correct
                self.close(run.root)
                raise
            with contextlib.suppress(Exception):  # the save that failed may fail again: the original error wins
                run.fail(exc, stage=None)
            raise

    def close(self, root: Path) -> None:
        entry = self._runs.pop(os.path.realpath(root), None)
        if entry is not None:
            _SIGTERM.release(entry[2])

    def _at_exit(self) -> None:
        for root, pid, _held in list(self._runs.values()):
            if pid != os.getpid():  # a forked child exiting: the run is its parent's
                continue
            # What state.json says now, not this process's copy: spawned ranks may have advanced it.
            with contextlib.suppress(Exception):  # a directory removed since (a test's tmp dir): nothing to record
                run = RunDir.reload(root)
                if run.state.get("status") == "running":
                    stop = Terminated(self.signalled) if self.signalled else Interrupted(
                        "the process ended with the run still open (stopped before its stages ran or between them)")
                    run.fail(stop, stage=run.state.get("current"))
        self._runs.clear()


_OPEN = _OpenRuns()


# ---- the lock ---------------------------------------------------------------------------------------------------


class RunLock:
    """An exclusive lock on a run directory: ``flock`` on ``<root>/.lock``, which holds the owner's pid and host.

    Re-entrant within a process (a run resumed in the process that started it); another process gets a
    :class:`RunError` naming the owner. ``flock`` is released by the OS when the owner exits, so a lock file left
    by a killed run is stale and is simply taken over.
    """

    _held: dict[str, RunLock] = {}  # per process: realpath -> lock

    def __init__(self, path: Path, fd: int) -> None:
        self.path = path
        self._fd: int | None = fd

    @classmethod
    def acquire(cls, root: str | os.PathLike[str]) -> RunLock:
        path = Path(root) / LOCK
        key = os.path.realpath(path)
        held = cls._held.get(key)
        if held is not None and held._fd is not None:
            return held
        try:
            import fcntl
        except ImportError:  # not POSIX: no advisory locks; runs on one name are the user's to keep apart
            fcntl = None  # type: ignore[assignment]
        try:
            # Never through a link, a directory or a hard link: the pid record below would be written into it.
            fd = open_in(root, path, os.O_RDWR | os.O_CREAT, 0o644)
        except UnsafePathError as exc:
            raise RunError(f"cannot lock {root}: {exc}") from None
        except OSError as exc:
            error = storage_error(exc, path, writing=True)
            raise (error or RunError(f"cannot lock {path}: {exc.strerror or exc}")) from exc
        try:
            if fcntl is not None:
                try:
                    fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                except BlockingIOError:
                    owner = _read_owner(fd)
                    raise RunError(
                        f"{root} is in use by another prunefx run ({owner}); wait for it to finish, or give this run "
                        "another name=/--out"
                    ) from None
                except OSError as exc:  # e.g. a network file system without locks
                    raise RunError(f"cannot lock {path}: {exc.strerror or exc}; put project= on a local disk") from exc
            os.ftruncate(fd, 0)
            os.write(fd, json.dumps({"pid": os.getpid(), "host": socket.gethostname(), "since": _now()}).encode())
        except BaseException:
            os.close(fd)
            raise
        lock = cls(path, fd)
        cls._held[key] = lock
        return lock

    def release(self) -> None:
        """Give the lock up (the file stays: removing it would race with a process about to lock it)."""
        if self._fd is None:
            return
        os.close(self._fd)  # closing the descriptor releases its flock
        self._fd = None
        self._held.pop(os.path.realpath(self.path), None)

    @contextlib.contextmanager
    def held_until_error(self) -> Iterator[RunLock]:
        """Keep the lock after the block, or give it up if the block raises (the run never started)."""
        try:
            yield self
        except BaseException:
            self.release()
            raise

    @classmethod
    def release_root(cls, root: str | os.PathLike[str]) -> None:
        """Release this process's lock on ``root``, if it holds one."""
        held = cls._held.get(os.path.realpath(Path(root) / LOCK))
        if held is not None:
            held.release()


def _read_owner(fd: int) -> str:
    try:
        info = parse_json(os.pread(fd, 4096, 0) or b"{}", dict)
        return f"pid {int(info['pid'])} on {str(info['host'])[:100]}, since {str(info['since'])[:40]}"
    except (OSError, KeyError, TypeError, ValueError):  # ValueError: JSONRefused too
        return "owner unknown"


# ---- helpers ----------------------------------------------------------------------------------------------------


def _strip(config: Mapping[str, Any]) -> dict[str, Any]:
    # Keys that choose how to open the run rather than what it computes: they may differ when resuming.
    return {k: v for k, v in config.items() if k not in RUN_KEYS}


def _diff(a: Any, b: Any, prefix: str = "") -> Iterator[str]:
    if isinstance(a, Mapping) and isinstance(b, Mapping):
        for k in set(a) | set(b):
            yield from _diff(a.get(k), b.get(k), f"{prefix}{k}.")
    elif a != b:
        yield prefix.rstrip(".")


def _first_line(exc: BaseException) -> str:
    lines = str(exc).strip().splitlines()
    return lines[0] if lines else type(exc).__name__


def _now() -> str:
    return datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds")
