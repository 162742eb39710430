"""`python -m experiments.run`: the registry resolves, and the quick YOLO/latency tables are produced well-formed."""

from __future__ import annotations

import csv
import importlib
from pathlib import Path

import pytest

from experiments import run as runner


def test_every_registered_experiment_has_a_main() -> None:
    for name, exp in runner.EXPERIMENTS.items():
        assert callable(importlib.import_module(exp.module).main), name


def test_unknown_experiment_is_an_error() -> None:
    with pytest.raises(SystemExit, match="unknown experiment 'nope'"):
        runner.main(["nope"])


def _table(md: Path) -> list[str]:
    rows = [line for line in md.read_text().splitlines() if line.startswith("| ")]
    assert all(line.count("|") == rows[0].count("|") for line in rows)
    return rows


def test_quick_latency_table(tmp_path: Path) -> None:
    [path] = runner.main(["latency_vs_macs", "--quick", "--out", str(tmp_path)])
    assert (
        path == tmp_path / "latency_vs_macs_quick.md"
        and "Command: `python -m experiments.bench_latency" in path.read_text()
    )
    rows = list(csv.DictReader(open(tmp_path / "latency_vs_macs_quick.csv")))
    assert len(rows) == len(_table(path)) - 1 == 6  # (original + 2 round_to) x 2 variants
    for r in rows:
        assert float(r["median_ms"]) > 0 and float(r["p10_ms"]) <= float(r["median_ms"]) <= float(r["p90_ms"])
        assert float(r["speedup"]) == pytest.approx(
            float(r["speedup_per_macs_ratio"]) * float(r["macs_ratio"]), rel=1e-6
        )
        if r["target"] != "1.0":
            assert float(r["macs_ratio"]) == pytest.approx(2.0, rel=0.05)


@pytest.mark.slow
def test_quick_yolo_table(tmp_path: Path) -> None:
    # A recipe variant (--set) goes to its own stem and run folder, and the table names the overrides.
    variant = ["--set", "prune.sparsity.selective=true", "--set", "prune.sparsity.schedule=target"]
    [path] = runner.main(
        [
            "yolo_synthetic",
            "--quick",
            "--out",
            str(tmp_path),
            "--runs",
            str(tmp_path / "runs"),
            *variant,
            "--stem",
            "variant_quick",
        ]
    )
    assert path == tmp_path / "variant_quick.md"
    assert "with prune.sparsity.selective=true prune.sparsity.schedule=target" in path.read_text()
    rows = list(csv.DictReader(open(tmp_path / "variant_quick.csv")))
    assert len(rows) == 1 and len(_table(path)) == 2
    r = rows[0]
    assert r["model"] == "yolov8n" and float(r["gflops_ratio"]) == pytest.approx(0.5, abs=0.025)
    assert 0 <= float(r["map50_95_finetuned"]) <= 1 and (Path(r["run"]) / "report.json").is_file()
    assert Path(r["run"]).parent == tmp_path / "runs" / "variant_quick"
    config = (Path(r["run"]) / "config.yaml").read_text()
    assert "selective: true" in config and "schedule: target" in config


def test_quick_yolo_latency_table(tmp_path: Path) -> None:
    [path] = runner.main(["yolo_latency", "--quick", "--out", str(tmp_path)])
    assert path == tmp_path / "yolo_latency_quick.md" and "BatchNorm fused" in path.read_text()
    rows = list(csv.DictReader(open(tmp_path / "yolo_latency_quick.csv")))
    assert len(rows) == len(_table(path)) - 1 == 1
    r = rows[0]
    assert float(r["gflops_ratio"]) == pytest.approx(0.5, abs=0.05)  # the pruned copy, counted as ultralytics does
    assert float(r["speedup"]) == pytest.approx(float(r["latency_ms_baseline"]) / float(r["latency_ms_model"]))
    ratio = float(r["gflops640_baseline"]) / float(r["gflops640_model"])
    assert float(r["speedup_per_gflops_ratio"]) == pytest.approx(float(r["speedup"]) / ratio)


def test_readme_tables_match_the_generated_files(tmp_path: Path) -> None:
    """docs/results.md and README.md hold the generated tables between their markers, as generated."""
    from experiments import readme

    assert [p.relative_to(readme.ROOT).as_posix() for p in readme.PAGES] == ["docs/results.md", "README.md"]
    for page in readme.PAGES:
        assert "<!-- results:" in page.read_text(), f"{page} holds no results markers"
    assert readme.main(["--check"]) == 0, "a results page is out of date: run python -m experiments.readme"
    stale = tmp_path / "page.md"  # a page whose table was edited by hand is reported, then rewritten
    stale.write_text(readme.PAGES[1].read_text().replace("| yolov8n | 0.5 | 0 |", "| yolov8n | 0.5 | 9 |"))
    assert readme.main(["--check", "--page", str(stale)]) == 1
    assert readme.main(["--page", str(stale)]) == 0 and stale.read_text() == readme.PAGES[1].read_text()
