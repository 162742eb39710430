"""Every code block of README.md and of the docs site (docs/**/*.md) works as pasted, and the site builds.

Python blocks run each in a fresh interpreter, in an empty directory. Bash blocks: one-shot ``prunefx`` commands
run as pasted (in a temporary directory holding a copy of configs/, in order, so a block's later lines see what
its earlier ones wrote); what cannot run in a test (installs, training pipelines, torchrun, latency timing) is
checked cheaply instead (the config loads with the overrides given, the command line parses) and skipped with
the reason. Test ids name the file and the line of the block (``docs/api.md:5``). The site: ``mkdocs build
--strict`` passes (every page in nav, no broken link or anchor, the API reference rendered from the docstrings)
and README.md stays a front door of at most 250 lines.
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
import yaml

ROOT = Path(__file__).resolve().parents[1]
README = ROOT / "README.md"
DOCS = ROOT / "docs"
PAGES = [README, *sorted(DOCS.rglob("*.md"))]  # every file whose code blocks are tested
# README.md held 3 python and 7 bash blocks before the docs site took its content over: none may go untested.
FLOOR = {"python": 3, "bash": 7}
README_MAX_LINES = 250


@dataclass(frozen=True)
class Block:
    """A fenced code block: its file (relative to the repository), the line of its opening fence, its text."""

    file: str
    line: int
    code: str

    @property
    def where(self) -> str:
        return f"{self.file}:{self.line}"


def blocks(lang: str, pages: list[Path] = PAGES) -> list[Block]:
    """Every fenced block of ``lang`` in ``pages`` (README.md and docs/**/*.md), in order."""
    out = []
    for page in pages:
        text = page.read_text()
        for m in re.finditer(rf"^```{lang}\n(.*?)^```", text, flags=re.M | re.S):
            out.append(Block(page.relative_to(ROOT).as_posix(), text[: m.start()].count("\n") + 1, m.group(1)))
    return out


@pytest.mark.slow
@pytest.mark.parametrize("block", blocks("python"), ids=lambda b: b.where)
def test_python_block_runs_as_pasted(block: Block, tmp_path: Path) -> None:
    proc = subprocess.run([sys.executable, "-c", block.code], cwd=tmp_path, capture_output=True, text=True,
                          timeout=900)
    assert proc.returncode == 0, f"{block.where}:\n{proc.stderr[-3000:]}"


def test_no_code_block_went_untested() -> None:
    """README.md and the docs hold at least as many python and bash blocks as README.md alone did."""
    counts = {lang: len(blocks(lang)) for lang in FLOOR}
    assert all(counts[lang] >= floor for lang, floor in FLOOR.items()), (counts, FLOOR)
    assert [b.file for b in blocks("python", [README])] == ["README.md"]  # the one-call API
    assert len(blocks("python", [DOCS / "api.md"])) >= 2  # the one-call API and the step-by-step API


# ---- bash blocks ---------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Line:
    """One command line of a bash block: continuation lines joined, with its file and line number."""

    file: str
    number: int
    text: str

    @property
    def where(self) -> str:
        return f"{self.file}:{self.number}"

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


def bash_lines(pages: list[Path] = PAGES) -> list[Line]:
    """Every command line of every bash block in ``pages`` (README.md and docs/**/*.md)."""
    out = []
    for block in blocks("bash", pages):
        pending, first = "", 0
        for i, raw in enumerate(block.code.splitlines()):
            if not pending:
                first = block.line + 1 + i
            pending += raw
            if pending.endswith("\\"):
                pending = pending[:-1]
                continue
            if shlex.split(pending, comments=True):
                out.append(Line(block.file, first, pending))
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
    if config.get("task") == "custom":
        from prunefx.pipeline.backends.custom import CustomJob as Job
    elif config.get("task") == "llm":
        from prunefx.pipeline.backends.llm import LlmJob as Job
    elif is_classifier_spec(config.get("model")):
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
    """How a documented command is tested: setup, torchrun, pipeline, timing or run (as pasted)."""
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
            pytest.fail(f"{line.where}: no rule says how to test {argv[0]!r} (tests/test_docs.py)")
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


@pytest.mark.parametrize("line", bash_lines(), ids=lambda line: line.where)
def test_bash_line_is_valid(line: Line, in_configs_copy: Path) -> None:
    """Every command parses (CLI) or loads (pipeline config); a line not run as pasted is skipped saying why."""
    notes = check(line)
    if not runs_as_pasted(line):
        pytest.skip(f"{line.where} not run: " + "; ".join(notes))


def _runnable_blocks() -> list[tuple[str, list[Line]]]:
    """(file:line of the block, its lines that run as pasted) for every bash block that has some."""
    starts = [(b.file, b.line) for b in blocks("bash")]
    by_block: dict[tuple[str, int], list[Line]] = {}
    for line in filter(runs_as_pasted, bash_lines()):
        start = max(s for f, s in starts if f == line.file and s < line.number)
        by_block.setdefault((line.file, start), []).append(line)
    return [(f"{file}:{start}", lines) for (file, start), lines in sorted(by_block.items())]


@pytest.mark.slow
@pytest.mark.parametrize("block,lines", [pytest.param(*b, id=b[0]) for b in _runnable_blocks()])
def test_bash_block_runs_as_pasted(block: str, lines: list[Line], in_configs_copy: Path) -> None:
    """The block's one-shot commands run in order, as pasted, in a fresh directory, and write nothing in the repo."""
    env = {**os.environ, "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ.get('PATH', '')}"}
    before = sorted(p.name for p in ROOT.iterdir())
    for line in lines:
        proc = subprocess.run(["bash", "-c", line.text], cwd=in_configs_copy, env=env, capture_output=True,
                              text=True, timeout=600)
        assert proc.returncode == 0, f"{line.where}: {line.text}\n{proc.stderr[-3000:]}"
    assert sorted(p.name for p in ROOT.iterdir()) == before


