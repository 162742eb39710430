"""Helpers for tests/hostile (hostile and broken inputs): a sandbox per test, payloads that leave a marker file
when they run, and the checks every refusal must pass (exit code 2, one ``error:`` line, inputs byte-identical,
nothing outside ``project`` touched, no run that looks complete).
"""

from __future__ import annotations

import builtins
import json
import re
from dataclasses import dataclass
from pathlib import Path

import torch
from typer.testing import CliRunner, Result

import prunefx
from prunefx.cli.main import app

REPO = Path(__file__).resolve().parents[1]
# The checkout whose prunefx is under test: subprocesses import the same code as this process.
PRUNEFX_ROOT = Path(prunefx.__file__).resolve().parents[1]
RUNNER = CliRunner()

# The factories the SPEC tests name; written into the sandbox (the current directory), as a user's file would be.
MODELS_PY = '''
import sys
from torch import nn


def tiny():
    return nn.Sequential(nn.Conv2d(3, 8, 3, padding=1), nn.BatchNorm2d(8), nn.ReLU(),
                         nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(8, 4))


def frozen():
    """Nothing to prune: the input's channels and the output's classes are all there is."""
    return nn.Sequential(nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(3, 4))


def big_kernel():
    """Takes images of 7 px and more."""
    return nn.Sequential(nn.Conv2d(3, 8, 7), nn.BatchNorm2d(8), nn.ReLU(), nn.AdaptiveAvgPool2d(1), nn.Flatten(),
                         nn.Linear(8, 4))


def exits():
    sys.exit(0)
'''


class _Payload:
    """Pickled, it runs ``exec(code)`` when unpickled (what a hostile checkpoint does)."""

    def __init__(self, code: str) -> None:
        self.code = code

    def __reduce__(self):
        return builtins.exec, (self.code,)


@dataclass(frozen=True)
class Sandbox:
    """A scratch tree: ``project`` for runs, ``outside`` beside it (must never change), inputs at the root."""

    root: Path
    project: Path
    outside: Path
    marker: Path  # written by every payload that runs

    def write_pickle(self, name: str = "evil.pt", **extra: object) -> Path:
        """An ultralytics-shaped checkpoint whose unpickling writes the marker."""
        path = self.root / name
        torch.save({"ema": _Payload(f"open({str(self.marker)!r}, 'w').close()"), **extra}, path)
        return path

    def write_yaml(self, name: str, text: str) -> Path:
        path = self.root / name
        path.write_text(text.replace("MARKER", str(self.marker)))
        return path

    def snapshot(self) -> dict[str, bytes | None]:
        """Every file (its bytes) and directory (None) outside ``project``: what a refusal must leave as it was."""
        found: dict[str, bytes | None] = {}
        for p in sorted(self.root.rglob("*")):
            if p == self.project or self.project in p.parents or "__pycache__" in p.parts:
                continue
            found[str(p.relative_to(self.root))] = p.read_bytes() if p.is_file() else None
        return found

    def complete_runs(self) -> list[Path]:
        """Run directories under ``project`` whose state says complete."""
        found = []
        for state in self.project.rglob("state.json") if self.project.is_dir() else []:
            try:
                data = json.loads(state.read_text())
            except ValueError:
                continue
            if isinstance(data, dict) and data.get("status") == "complete":
                found.append(state.parent)
        return found


def invoke(*args: str) -> Result:
    return RUNNER.invoke(app, [str(a) for a in args], env={"COLUMNS": "200"})


def assert_refused(result: Result, pattern: str) -> str:
    """Exit code 2 and exactly one ``error:`` line on stderr (after any warning lines) matching ``pattern``."""
    assert result.exit_code == 2, result.output
    assert "Traceback" not in result.output, result.output
    lines = [line for line in result.stderr.splitlines() if not line.startswith("warning: ")]
    assert len(lines) == 1 and lines[0].startswith("error: "), result.stderr
    assert re.search(pattern, lines[0]), lines[0]
    return lines[0]


def assert_untouched(box: Sandbox, before: dict[str, bytes]) -> None:
    """Inputs byte-identical, nothing new outside ``project``, no payload ran, no run looks complete."""
    after = box.snapshot()
    changed = sorted(k for k in before.keys() | after.keys() if before.get(k, b"?") != after.get(k, b"?"))
    assert not changed, f"changed outside project: {changed}"
    assert not box.marker.exists(), "a payload ran"
    assert box.complete_runs() == []
