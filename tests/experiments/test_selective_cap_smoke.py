"""experiments/selective_cap.py --quick: every cell runs from its seed's baseline and the table has every cap."""

from __future__ import annotations

import csv
import json
from pathlib import Path

from experiments import selective_cap


def test_quick_run_writes_one_row_per_cell(tmp_path: Path) -> None:
    md = selective_cap.main(["--quick", "--out", str(tmp_path), "--runs", str(tmp_path / "runs")])
    rows = list(csv.DictReader((tmp_path / "selective_cap_quick.csv").open()))
    assert {(r["target"], float(r["layer_cap"])) for r in rows} == {(t, c) for t in ("2x", "4x") for c in (1.0, 0.5)}
    assert all(r[k] != "" for r in rows for k in ("baseline", "sparse", "pruned", "finetuned"))
    # the cap reached the run: each run's report records the sparsity settings it ran with
    for r in rows:
        report = json.loads((tmp_path / "runs" / f"s0-{r['target']}-cap{float(r['layer_cap']):g}" / "report.json")
                            .read_text())
        assert report["settings"]["config"]["prune"]["sparsity"]["layer_cap"] == float(r["layer_cap"])
    table = [line.strip("|").split("|") for line in md.read_text().splitlines() if line.startswith("| ")]
    cells = {(c[0].strip(), float(c[1])) for c in table[1:]}
    assert cells == {(r["target"], float(r["layer_cap"])) for r in rows}
