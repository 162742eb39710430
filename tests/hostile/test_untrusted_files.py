"""Checkpoints and model yamls that run code: refused through every entry point unless trusted, and then named.

Every payload writes a marker file when it runs; a refusal must leave no marker. With the trust flag the marker
appears and a warning names the file. Stock and pruned YOLO checkpoints still load without trust.
"""

from __future__ import annotations

import warnings
from pathlib import Path

import pytest
import torch
from _hostile import Sandbox, assert_refused, assert_untouched, invoke

import prunefx
from prunefx.errors import PrunefxError, TrustWarning, UntrustedFileError
from prunefx.integrations.ultralytics.io import load_yolo, save_yolo, ultralytics_loading
from prunefx.pipeline.backends.yolo import YoloJob
from prunefx.pipeline.classify_model import read_state_dict
from prunefx.pipeline.run_config import load_config
from prunefx.pipeline.rundir import RunDir, RunLock
from prunefx.spec import load_spec

# A YOLO config that validates in a second and, if it ever started, would do little work.
YOLO_SMALL = ["imgsz=64", "batch=4", "nbs=4", "prune.data.n_train=8", "prune.data.n_val=4", "prune.data.imgsz=64"]
NOT_LOADED = r"evil\.pt was not loaded: it needs the global exec.*--trust-checkpoint"

# ultralytics evaluates `activation:` with eval(); a layer's module string may name any global of its tasks module.
EVIL_ACTIVATION = """
nc: 2
activation: "__import__('pathlib').Path('MARKER').touch() or nn.SiLU()"
backbone:
  - [-1, 1, Conv, [16, 3, 2]]
head:
  - [-1, 1, Classify, [2]]
"""
EVIL_LAYER = """
nc: 2
backbone:
  - [-1, 1, Conv, [16, 3, 2]]
  - [-1, 1, torch_safe_load, ["evil.pt"]]
head:
  - [-1, 1, Classify, [2]]
"""
PLAIN_ACTIVATION = """
nc: 2
activation: torch.nn.LeakyReLU(0.1)
backbone:
  - [-1, 1, Conv, [16, 3, 2]]
head:
  - [-1, 1, Classify, [2]]
"""


# ---- malicious pickles ------------------------------------------------------------------------------------------


@pytest.mark.parametrize("command", [["analyze"], ["flops"], ["prune", "--out", "runs/once"]])
def test_pickle_through_spec_commands(sandbox: Sandbox, command: list[str]) -> None:
    evil = sandbox.write_pickle()
    before = sandbox.snapshot()
    result = invoke(command[0], evil.name, "--imgsz", "64", *command[1:])
    assert_refused(result, NOT_LOADED)
    assert_untouched(sandbox, before)
    assert not sandbox.project.exists()


def test_pickle_as_the_yolo_pipelines_model(sandbox: Sandbox) -> None:
    evil = sandbox.write_pickle()
    before = sandbox.snapshot()
    result = invoke("prune", "yolo.yaml", f"model={evil.name}", "project=runs", *YOLO_SMALL)
    assert_refused(result, NOT_LOADED)
    assert_untouched(sandbox, before)
    assert not sandbox.project.exists()  # refused while validating, before a run directory exists


def test_pickle_planted_as_a_resumed_runs_baseline(sandbox: Sandbox) -> None:
    overrides = ["project=runs", "name=planted", *YOLO_SMALL]
    job = YoloJob.from_config(load_config("yolo.yaml", overrides), config_name="yolo")
    run = RunDir.open(job.run.project, job.run.name, job.config)
    with run.stage("baseline") as info:  # a run whose baseline is done, as far as its state says
        info.update(source="planted", metrics={"map50": 0.0})
    (run.root / "weights").mkdir()
    sandbox.write_pickle().rename(run.root / "weights" / "baseline.pt")
    RunLock.release_root(run.root)
    before = sandbox.snapshot()
    result = invoke("prune", "yolo.yaml", *overrides, "resume=true")
    assert_refused(result, r"baseline\.pt was not loaded: it needs the global exec")
    assert_untouched(sandbox, before)
    assert "stopped in stage 'sparsity'" in result.stdout


