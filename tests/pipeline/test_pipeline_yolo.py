"""`prunefx prune configs/yolo.yaml`: every stage with ultralytics' own trainer, on a tiny synthetic set."""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from typer.testing import CliRunner

from prunefx.cli.main import app
from prunefx.data.detection import make_shapes_dataset
from prunefx.errors import PrunefxError
from prunefx.integrations.ultralytics.gflops import ultralytics_gflops
from prunefx.integrations.ultralytics.io import save_yolo
from prunefx.integrations.ultralytics.train import TrainHooks, load_yolo, param_count, trainer_class
from prunefx.report import load_report, validate_report

REPO = Path(__file__).resolve().parents[2]
CONFIG = str(REPO / "configs" / "yolo.yaml")
TINY = ["imgsz=64", "batch=8", "nbs=8", "prune.data.n_train=32", "prune.data.n_val=16", "prune.data.imgsz=64"]


@pytest.fixture(scope="module")
def data_yaml(tmp_path_factory) -> Path:
    return make_shapes_dataset(tmp_path_factory.mktemp("shapes"), n_train=32, n_val=16, imgsz=64)


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory) -> Path:
    """An untrained yolov8n for the shapes set's 4 classes, as an ultralytics checkpoint."""
    from ultralytics.nn.tasks import DetectionModel

    torch.manual_seed(0)
    model = DetectionModel("yolov8n.yaml", nc=4, verbose=False)
    model.names = {i: n for i, n in enumerate(("circle", "square", "triangle", "cross"))}
    path = tmp_path_factory.mktemp("ckpt") / "base.pt"
    save_yolo(model, path, train_args={"imgsz": 64})
    return path


def _prune(*args: str):
    return CliRunner().invoke(app, ["prune", CONFIG, *args])


def _shapes(path: Path) -> dict[str, tuple[int, ...]]:
    return {k: tuple(v.shape) for k, v in load_yolo(path).state_dict().items()}


@pytest.mark.slow
def test_every_stage_from_the_model_yaml(tmp_path: Path) -> None:
    result = _prune(*TINY, "epochs=1", "prune.sparsity.epochs=1", "prune.sparsity.s=2e-3",
                    "prune.sparsity.schedule=constant", "prune.finetune.epochs=1", f"project={tmp_path}", "name=e2e")
    assert result.exit_code == 0, result.output
    run = tmp_path / "e2e"
    assert f"report: {run / 'report.md'}" in result.output.replace("\n", "")
    for f in ("config.yaml", "state.json", "plan.json", "graph.json", "report.json", "report.md", "report.html",
              "widths.png",
              "weights/baseline.pt", "weights/sparse.pt", "weights/pruned.pt", "weights/best.pt", "weights/last.pt"):
        assert (run / f).is_file(), f
    for name, trained in (("baseline", "baseline/weights/best"), ("sparse", "sparsity/weights/last"),
                          ("best", "finetune/weights/best"), ("last", "finetune/weights/last")):
        # the trainer's own file under a second name, not a second copy of its bytes (issue 12, item 9)
        assert (run / f"weights/{name}.pt").samefile(run / f"train/{trained}.pt"), name
    state = json.loads((run / "state.json").read_text())
    assert state["status"] == "complete" and list(state["stages"]) == [
        "baseline",
        "sparsity",
        "prune",
        "finetune",
        "controls",  # skipped: prune.controls is empty by default
        "report",
    ]
    assert state["stages"]["controls"]["skipped"] == "prune.controls is empty"
    # Logged by the hook only once BNSparsity is attached to the trainer's optimizer: the penalty really ran.
    assert state["stages"]["sparsity"]["history"][0]["s"] == pytest.approx(2e-3)

    report = load_report(run)
    validate_report(report)
    stages = report["stages"]
    assert set(stages) == {"baseline", "pruned", "finetuned"}
    for s in stages.values():
        assert {"map50", "map50_95", "precision", "recall", "yolo_gflops@640", "yolo_gflops@64"} <= set(s["metrics"])
    # The target is half the FLOPs; in ultralytics' own GFLOPs (an independent count) within 5 %.
    ratio = stages["pruned"]["metrics"]["yolo_gflops@640"] / stages["baseline"]["metrics"]["yolo_gflops@640"]
    assert ratio == pytest.approx(0.5, abs=0.025)
    assert stages["pruned"]["macs"] == pytest.approx(0.5 * stages["baseline"]["macs"], rel=0.02)

    # Fine-tuning trained the pruned architecture, not a rebuilt yolov8n; YOLO(best.pt) loads, validates, exports.
    pruned, best = _shapes(run / "weights/pruned.pt"), _shapes(run / "weights/best.pt")
    assert best == pruned and best != _shapes(run / "weights/baseline.pt")
    from ultralytics import YOLO

    yolo = YOLO(str(run / "weights/best.pt"))
    assert param_count(yolo.model) == stages["finetuned"]["params"] < stages["baseline"]["params"]
    assert yolo.model.yaml["backbone"]  # still an ordinary DetectionModel
    assert ultralytics_gflops(yolo.model, 640) == pytest.approx(stages["finetuned"]["metrics"]["yolo_gflops@640"])
    metrics = yolo.val(
        data=report["settings"]["data"],
        imgsz=64,
        batch=8,
        device="cpu",
        workers=0,
        plots=False,
        verbose=False,
        project=str(tmp_path / "val"),
    )
    assert metrics.box.map50 == pytest.approx(stages["finetuned"]["metrics"]["map50"], abs=1e-6)
    assert yolo.predict(torch.zeros(1, 3, 64, 64), verbose=False)[0].boxes is not None

    import onnx  # the test extra pins it; ultralytics' exporter needs it

    onnx_path = Path(YOLO(str(run / "weights/best.pt")).export(format="onnx", imgsz=64, simplify=False))
    graph = onnx.load(str(onnx_path))
    onnx.checker.check_model(graph)
    first_conv = next(t for t in graph.graph.initializer if t.name == "model.0.conv.weight")  # BN folded in
    assert (
        first_conv.dims[0]
        == pruned["model.0.conv.weight"][0]
        < _shapes(run / "weights/baseline.pt")["model.0.conv.weight"][0]
    )


