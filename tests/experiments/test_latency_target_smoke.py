"""experiments/latency_target.py --quick runs end to end and writes a well-formed table (no timing thresholds)."""

import csv
from pathlib import Path

import pytest

from experiments import latency_target


@pytest.mark.slow
def test_quick_latency_target_table(tmp_path: Path) -> None:
    path = latency_target.main(["--quick", "--out", str(tmp_path), "--cache", str(tmp_path / "cache")])
    rows = list(csv.DictReader(open(tmp_path / "latency_target_quick.csv")))
    assert [(r["backend"], r["plan"]) for r in rows] == [
        (b, p) for b in ("torch", "onnxruntime") for p in ("latency", "flops r8", "flops rauto")
    ]
    for r in rows:
        assert 0 < float(r["measured"]) and 0 < float(r["macs_ratio"]) < 1
        assert 1 <= int(r["plans"]) <= 4
        assert float(r["speedup"]) == pytest.approx(1 / float(r["measured"]))
    text = path.read_text()
    assert text.count("\n| resnet18 | 1 |") == 6 and "## Summary" in text
    assert list((tmp_path / "cache").glob("torch-cpu-b1-float32-t1-*.json"))
    assert list((tmp_path / "cache").glob("onnxruntime-cpu-b1-float32-t1-*.json"))