def test_readme_test_command_is_the_ci_command() -> None:
    """README's "install and run the tests" line is exactly what .ci/run runs."""
    ci = [line.strip() for line in (ROOT / ".ci" / "run").read_text().splitlines() if "pytest" in line]
    readme = [line.text.strip() for line in bash_lines([README]) if "pytest" in line.text]
    assert len(ci) == 1 and readme == ci, (readme, ci)
    copies = [line for line in bash_lines() if "pytest" in line.text]  # the quick start page repeats it
    assert all(line.text.strip() == ci[0] for line in copies), [line.where for line in copies]


# ---- README as the front door, and the docs site ---------------------------------------------------------------


def test_readme_is_a_front_door() -> None:
    """At most 250 lines: what prunefx is, the two commands, one API example, one table, links into the docs."""
    lines = README.read_text().splitlines()
    assert len(lines) <= README_MAX_LINES, f"README.md has {len(lines)} lines (at most {README_MAX_LINES})"
    main_job = 'pip install -e ".[yolo]" && prunefx prune configs/yolo.yaml'
    assert any(main_job in line.text for line in bash_lines([README])), "README lost the main job's command"


def _relative_links(page: Path) -> list[str]:
    """The relative link targets of ``page`` (no scheme, no pure anchor), their anchors dropped."""
    targets = re.findall(r"\]\(([^)\s]+)\)", page.read_text())
    return [t.split("#", 1)[0] for t in targets if "://" not in t and not t.startswith(("#", "mailto:"))]


def test_readme_links_resolve() -> None:
    """Every relative link of README.md names a file of the repository (on GitHub and in the sdist's tree)."""
    missing = [t for t in _relative_links(README) if not (ROOT / t).exists()]
    assert not missing, missing


def _nav_pages(nav: object) -> list[str]:
    if isinstance(nav, str):
        return [nav]
    if isinstance(nav, dict):
        return [p for value in nav.values() for p in _nav_pages(value)]
    if isinstance(nav, list):
        return [p for item in nav for p in _nav_pages(item)]
    return []


def test_every_docs_page_is_in_nav() -> None:
    """mkdocs.yml's nav lists every page of docs/ once, and nothing that is not there."""
    config = yaml.safe_load((ROOT / "mkdocs.yml").read_text())
    nav = _nav_pages(config["nav"])
    pages = sorted(p.relative_to(DOCS).as_posix() for p in DOCS.rglob("*.md"))
    assert sorted(nav) == pages, {"not in nav": sorted(set(pages) - set(nav)), "no page": sorted(set(nav) - set(pages))}
    assert len(nav) == len(set(nav)), "a page is listed twice in nav"


@pytest.mark.slow
def test_docs_site_builds_strictly(tmp_path: Path) -> None:
    """``mkdocs build --strict`` passes, and the API reference holds ``prunefx.prune``'s rendered docstring."""
    for module in ("mkdocs", "material", "mkdocstrings", "mkdocstrings_handlers.python"):
        pytest.importorskip(module, reason="the docs extra is in the test extra: pip install -e '.[test]'")
    site = tmp_path / "site"
    env = {**os.environ, "NO_MKDOCS_2_WARNING": "1"}
    proc = subprocess.run([sys.executable, "-m", "mkdocs", "build", "--strict", "-d", str(site)], cwd=ROOT, env=env,
                          capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-5000:]
    reference = (site / "reference" / "prune" / "index.html").read_text()
    assert "in place to <code>config</code>" in reference  # "Prune ``model`` in place to ``config``'s target"
    assert "verify it against the masked original" in reference
    assert "PlanConfig" in reference and "PruneResult" in reference