@pytest.mark.slow
def test_sparsity_from_scratch_retraces_the_baseline_when_the_penalty_is_zero(tmp_path: Path, data_yaml: Path) -> None:
    # start=scratch must begin where the baseline began (ultralytics builds the yaml with the same seed): with
    # s=0 and the baseline's epochs the sparse checkpoint is the baseline, weight for weight.
    result = _prune(
        *TINY,
        "model=yolov8n.yaml",
        f"data={data_yaml}",
        "epochs=1",
        "prune.sparsity.epochs=1",
        "prune.sparsity.start=scratch",
        "prune.sparsity.s=0",
        "prune.sparsity.schedule=constant",
        "prune.finetune.epochs=0",
        "prune.latency=false",
        f"project={tmp_path}",
        "name=s0",
    )
    assert result.exit_code == 0, result.output
    base = load_yolo(tmp_path / "s0/weights/baseline.pt").state_dict()
    sparse = load_yolo(tmp_path / "s0/weights/sparse.pt").state_dict()
    assert base.keys() == sparse.keys()
    assert all(torch.equal(base[k], sparse[k]) for k in base)


@pytest.mark.slow
def test_the_shipped_recipe_reaches_its_sparsity_target(tmp_path: Path) -> None:
    # configs/yolo.yaml's sparsity as shipped (from scratch, TargetSparsity, selective) on a small set: 64 steps.
    result = _prune("imgsz=64", "batch=8", "nbs=8", "prune.data.n_train=64", "prune.data.n_val=16",
                    "prune.data.imgsz=64", "epochs=1", "prune.sparsity.epochs=8", "prune.finetune.epochs=0",
                    "prune.latency=false", f"project={tmp_path}", "name=target")
    assert result.exit_code == 0, result.output
    sparsity = json.loads((tmp_path / "target/state.json").read_text())["stages"]["sparsity"]
    assert sparsity["gammas"]["below_0.01"] == pytest.approx(0.5, abs=0.1)


