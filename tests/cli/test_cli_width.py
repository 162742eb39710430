"""Output to a file or pipe never wraps: a table row, title or caption stays whole however long its labels."""

from __future__ import annotations

from pathlib import Path

import pytest
from typer.testing import CliRunner

import prunefx
from prunefx.cli._console import new_console
from prunefx.integrations.ultralytics.env import setup_offline
from prunefx.metrics import measure
from prunefx.spec import load_spec

setup_offline()  # before ultralytics is imported: it reads YOLO_OFFLINE and YOLO_CONFIG_DIR at import

from prunefx.cli.main import app

TESTS = Path(__file__).resolve().parents[1]
LONG = ["_factories:long_names", "--imgsz", "32"]  # member labels longer than 80 columns
runner = CliRunner()


@pytest.fixture(autouse=True)
def factories_importable(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.syspath_prepend(str(TESTS))


def _invoke(*args: str) -> str:
    # CliRunner's stdout is not a terminal; COLUMNS=80 is what rich would otherwise wrap a file's lines at.
    result = runner.invoke(app, list(args), env={"COLUMNS": "80"})
    assert result.exit_code == 0, result.output
    return result.stdout


def _rows(text: str) -> list[list[str]]:
    """The cells of every body line of the rich tables in ``text``."""
    return [[c.strip() for c in line.split("│")[1:-1]] for line in text.splitlines() if line.startswith("│")]


def test_analyze_table_keeps_every_member_label_whole() -> None:
    loaded = load_spec(LONG[0], imgsz=32)
    members = prunefx.analyze(loaded.model, loaded.example_inputs).table().columns[-1]
    labels = {line for cell in members.cells for line in str(cell).splitlines()}
    assert max(map(len, labels)) > 80  # the case that wrapped before
    printed = {row[-1] for row in _rows(_invoke("analyze", *LONG)) if row[-1]}
    assert printed == labels  # a label split over two lines would print two fragments that are neither


def test_flops_rows_title_and_caption_stay_on_one_line() -> None:
    out = _invoke("flops", *LONG, "--top", "20")
    loaded = load_spec(LONG[0], imgsz=32)
    modules = set(measure(loaded.model, loaded.example_inputs, by="leaf").per_module)
    breakdown = {row[0] for row in _rows(out) if len(row) == 3}
    assert breakdown == modules and max(map(len, modules)) > 80
    lines = [line.strip() for line in out.splitlines()]
    assert f"{LONG[0]}: one forward of 1 x 3 x 32 x 32" in lines
    assert "FLOPs = 2 x MACs; M = 1e6, G = 1e9, MB = 1e6 bytes of the saved state_dict" in lines


def test_a_terminal_keeps_its_width(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("COLUMNS", "50")
    assert new_console().width > 10_000  # pytest's captured stdout is not a terminal
    monkeypatch.setenv("TTY_COMPATIBLE", "1")  # rich's switch for "this output is a terminal"
    assert new_console().width == 50
