"""The classification pipeline end to end: every stage, the report, resume, DDP on 2 CPU processes, bad input."""

from __future__ import annotations

import json
import math
import time
from pathlib import Path

import pytest
import torch

import prunefx
from prunefx.pipeline import ConfigError, load_config, run_config
from prunefx.pipeline import runner as R
from prunefx.pipeline.backends import classify as C
from prunefx.pipeline.backends.classify import ClassifyJob, run_classify
from prunefx.pipeline.classify_model import arch_signature, classifier_factory, is_classifier_spec, read_state_dict
from prunefx.pipeline.job import STAGES
from prunefx.report import load_report
from prunefx.train.distributed import DistributedError

CONFIG = Path(__file__).resolve().parents[2] / "configs" / "digits_cnn.yaml"
# Seconds, not minutes: 8x8 digits, a narrow CNN, a few epochs. Sparsity strong enough to matter in 2 epochs.
TINY = ["model=_classify_factories:tiny_bn_cnn", "dataset.image_size=8", "epochs=4", "lr=0.1",
        "prune.sparsity.epochs=2", "prune.sparsity.schedule=constant", "prune.sparsity.s=2.0e-2",
        "prune.finetune.epochs=3", "prune.latency=false", "threads=1"]


def _job(tmp_path: Path, *extra: str) -> ClassifyJob:
    config = load_config(CONFIG, [*TINY, f"project={tmp_path}", *extra])
    return ClassifyJob.from_config(config, config_name="digits")


def _state(run_root: Path) -> dict:
    return json.loads((run_root / "state.json").read_text())


