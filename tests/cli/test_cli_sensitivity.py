"""`prunefx prune SPEC --scope sensitivity`: the curves are measured on the example input and planned on."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from typer.testing import CliRunner

from prunefx.cli.main import app
from prunefx.pipeline.run_config import PruneSpec
from prunefx.plan import PruningPlan
from prunefx.plan.sensitivity import SensitivityCurves
from prunefx.report import plots

TESTS = Path(__file__).resolve().parents[1]
TINY = ["_factories:tiny_cnn", "--imgsz", "32"]


@pytest.fixture(autouse=True)
def factories_importable(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.syspath_prepend(str(TESTS))
    monkeypatch.setenv("PRUNEFX_CACHE_DIR", str(tmp_path / "cache"))  # the curves' cache, not the working directory


def test_prune_spec_with_sensitivity_scope_plans_on_measured_curves(tmp_path: Path) -> None:
    run = tmp_path / "run"
    args = ["prune", *TINY, "--ratio", "0.4", "--scope", "sensitivity", "--no-latency", "--out", str(run)]
    result = CliRunner().invoke(app, args)
    assert result.exit_code == 0, result.output
    plan = PruningPlan.from_json(next(run.rglob("plan.json")).read_text())
    assert plan.target["scope"] == "sensitivity" and plan.pruned
    assert all(g.why.startswith("sensitivity: width") for g in plan.groups)
    removed = sum(g.before - g.after for g in plan.groups) / sum(g.before for g in plan.groups)
    assert removed >= 0.4
    cached = list((tmp_path / "cache" / "sensitivity").glob("*.json"))
    assert len(cached) == 1 and json.loads(cached[0].read_text())["curves"]
    # the report carries the curves it planned on, measured on the example input (a SPEC comes with no data)
    curves = json.loads((run / "report.json").read_text())["settings"]["sensitivity"]
    assert "example input" in curves["calibration"] and curves["reference_forwards"] == 1
    assert {c["group"] for c in curves["curves"]} == {g.group for g in plan.groups}
    assert SensitivityCurves.from_dict({k: v for k, v in curves.items() if k != "calibration"}).forwards > 0
    state = json.loads((run / "state.json").read_text())
    assert state["stages"]["prune"]["sensitivity"]["key"] == curves["key"]
    if plots.available():
        assert (run / "sensitivity.png").read_bytes()[:4] == b"\x89PNG"


def test_pipeline_scope_sensitivity_parses() -> None:
    spec = PruneSpec.parse({"scope": "sensitivity", "target": {"flops": 0.5}}, train_keys=())
    assert spec.plan.scope == "sensitivity"
    assert PruneSpec.parse(spec.to_dict(), train_keys=()) == spec