def test_pickle_as_a_classification_checkpoint(sandbox: Sandbox) -> None:
    evil = sandbox.write_pickle()
    before = sandbox.snapshot()
    result = invoke("prune", "digits_cnn.yaml", f"checkpoint={evil.name}", "project=runs")
    assert_refused(result, NOT_LOADED)
    assert_untouched(sandbox, before)


def test_pickle_through_the_python_api(sandbox: Sandbox) -> None:
    evil = sandbox.write_pickle()
    for load in (load_yolo, lambda p: load_spec(str(p)), read_state_dict):
        with pytest.raises(UntrustedFileError, match=r"needs the global exec"):
            load(evil)
    with pytest.raises(PrunefxError, match=r"not a prunefx checkpoint.*not unpickled"):
        prunefx.load(evil, lambda: torch.nn.Linear(1, 1))
    from ultralytics import YOLO

    with ultralytics_loading(), pytest.raises(TypeError, match="outside the supported"):
        YOLO(str(evil))  # ultralytics' own loads (the pipelines' evaluations) under the same rule
    assert not sandbox.marker.exists()


def test_trusted_pickle_runs_and_is_named(sandbox: Sandbox) -> None:
    evil = sandbox.write_pickle()
    result = invoke("analyze", evil.name, "--imgsz", "64", "--trust-checkpoint")
    assert sandbox.marker.exists()  # trusted: the file's code ran, as asked
    assert result.stderr.startswith(f"warning: loading {evil.name} with full unpickling")
    assert_refused(result, r"holds no ultralytics model")  # the payload is not a model after all
    sandbox.marker.unlink()
    result = invoke("prune", "yolo.yaml", f"model={evil.name}", "project=runs", "trust_checkpoint=true", *YOLO_SMALL)
    assert sandbox.marker.exists()
    assert_refused(result, r"holds no ultralytics model")
    sandbox.marker.unlink()
    result = invoke("prune", "digits_cnn.yaml", f"checkpoint={evil.name}", "project=runs", "trust_checkpoint=true")
    assert sandbox.marker.exists()
    assert_refused(result, r"holds no state_dict")
    sandbox.marker.unlink()
    with pytest.warns(TrustWarning, match=r"evil\.pt with full unpickling"), pytest.raises(PrunefxError):
        load_yolo(evil, trust_checkpoint=True)
    assert sandbox.marker.exists()


# ---- model yamls ------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("command", [["analyze"], ["flops"], ["prune", "--out", "runs/once"]])
@pytest.mark.parametrize("case", ["activation", "layer"])
def test_model_yaml_code_through_spec_commands(sandbox: Sandbox, command: list[str], case: str) -> None:
    sandbox.write_pickle()  # what the layer variant would unpickle
    path = sandbox.write_yaml(f"evil-{case}.yaml", EVIL_ACTIVATION if case == "activation" else EVIL_LAYER)
    before = sandbox.snapshot()
    result = invoke(command[0], f"ultralytics:{path.name}", "--imgsz", "32", *command[1:])
    what = r"activation .* is not a torch\.nn activation" if case == "activation" else r"'torch_safe_load'.*not a model"
    assert_refused(result, rf"model yaml evil-{case}\.yaml was not built: ultralytics would run .*{what}")
    assert_untouched(sandbox, before)


def test_model_yaml_code_as_the_yolo_pipelines_model(sandbox: Sandbox) -> None:
    path = sandbox.write_yaml("evil.yaml", EVIL_ACTIVATION)
    before = sandbox.snapshot()
    result = invoke("prune", "yolo.yaml", f"model={path.name}", "project=runs", "data=null", *YOLO_SMALL)
    assert_refused(result, r"model yaml evil\.yaml was not built")
    assert_untouched(sandbox, before)
    assert not sandbox.project.exists()


def test_trusted_model_yaml_is_built_and_named(sandbox: Sandbox) -> None:
    path = sandbox.write_yaml("evil.yaml", EVIL_ACTIVATION)
    result = invoke("analyze", f"ultralytics:{path.name}", "--imgsz", "32", "--trust-checkpoint")
    assert result.exit_code == 0, result.output
    assert sandbox.marker.exists()
    assert result.stderr.startswith("warning: building evil.yaml with activation")