@pytest.mark.slow
def test_interrupted_run_resumes_after_the_last_finished_stage(
    tmp_path: Path, checkpoint: Path, data_yaml: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import prunefx.pipeline.runner as pipeline

    args = [
        *TINY,
        f"model={checkpoint}",
        f"data={data_yaml}",
        "prune.sparsity.epochs=0",
        "prune.finetune.epochs=1",
        "prune.latency=false",
        f"project={tmp_path}",
        "name=r",
    ]

    def crash(ctx):
        raise KeyboardInterrupt

    monkeypatch.setattr(pipeline, "finetune_stage", crash)
    first = _prune(*args)
    assert first.exit_code != 0
    run = tmp_path / "r"
    state = json.loads((run / "state.json").read_text())
    assert state["status"] == "interrupted" and set(state["stages"]) == {"baseline", "sparsity", "prune"}
    assert not (run / "report.json").exists()  # never looks finished
    assert "resume=true name=r" in first.output.replace("\n", "")
    pruned_mtime = (run / "weights/pruned.pt").stat().st_mtime_ns
    finished_before = {k: v["finished"] for k, v in state["stages"].items()}

    monkeypatch.undo()
    again = _prune(*args, "resume=true")
    assert again.exit_code == 0, again.output
    assert "prune: done earlier, skipped" in again.output
    assert (run / "weights/pruned.pt").stat().st_mtime_ns == pruned_mtime  # not redone
    state = json.loads((run / "state.json").read_text())
    assert state["status"] == "complete"
    assert {k: state["stages"][k]["finished"] for k in finished_before} == finished_before  # kept, not rerun
    assert _shapes(run / "weights/best.pt") == _shapes(run / "weights/pruned.pt")
    assert not list(tmp_path.glob("r2"))  # resumed in place, no new run

    assert _prune(*args, "resume=true").exit_code == 2  # a complete run cannot be resumed


@pytest.mark.slow
def test_bad_inputs_exit_2_without_a_finished_looking_run(tmp_path: Path, checkpoint: Path, data_yaml: Path) -> None:
    base = [
        *TINY,
        f"model={checkpoint}",
        f"data={data_yaml}",
        "prune.sparsity.epochs=0",
        "prune.finetune.epochs=0",
        "prune.latency=false",
        f"project={tmp_path}",
    ]
    for extra, message in [
        (["data=missing.yaml"], "data yaml missing.yaml not found"),
        (["model=yolov99z.yaml"], "unknown model"),
        (["prune.target.flops=2"], "flops must be in (0, 1]"),
        (["prune.criterion=bn-scale"], "did you mean 'bn_scale'"),
        (["prune.sparsity.epochs=1", "prune.sparsity.start=scratch"], "start=scratch trains from the model yaml"),
    ]:
        result = _prune(*base, *extra, "name=bad")
        assert result.exit_code == 2 and message in result.output.replace("\n", ""), result.output
    assert not (tmp_path / "bad").exists()
    met = _prune(*base, "prune.target.flops=1.0", "name=met")  # keeps everything: refused before any work
    assert met.exit_code == 2 and "keeps every channel" in met.output.replace("\n", ""), met.output
    assert not (tmp_path / "met").exists()
    wrong_nc = tmp_path / "wrong.yaml"
    wrong_nc.write_text(data_yaml.read_text().replace("3: cross", "3: cross\n  4: ring"))
    assert "ring" in wrong_nc.read_text()
    result = _prune(*base, f"data={wrong_nc}", "name=nc")
    assert result.exit_code == 2 and "predicts 4 classes" in result.output.replace("\n", ""), result.output
    assert _prune("--flops", "0.3").exit_code == 2  # SPEC options do not mix with a config


def test_trainer_refuses_a_model_that_is_not_the_one_handed_over(
    checkpoint: Path, data_yaml: Path, tmp_path: Path
) -> None:
    """The guard every process (DDP workers included) runs after setup: no silent rebuild from yaml."""
    model = load_yolo(checkpoint)
    hooks = TrainHooks(expected_params=param_count(model) - 1)
    trainer = trainer_class("detect")(
        overrides={
            "model": "yolov8n.yaml",
            "data": str(data_yaml),
            "epochs": 1,
            "imgsz": 64,
            "batch": 8,
            "device": "cpu",
            "workers": 0,
            "amp": False,
            "plots": False,
            "project": str(tmp_path),
            "name": "t",
        }
    )
    trainer.model = model
    hooks.register(trainer)
    with pytest.raises(PrunefxError, match="ultralytics rebuilt it"):
        trainer.train()


@pytest.mark.slow
def test_ddp_worker_file_trains_the_handed_over_pruned_model(checkpoint: Path, data_yaml: Path, tmp_path: Path) -> None:
    """Multi-GPU ultralytics runs the trainer in workers from a generated file; on CPU run that file as rank 0."""
    from ultralytics.utils.dist import generate_ddp_file

    import prunefx

    model = load_yolo(checkpoint)
    prunefx.prune(model, torch.zeros(1, 3, 64, 64), prunefx.PlanConfig(flops=0.5), check=False)
    pruned = {k: tuple(v.shape) for k, v in model.state_dict().items()}
    trainer = trainer_class("detect")(
        overrides={
            "model": str(checkpoint),
            "data": str(data_yaml),
            "epochs": 1,
            "imgsz": 64,
            "batch": 8,
            "device": "cpu",
            "workers": 0,
            "amp": False,
            "plots": False,
            "project": str(tmp_path),
            "name": "ddp",
        }
    )
    trainer.model = model
    TrainHooks.for_model(model).register(trainer)
    file = generate_ddp_file(trainer)
    try:
        env = {**os.environ, "RANK": "0", "LOCAL_RANK": "0", "WORLD_SIZE": "1"}
        out = subprocess.run([sys.executable, file], env=env, capture_output=True, text=True, timeout=600)
    finally:
        Path(file).unlink(missing_ok=True)
        Path(file).with_suffix(".pt").unlink(missing_ok=True)
    assert out.returncode == 0, out.stderr[-3000:]
    best = tmp_path / "ddp" / "weights" / "best.pt"
    assert {k: tuple(v.shape) for k, v in load_yolo(best).state_dict().items()} == pruned


@pytest.mark.slow
def test_controls_and_distillation_on_the_hard_set(tmp_path):
    # One tiny run: the hard embedded set, output KD inside ultralytics' trainer, both controls, the verdict.
    from prunefx.pipeline import run_config

    run = run_config(CONFIG, [*TINY, "prune.data.hard=true", "epochs=1", "prune.sparsity.epochs=0",
                              "prune.finetune.epochs=1", "prune.finetune.distill=true", "prune.latency=false",
                              "prune.controls=[narrow, scratch]", f"project={tmp_path}", "name=ctl"],
                     log=lambda _: None)
    state = json.loads((run.root / "state.json").read_text())
    ft = state["stages"]["finetune"]
    assert ft["distill"]["teacher"] == "baseline"
    assert ft["history"][0]["kd_loss"] > 0  # the KD term was computed in the trainer's training steps
    runs = state["stages"]["controls"]["runs"]
    assert {k: v["epochs"] for k, v in runs.items()} == {"narrow": 2, "narrow_ft": 1, "scratch": 2}
    assert abs(state["stages"]["controls"]["narrow"]["macs_vs_pruned"] - 1) <= 0.03
    report = load_report(run.root)
    rows = {r["name"]: r for r in report["controls"]["runs"]}
    assert rows["scratch"]["params"] == report["stages"]["finetuned"]["params"]
    md = (run.root / "report.md").read_text()
    verdict = md[md.index("## Verdict"):].splitlines()[2]
    scores = [report["stages"]["finetuned"]["metrics"]["map50_95"],
              *(r["metrics"]["map50_95"] for r in report["controls"]["runs"])]
    # One epoch on the hard set may teach nothing: every mAP ~0 must give "No verdict", never a ranking of noise.
    unranked = all(abs(v) < 5e-4 for v in scores)
    assert verdict.startswith("No verdict: every model scores 0 on map50_95" if unranked else "Metric: map50_95"), md
    assert "shapes-hard" in report["settings"]["data"]


def test_calibration_images_are_the_first_training_images_as_the_validator_feeds_them(data_yaml: Path) -> None:
    from prunefx.integrations.ultralytics.calibration import calibration_images

    batches = calibration_images(str(data_yaml), "detect", 64, batches=8, batch_size=12)
    assert [tuple(b.shape) for b in batches] == [(12, 3, 64, 64), (12, 3, 64, 64), (8, 3, 64, 64)]  # 32 images
    images = torch.cat(batches)
    assert images.dtype == torch.float32 and 0 <= float(images.min()) and float(images.max()) <= 1
    assert float(images.std()) > 0.05  # real pictures, not padding
    assert len(calibration_images(str(data_yaml), "detect", 64, batches=1, batch_size=12)) == 1


@pytest.mark.slow
def test_prune_refit_re_fits_on_the_datasets_training_images(
    tmp_path: Path, checkpoint: Path, data_yaml: Path
) -> None:
    result = _prune(*TINY, f"model={checkpoint}", f"data={data_yaml}", "prune.sparsity.epochs=0",
                    "prune.finetune.epochs=0", "prune.latency=false", "prune.refit=true", f"project={tmp_path}",
                    "name=refit")
    assert result.exit_code == 0, result.output
    run = tmp_path / "refit"
    refit = json.loads((run / "state.json").read_text())["stages"]["prune"]["refit"]
    assert refit["batches"] == 2 and "training images" in refit["calibration"]  # 32 images, 16 a batch
    assert refit["layers"] and refit["after"] < refit["before"]
    assert load_report(run)["settings"]["refit"] == refit
    assert _shapes(run / "weights/pruned.pt") != _shapes(checkpoint)  # an ordinary ultralytics checkpoint, pruned
