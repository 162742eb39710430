"""experiments/classify_slimming.py --quick runs the pipeline at both targets and writes a consistent CSV + table."""

from __future__ import annotations

import csv

import pytest


def _table_rows(text: str) -> list[list[str]]:
    """Cells of every markdown table body row (header and separator rows dropped)."""
    lines = [ln for ln in text.splitlines() if ln.startswith("|")]
    return [[c.strip() for c in ln.strip("|").split("|")] for ln in lines[2:]]


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
    assert "--quick" in text
    # The table's MACs-kept column is the CSV's number (parsed, compared with a tolerance: never the formatted text).
    table = {(cells[0], cells[1]): float(cells[2]) for cells in _table_rows(text)}
    assert set(table) == {("digits", t) for t in TARGETS}
    for r in rows:
        assert table[("digits", r["target"])] == pytest.approx(float(r["macs_kept"]), abs=5e-4)
