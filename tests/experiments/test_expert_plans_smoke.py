"""experiments/expert_plans.py --quick: a 4-layer 8-expert Mixtral (60 steps), half the experts kept by each plan."""

from __future__ import annotations

import csv

import pytest

pytest.importorskip("transformers")

from experiments import expert_plans


@pytest.mark.slow
def test_expert_plans_quick_measures_every_plan(tmp_path, monkeypatch):
    monkeypatch.setenv("PRUNEFX_CACHE_DIR", str(tmp_path / "cache"))
    assert expert_plans.main(["--quick", "--out", str(tmp_path)]) == 0
    rows = {r["plan"]: r for r in csv.DictReader(open(tmp_path / "expert_plans_quick.csv"))}
    assert set(rows) == {"unpruned", "reap", "frequency", "contribution", "random"}
    # 4 of 8 experts in every layer: the experts' share of the parameters halves, the rest stays
    kept = {float(rows[p]["params_kept"]) for p in ("reap", "frequency", "contribution", "random")}
    assert len(kept) == 1 and 0.5 < kept.pop() < 0.65
    assert all(float(r["ppl"]) > 1 for r in rows.values())
    assert "Command: `python -m experiments.expert_plans" in (tmp_path / "expert_plans_quick.md").read_text()
