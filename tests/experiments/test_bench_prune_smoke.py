"""experiments.bench_prune runs end to end and writes a well-formed CSV and Markdown report, with or without
Torch-Pruning."""

from __future__ import annotations

import csv
import importlib.util
import os
import subprocess
import sys
from pathlib import Path

import pytest

from experiments import _table as table

ROOT = Path(__file__).resolve().parents[2]
HAS_TP = importlib.util.find_spec("torch_pruning") is not None
PFX_TIMES = ("pfx_analyze_s", "pfx_score_plan_s", "pfx_apply_s", "pfx_spa_s", "pfx_total_s")


def _load_bench():
    # by path: pytest does not put the repository root on sys.path
    spec = importlib.util.spec_from_file_location("experiments.bench_prune", ROOT / "experiments" / "bench_prune.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


bench_prune = _load_bench()


def _run(out: Path, *args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess:
    proc = subprocess.run(
        [sys.executable, "-m", "experiments.bench_prune", "--out", str(out), *args],
        capture_output=True, text=True, timeout=900, cwd=ROOT, env=env,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-3000:]
    return proc


def _read(out: Path) -> tuple[list[dict[str, str]], str]:
    with (out / "prune_speed.csv").open() as f:
        reader = csv.DictReader(f)
        assert reader.fieldnames == bench_prune.CSV_FIELDS
        rows = list(reader)
    md = (out / "prune_speed.md").read_text()
    table = [line for line in md.splitlines() if line.startswith("| ")]
    assert len(table) == 1 + len(rows)  # header + one line per model
    assert all(line.count("|") == table[0].count("|") for line in table)
    for key in ("- date:", "logical CPUs", "- torch threads: 2", "- torch:", "- torchvision:", "- torch-pruning:",
                "statistic: median", "load average", "What is compared", "## Summary"):  # fmt: skip
        assert key in md, key
    return rows, md


def _check_prunefx(row: dict[str, str]) -> None:
    assert row["pfx_status"] == "ok", row["errors"]
    for key in PFX_TIMES:
        assert float(row[key]) > 0, key
    assert float(row["pfx_spa_s"]) == pytest.approx(
        float(row["pfx_score_plan_s"]) + float(row["pfx_apply_s"]), rel=0.05
    )
    assert float(row["pfx_total_s"]) >= float(row["pfx_spa_s"])
    assert 0 < float(row["pfx_params_m"]) < float(row["params_m"])  # it pruned
    assert 0 < float(row["pfx_gmacs"]) < float(row["gmacs"])
    assert row["pfx_forward"] == "ok"
    assert int(row["pfx_pruned_groups"]) > 0 and row["input"] == "1x3x224x224"


@pytest.mark.slow
def test_quick_run_writes_csv_and_md(tmp_path):
    proc = _run(tmp_path, "--quick")
    rows, md = _read(tmp_path)
    assert [r["model"] for r in rows] == bench_prune.QUICK_MODELS
    assert "- repeats: 1 " in md
    for r in rows:
        _check_prunefx(r)
        if HAS_TP:
            assert r["tp_status"] == "ok" or r["tp_status"].startswith(("error", "timeout")), r["tp_status"]
            if r["tp_status"] == "ok":
                assert float(r["tp_init_s"]) > 0 and float(r["tp_step_s"]) > 0
                assert float(r["tp_step_over_pfx_spa"]) == pytest.approx(
                    float(r["tp_step_s"]) / float(r["pfx_spa_s"]), rel=0.01, abs=0.01)  # fmt: skip
        else:
            _check_without_tp(r, md)
    assert "pruning time" in proc.stdout  # the rich table was printed


def _check_without_tp(row: dict[str, str], md: str) -> None:
    assert row["tp_status"] == "not installed"
    assert all(row[k] == "" for k in ("tp_init_s", "tp_step_s", "tp_step_over_pfx_spa"))
    assert "- torch-pruning: not installed" in md and "| not installed |" in md


@pytest.mark.slow
@pytest.mark.skipif(not HAS_TP, reason="no torch_pruning: test_quick_run_writes_csv_and_md checks the run without it")
def test_runs_without_torch_pruning(tmp_path):
    """A torch_pruning that fails to import stands in for an environment without it."""
    shadow = tmp_path / "shadow" / "torch_pruning"
    shadow.mkdir(parents=True)
    (shadow / "__init__.py").write_text("raise ImportError('torch_pruning hidden by the test')\n")
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(shadow.parent), str(ROOT)])}
    out = tmp_path / "out"
    _run(out, "--models", "resnet18", "--repeats", "1", env=env)
    rows, md = _read(out)
    _check_prunefx(rows[0])
    _check_without_tp(rows[0], md)


def test_report_from_synthetic_rows(tmp_path):
    """Timeouts and errors show as such; the ratio is Torch-Pruning step / prunefx score+plan+apply."""
    rows = [
        {"model": "a", "params_m": 10.0, "gmacs": 1.0, "pfx_status": "ok", "pfx_analyze_s": 0.1,
         "pfx_score_plan_s": 0.02, "pfx_apply_s": 0.08, "pfx_spa_s": 0.1, "pfx_total_s": 0.2, "pfx_params_m": 3.0,
         "pfx_gmacs": 0.3, "pfx_forward": "ok", "tp_status": "ok", "tp_init_s": 1.0, "tp_step_s": 0.4,
         "tp_total_s": 1.4, "tp_params_m": 3.1, "tp_gmacs": 0.31, "tp_forward": "error: RuntimeError",
         "tp_step_over_pfx_spa": 4.0, "tp_total_over_pfx_total": 7.0},
        {"model": "b", "params_m": 2.0, "gmacs": 0.5, "pfx_status": "error: PlanError", "tp_status": "timeout",
         "errors": "pfx: PlanError: boom"},
    ]  # fmt: skip
    lines = bench_prune.summary(rows)
    assert "TP step / prunefx score+plan+apply on 1 models: geometric mean 4.00x, range 4.00x - 4.00x" in lines
    assert "prunefx failed on: b (error: PlanError)" in lines
    assert "Torch-Pruning failed on: b (timeout)" in lines
    assert "Torch-Pruning's pruned model does not run: a (error: RuntimeError)" in lines
    table.write_csv(rows, tmp_path / "x.csv", bench_prune.CSV_FIELDS, digits=4)
    bench_prune.write_md(rows, {"date": "today"}, tmp_path / "x.md")
    got = list(csv.DictReader((tmp_path / "x.csv").open()))
    assert got[1]["tp_status"] == "timeout" and got[1]["tp_step_s"] == ""
    md = (tmp_path / "x.md").read_text()
    # fixed input rows: this checks the formatter itself, not a machine's numbers
    row = "| a | 10.00 | 1.00 | 0.100 | 0.020 | 0.080 | 0.100 | 0.200 | 1.000 | 0.400 | 1.400 | 4.0x | 7.0x | "
    assert row + "3.00 / 3.10 | 0.30 / 0.31 |" in md
    assert "| b | 2.00 | 0.50 | error: PlanError |" in md and "| timeout | timeout | timeout | - | - |" in md
    assert "- b: pfx: PlanError: boom" in md


def test_deadline_interrupts_a_long_run():
    with pytest.raises(bench_prune.RunTimeout):
        with bench_prune.deadline(0.05):
            while True:
                pass
