"""The CLI's HTML pages: ``analyze --html``, report.html from ``prune SPEC``, ``report RUN --html``."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
from typer.testing import CliRunner

from prunefx.integrations.ultralytics.env import setup_offline

setup_offline()  # before ultralytics is imported: it reads YOLO_OFFLINE and YOLO_CONFIG_DIR at import

from prunefx.cli.main import app

TESTS = Path(__file__).resolve().parents[1]
TINY = ["_factories:tiny_cnn", "--imgsz", "32"]
runner = CliRunner()


@pytest.fixture(autouse=True)
def factories_importable(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.syspath_prepend(str(TESTS))


def page_data(path: Path) -> dict:
    match = re.search(r'<script id="data" type="application/json">(.*?)</script>', path.read_text(), re.S)
    return json.loads(match.group(1))


def test_analyze_html(tmp_path: Path) -> None:
    out = tmp_path / "new" / "groups.html"  # a missing parent directory is created
    result = runner.invoke(app, ["analyze", *TINY, "--html", str(out), "--json", str(tmp_path / "g.json")])
    assert result.exit_code == 0, result.output
    assert f"wrote {out}" in result.stdout.replace("\n", "")
    graph, groups = page_data(out)["graph"], json.loads((tmp_path / "g.json").read_text())
    assert graph["summary"]["nodes"] == groups["nodes"] and graph["summary"]["groups"] == len(groups["groups"])
    assert [g["id"] for g in graph["groups"]] == [g["id"] for g in groups["groups"]]


def test_prune_spec_writes_report_html_and_report_redraws_it(tmp_path: Path) -> None:
    run = tmp_path / "run"
    result = runner.invoke(app, ["prune", *TINY, "--ratio", "0.5", "--no-latency", "--out", str(run)])
    assert result.exit_code == 0, result.output
    assert {"graph.json", "report.html", "plan.json", "report.md"} <= {p.name for p in run.iterdir()}
    plan = json.loads((run / "plan.json").read_text())
    data = page_data(run / "report.html")
    assert data["mode"] == "report"
    decided = {g["id"]: (g["plan"]["before"], g["plan"]["after"]) for g in data["graph"]["groups"] if g.get("plan")}
    assert decided == {g["group"]: (g["before"], g["after"]) for g in plan["groups"]}
    (run / "report.html").unlink()
    result = runner.invoke(app, ["report", str(run), "--html"])
    assert result.exit_code == 0, result.output
    assert page_data(run / "report.html") == data
    assert sorted(p.name for p in run.iterdir()) == [".lock", "config.yaml", "graph.json", "plan.json", "pruned.pt",
                                                      "report.html", "report.json", "report.md", "state.json",
                                                      "widths.png"]
