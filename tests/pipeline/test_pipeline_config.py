"""Pipeline configs and run directories: overrides, validation before any work, stage state and resume."""

import json
from pathlib import Path

import pytest
import yaml

from prunefx.pipeline import ConfigError, PruneSpec, apply_overrides, load_config
from prunefx.pipeline.backends.yolo import YoloJob, ultralytics_keys
from prunefx.pipeline.rundir import RunDir, RunError

REPO = Path(__file__).resolve().parents[2]
YOLO_CONFIG = REPO / "configs" / "yolo.yaml"


def test_overrides_reach_into_blocks_and_parse_values() -> None:
    cfg = apply_overrides({"epochs": 10, "prune": {"target": {"ratio": 0.3}}},
                          ["epochs=3", "prune.round_to=8", "prune.ignore=[model.22.*]", "prune.sparsity.s=1e-4",
                           "data=null"])
    assert cfg["epochs"] == 3 and cfg["prune"]["round_to"] == 8 and cfg["prune"]["ignore"] == ["model.22.*"]
    assert cfg["prune"]["sparsity"] == {"s": "1e-4"} and cfg["data"] is None  # YAML 1.1 reads 1e-4 as a string
    # ... which the spec accepts as a number
    assert PruneSpec.parse(cfg["prune"], train_keys=()).sparsity.config.s == 1e-4


def test_a_target_override_replaces_the_other_target_keys() -> None:
    cfg = apply_overrides({"prune": {"target": {"ratio": 0.3}}}, ["prune.target.flops=0.4"])
    assert cfg["prune"]["target"] == {"flops": 0.4}
    spec = PruneSpec.parse(cfg["prune"], train_keys=())
    assert spec.target == {"flops": 0.4} and spec.plan.flops == 0.4


@pytest.mark.parametrize("bad", ["epochs", "=3", "a..b=1", "prune.target.flops=[1"])
def test_malformed_overrides_are_errors(bad: str) -> None:
    with pytest.raises(ConfigError, match="override"):
        apply_overrides({"prune": {}}, [bad])


def test_override_into_a_scalar_is_an_error() -> None:
    with pytest.raises(ConfigError, match="epochs is 10, not a block"):
        apply_overrides({"epochs": 10}, ["epochs.x=1"])


