"""The runner's checks and diagnostics, shared by every pipeline: what is refused before any work, what is warned.

Each refusal is one ConfigError (exit 2, one ``error:`` line) before the run directory exists; each warning appears
in the run's output and in report.json / report.md.
"""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path

import pytest
import torch
from typer.testing import CliRunner

from prunefx.cli.main import app
from prunefx.pipeline import ConfigError, load_config
from prunefx.pipeline.backends.classify import ClassifyJob, run_classify
from prunefx.pipeline.backends.yolo import YoloJob
from prunefx.pipeline.diagnose import score_warnings, sparsity_warnings
from prunefx.pipeline.rundir import RunDir
from prunefx.train import SparsityConfig
from prunefx.train.sparsity import GammaStats

REPO = Path(__file__).resolve().parents[2]
DIGITS = REPO / "configs" / "digits_cnn.yaml"
YOLO = REPO / "configs" / "yolo.yaml"
TINY = ["model=_classify_factories:tiny_bn_cnn", "dataset.image_size=8", "epochs=1", "prune.sparsity.epochs=0",
        "prune.finetune.epochs=0", "prune.latency=false", "threads=1"]
TESTS = REPO / "tests"


@pytest.fixture(autouse=True)
def factories_importable(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.syspath_prepend(str(TESTS))


def _one_line_error(result) -> str:
    assert result.exit_code == 2, result.output
    lines = [line for line in result.output.splitlines() if line.strip()]
    assert len(lines) == 1 and lines[0].startswith("error: "), result.output
    return lines[0]


@pytest.mark.parametrize(("overrides", "message"), [
    (["prune.target.flops=1.0"], r"prune.target.flops=1.0 keeps every channel, so there is nothing to prune"),
    (["prune.target.ratio=0"], r"prune.target.ratio=0.0 keeps every channel"),
    (["prune.ignore=['*']"], r"none of the 4 prunable groups of _classify_factories:tiny_bn_cnn may be pruned: "
                             r"ignored by pattern '\*' \(4\)"),
    (["model=_classify_factories:nothing_prunable"], r"nothing in _classify_factories:nothing_prunable can be "
                                                     r"pruned: all \d+ channel groups are frozen"),
])
def test_a_run_that_cannot_prune_anything_is_refused_before_any_work(tmp_path, overrides, message):
    job = ClassifyJob.from_config(load_config(DIGITS, [*TINY, f"project={tmp_path}", *overrides]))
    with pytest.raises(ConfigError, match=message):
        run_classify(job, log=lambda _: None)
    assert not any(tmp_path.iterdir())  # no run directory, nothing trained


@pytest.mark.parametrize(("args", "message"), [
    (["--flops", "1.0"], "--flops 1.0 keeps every channel, so there is nothing to prune"),
    (["--ignore", "*"], "none of the 2 prunable groups of _factories:tiny_cnn may be pruned: ignored by pattern '*'"),
])
def test_one_shot_prune_refuses_a_cut_of_nothing(tmp_path, args, message):
    result = CliRunner().invoke(app, ["prune", "_factories:tiny_cnn", "--imgsz", "32", "--no-latency",
                                      "--out", str(tmp_path / "run"), *args])
    assert message in _one_line_error(result)
    assert not (tmp_path / "run").exists()


@pytest.mark.parametrize(("imgsz", "message"), [
    (-1, r"imgsz=-1: yolov8n.yaml takes square images whose side is a positive multiple of its stride 32; "
         r"use e.g. imgsz=32"),
    (0, r"imgsz=0: .* use e.g. imgsz=32"),
    (48, r"imgsz=48: .* use e.g. imgsz=64"),
    ("[64, 96]", r"imgsz must be one integer"),
])
def test_yolo_image_size_is_checked_before_the_baseline_trains(tmp_path, imgsz, message):
    with pytest.raises(ConfigError, match=message):
        YoloJob.from_config(load_config(YOLO, [f"imgsz={imgsz}", f"project={tmp_path}"]))
    assert not any(tmp_path.iterdir())


def test_an_empty_classification_checkpoint_is_one_error_line(tmp_path):
    empty = tmp_path / "empty.pt"
    empty.write_bytes(b"")
    result = CliRunner().invoke(app, ["prune", str(DIGITS), *TINY, f"checkpoint={empty}", f"project={tmp_path}"])
    assert "empty.pt" in _one_line_error(result)
    assert empty.read_bytes() == b"" and sorted(p.name for p in tmp_path.iterdir()) == ["empty.pt"]


def test_a_corrupt_config_on_resume_is_one_error_line(tmp_path):
    run = RunDir.open(tmp_path, "r", {"model": "x"})
    (run.root / "config.yaml").write_text("model: [unclosed\n")
    before = {p.name: p.read_bytes() for p in run.root.iterdir()}
    result = CliRunner().invoke(app, ["prune", str(DIGITS), *TINY, "resume=true", "name=r", f"project={tmp_path}"])
    assert "config.yaml" in _one_line_error(result)
    assert {p.name: p.read_bytes() for p in run.root.iterdir()} == before


def test_tied_scores_are_warned_in_the_output_and_the_report(tmp_path):
    # A fresh network: every BatchNorm gamma is 1, so bn_scale ties every channel.
    result = CliRunner().invoke(app, ["prune", "_factories:tiny_cnn", "--imgsz", "32", "--no-latency",
                                      "--out", str(tmp_path / "run")])
    assert result.exit_code == 0, result.output
    report = json.loads((tmp_path / "run" / "report.json").read_text())
    assert len(report["warnings"]) == 1 and "(near-)tied" in report["warnings"][0]
    assert "train with sparsity first" in report["warnings"][0]
    md = (tmp_path / "run" / "report.md").read_text()
    assert md.index("## Warnings") < md.index("| stage |") and "(near-)tied" in md
    assert "warning:" in result.output and "(near-)tied" in result.output.replace("\n", " ")
    plan = json.loads((tmp_path / "run" / "plan.json").read_text())
    # A group's reason says where its scores fall against the global threshold, not only a rank.
    assert all("the global threshold" in g["why"] and "its scores: min" in g["why"] for g in plan["groups"])


def test_separated_scores_and_gammas_are_not_warned():
    from _factories import tiny_cnn

    import prunefx

    model = tiny_cnn().eval()
    with torch.no_grad():
        model[1].weight.copy_(torch.linspace(0.01, 1.0, 8))  # gammas a sparse model would have
    result = prunefx.prune(model, torch.randn(2, 3, 32, 32), prunefx.PlanConfig(flops=0.6))
    assert score_warnings(result, "bn_scale", None) == []
    separated = GammaStats(100, below={0.01: 0.5}, quantiles={0.1: 1e-4, 0.9: 0.9})
    assert sparsity_warnings(separated, SparsityConfig(schedule="target", target=0.5)) == []


def test_sparsity_that_moved_no_gamma_is_warned():
    # The default YOLO recipe's record from issue 12: no gamma below 0.01, quantiles 0.994 .. 1.002.
    stuck = GammaStats(100, below={0.01: 0.0}, quantiles={0.1: 0.994, 0.9: 1.002})
    (constant,) = sparsity_warnings(stuck, SparsityConfig(s=1e-3))
    assert "did not separate the gammas: 0.0% below 0.01 (q0.1 0.994 .. q0.9 1.002)" in constant
    assert "start=scratch, schedule=target, selective=true" in constant
    (target,) = sparsity_warnings(replace(stuck, below={0.01: 0.1}), SparsityConfig(schedule="target", target=0.5))
    assert "reached 10.0% of the gammas below 0.01, not the target 50%" in target


def _refused(result) -> str:
    """Exit 2 with one error line on stderr (the log before it, "run directory: ...", is stdout)."""
    assert result.exit_code == 2 and "Traceback" not in result.output, result.output
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: "), result.stderr
    return lines[0]


def test_resume_refuses_a_plan_or_weights_changed_since_their_stage_wrote_them(tmp_path, monkeypatch):
    import prunefx
    import prunefx.pipeline.runner as runner

    args = ["prune", str(DIGITS), *TINY, "prune.finetune.epochs=1", "name=r", f"project={tmp_path}"]

    def stop(ctx):
        raise KeyboardInterrupt

    monkeypatch.setattr(runner, "finetune_stage", stop)
    assert CliRunner().invoke(app, args).exit_code != 0
    monkeypatch.undo()
    root = tmp_path / "r"
    plan, pruned = root / "plan.json", root / "weights" / "pruned.pt"
    kept = {p: p.read_bytes() for p in (plan, pruned, root / "state.json")}

    edited = json.loads(plan.read_text())
    edited["groups"][0]["after"] -= 1  # a width edited between stop and resume
    plan.write_text(json.dumps(edited))
    line = _refused(CliRunner().invoke(app, [*args, "resume=true"]))
    assert "plan.json changed since the prune stage wrote it" in line
    assert not (root / "weights" / "finetuned.pt").exists()  # nothing trained on the edited plan ...
    assert (root / "state.json").read_bytes() == kept[root / "state.json"]  # ... refused before anything is written
    plan.write_bytes(kept[plan])

    pruned.write_bytes((root / "weights" / "baseline.pt").read_bytes())  # a weights file swapped
    line = _refused(CliRunner().invoke(app, [*args, "resume=true"]))
    assert "weights/pruned.pt changed since the prune stage wrote it" in line
    pruned.write_bytes(kept[pruned])

    result = CliRunner().invoke(app, [*args, "resume=true"])  # everything as the stages wrote it: it resumes
    assert result.exit_code == 0, result.output
    job = ClassifyJob.from_config(load_config(DIGITS, [*TINY, f"project={tmp_path}"]))
    assert prunefx.load(root / "weights" / "finetuned.pt", job.factory())(job.example()).shape == (1, 10)


@pytest.mark.parametrize(("metric", "goal", "higher"), [
    ("top1", None, True), ("map50_95", None, True), ("r2", None, True), ("ppl", None, False),
    ("val_loss", None, False), ("mae_hz", None, False), ("mse", None, False), ("wer", None, False),
    ("mse", "max", True), ("top1", "min", False),
])
def test_the_direction_a_metric_improves_in_is_read_from_its_goal_or_its_name(metric, goal, higher):
    # the fine-tune stage keeps the cut model when the fine-tuned one scores worse: which way is worse matters
    from types import SimpleNamespace

    from prunefx.pipeline.job import higher_is_better

    assert higher_is_better(SimpleNamespace(primary_metric=metric, metric_goal=goal)) is higher
