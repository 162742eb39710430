"""Every code block in README.md works as pasted.

Python blocks run each in a fresh interpreter, in an empty directory. Bash blocks: one-shot ``prunefx`` commands
run as pasted (in a temporary directory holding a copy of configs/, in order, so a block's later lines see what
its earlier ones wrote); what cannot run in a test (installs, training pipelines, torchrun, latency timing) is
checked cheaply instead (the config loads with the overrides given, the command line parses) and skipped with
the reason.
"""

from __future__ import annotations

import os
import re
import shlex
import shutil
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
README = ROOT / "README.md"


def blocks(lang: str) -> list[tuple[int, str]]:
    """(line number, text) of every fenced block of ``lang`` in README.md."""
    text = README.read_text()
    out = []
    for m in re.finditer(rf"^```{lang}\n(.*?)^```", text, flags=re.M | re.S):
        out.append((text[: m.start()].count("\n") + 1, m.group(1)))
    return out


@pytest.mark.slow
@pytest.mark.parametrize("line,code", blocks("python"), ids=lambda v: f"line{v}" if isinstance(v, int) else "")
def test_python_block_runs_as_pasted(line: int, code: str, tmp_path: Path) -> None:
    proc = subprocess.run([sys.executable, "-c", code], cwd=tmp_path, capture_output=True, text=True, timeout=900)
    assert proc.returncode == 0, f"README.md line {line}:\n{proc.stderr[-3000:]}"


def test_readme_has_python_blocks() -> None:
    assert len(blocks("python")) >= 2  # the one-call API and the step-by-step API


# ---- bash blocks ---------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Line:
    """One command line of a bash block: continuation lines joined, with its README line number."""

    number: int
    text: str

    @property
    def commands(self) -> list[list[str]]:
        """The ``&&``-chained commands of the line as argv lists (comments dropped)."""
        out: list[list[str]] = [[]]
        for token in shlex.split(self.text, comments=True):
            if token == "&&":
                out.append([])
            else:
                out[-1].append(token)
        return [c for c in out if c]


def bash_lines() -> list[Line]:
    """Every command line of every bash block in README.md."""
    out = []
    for start, code in blocks("bash"):
        pending, first = "", 0
        for i, raw in enumerate(code.splitlines()):
            if not pending:
                first = start + 1 + i
            pending += raw
            if pending.endswith("\\"):
                pending = pending[:-1]
                continue
            if shlex.split(pending, comments=True):
                out.append(Line(first, pending))
            pending = ""
    return out


# Setup steps a test must not repeat: (how the command starts, why it is not run).
NOT_RUN = (
    (("python3", "-m", "venv"), "creates a virtual environment"),
    ((".",), "activates the virtual environment"),
    (("pip", "install"), "installs packages"),
    (("ruff", "check"), "lints the repository (the CI command, checked against .ci/run)"),
    (("python", "-m", "pytest"), "runs the test suite (the CI command, checked against .ci/run)"),
    (("python", "-m", "build"), "builds the sdist and the wheel (as .ci/wheel_smoke.sh does)"),
)
TIMING = ("--latency", "--latency-target")  # options that time real forwards: minutes on 2 cores


def _validate_config(path: str, overrides: list[str]) -> str:
    """The pipeline config loads with ``overrides`` and its job builds; returns what was checked.

    An error may only be about something the line itself names for the reader to supply (their checkpoint,
    dataset root or GPU): the config and every key were accepted before the check of that value.
    """
    from prunefx.errors import PrunefxError
    from prunefx.pipeline import load_config
    from prunefx.pipeline.classify_model import is_classifier_spec

    config = load_config(path, overrides)
    if is_classifier_spec(config.get("model")):
        from prunefx.pipeline.backends.classify import ClassifyJob as Job
    else:
        from prunefx.pipeline.backends.yolo import YoloJob as Job
    try:
        Job.from_config(config, config_name=Path(path).stem)
    except PrunefxError as exc:
        supplied = [o.split("=", 1)[1] for o in overrides if "=" in o]
        if not any(value and value in str(exc) for value in supplied):
            raise
        return f"config {shlex.join([path, *overrides])} loads; the job stops at the reader's own input: {exc}"
    return f"config {shlex.join([path, *overrides])} loads and builds a {Job.__name__}"


