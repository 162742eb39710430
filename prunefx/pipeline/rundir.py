"""A pipeline run directory: resolved config, stage-by-stage state, and resume.

``<project>/<name>/state.json`` records every finished stage (its results and timing); a stage counts as done
only once its artefacts are written and its entry is saved, so an interrupted run resumes from the last finished
stage and never looks complete: ``status`` is ``complete`` only after the report, the last stage, is written.

    run = RunDir.open(Path("runs/prune"), "yolo", config, resume=False, exist_ok=False)
    if not run.done("baseline"):
        with run.stage("baseline") as info:
            ...; info["metrics"] = {...}
    run.complete()
"""

from __future__ import annotations

import contextlib
import datetime
import json
import shutil
import time
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

from prunefx._io import atomic_write
from prunefx.pipeline.config import ConfigError, dump_config

STATE = "state.json"
CONFIG = "config.yaml"
SCHEMA = "prunefx.run/1"
# Keys that choose how to open the run rather than what it computes: they may differ when resuming.
RUN_KEYS = ("resume", "exist_ok", "name", "project")


class RunError(ConfigError):
    """A run directory cannot be created or resumed as asked."""


class RunDir:
    """One run directory and its ``state.json``; see the module docstring."""

    def __init__(self, root: Path, state: dict[str, Any]) -> None:
        self.root = root
        self.state = state

    @classmethod
    def open(cls, project: Path, name: str, config: Mapping[str, Any], *, resume: bool = False,
             exist_ok: bool = False) -> RunDir:
        """Create ``project/name`` (``name2``, ``name3``... when taken), replace it (``exist_ok``) or resume it."""
        root = Path(project) / name
        if resume:
            return cls._resume(root, config)
        if root.exists() and exist_ok:
            shutil.rmtree(root)
        elif root.exists():
            root = _next_free(root)
        root.mkdir(parents=True)
        state = {"schema": SCHEMA, "status": "running", "created": _now(), "stages": {}, "error": None}
        run = cls(root, state)
        atomic_write(root / CONFIG, dump_config(config).encode())
        run._save()
        return run

    @classmethod
    def _resume(cls, root: Path, config: Mapping[str, Any]) -> RunDir:
        state_path = root / STATE
        if not state_path.is_file():
            raise RunError(f"cannot resume {root}: it holds no {STATE} (no prunefx run was started there); "
                           "drop resume=true to start a new run, or give the run's name=")
        try:
            state = json.loads(state_path.read_text())
        except json.JSONDecodeError as exc:
            raise RunError(f"cannot resume {root}: {STATE} is corrupt ({exc}); start a new run") from exc
        import yaml

        saved = yaml.safe_load((root / CONFIG).read_text()) or {}
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
        state["status"] = "running"
        state["error"] = None
        run = cls(root, state)
        run._save()
        return run

    def done(self, stage: str) -> dict[str, Any] | None:
        """The saved results of ``stage`` if it finished, else None."""
        return self.state["stages"].get(stage)

    @contextlib.contextmanager
    def stage(self, name: str) -> Iterator[dict[str, Any]]:
        """Run one stage: yields a dict to fill with results; saved as done only if the block finishes."""
        info: dict[str, Any] = {}
        start = time.perf_counter()
        self.state["current"] = name
        self._save()
        try:
            yield info
        except BaseException as exc:
            self.state["status"] = "interrupted" if isinstance(exc, KeyboardInterrupt) else "failed"
            self.state["error"] = {"stage": name, "type": type(exc).__name__, "message": str(exc)[:2000]}
            self._save()
            raise
        info["seconds"] = round(time.perf_counter() - start, 2)
        info["finished"] = _now()
        self.state["stages"][name] = info
        self.state.pop("current", None)
        self._save()

    def complete(self) -> None:
        self.state["status"] = "complete"
        self.state["finished"] = _now()
        self._save()

    @property
    def is_complete(self) -> bool:
        return self.state.get("status") == "complete"

    def _save(self) -> None:
        atomic_write(self.root / STATE, json.dumps(self.state, indent=2, default=str).encode())


def _next_free(root: Path) -> Path:
    i = 2
    while (candidate := root.with_name(f"{root.name}{i}")).exists():
        i += 1
    return candidate


def _strip(config: Mapping[str, Any]) -> dict[str, Any]:
    return {k: v for k, v in config.items() if k not in RUN_KEYS}


def _diff(a: Any, b: Any, prefix: str = "") -> Iterator[str]:
    if isinstance(a, Mapping) and isinstance(b, Mapping):
        for k in set(a) | set(b):
            yield from _diff(a.get(k), b.get(k), f"{prefix}{k}.")
    elif a != b:
        yield prefix.rstrip(".")


def _now() -> str:
    return datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds")