@pytest.fixture(scope="module")
def finished(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("classify")
    return run_config(CONFIG, [*TINY, f"project={tmp}", "name=e2e"], log=lambda _: None)


def test_every_stage_runs_and_the_report_shows_the_target_and_accuracies(finished):
    root = finished.root
    state = _state(root)
    assert state["status"] == "complete" and list(state["stages"]) == list(STAGES)
    report = load_report(root)
    stages = report["stages"]
    kept = stages["pruned"]["macs"] / stages["baseline"]["macs"]
    assert abs(kept - 0.5) <= 0.05 * 0.5, kept  # the requested target, by the report's own count
    assert stages["finetuned"]["macs"] == stages["pruned"]["macs"]
    base, pruned, tuned = (stages[s]["metrics"]["top1"] for s in ("baseline", "pruned", "finetuned"))
    assert base > 0.8  # 10 classes: chance is 0.1
    assert 0 <= pruned <= 1 and tuned > 0.8 and tuned >= pruned
    assert stages["pruned"]["metrics_delta"]["top1"]["abs"] == pytest.approx(pruned - base)
    assert all(0 < m["top5"] <= 1 and m["top5"] >= m["top1"] for m in (s["metrics"] for s in stages.values()))
    assert report["widths"] and all(w["after"] <= w["before"] for w in report["widths"])
    assert any(w["after"] < w["before"] for w in report["widths"])
    # Sparsity training pulled the gammas down before pruning.
    def gammas(name):
        sd = torch.load(root / "weights" / name, weights_only=True)["state_dict"]
        return torch.cat([v.abs() for k, v in sd.items() if k.endswith(".weight") and v.dim() == 1])

    assert gammas("sparse.pt").median() < gammas("baseline.pt").median() - 0.1
    assert state["stages"]["sparsity"]["gammas"]["q0.5"] == pytest.approx(gammas("sparse.pt").quantile(0.5).item())
    written = {p.name for p in root.iterdir()}
    assert {"report.md", "report.html", "report.json", "plan.json", "graph.json", "config.yaml"} <= written
    assert {"baseline.pt", "sparse.pt", "pruned.pt", "finetuned.pt"} <= {p.name for p in (root / "weights").iterdir()}


def test_finetuned_checkpoint_reloads_as_the_pruned_architecture_with_the_reported_accuracy(finished):
    root = finished.root
    job = _job(root.parent)
    model = prunefx.load(root / "weights" / "finetuned.pt", job.factory()).eval()
    pruned = prunefx.load(root / "weights" / "pruned.pt", job.factory())
    assert [p.shape for p in model.parameters()] == [p.shape for p in pruned.parameters()]
    from prunefx.data.classification import load_dataset

    test = load_dataset(job.dataset).test
    with torch.no_grad():
        top1 = (model(test.images).argmax(1) == test.labels).float().mean().item()
    assert top1 == pytest.approx(load_report(root)["stages"]["finetuned"]["metrics"]["top1"])


def test_resume_after_an_interruption_continues_without_redoing_finished_stages(tmp_path, monkeypatch):
    def boom(ctx):
        raise RuntimeError("power cut during fine-tuning")

    monkeypatch.setattr(R, "finetune_stage", boom)
    with pytest.raises(RuntimeError, match="power cut"):
        run_classify(_job(tmp_path, "name=r"), log=lambda _: None)
    root = tmp_path / "r"
    state = _state(root)
    assert state["status"] == "failed" and state["error"]["stage"] == "finetune"
    assert list(state["stages"]) == ["baseline", "sparsity", "prune"]
    pruned_bytes = (root / "weights" / "pruned.pt").read_bytes()
    monkeypatch.undo()

    def must_not_run(ctx):
        raise AssertionError("a finished stage ran again")

    for name in ("baseline_stage", "sparsity_stage", "prune_stage"):
        monkeypatch.setattr(R, name, must_not_run)
    run = run_classify(_job(tmp_path, "name=r", "resume=true"), log=lambda _: None)
    assert run.root == root and run.is_complete
    after = _state(root)
    for stage in ("baseline", "sparsity", "prune"):
        assert after["stages"][stage] == state["stages"][stage]
    assert (root / "weights" / "pruned.pt").read_bytes() == pruned_bytes
    assert load_report(root)["stages"]["finetuned"]["metrics"]["top1"] > 0.5


def test_ddp_finetune_on_two_gloo_processes(tmp_path):
    start = time.monotonic()
    run = run_classify(_job(tmp_path, "name=ddp", "nproc=2", "device=cpu"), log=lambda _: None)
    state = _state(run.root)
    assert state["status"] == "complete"
    ft = state["stages"]["finetune"]
    # Both ranks fine-tuned the pruned model that pruned.pt describes, not a fresh one.
    job = _job(tmp_path)
    pruned = prunefx.load(run.root / "weights" / "pruned.pt", job.factory())
    assert [r["rank"] for r in ft["ranks"]] == [0, 1]
    assert ft["ranks"][0]["arch"] == ft["ranks"][1]["arch"] == C._digest(arch_signature(pruned))
    assert ft["ranks"][0]["params"] == sum(p.numel() for p in pruned.parameters())
    assert ft["ranks"][0]["params"] < sum(p.numel() for p in job.factory()().parameters())
    # Each rank saw its own half of the data: finite losses that fall over the epochs in both ranks.
    losses = [row["rank_loss"] for row in ft["history"]]
    assert all(len(r) == 2 and all(math.isfinite(v) for v in r) for r in losses)
    for rank in (0, 1):
        assert losses[-1][rank] < losses[0][rank]
    assert losses[0][0] != losses[0][1]  # different shards, not one process twice
    # Metrics are reduced over ranks: evaluated on the whole test split.
    assert load_report(run.root)["stages"]["finetuned"]["metrics"]["top1"] > 0.8
    assert time.monotonic() - start < 300


def test_a_failing_rank_is_a_clear_error_not_a_hang(tmp_path):
    start = time.monotonic()
    job = _job(tmp_path, "name=fail", "nproc=2", "device=cpu", "model=_classify_factories:fails_in_rank1")
    with pytest.raises(DistributedError, match=r"worker rank 1 of 2 failed: .*simulated failure in rank 1"):
        run_classify(job, log=lambda _: None)
    state = _state(tmp_path / "fail")
    assert state["status"] == "failed" and "rank 1" in state["error"]["message"]
    assert time.monotonic() - start < 120


@pytest.mark.parametrize("override, message", [
    ("epoch=3", r"unknown key in the config.*'epoch' \(did you mean 'epochs'"),
    ("dataset.imag_size=8", r"unknown key in dataset: 'imag_size' \(did you mean 'image_size'"),
    ("dataset.name=mnist", r"unknown dataset 'mnist'"),
    ("model=torchvision:resnet19", r"unknown torchvision classifier 'resnet19'.*resnet18"),
    ("model=no_such_pkg.models:net", r"no module named 'no_such_pkg.models' for factory SPEC 'no_such_pkg.models:net'"),
    ("model=prunefx.zoo:bn_cnnn", r"'prunefx.zoo' has no attribute 'bn_cnnn'.*Did you mean bn_cnn"),
    ("prune.finetune.lr=fast", r"prune.finetune.lr must be a number"),
    ("prune.finetune.epoch=3", r"unknown key in prune.finetune: 'epoch' \(did you mean 'epochs'"),
    ("optimizer=adam", r"optimizer must be one of 'sgd', 'adamw'"),
    ("nproc=0", r"nproc must be a positive integer"),
    ("task=detect", r"task is 'detect'"),
])
def test_bad_config_is_a_config_error_before_any_work(tmp_path, override, message):
    with pytest.raises(ConfigError, match=message):
        _job(tmp_path, override)
    assert not any(tmp_path.iterdir())  # nothing was started


def test_a_checkpoint_that_does_not_match_the_model_is_refused(tmp_path):
    other = classifier_factory("_classify_factories:tiny_bn_cnn", num_classes=5, in_channels=1)()
    torch.save(other.state_dict(), tmp_path / "five_classes.pt")
    with pytest.raises(ConfigError, match=r"does not match .*shape mismatch: 16.weight \(5, 64\) vs \(10, 64\)"):
        _job(tmp_path, f"checkpoint={tmp_path / 'five_classes.pt'}")
    (tmp_path / "broken.pt").write_bytes(b"PK\x03\x04 truncated")
    with pytest.raises(ConfigError, match="not a readable weights file"):
        _job(tmp_path, f"checkpoint={tmp_path / 'broken.pt'}")
    with pytest.raises(ConfigError, match="not found"):
        _job(tmp_path, f"checkpoint={tmp_path / 'missing.pt'}")


def test_a_matching_checkpoint_replaces_baseline_training(tmp_path, finished):
    weights = finished.root / "weights" / "baseline.pt"
    run = run_classify(_job(tmp_path, "name=ck", f"checkpoint={weights}", "prune.sparsity.epochs=0",
                            "prune.finetune.epochs=0"), log=lambda _: None)
    state = _state(run.root)
    assert state["stages"]["baseline"]["source"] == f"checkpoint {weights}"
    assert "history" not in state["stages"]["baseline"]
    assert state["stages"]["baseline"]["metrics"] == _state(finished.root)["stages"]["baseline"]["metrics"]
    assert state["stages"]["finetune"]["skipped"] and "finetuned" not in load_report(run.root)["stages"]


def test_dispatch_classifier_specs_to_this_pipeline_and_ultralytics_to_yolo():
    assert is_classifier_spec("torchvision:resnet18") and is_classifier_spec("prunefx.zoo:bn_cnn")
    for yolo in ("yolov8n.yaml", "runs/best.pt", "ultralytics:yolov8n.yaml", "path/with:colon.yaml", None, 3):
        assert not is_classifier_spec(yolo)


def test_cli_exit_code_2_on_a_bad_classification_config(tmp_path):
    from typer.testing import CliRunner

    from prunefx.cli.main import app

    result = CliRunner().invoke(app, ["prune", str(CONFIG), "dataset.name=imagenet", f"project={tmp_path}"])
    assert result.exit_code == 2 and "unknown dataset 'imagenet'" in result.output


@pytest.mark.parametrize("name", ["digits_cnn", "resnet18_synthetic", "imagefolder"])
def test_shipped_classification_configs_validate(name, tmp_path):
    overrides = [f"project={tmp_path}"]
    if name == "imagefolder":
        from PIL import Image

        for split in ("train", "val"):
            for cls in ("a", "b", "c"):
                (tmp_path / "data" / split / cls).mkdir(parents=True)
                Image.new("RGB", (8, 8)).save(tmp_path / "data" / split / cls / "0.png")
        with pytest.raises(ConfigError, match="dataset root /path/to/data does not exist"):
            ClassifyJob.from_config(load_config(CONFIG.parent / f"{name}.yaml", overrides))
        overrides.append(f"dataset.root={tmp_path / 'data'}")
    job = ClassifyJob.from_config(load_config(CONFIG.parent / f"{name}.yaml", overrides), config_name=name)
    assert job.num_classes == (3 if name == "imagefolder" else 10)
    assert job.prune.target == {"flops": 0.5} and job.prune.finetune.epochs > 0 and job.prune.sparsity.epochs > 0


@pytest.mark.slow
def test_torchrun_launches_the_same_pipeline_in_two_ranks(tmp_path):
    import shutil
    import subprocess

    torchrun = shutil.which("torchrun") or pytest.skip("torchrun not on PATH")
    cmd = [torchrun, "--nproc_per_node", "2", "-m", "prunefx.pipeline", str(CONFIG), *TINY,
           f"project={tmp_path}", "name=tr", "device=cpu"]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=600, cwd=Path(__file__).resolve().parents[1])
    assert proc.returncode == 0, proc.stderr[-3000:]
    state = _state(tmp_path / "tr")
    ranks = state["stages"]["finetune"]["ranks"]
    assert state["status"] == "complete" and [r["rank"] for r in ranks] == [0, 1]
    assert ranks[0]["arch"] == ranks[1]["arch"]