def _parse_cli(argv: list[str]) -> None:
    """``prunefx ARGV`` parses: the command exists and every option and value is accepted (nothing runs)."""
    from typer.main import get_command

    from prunefx.cli.main import app

    command, rest = get_command(app), argv
    while hasattr(command, "commands"):  # a group: the next word names its command (typer vendors its own click)
        assert rest and rest[0] in command.commands, f"prunefx has no command {' '.join(argv[:2])!r}"
        command, rest = command.commands[rest[0]], rest[1:]
    command.make_context(command.name, list(rest))


def _kind(argv: list[str]) -> str:
    """How a README command is tested: setup, torchrun, pipeline, timing or run (as pasted)."""
    if any(tuple(argv[: len(start)]) == start for start, _ in NOT_RUN):
        return "setup"
    if argv[0] == "torchrun":
        return "torchrun"
    if argv[0] != "prunefx":
        return "unknown"
    if argv[1:2] == ["prune"] and argv[2].endswith((".yaml", ".yml")):
        return "pipeline"
    return "timing" if any(a in TIMING for a in argv) else "run"


def check(line: Line) -> list[str]:
    """Check every command of ``line`` that does not run as pasted cheaply; why each was not run, and what ran."""
    notes = []
    for argv in line.commands:
        kind = _kind(argv)
        if kind == "unknown":
            pytest.fail(f"README.md line {line.number}: no rule says how to test {argv[0]!r} (tests/test_readme.py)")
        if kind == "setup":
            why = next(why for start, why in NOT_RUN if argv[: len(start)] == list(start))
            notes.append(f"{' '.join(argv[:3])}: {why}")
        elif kind == "torchrun":
            config = argv[argv.index("prunefx.pipeline") + 1:]
            notes.append("torchrun: a multi-process training job; " + _validate_config(config[0], config[1:]))
        elif kind == "pipeline":
            notes.append("a training pipeline (minutes to hours); " + _validate_config(argv[2], argv[3:]))
        else:
            _parse_cli(argv[1:])
            if kind == "timing":
                notes.append(f"{' '.join(argv[:3])}: times real forwards (minutes on 2 cores); the command parses")
    return notes


def runs_as_pasted(line: Line) -> bool:
    return all(_kind(argv) == "run" for argv in line.commands)


@pytest.fixture
def in_configs_copy(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A temporary working directory holding a copy of the repository's configs/."""
    shutil.copytree(ROOT / "configs", tmp_path / "configs")
    monkeypatch.chdir(tmp_path)
    return tmp_path


@pytest.mark.parametrize("line", bash_lines(), ids=lambda line: f"line{line.number}")
def test_bash_line_is_valid(line: Line, in_configs_copy: Path) -> None:
    """Every command parses (CLI) or loads (pipeline config); a line not run as pasted is skipped saying why."""
    notes = check(line)
    if not runs_as_pasted(line):
        pytest.skip(f"README.md line {line.number} not run: " + "; ".join(notes))


def _runnable_blocks() -> list[tuple[int, list[Line]]]:
    """(README line of the block, its lines that run as pasted) for every bash block that has some."""
    starts = [start for start, _ in blocks("bash")]
    by_block: dict[int, list[Line]] = {}
    for line in filter(runs_as_pasted, bash_lines()):
        by_block.setdefault(max(s for s in starts if s < line.number), []).append(line)
    return sorted(by_block.items())


@pytest.mark.slow
@pytest.mark.parametrize("block,lines", _runnable_blocks(), ids=lambda v: f"block{v}" if isinstance(v, int) else "")
def test_bash_block_runs_as_pasted(block: int, lines: list[Line], in_configs_copy: Path) -> None:
    """The block's one-shot commands run in order, as pasted, in a fresh directory, and write nothing in the repo."""
    env = {**os.environ, "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ.get('PATH', '')}"}
    before = sorted(p.name for p in ROOT.iterdir())
    for line in lines:
        proc = subprocess.run(["bash", "-c", line.text], cwd=in_configs_copy, env=env, capture_output=True,
                              text=True, timeout=600)
        assert proc.returncode == 0, f"README.md line {line.number}: {line.text}\n{proc.stderr[-3000:]}"
    assert sorted(p.name for p in ROOT.iterdir()) == before


def test_readme_test_command_is_the_ci_command() -> None:
    """README's "install and run the tests" line is exactly what .ci/run runs."""
    ci = [line.strip() for line in (ROOT / ".ci" / "run").read_text().splitlines() if "pytest" in line]
    readme = [line.text.strip() for line in bash_lines() if "pytest" in line.text]
    assert len(ci) == 1 and readme == ci, (readme, ci)
