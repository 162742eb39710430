"""experiments/classify_slimming.py --quick runs the pipeline at both targets and writes a consistent CSV + table."""

from __future__ import annotations

import csv

import pytest


@pytest.mark.slow
def test_classify_slimming_quick(tmp_path):
    from experiments.classify_slimming import FIELDS, TARGETS, main

    md = main(["--quick", "--out", str(tmp_path / "out"), "--runs", str(tmp_path / "runs"), "--datasets", "digits",
               "--threads", "1"])
    with open(tmp_path / "out" / "classify_slimming_quick.csv") as f:
        reader = csv.DictReader(f)
        assert reader.fieldnames == FIELDS
        rows = list(reader)
    assert [r["target"] for r in rows] == list(TARGETS)
    for r in rows:
        assert abs(float(r["macs_kept"]) - TARGETS[r["target"]]) <= 0.05 * TARGETS[r["target"]]
        assert all(0 <= float(r[k]) <= 1 for k in ("baseline_top1", "pruned_top1", "finetuned_top1"))
        assert r["verify"].startswith("max relative error")
    text = md.read_text()
    assert "| digits | 2x | 0.5" in text and "| digits | 4x | 0.2" in text and "--quick" in text
