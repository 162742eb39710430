"""experiments/latency_accuracy.py --quick runs end to end: three plans per target, their latencies measured together,
each fine-tuned and evaluated (no timing or accuracy thresholds)."""

from pathlib import Path

import pytest

from experiments import latency_accuracy
from experiments._table import read_csv


@pytest.mark.slow
def test_quick_latency_accuracy_table(tmp_path: Path) -> None:
    path = latency_accuracy.main(["--quick", "--out", str(tmp_path), "--cache", str(tmp_path / "cache"),
                                  "--search", "2"])
    rows = read_csv(tmp_path / "latency_accuracy_quick.csv")
    assert [r["plan"] for r in rows] == ["latency", "flops, round_to 1", "flops, round_to 8"]
    for r in rows:
        assert 0 < r["macs_ratio"] < 1 and 0 < r["measured"] < 1.5
        assert r["latency_ms"] == pytest.approx(r["measured"] * r["base_ms"], rel=1e-3)
        assert 0 <= r["finetuned_top1"] <= 1
    assert 1 <= rows[0]["search"] <= 4 and all(1 <= r["search"] <= 2 for r in rows[1:])  # latency rounds; FLOPs plans
    assert rows[0]["flops_asked"] is None and all(0 < r["flops_asked"] <= 1 for r in rows[1:])
    assert "## At equal latency" in path.read_text()
    assert list((tmp_path / "cache").glob("torch-cpu-b32-float32-t1-*.json"))
