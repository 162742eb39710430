"""experiments.slimming --quick writes a well-formed table, csv and plot (the numbers are not asserted).

>>> python -m pytest -q tests/test_experiments_slimming.py
"""

from __future__ import annotations

import csv
import math

import pytest

pytest.importorskip("sklearn")
pytest.importorskip("matplotlib")

from experiments import slimming


def test_quick_run_writes_md_csv_png(tmp_path):
    md = slimming.main(["--quick", "--jobs", "2", "--out", str(tmp_path)])  # the path the published table takes
    assert md == tmp_path / "slimming_quick.md"
    with open(tmp_path / "slimming_quick.csv", newline="") as f:
        reader = csv.DictReader(f)
        assert tuple(reader.fieldnames) == slimming.COLUMNS
        rows = list(reader)
    grid = slimming.QUICK["synthetic"]
    methods = {"baseline", "sparse", "bn_scale", "random", "l1", "scratch", "uniform"}
    if slimming.have_tp():
        methods.add("tp_bn_scale")
    # per dataset and seed: baseline, one sparse model per nonzero setting, bn_scale per setting, the controls
    per_seed = 1 + (len(grid.sparsity) - 1) + len(grid.sparsity) + len(methods - {"baseline", "sparse", "bn_scale"})
    assert len(rows) == 2 * len(grid.seeds) * per_seed
    assert {r["method"] for r in rows} == methods
    assert {r["dataset"] for r in rows} == {"synthetic", "digits"}
    for r in rows:
        assert 0 < float(r["macs_kept"]) <= 1.0 and int(r["macs"]) > 0 and int(r["params"]) > 0
        tops = [float(r[k]) for k in ("top1_pruned", "top1_short", "top1_full")]
        assert all(math.isnan(t) or 0.0 <= t <= 1.0 for t in tops)
        assert not math.isnan(tops[2])
        if r["method"] in ("bn_scale", "random", "l1", "tp_bn_scale"):
            assert float(r["target"]) == 2.0 and abs(float(r["macs_kept"]) - 0.5) < 0.05  # the same MACs, measured
            assert not math.isnan(tops[0]) and not math.isnan(tops[1])
    text = md.read_text()
    assert "Command: `python -m experiments.slimming --quick`" in text and "torch thread" in text
    table = [line for line in text.splitlines() if line.startswith("| ") and "---" not in line]
    skipped = [line for line in table if "skipped: torch-pruning not installed" in line]
    assert len(skipped) == (0 if slimming.have_tp() else 1)  # without the extra the table says so in one row
    assert len(table) - len(skipped) == 1 + len({(r["dataset"], r["method"], r["sparsity"], r["target"]) for r in rows})
    assert "## Summary" in text and "bn_scale (select0.5) at 2x fewer MACs" in text
    assert (tmp_path / "slimming_quick.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    # re-rendering from the csv gives the same table
    (tmp_path / "slimming_quick.png").unlink()
    slimming.main(["--quick", "--render", "--out", str(tmp_path)])
    assert md.read_text() == text and (tmp_path / "slimming_quick.png").is_file()

    # --resume makes only the missing rows, and makes them as a full run does (same seeds, same numbers).
    csv_path = tmp_path / "slimming_quick.csv"
    lines = csv_path.read_text().splitlines()
    dropped = [line for line in lines[1:] if line.startswith("synthetic,") and ",select0.5," in line]
    assert dropped
    csv_path.write_text("\n".join(line for line in lines if line not in dropped) + "\n")
    slimming.main(["--quick", "--resume", "--out", str(tmp_path)])
    again = csv_path.read_text().splitlines()
    assert len(again) == len(lines)
    def measured(line: str) -> str:
        return line.rsplit(",", 1)[0]  # all but the seconds column
    assert sorted(map(measured, again)) == sorted(map(measured, lines))
