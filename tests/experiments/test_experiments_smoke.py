"""python -m experiments.bench_analysis --quick runs end to end and writes a well-formed CSV and Markdown report."""

from __future__ import annotations

import csv
import importlib.util
import subprocess
import sys
from pathlib import Path

import pytest

from experiments import _table as table

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "experiments" / "bench_analysis.py"
HAS_TP = importlib.util.find_spec("torch_pruning") is not None


def _load_script():
    spec = importlib.util.spec_from_file_location("bench_analysis", SCRIPT)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


@pytest.mark.slow
def test_bench_analysis_quick_writes_csv_and_md(tmp_path):
    bench = _load_script()
    proc = subprocess.run(
        [sys.executable, "-m", "experiments.bench_analysis", "--quick", "--out", str(tmp_path), "--timeout", "120"],
        capture_output=True, text=True, timeout=600, cwd=ROOT,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-3000:]

    with (tmp_path / "analysis_speed.csv").open() as f:
        reader = csv.DictReader(f)
        assert reader.fieldnames == bench.CSV_FIELDS
        rows = list(reader)
    assert [r["model"] for r in rows] == bench.QUICK_MODELS
    for r in rows:
        assert r["prunefx_status"] == "ok" and 0 < float(r["prunefx_s"]) < 60
        assert float(r["prunefx_min_s"]) <= float(r["prunefx_s"])
        assert int(r["prunable_groups"]) > 0 and int(r["groups"]) >= int(r["prunable_groups"])
        assert float(r["params_m"]) > 0 and r["input"] == "1x3x224x224"
        if HAS_TP:
            for tool in ("tp_real", "tp_meta"):
                status = r[f"{tool}_status"]
                assert status == "ok" or status.startswith(("error", "timeout")), status
                if status == "ok":
                    ratio = float(r[f"{tool}_over_prunefx"])
                    assert ratio == pytest.approx(float(r[f"{tool}_s"]) / float(r["prunefx_s"]), rel=0.01, abs=0.01)
        else:
            assert r["tp_real_status"] == r["tp_meta_status"] == ""

    md = (tmp_path / "analysis_speed.md").read_text()
    keys = ("- date:", "- machine:", "logical CPUs", "- torch threads: 2", "- torch:", "- repeats: 1", "median")
    keys += ("- torch-pruning:",)
    for key in keys:
        assert key in md, key
    table = [line for line in md.splitlines() if line.startswith("| ")]
    assert len(table) == 1 + len(rows)  # header + one line per model
    assert all(line.count("|") == table[0].count("|") for line in table)
    assert "## Summary" in md and "over 0.3 s" in md
    assert "analysis time" in proc.stdout  # the rich table was printed


def test_summary_and_files_from_synthetic_rows(tmp_path):
    """The report helpers on hand-made rows: timeouts and errors show as such, ratios are Torch-Pruning / prunefx."""
    bench = _load_script()
    rows = [
        {"model": "a", "params_m": 1.0, "input": "1x3x224x224", "prunefx_s": 0.1, "prunefx_min_s": 0.09,
         "prunefx_status": "ok", "groups": 5, "prunable_groups": 4, "tp_real_s": 0.4, "tp_real_status": "ok",
         "tp_meta_s": None, "tp_meta_status": "timeout", "tp_real_over_prunefx": 4.0, "tp_meta_over_prunefx": None},
        {"model": "b", "params_m": 2.0, "input": "1x3x224x224", "prunefx_s": 0.5, "prunefx_min_s": 0.5,
         "prunefx_status": "ok", "groups": 3, "prunable_groups": 2, "tp_real_s": None,
         "tp_real_status": "error: ZeroDivisionError", "tp_meta_s": 1.0, "tp_meta_status": "ok",
         "tp_real_over_prunefx": None, "tp_meta_over_prunefx": 2.0},
    ]  # fmt: skip
    lines = bench.summary(rows)
    assert "over 0.3 s: 1 models: b 0.50" in lines
    assert "tp_real failed on 1 models: b (error: ZeroDivisionError)" in lines
    assert "tp_meta failed on 1 models: a (timeout)" in lines
    assert any(line.startswith("tp_real / prunefx on 1 models: geometric mean 4.00x") for line in lines)
    table.write_csv(rows, tmp_path / "x.csv", bench.CSV_FIELDS, digits=4)
    bench.write_md(rows, {"date": "today"}, tmp_path / "x.md")
    got = list(csv.DictReader((tmp_path / "x.csv").open()))
    assert got[0]["tp_meta_status"] == "timeout" and got[0]["tp_meta_s"] == ""
    md = (tmp_path / "x.md").read_text()
    assert "| a | 1.0 | 0.100 | 5 (4) | 0.400 | timeout | - | 4.0x | - |" in md


def test_zoo_census_counts_fixed_channels_apart():
    """A 1000-class head is counted as fixed, not as frozen internal channels; old rows derive it."""
    import torch
    from torch import nn

    import prunefx
    from experiments import zoo_sweep

    model = nn.Sequential(nn.Conv2d(3, 8, 3), nn.BatchNorm2d(8), nn.ReLU(), nn.Conv2d(8, 16, 3), nn.BatchNorm2d(16),
                          nn.ReLU(), nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(16, 1000))
    row = zoo_sweep.census(prunefx.analyze(model, torch.randn(1, 3, 16, 16)))
    assert row["channels"] == 8 + 16 + 1000 and row["fixed_channels"] == 1000
    assert row["prunable_share"] == pytest.approx(24 / 1024, abs=1e-4)
    assert row["internal_share"] == pytest.approx(1.0)
    old = {"status": "ok", "channels": 1024, "prunable_share": 24 / 1024, "frozen_reasons": [["model output", 1000]]}
    assert zoo_sweep.internal_share(old) == pytest.approx(1.0)
    assert zoo_sweep.summary([{**old, "zoo": "timm", "model": "m"}])["half"] == 1
    assert zoo_sweep.summary([{**old, "zoo": "timm", "model": "m"}])["half_all"] == 0


def test_zoo_census_fixed_reasons_are_the_analysis_own_words():
    """Each reason the census counts as fixed is what the analysis says for such dims (vocabulary rows under export,
    a Swin3D relative-position table's rows), so a reworded reason cannot silently change the census."""
    import torch
    from torch import nn
    from torchvision.models.video.swin_transformer import SwinTransformer3d

    import prunefx
    from experiments import zoo_sweep

    class Tokens(nn.Module):
        def __init__(self):
            super().__init__()
            self.emb, self.out = nn.Embedding(50, 8), nn.Linear(8, 4)

        def forward(self, ids):
            return self.out(self.emb(ids))

    said = set()
    dg = prunefx.analyze(Tokens().eval(), (torch.randint(0, 50, (2, 5)),), capture="export")
    said |= {zoo_sweep._reason_key(g.reasons[0]) for g in dg.groups if not g.prunable}
    torch.manual_seed(0)
    swin = SwinTransformer3d(patch_size=[2, 4, 4], embed_dim=16, depths=[2], num_heads=[2], window_size=[2, 4, 4],
                             num_classes=4).eval()
    dg = prunefx.analyze(swin, torch.randn(1, 3, 4, 16, 16))
    said |= {zoo_sweep._reason_key(g.reasons[0]) for g in dg.groups if not g.prunable}
    assert set(zoo_sweep.FIXED_REASONS) <= said, said
