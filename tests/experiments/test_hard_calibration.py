"""experiments/hard_calibration.py renders ultralytics' per-epoch results.csv into the table, numbers unchanged."""

from __future__ import annotations

import csv
from pathlib import Path

import pytest

from experiments import hard_calibration as H


def test_render_reads_each_runs_results_csv(tmp_path: Path) -> None:
    cols = ["epoch", "time", "train/box_loss", "metrics/precision(B)", "metrics/recall(B)", "metrics/mAP50(B)",
            "metrics/mAP50-95(B)"]
    curves = {"yolov8n": [(0.10, 0.05), (0.30, 0.17)], "yolov8s": [(0.20, 0.09)]}
    for model, curve in curves.items():
        run = tmp_path / "runs" / f"{model}-2ep"
        run.mkdir(parents=True)
        with (run / "results.csv").open("w", newline="") as f:
            w = csv.writer(f)
            w.writerow(cols)
            for i, (m50, m) in enumerate(curve, 1):
                w.writerow([i, 10.0 * i, 1.0, 0.5, 0.5, m50, m])
    md = H.render(["yolov8n", "yolov8s"], 2, tmp_path / "runs", tmp_path, "python -m experiments.hard_calibration",
                  {})
    text = md.read_text()
    assert "yolov8n 2 of 2, yolov8s 1 of 2" in text
    body = [ln.split("|")[1:-1] for ln in text.splitlines() if ln.startswith("| ") and "epoch" not in ln]
    assert [c.strip() for c in body[1]] == ["2", "0.3000 / 0.1700", "-"]
    rows = list(csv.DictReader((tmp_path / "hard_calibration.csv").open()))
    assert [(r["model"], float(r["map50_95"])) for r in rows] == [("yolov8n", 0.05), ("yolov8n", 0.17),
                                                                   ("yolov8s", pytest.approx(0.09))]