def test_sparsity_from_scratch_starts_from_the_baselines_initial_weights(tmp_path):
    # With s=0 and the baseline's epochs, a stage that starts where the baseline started must retrace it exactly.
    common = [*TINY, f"project={tmp_path}", "prune.sparsity.epochs=4", "prune.sparsity.start=scratch",
              "prune.finetune.epochs=0"]
    run_config(CONFIG, [*common, "prune.sparsity.s=0", "name=s0"], log=lambda _: None)
    base = read_state_dict(tmp_path / "s0/weights/baseline.pt")
    sparse = read_state_dict(tmp_path / "s0/weights/sparse.pt")
    assert base.keys() == sparse.keys() and all(torch.equal(base[k], sparse[k]) for k in base)
    # With the target schedule the same stage drives gammas to zero (TargetSparsity aims at half of them).
    run_config(CONFIG, [*common, "batch=16", "prune.sparsity.schedule=target", "name=target"], log=lambda _: None)
    assert _state(tmp_path / "target")["stages"]["sparsity"]["gammas"]["below_0.01"] >= 0.3


def test_sparsity_s_max_is_honoured(tmp_path):
    # Regression: prune.sparsity.s_max was validated but ignored here (a second SparsityConfig without it).
    run = run_classify(_job(tmp_path, "name=smax", "prune.sparsity.schedule=target", "prune.sparsity.s=1e-3",
                            "prune.sparsity.s_max=2e-3", "prune.finetune.epochs=0"), log=lambda _: None)
    strengths = [row["sparsity_s"] for row in _state(run.root)["stages"]["sparsity"]["history"]]
    assert max(strengths) == pytest.approx(2e-3)  # the controller wanted more (no gamma near 0 yet): capped