def test_plain_activations_need_no_trust(sandbox: Sandbox) -> None:
    path = sandbox.write_yaml("leaky.yaml", PLAIN_ACTIVATION)
    result = invoke("analyze", f"ultralytics:{path.name}", "--imgsz", "32")
    assert result.exit_code == 0, result.output
    assert result.stderr == ""


def test_data_yaml_download_script_never_runs(sandbox: Sandbox) -> None:
    data = sandbox.write_yaml("data.yaml", "path: .\ntrain: images/train\nval: images/val\nnames: {0: a}\n"
                              "download: open('MARKER', 'w').close()\n")
    before = sandbox.snapshot()
    result = invoke("prune", "yolo.yaml", f"data={data.name}", "project=runs", *YOLO_SMALL)
    assert_refused(result, r"data yaml data\.yaml has a download: script")
    assert_untouched(sandbox, before)


# ---- Hugging Face checkpoints with their own code ----------------------------------------------------------------


def test_a_checkpoint_with_remote_code_is_refused_without_a_prompt(sandbox: Sandbox,
                                                                    monkeypatch: pytest.MonkeyPatch) -> None:
    """transformers asks on stdin whether to run a checkpoint's Python files; prunefx says no unless told yes."""
    pytest.importorskip("transformers")
    import builtins
    import json

    from prunefx.integrations import transformers as pfx_hf

    ckpt = sandbox.root / "custom"
    ckpt.mkdir()
    (ckpt / "config.json").write_text(json.dumps({
        "model_type": "evil", "architectures": ["EvilForCausalLM"],
        "auto_map": {"AutoConfig": "configuration_evil.EvilConfig",
                     "AutoModelForCausalLM": "modeling_evil.EvilForCausalLM"},
    }))
    payload = f"open({str(sandbox.marker)!r}, 'w').close()\n"
    for name in ("configuration_evil.py", "modeling_evil.py"):
        (ckpt / name).write_text(payload)
    prompts: list[str] = []

    def no_prompt(question: str = "") -> str:
        prompts.append(question)
        return "n"

    monkeypatch.setattr(builtins, "input", no_prompt)
    before = sandbox.snapshot()
    with pytest.raises(UntrustedFileError, match=r"custom was not loaded: its config\.json names an architecture "
                                                 r"defined by Python files in the checkpoint.*trust_remote_code=True"):
        pfx_hf.meta_model(ckpt)
    assert prompts == []
    assert_untouched(sandbox, before)


# ---- what must keep loading without trust -----------------------------------------------------------------------


@pytest.fixture(scope="module")
def yolo_files(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path, dict[str, tuple[int, ...]]]:
    """A stock yolov8n checkpoint and a pruned one (prunefx's save_yolo), plus the pruned shapes."""
    root = tmp_path_factory.mktemp("yolo")
    loaded = load_spec("ultralytics:yolov8n.yaml", imgsz=64)
    save_yolo(loaded.model, root / "stock.pt")
    result = prunefx.prune(loaded.model, loaded.example_inputs, prunefx.PlanConfig(flops=0.5), criterion="random")
    assert result.verified.ok
    save_yolo(loaded.model, root / "pruned.pt", plan=result.plan)
    return root / "stock.pt", root / "pruned.pt", {k: tuple(v.shape) for k, v in loaded.model.state_dict().items()}


def test_stock_and_pruned_checkpoints_load_without_trust(yolo_files, sandbox: Sandbox) -> None:
    stock, pruned, shapes = yolo_files
    with warnings.catch_warnings():
        warnings.simplefilter("error", TrustWarning)  # nothing here may need trust
        assert {k: tuple(v.shape) for k, v in load_yolo(pruned).state_dict().items()} == shapes
        assert load_spec(str(stock), imgsz=64).kind == "checkpoint"
        from ultralytics import YOLO

        with ultralytics_loading():
            assert {k: tuple(v.shape) for k, v in YOLO(str(pruned)).model.state_dict().items()} == shapes
    for path in (stock, pruned):
        result = invoke("analyze", str(path), "--imgsz", "64")
        assert result.exit_code == 0, result.output
        assert result.stderr == ""
