"""`prunefx prune SPEC --refit`: the re-fit runs on the example input and the report gives its errors."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from typer.testing import CliRunner

from prunefx.cli.main import app

TESTS = Path(__file__).resolve().parents[1]
TINY = ["_factories:tiny_cnn", "--imgsz", "32"]


@pytest.fixture(autouse=True)
def factories_importable(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.syspath_prepend(str(TESTS))


def test_prune_spec_refit_reaches_the_run_and_the_report(tmp_path: Path) -> None:
    run = tmp_path / "run"
    result = CliRunner().invoke(app, ["prune", *TINY, "--ratio", "0.5", "--refit", "--no-latency", "--out", str(run)])
    assert result.exit_code == 0, result.output
    refit = json.loads((run / "report.json").read_text())["settings"]["refit"]
    assert refit["batches"] == 1 and "example input" in refit["calibration"]  # a SPEC comes with no data
    layers = {x["name"]: x for x in refit["layers"]}
    assert set(layers) == {"3"}  # the second conv reads the first's pruned channels: re-fitted on 15x15 positions
    assert layers["3"]["rows"] + layers["3"]["held_out"] == 225 and layers["3"]["after"] < layers["3"]["before"]
    assert refit["after"] < refit["before"]
    skipped = {x["name"]: x["why"] for x in refit["skipped"]}
    assert "fewer calibration rows (1)" in skipped["6"]  # the Linear sees one row per example: nothing to fit
    state = json.loads((run / "state.json").read_text())
    assert state["stages"]["prune"]["refit"]["layers"][0]["name"] == "3"


def test_prune_spec_without_refit_records_none(tmp_path: Path) -> None:
    run = tmp_path / "run"
    result = CliRunner().invoke(app, ["prune", *TINY, "--ratio", "0.5", "--no-latency", "--out", str(run)])
    assert result.exit_code == 0, result.output
    assert "refit" not in json.loads((run / "report.json").read_text())["settings"]
    assert "refit" not in json.loads((run / "state.json").read_text())["stages"]["prune"]
    said = " ".join(result.output.split())  # the console wraps long lines
    assert "a few batches of real inputs would re-fit it" in said  # no data: what data would add, said
    assert "verify: max relative error" in said  # a proven cut, not labelled inexact