def test_finetuning_cut_mid_epoch_resumes_from_its_last_epoch_and_ends_as_an_uninterrupted_run(tmp_path, monkeypatch):
    straight = run_classify(_job(tmp_path, "name=straight"), log=lambda _: None)
    calls, augment = [], C.augment_batch

    def cut_in_the_second_epoch(x, cfg):
        calls.append(1)
        if len(calls) == 1 + per_epoch + 3:  # the loss-kind probe, one epoch, three steps of the next
            raise RuntimeError("power cut during fine-tuning")
        return augment(x, cfg)

    per_epoch = len(C.load_dataset(_job(tmp_path).dataset).train) // 64  # batch 64, the last partial one dropped
    monkeypatch.setattr(C, "augment_batch", cut_in_the_second_epoch)
    with pytest.raises(RuntimeError, match="power cut"):
        run_classify(_job(tmp_path, "name=cut"), log=lambda _: None)
    monkeypatch.undo()
    ckpt = tmp_path / "cut" / "weights" / "finetune_recover"
    assert json.loads((ckpt / "recover.json").read_text())["step"] == per_epoch  # the first epoch's checkpoint
    lines: list[str] = []
    resumed = run_classify(_job(tmp_path, "name=cut", "resume=true"), log=lines.append)
    assert any(f"steps from step {per_epoch} " in line for line in lines)  # continued, not restarted
    ft = _state(resumed.root)["stages"]["finetune"]
    assert [row["epoch"] for row in ft["history"]] == [1, 2, 3]  # the whole stage's history, across the cut
    assert all("val_top1" in row for row in ft["history"])
    job = _job(tmp_path)
    a = prunefx.load(straight.root / "weights" / "finetuned.pt", job.factory())
    b = prunefx.load(resumed.root / "weights" / "finetuned.pt", job.factory())
    for (name, x), y in zip(a.state_dict().items(), b.state_dict().values(), strict=True):
        torch.testing.assert_close(y, x, rtol=1e-4, atol=1e-5, msg=name)
    assert _state(straight.root)["stages"]["finetune"]["metrics"] == pytest.approx(ft["metrics"], abs=1e-6)