@pytest.mark.parametrize(
    ("block", "message"),
    [
        ({"criterian": "l1"}, r"unknown key in prune: 'criterian' \(did you mean 'criterion'\?\)"),
        ({"criterion": "bn-scale"}, r"unknown value in prune.criterion: 'bn-scale' \(did you mean 'bn_scale'"),
        ({"target": {"flops": 1.5}}, r"flops must be in \(0, 1\]"),
        ({"target": {"ratio": 1.0}}, r"ratio must be in \[0, 1\)"),
        ({"target": {"flops": 0.5, "ratio": 0.2}}, "exactly one of ratio, flops, params"),
        ({"target": {"flop": 0.5}}, r"did you mean 'flops'"),
        ({"target": {"flops": "half"}}, "must be a number"),
        ({"round_to": 0}, "round_to must be an integer >= 1"),
        ({"sparsity": {"epochs": -1}}, "epochs must be >= 0"),
        ({"sparsity": {"schedule": "cosine"}}, "schedule must be one of 'constant', 'target'"),
        ({"sparsity": {"start": "pretrained"}}, "start must be one of 'baseline', 'scratch'"),
        ({"sparsity": {"epoch": 3}}, r"did you mean 'epochs'"),
        ({"finetune": {"lr00": 0.1}}, r"did you mean 'lr0'"),
        ({"verify": "yes"}, "must be true/false"),
    ],
)
def test_prune_block_errors_name_the_key_and_the_fix(block: dict, message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        PruneSpec.parse(block, train_keys={"lr0", "epochs"})


def test_prune_spec_round_trip() -> None:
    spec = PruneSpec.parse({"target": 0.4, "round_to": 8, "sparsity": {"epochs": 2, "s": 1e-3, "lr0": 0.02},
                            "finetune": {"epochs": 5, "lr0": 0.001}}, train_keys={"lr0"})
    assert spec.plan.flops == 0.4 and spec.plan.round_to == 8 and spec.sparsity.config.s == 1e-3
    assert spec.sparsity.overrides == {"lr0": 0.02} and spec.finetune.overrides == {"lr0": 0.001}
    again = PruneSpec.parse(spec.to_dict(), train_keys={"lr0"})
    assert again == spec


def test_shipped_yolo_config_validates_and_keeps_prunefx_keys_from_ultralytics() -> None:
    job = YoloJob.from_config(load_config(YOLO_CONFIG), config_name="yolo")
    assert job.data is None and job.model == "yolov8n.yaml"
    assert "prune" not in job.train and not set(job.train) - ultralytics_keys()
    assert job.prune.target == {"flops": 0.5} and job.prune.finetune.epochs > 0


@pytest.mark.parametrize(
    ("overrides", "message"),
    [
        (["epoch=3"], r"'epoch' \(did you mean 'epochs'\?\)"),
        (["epochs=abc"], "invalid ultralytics argument"),
        (["model=yolov99z.yaml"], "unknown model 'yolov99z.yaml'"),
        (["model=/nonexistent/best.pt"], "never downloads weights"),
        (["model=resnet"], "neither a model yaml nor a .pt"),
        (["data=/nonexistent/data.yaml"], "data yaml /nonexistent/data.yaml not found"),
        (["prune.target.params=0"], r"params must be in \(0, 1\]"),
        (["prune.data.n_images=5"], r"prune.data .*'n_images'"),
        (["prune.data.n_train=0"], r"prune.data.n_train must be an integer >= 1"),
        (["prune.data.hard=3"], r"prune.data.hard must be true or false"),
        (["task=segment"], "task=segment but yolov8n.yaml is a detect model"),
        (["model=yolov8n-seg.yaml"], "embedded synthetic dataset is for detection"),
    ],
)
def test_bad_yolo_configs_fail_before_any_work(overrides: list[str], message: str, tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match=message):
        YoloJob.from_config(load_config(YOLO_CONFIG, [*overrides, f"project={tmp_path}"]))
    assert not any(tmp_path.iterdir())  # nothing was created


def test_corrupt_checkpoint_is_an_error(tmp_path: Path) -> None:
    bad = tmp_path / "best.pt"
    bad.write_bytes(b"not a checkpoint")
    with pytest.raises(ConfigError, match=r"cannot load checkpoint .*best.pt: it is not a torch.save archive"):
        YoloJob.from_config(load_config(YOLO_CONFIG, [f"model={bad}", f"project={tmp_path}"]))
    assert bad.read_bytes() == b"not a checkpoint"  # what the user gave is untouched


def test_data_yaml_with_missing_images_is_an_error(tmp_path: Path) -> None:
    data = tmp_path / "data.yaml"
    data.write_text(yaml.safe_dump({"path": str(tmp_path), "train": "images/train", "val": "images/val",
                                    "names": {0: "a"}}))
    with pytest.raises(ConfigError, match="images/train do not exist"):
        YoloJob.from_config(load_config(YOLO_CONFIG, [f"data={data}"]))
    data.write_text(yaml.safe_dump({"train": "x"}))
    with pytest.raises(ConfigError, match="lacks val, names"):
        YoloJob.from_config(load_config(YOLO_CONFIG, [f"data={data}"]))


def test_missing_and_non_mapping_config_files(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="does not exist"):
        load_config(tmp_path / "nope.yaml")
    (tmp_path / "list.yaml").write_text("- a\n- b\n")
    with pytest.raises(ConfigError, match="must hold a YAML mapping"):
        load_config(tmp_path / "list.yaml")


# -- run directories ---------------------------------------------------------------------------------------------


def test_new_runs_never_overwrite_existing_ones(tmp_path: Path) -> None:
    cfg = {"epochs": 1}
    a = RunDir.open(tmp_path, "run", cfg)
    (a.root / "keep.txt").write_text("mine")
    b = RunDir.open(tmp_path, "run", cfg)
    c = RunDir.open(tmp_path, "run", cfg)
    assert [a.root.name, b.root.name, c.root.name] == ["run", "run2", "run3"]
    assert (a.root / "keep.txt").read_text() == "mine"
    assert yaml.safe_load((b.root / "config.yaml").read_text()) == cfg
    d = RunDir.open(tmp_path, "run", cfg, exist_ok=True)  # asked for: replaces
    assert d.root == a.root and not (a.root / "keep.txt").exists()


def test_a_failed_stage_is_not_done_and_resume_continues_after_the_last_finished_one(tmp_path: Path) -> None:
    cfg = {"epochs": 1, "prune": {"target": {"flops": 0.5}}}
    run = RunDir.open(tmp_path, "r", cfg)
    with run.stage("one") as info:
        info["value"] = 1
    with pytest.raises(RuntimeError), run.stage("two"):
        raise RuntimeError("boom")
    state = json.loads((run.root / "state.json").read_text())
    assert state["status"] == "failed" and state["error"]["stage"] == "two" and "two" not in state["stages"]
    assert state["stages"]["one"]["value"] == 1

    with pytest.raises(RunError, match=r"differs from the run's config.yaml in epochs"):
        RunDir.open(tmp_path, "r", {**cfg, "epochs": 2}, resume=True)
    again = RunDir.open(tmp_path, "r", {**cfg, "resume": True}, resume=True)  # run keys may differ
    assert again.root == run.root and again.done("one") == {**state["stages"]["one"]} and again.done("two") is None
    with again.stage("two"):
        pass
    again.complete()
    with pytest.raises(RunError, match="already complete"):
        RunDir.open(tmp_path, "r", cfg, resume=True)


def test_resume_without_a_run_is_an_error(tmp_path: Path) -> None:
    with pytest.raises(RunError, match="holds no state.json"):
        RunDir.open(tmp_path, "never", {}, resume=True)


def test_interrupt_is_recorded(tmp_path: Path) -> None:
    run = RunDir.open(tmp_path, "r", {})
    with pytest.raises(KeyboardInterrupt), run.stage("train"):
        raise KeyboardInterrupt
    assert json.loads((run.root / "state.json").read_text())["status"] == "interrupted"
    assert not run.is_complete


def test_report_of_an_unfinished_run_is_refused(tmp_path: Path) -> None:
    from typer.testing import CliRunner

    from prunefx.cli.main import app
    from prunefx.pipeline.rundir import check_finished

    run = RunDir.open(tmp_path, "r", {})
    (run.root / "report.json").write_text("{}")  # e.g. written just before a crash
    with pytest.raises(RunError), run.stage("report"):
        raise RunError("disk full")
    with pytest.raises(RunError, match=r"not complete \(status 'failed' in stage 'report' \(RunError: disk full"):
        check_finished(run.root)
    result = CliRunner().invoke(app, ["report", str(run.root)])
    assert result.exit_code == 2 and "is not complete" in result.output.replace("\n", "")


def test_cli_writes_the_embedded_dataset(tmp_path: Path) -> None:
    from typer.testing import CliRunner

    from prunefx.cli.main import app

    result = CliRunner().invoke(app, ["data", "shapes", str(tmp_path / "d"), "--n-train", "3", "--n-val", "2",
                                      "--imgsz", "64"])
    assert result.exit_code == 0, result.output
    data = yaml.safe_load((tmp_path / "d" / "data.yaml").read_text())
    assert Path(result.output.strip()) == tmp_path / "d" / "data.yaml" and len(data["names"]) == 4
    assert len(list((tmp_path / "d").rglob("*.jpg"))) == 5


@pytest.mark.parametrize(("config", "message"), [
    ({"task": "custon", "model": "prunefx.examples.sine:regressor"},
     r"unknown task 'custon' \(did you mean 'custom'\?\); task is one of: classify, custom, detect, llm, obb, pose"),
    ({"task": ["custom"], "model": "yolov8n.yaml"}, r"task must be one name, got \['custom'\]; task is one of"),
    # a custom config without task: is told to add it, not that `data` might be the classification `dataset`
    ({"model": "prunefx.examples.sine:regressor", "data": "prunefx.examples.sine:make_data",
      "metric": "prunefx.examples.sine:metric"}, r"the config has no task:, but metric belong to task: custom; add "
                                                 r"task: custom"),
    ({"model": "ckpt", "text": "a.txt"}, r"text belong to task: llm; add task: llm"),
    # the task decides the pipeline: the custom task's own message, whatever the model looks like
    ({"task": "custom", "model": "yolov8n.yaml", "data": "x:y", "metric": "x:z", "trust_code": True},
     r"^model must name a function as package.module:function, got 'yolov8n.yaml'"),
    ({"task": "custom", "model": "torchvision:resnet18", "data": "x:y", "metric": "x:z"},
     r"^a custom-task config runs the Python it names"),
])
def test_the_task_decides_the_pipeline_before_the_model_does(tmp_path: Path, config: dict, message: str) -> None:
    pytest.importorskip("accelerate")
    from prunefx.pipeline import run_config

    path = tmp_path / "c.yaml"
    path.write_text(yaml.safe_dump({**config, "project": str(tmp_path / "runs")}))
    with pytest.raises(ConfigError, match=message):
        run_config(path, log=lambda _: None)
    assert not (tmp_path / "runs").exists()
