"""Controls (models of the pruned model's budget trained from scratch) and the verdict that ends report.md."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
import torch
import torchvision

from prunefx import prune
from prunefx.metrics import measure
from prunefx.pipeline import load_config, run_config
from prunefx.pipeline.backends.classify import ClassifyJob, run_classify
from prunefx.pipeline.controls import NARROW_TOLERANCE, control_runs, narrow_model
from prunefx.pipeline.run_config import PruneSpec
from prunefx.plan import PlanConfig
from prunefx.report import Stage, build_report, load_report, render_markdown
from prunefx.report.verdict import verdict

CONFIG = Path(__file__).resolve().parents[2] / "configs" / "digits_cnn.yaml"
TINY = ["model=_classify_factories:tiny_bn_cnn", "dataset.image_size=8", "epochs=3", "lr=0.1",
        "prune.sparsity.epochs=0", "prune.finetune.epochs=2", "prune.latency=false", "threads=1",
        "prune.target.flops=0.5"]


@pytest.mark.parametrize("round_to", [8])  # 8: one common fraction misses; exact widths (1) reach it
def test_narrow_control_matches_the_pruned_models_macs(round_to: int) -> None:
    x = (torch.zeros(1, 3, 32, 32),)
    pruned = prune(torchvision.models.resnet18(num_classes=10).eval(), x, PlanConfig(flops=0.45), criterion="l1",
                   check=False).model
    goal = measure(pruned, x).macs
    fresh = torchvision.models.resnet18(num_classes=10).eval()
    narrow, plan, macs = narrow_model(fresh, x, goal, PlanConfig(round_to=round_to))
    assert macs == measure(narrow, x).macs
    assert abs(macs / goal - 1) <= NARROW_TOLERANCE
    # uniform: every pruned group keeps about the same fraction (rounding aside)
    kept = [g.after / g.before for g in plan.groups if g.before >= 64]
    assert max(kept) - min(kept) < 0.15
    assert narrow(x[0]).shape == (1, 10)


def test_control_runs_give_the_stated_budgets() -> None:
    spec = PruneSpec.parse({"controls": ["narrow", "scratch"], "sparsity": {"epochs": 4},
                            "finetune": {"epochs": 3}}, train_keys=set())
    assert control_runs(spec, 10) == [("narrow", "narrow_init", 17), ("narrow_ft", "narrow_init", 3),
                                      ("scratch", "scratch_init", 17)]
    assert control_runs(PruneSpec(), 10) == []  # off by default
    no_ft = PruneSpec.parse({"controls": ["narrow"]}, train_keys=set())
    assert control_runs(no_ft, 5) == [("narrow", "narrow_init", 5)]


def _report(pruned_top1: float, narrow: float, narrow_ft: float, scratch: float) -> dict:
    m = torch.nn.Sequential(torch.nn.Conv2d(3, 8, 3), torch.nn.Conv2d(8, 4, 3))
    small = torch.nn.Sequential(torch.nn.Conv2d(3, 4, 3), torch.nn.Conv2d(4, 4, 3))
    x = torch.zeros(1, 3, 16, 16)
    big, few = measure(m, (x,)), measure(small, (x,))
    return build_report(
        model="m", baseline=Stage(big, None, {"top1": 0.9}), pruned=Stage(few, None, {"top1": 0.5}),
        finetuned=Stage(few, None, {"top1": pruned_top1}),
        controls={"metric": "top1", "total_epochs": 12, "finetune_epochs": 2, "runs": [
            ("narrow", "uniformly narrower", 12, Stage(few, None, {"top1": narrow})),
            ("narrow_ft", "uniformly narrower", 2, Stage(few, None, {"top1": narrow_ft})),
            ("scratch", "pruned architecture", 12, Stage(few, None, {"top1": scratch})),
        ]})


def test_verdict_is_produced_from_the_reports_numbers() -> None:
    report = _report(0.812, 0.800, 0.830, 0.812)
    lines = verdict(report)
    text = " ".join(lines)
    assert "Pruned beats the narrow model by 1.2 points at equal GFLOPs and equal total epochs" in text
    assert "and trails it by 1.8 points at equal fine-tune epochs" in text
    assert "pruning matches." in text  # scratch: equal numbers
    assert "0.8120 vs 0.8000" in text and "(+0.0%)" in text
    # report.md ends with the verdict, and the verdict follows the numbers when they change
    md = render_markdown(report)
    assert md.rstrip().endswith(lines[-1])
    flipped = " ".join(verdict(_report(0.70, 0.75, 0.60, 0.80)))
    assert "Pruned trails the narrow model by 5.0 points" in flipped
    assert "and beats it by 10.0 points at equal fine-tune epochs" in flipped
    assert "pruning trails it by 10.0 points" in flipped


def test_no_controls_no_verdict() -> None:
    report = _report(0.8, 0.8, 0.8, 0.8)
    del report["controls"]
    assert verdict(report) == []
    assert "## Verdict" not in render_markdown(report)


def test_report_html_shows_the_controls_and_the_verdict() -> None:
    from prunefx.report.report_html import report_html

    report = _report(0.812, 0.800, 0.830, 0.812)
    page = report_html(report)
    assert "<h3>Controls</h3>" in page and "<h3>Verdict</h3>" in page
    for name in ("narrow", "narrow_ft", "scratch"):
        assert f"<td>{name}</td>" in page
    # the same sentences as report.md, the answering ones emphasised, nothing left as markdown
    assert "<strong>Pruned beats the narrow model by 1.2 points at equal GFLOPs and equal total epochs</strong>" in page
    assert "**" not in page
    del report["controls"]
    assert "<h3>Verdict</h3>" not in report_html(report)


def _points(text: str) -> list[float]:
    return [float(v) for v in re.findall(r"by (\d+\.\d) points", text)]


def test_classification_pipeline_trains_the_controls_and_ends_with_the_verdict(tmp_path: Path) -> None:
    run = run_config(CONFIG, [*TINY, f"project={tmp_path}", "name=c", "prune.controls=[narrow, scratch]"],
                     log=lambda _: None)
    state = json.loads((run.root / "state.json").read_text())
    runs = state["stages"]["controls"]["runs"]
    assert {k: (v["epochs"], len(v["history"])) for k, v in runs.items()} == {
        "narrow": (5, 5), "narrow_ft": (2, 2), "scratch": (5, 5)}
    report = load_report(run.root)
    rows = {r["name"]: r for r in report["controls"]["runs"]}
    tuned = report["stages"]["finetuned"]
    assert rows["scratch"]["macs"] == tuned["macs"]  # the pruned architecture itself
    # the narrow control is not the pruned architecture: a uniform width, near the pruned model's MACs
    assert rows["narrow"]["params"] != tuned["params"]
    assert abs(rows["narrow"]["macs"] / tuned["macs"] - 1) <= 0.2  # tiny 16-channel layers: coarse steps
    gap = rows["narrow"]["macs"] / tuned["macs"] - 1
    assert (abs(gap) > NARROW_TOLERANCE) == any("narrow control" in w for w in report["warnings"])
    md = (run.root / "report.md").read_text()
    assert md.rstrip().splitlines()[-3].startswith("Metric: top1")
    expected = [abs(tuned["metrics"]["top1"] - rows[k]["metrics"]["top1"]) * 100 for k in ("narrow", "narrow_ft")]
    got = _points(md.rstrip().splitlines()[-2])
    assert got == pytest.approx([round(v, 1) for v in expected if round(v, 1) >= 0.05], abs=1e-9)


@pytest.mark.slow
def test_ddp_controls_and_distillation_on_two_gloo_processes(tmp_path: Path) -> None:
    config = load_config(CONFIG, [*TINY, f"project={tmp_path}", "name=ddp", "nproc=2", "device=cpu", "epochs=2",
                                  "prune.finetune.epochs=1", "prune.controls=[narrow, scratch]",
                                  "prune.finetune.distill=true"])
    run = run_classify(ClassifyJob.from_config(config, config_name="digits"), log=lambda _: None)
    state = json.loads((run.root / "state.json").read_text())
    assert state["status"] == "complete"
    assert state["stages"]["finetune"]["distill"]["teacher"] == "baseline"
    for role, row in state["stages"]["controls"]["runs"].items():
        assert all(len(h["rank_loss"]) == 2 for h in row["history"]), role  # both ranks trained every control
    assert load_report(run.root)["controls"]["runs"]
