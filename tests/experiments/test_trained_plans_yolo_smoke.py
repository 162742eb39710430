"""experiments/trained_plans_yolo.py: C2fV2 computes what C2f does, and --quick cuts every method to the MACs asked
(counted by torch's flop counter), keeps prunefx's model an ordinary ultralytics checkpoint and tables every row."""

from __future__ import annotations

import pytest

pytest.importorskip("ultralytics")

from experiments import _table as table
from experiments import trained_plans_yolo


@pytest.fixture(autouse=True)
def _offline(monkeypatch):
    monkeypatch.setenv("YOLO_OFFLINE", "1")
    from prunefx.integrations.ultralytics.env import setup_offline

    setup_offline()


def test_c2f_v2_replaces_every_c2f_and_keeps_the_outputs() -> None:
    import torch
    from ultralytics.nn.modules.block import C2f
    from ultralytics.nn.tasks import DetectionModel

    torch.manual_seed(0)
    model = DetectionModel("yolov8n.yaml", nc=4, verbose=False).eval()
    for bn in (m for m in model.modules() if isinstance(m, torch.nn.BatchNorm2d)):  # non-trivial statistics
        bn.running_mean.uniform_(-0.5, 0.5)
        bn.running_var.uniform_(0.5, 2.0)
    v2 = trained_plans_yolo.with_c2f_v2(model, 64)  # asserts equal outputs itself; checked again here
    assert not any(type(m) is C2f for m in v2.modules())
    assert sum(isinstance(m, trained_plans_yolo.C2fV2) for m in v2.modules()) == 8
    x = torch.rand(1, 3, 64, 64)
    with torch.no_grad():
        assert torch.allclose(model(x)[0], v2(x)[0], atol=1e-4, rtol=1e-4)


def test_the_scratch_control_starts_from_fresh_weights_but_keeps_the_fixed_dfl_projection() -> None:
    import torch
    from ultralytics.nn.tasks import DetectionModel

    torch.manual_seed(0)
    model = DetectionModel("yolov8n.yaml", nc=4, verbose=False)
    fresh = trained_plans_yolo.reinitialised(model, seed=1)  # another seed than the one that built it
    dfl = model.model[-1].dfl.conv.weight  # never trained: decodes box distributions at inference
    assert torch.equal(fresh.model[-1].dfl.conv.weight, dfl)
    trained = [(n, p) for n, p in model.named_parameters() if p.requires_grad and p.dim() > 1]
    new = dict(fresh.named_parameters())
    assert trained and all(not torch.equal(new[n], p) for n, p in trained)


@pytest.mark.slow
def test_quick_run_cuts_every_method_to_the_target(tmp_path) -> None:
    from ultralytics.nn.modules.block import C2f

    from prunefx.integrations.ultralytics.io import load_yolo

    runs = tmp_path / "runs"
    common = ["--quick", "--out", str(tmp_path), "--cache", str(tmp_path / "cache"), "--runs", str(runs)]
    md = trained_plans_yolo.main(common)
    rows = table.read_csv(tmp_path / "trained_plans_yolo_quick.csv")
    expected = [("raw", "none"), ("sensitivity", "refit")]
    if any(r["method"].startswith("tp_") for r in rows):
        expected.append(("tp_l2_global", "none"))
    assert [(r["method"], r["recovery"]) for r in rows] == expected
    # the control, afterwards, from the raw cut that run left: prunefx's architecture trained from scratch
    trained_plans_yolo.main([*common, "--controls-only"])
    (control,) = table.read_csv(tmp_path / "trained_plans_yolo_quick_controls.csv")
    assert (control["method"], control["cut"]) == ("scratch", None)  # trained, never cut
    for r in (*rows, control):
        assert r["error"] is None, r
        assert r["macs_kept"] == pytest.approx(0.5, abs=0.03), r
        assert all(0.0 <= r[k] <= 1.0 for k in ("baseline", "cut", "finetuned") if r[k] is not None), r
    assert len(list((tmp_path / "cache").glob("yolov8n-seed0-img64-ep1-*-v*.pt"))) == 1
    # prunefx's cut model: an ordinary ultralytics checkpoint (weights-only load), its C2f blocks kept
    pruned = load_yolo(runs / "seed0-2x-raw-none.pt")
    assert sum(type(m) is C2f for m in pruned.modules()) == 8
    lines = [line for line in md.read_text().splitlines() if line.startswith("| yolov8n")]
    assert len(lines) == len(rows)
    assert f"| {rows[0]['macs_kept']:.3f} |" in lines[0]
    # --combine: the same rows and the run's machine line in trained_plans_yolo.csv / .md; nothing is run again
    combined = trained_plans_yolo.main(["--combine", str(tmp_path / "trained_plans_yolo_quick.csv"),
                                        "--out", str(tmp_path / "all")])
    assert table.read_csv(tmp_path / "all" / "trained_plans_yolo.csv") == rows
    machine = [line for line in md.read_text().splitlines() if line.startswith("Machine: ")]
    assert len(machine) == 1 and any(line.startswith(machine[0]) for line in combined.read_text().splitlines())
    assert [line for line in combined.read_text().splitlines() if line.startswith("| yolov8n")] == lines
