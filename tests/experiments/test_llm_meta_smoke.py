"""experiments/llm_meta.py --quick: two layers of the 1B Llama config analysed on the meta device, one CSV row."""

from __future__ import annotations

import csv

import pytest

pytest.importorskip("transformers")

from experiments import llm_meta


@pytest.mark.slow
def test_llm_meta_quick_writes_a_row_per_tool(tmp_path):
    assert llm_meta.main(["--quick", "--sizes", "1b", "--no-tp", "--timeout", "300", "--out", str(tmp_path)]) == 0
    (row,) = list(csv.DictReader(open(tmp_path / "llm_meta_quick.csv")))
    assert row["tool"] == "prunefx" and row["status"] == "ok", row
    assert float(row["analysis_s"]) > 0 and 0 < float(row["analysis_cpu_s"])
    assert int(row["prunable"]) == 5  # 2 x heads (KV groups), 2 x MLP, the residual stream (tied embeddings)
    assert "params kept 0.7" in row["detail"]  # the plan met its parameter target
    assert "Command: `python -m experiments.llm_meta" in (tmp_path / "llm_meta_quick.md").read_text()
