"""experiments/worth_it.py: the protocol's cells, a quick classification run, its table, and resume reusing cells."""

from __future__ import annotations

import csv
from pathlib import Path

import pytest

from experiments import worth_it as W


def test_protocol_cells_and_budgets(tmp_path: Path) -> None:
    sizes = W.Sizes(seeds=(0, 1), det_epochs=50, families=("yolov8",))
    assert sizes.ks() == (5, 15)  # K = 10% and 30% of the baseline's epochs
    cls = W.classify_cells(sizes, tmp_path)
    assert len(cls) == 2 * 2 * 4  # seeds x targets x (bn_scale with controls, l1, taylor, bn_scale+kd)
    main = [c for c in cls if c.name.endswith("-bn_scale")]
    assert all(c.config["prune"]["controls"] == ["narrow", "scratch"] for c in main)
    assert all("controls" not in c.config["prune"] for c in cls if c not in main)
    # every run of a seed prunes the same baseline: the first run's, as a checkpoint
    s0 = [c for c in cls if c.seed == 0]
    assert s0[0].config["checkpoint"] is None
    first = tmp_path / "cls-s0-2x-bn_scale" / "weights" / "baseline.pt"
    assert {c.config["checkpoint"] for c in s0[1:]} == {str(first)}
    assert [c.config["prune"]["finetune"].get("distill", False) for c in s0[:4]] == [False, False, False, True]
    det = W.detect_cells(sizes, tmp_path)
    plain = {c.name: c.config["epochs"] for c in det if c.kind == "train" and c.seed == 0}
    assert plain == {"det-s0-yolov8-yolov8n-5ep": 5, "det-s0-yolov8-yolov8n-15ep": 15,
                     "det-s0-yolov8-yolov8n-75ep": 50 + 10 + 15}
    target = det[0].config["prune"]["target"]["flops"]
    assert 0.2 < target < 0.4  # yolov8n's GFLOPs over yolov8s's


def _table_rows(text: str) -> list[list[str]]:
    return [[c.strip() for c in ln.strip("|").split("|")] for ln in text.splitlines()
            if ln.startswith("| ") and not ln.startswith("| model")]


@pytest.mark.slow
def test_quick_classification_writes_the_table_and_resume_reuses_every_cell(tmp_path: Path, capsys) -> None:
    argv = ["--part", "classify", "--quick", "--out", str(tmp_path / "out"), "--runs", str(tmp_path / "runs"),
            "--set", 'cls_data={"n_train": 128, "n_val": 32, "n_test": 64}', "--set", "cls_epochs=1"]
    (md,) = W.main(argv)
    with open(tmp_path / "out" / "worth_it_classify.csv") as f:
        rows = list(csv.DictReader(f))
    names = {r["row"] for r in rows}
    assert {"baseline (unpruned)", "pruned bn_scale, fine-tuned 1 ep", "pruned l1, fine-tuned 1 ep",
            "pruned taylor, fine-tuned 1 ep", "pruned bn_scale+kd, fine-tuned 1 ep"} <= names
    assert any(n.startswith("uniformly narrower, from scratch, total epochs") for n in names)
    assert all(0 <= float(r["value"]) <= 1 for r in rows)
    text = md.read_text()
    assert "Cells finished: 8 of 8" in text and "--quick" in text and "Pruned " in text
    # the table's numbers are the CSV's (one seed: the mean is the value)
    csv_2x = {r["row"]: float(r["value"]) for r in rows if r["group"] == "2x"}
    section = text.split("**2x**", 1)[1].split("**4x**", 1)[0]
    for cells in _table_rows(section):
        assert float(cells[4].split()[0]) == pytest.approx(csv_2x[cells[0]], abs=5e-5)
    capsys.readouterr()
    W.main([*argv, "--resume"])
    assert capsys.readouterr().out.count("finished earlier, reused") == 8
