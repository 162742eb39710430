"""experiments/trained_plans.py --quick: every method cuts the trained model to the MACs asked, the table has one
row per method with the numbers of the CSV, and --combine writes the same table from the CSV."""

from __future__ import annotations

import pytest

pytest.importorskip("sklearn")

from experiments import _table as table
from experiments import trained_plans


def test_quick_run_cuts_every_method_to_the_target(tmp_path) -> None:
    md = trained_plans.main(["--quick", "--out", str(tmp_path), "--cache", str(tmp_path / "cache")])
    rows = table.read_csv(tmp_path / "trained_plans_quick.csv")
    assert [(r["method"], r["recovery"]) for r in rows] == [
        ("raw", "none"), ("normalized", "none"), ("sensitivity", "refit"), ("raw", "bn-recal"), ("scratch", "none")]
    for r in rows:
        # MACs counted by torch's flop counter, independently of prunefx's cost model
        assert r["macs_kept"] == pytest.approx(0.5, abs=0.03), r
        assert 0.0 <= r["finetuned"] <= 1.0 and 0.0 <= r["baseline"] <= 1.0
        assert r["cut"] is None if r["method"] == "scratch" else 0.0 <= r["cut"] <= 1.0
    assert len(list((tmp_path / "cache").glob("resnet-seed0-epochs3-v*.pt"))) == 1  # the baseline was cached there
    lines = [line for line in md.read_text().splitlines() if line.startswith("| resnet")]
    assert len(lines) == len(rows)
    assert f"{rows[2]['cut']:.1%}" in lines[2]
    # --combine: the same rows, and the run's machine line, in trained_plans.csv / .md; nothing is run again
    combined = trained_plans.main(["--combine", str(tmp_path / "trained_plans_quick.csv"), "--quick",
                                   "--out", str(tmp_path / "all")])
    assert table.read_csv(tmp_path / "all" / "trained_plans.csv") == rows
    machine = [line for line in md.read_text().splitlines() if line.startswith("Machine: ")]
    assert len(machine) == 1 and f"{machine[0]} (trained_plans_quick)" in combined.read_text().splitlines()
    # the same number of rows drawn (their values are compared through the CSV above, not as formatted text)
    assert len([line for line in combined.read_text().splitlines() if line.startswith("| resnet")]) == len(lines)


def test_quick_vit_meets_the_macs_target_counted_independently(tmp_path) -> None:
    """The ViT (nn.MultiheadAttention): each prunefx plan keeps the MACs asked by torch's counter (the planner's
    cost model once counted attention's parts as one product and missed 0.5 by 0.2); no BatchNorm rows."""
    trained_plans.main(["--quick", "--models", "vit", "--out", str(tmp_path), "--cache", str(tmp_path / "cache")])
    rows = table.read_csv(tmp_path / "trained_plans_quick.csv")
    assert [(r["method"], r["recovery"]) for r in rows] == [
        ("raw", "none"), ("normalized", "none"), ("sensitivity", "refit"), ("scratch", "none")]
    for r in rows:
        assert r["macs_kept"] == pytest.approx(0.5, abs=0.03), r
