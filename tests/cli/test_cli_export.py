"""``prunefx export RUN`` on a finished run of every task: the ONNX file computes what the run's final model does,
read back by the pipeline that wrote the run; a model the run names as code is never imported (``--model``)."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import torch
import yaml
from typer.testing import CliRunner

import prunefx
from prunefx.cli.main import app
from prunefx.pipeline import load_config, run_config
from prunefx.pipeline.backends.classify import ClassifyJob

ort = pytest.importorskip("onnxruntime", reason="the deploy extra: pip install -e '.[deploy]'")

TESTS = Path(__file__).resolve().parents[1]
CONFIGS = TESTS.parent / "configs"
CONFIG = CONFIGS / "digits_cnn.yaml"
# tests/pipeline/test_pipeline_classify.py's tiny run, shorter still: the export is under test, not the training.
TINY = ["model=_classify_factories:tiny_bn_cnn", "dataset.image_size=8", "epochs=1", "lr=0.1",
        "prune.sparsity.epochs=0", "prune.latency=false", "threads=1"]


def _export(*args: object):
    return CliRunner().invoke(app, ["export", *map(str, args)], env={"COLUMNS": "200"})


def _one_line(result, pattern: str) -> None:
    assert result.exit_code == 2 and "Traceback" not in result.output, result.output
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and pattern in lines[0], result.stderr


def _ort(path: Path, *xs: torch.Tensor) -> np.ndarray:
    session = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    names = [i.name for i in session.get_inputs()]
    return session.run(None, {n: x.numpy() for n, x in zip(names, xs, strict=True)})[0]


def _close(got: np.ndarray, expected: np.ndarray) -> bool:
    return got.shape == expected.shape and np.abs(got - expected).max() <= 1e-4 * np.abs(expected).max()


@pytest.mark.parametrize("finetune_epochs,final", [(1, "finetuned.pt"), (0, "pruned.pt")])
def test_export_of_a_classification_run_equals_its_final_model(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, finetune_epochs: int, final: str
) -> None:
    monkeypatch.syspath_prepend(str(TESTS))  # the run's model is _classify_factories:tiny_bn_cnn
    overrides = [*TINY, f"prune.finetune.epochs={finetune_epochs}", f"project={tmp_path}", "name=run"]
    run = run_config(CONFIG, overrides, log=lambda _: None).root
    assert (run / "weights" / "finetuned.pt").is_file() == bool(finetune_epochs)

    # the run names its model as code (module:function): export never imports it, and says what to give
    _one_line(_export(run), "--model package.module:function")
    assert not (run / "model.onnx").exists()
    result = _export(run, "--model", "_classify_factories:tiny_bn_cnn")
    assert result.exit_code == 0, result.output
    assert "wrote" in result.stdout and (run / "model.onnx").is_file()

    job = ClassifyJob.from_config(load_config(CONFIG, overrides))
    model = prunefx.load(run / "weights" / final, job.factory()).eval()
    x = torch.rand(1, *job.example().shape[1:], generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        expected = model(x).numpy()
    assert expected.shape == (1, 10) and _close(_ort(run / "model.onnx", x), expected)


def test_export_of_a_custom_task_run_takes_the_model_from_the_command_line(tmp_path: Path) -> None:
    pytest.importorskip("accelerate")
    from prunefx.examples import sine

    config = tmp_path / "sine.yaml"
    config.write_text(yaml.safe_dump({
        "task": "custom", "model": "prunefx.examples.sine:regressor", "data": "prunefx.examples.sine:make_data",
        "metric": "prunefx.examples.sine:metric", "trust_code": True, "project": str(tmp_path), "name": "s",
        "prune": {"target": {"flops": 0.5}, "latency": False, "finetune": {"epochs": 1}}}))
    run = run_config(config, log=lambda _: None).root
    assert (run / "weights" / "finetuned.pt").is_file()

    _one_line(_export(run), "--model package.module:function")
    result = _export(run, "--model", "prunefx.examples.sine:regressor")
    assert result.exit_code == 0, result.output
    model = prunefx.load(run / "weights" / "finetuned.pt", sine.regressor).eval()
    x = torch.rand(1, *sine.make_data()["val"][0][0].shape[1:], generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        assert _close(_ort(run / "model.onnx", x), model(x).numpy())


def test_export_of_a_spec_run_builds_a_built_in_model_and_asks_for_user_code(tmp_path: Path,
                                                                            monkeypatch: pytest.MonkeyPatch) -> None:
    from prunefx.zoo import bn_cnn_synthetic

    monkeypatch.syspath_prepend(str(TESTS))
    zoo = tmp_path / "zoo"
    prune = CliRunner().invoke(app, ["prune", "prunefx.zoo:bn_cnn_synthetic", "--imgsz", "16", "--no-latency",
                                     "--out", str(zoo)])
    assert prune.exit_code == 0, prune.output
    result = _export(zoo)  # prunefx's own zoo: a fixed registry, built without --model
    assert result.exit_code == 0, result.output
    model = prunefx.load(zoo / "pruned.pt", bn_cnn_synthetic).eval()
    x = torch.rand(1, 3, 16, 16, generator=torch.Generator().manual_seed(2))
    with torch.no_grad():
        assert _close(_ort(zoo / "model.onnx", x), model(x).numpy())

    own = tmp_path / "own"
    prune = CliRunner().invoke(app, ["prune", "_classify_factories:tiny_bn_cnn", "--input", "1x1x8x8",
                                     "--no-latency", "--out", str(own)])
    assert prune.exit_code == 0, prune.output
    _one_line(_export(own), "--model package.module:function")
    result = _export(own, "--model", "_classify_factories:tiny_bn_cnn")
    assert result.exit_code == 0, result.output
    assert _ort(own / "model.onnx", torch.rand(1, 1, 8, 8)).shape == (1, 10)  # the run's recorded 1x1x8x8 input


@pytest.mark.slow  # about a minute on 2 loaded cores: the pipeline's stages, then torch.onnx on a Llama
def test_export_of_an_llm_run_reads_its_safetensors_checkpoint(tmp_path: Path) -> None:
    pytest.importorskip("accelerate")
    transformers = pytest.importorskip("transformers")
    torch.manual_seed(0)
    config = transformers.LlamaConfig(vocab_size=256, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                                      num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=32,
                                      bos_token_id=None, eos_token_id=None, pad_token_id=None)
    transformers.AutoModelForCausalLM.from_config(config).save_pretrained(tmp_path / "ckpt")
    (tmp_path / "a.txt").write_text(json.__doc__ * 8)
    prune = CliRunner().invoke(app, [
        "prune", str(CONFIGS / "llm.yaml"), f"model={tmp_path / 'ckpt'}", f"text={tmp_path / 'a.txt'}",
        "tokenizer=bytes", "seq_len=16", "batch=2", "train_batches=2", "val_batches=1", f"project={tmp_path}",
        "name=lm", "prune.depth.remove=0", "prune.target.params=0.8", "prune.criterion=l2", "prune.refit=false",
        "prune.latency=false", "prune.finetune.epochs=0"])
    assert prune.exit_code == 0, prune.output
    run = tmp_path / "lm"
    result = _export(run)
    assert result.exit_code == 0, result.output
    model = transformers.AutoModelForCausalLM.from_pretrained(run / "weights" / "pruned").eval()
    ids = torch.arange(16).reshape(1, 16)
    with torch.no_grad():
        assert _close(_ort(run / "model.onnx", ids), model(ids).logits.numpy())
    _one_line(_export(run, "--model", "x:y"), "drop --model")  # an llm run's model is its checkpoint


@pytest.mark.slow
def test_export_of_a_yolo_run_is_its_pruned_checkpoint_through_ultralytics(tmp_path: Path) -> None:
    pytest.importorskip("ultralytics")
    from ultralytics.nn.tasks import DetectionModel

    from prunefx.data.detection import make_shapes_dataset
    from prunefx.integrations.ultralytics.io import save_yolo

    data = make_shapes_dataset(tmp_path / "shapes", n_train=16, n_val=8, imgsz=64)
    torch.manual_seed(0)
    base = DetectionModel("yolov8n.yaml", nc=4, verbose=False)
    base.names = dict(enumerate(("circle", "square", "triangle", "cross")))
    save_yolo(base, tmp_path / "base.pt", train_args={"imgsz": 64})
    prune = CliRunner().invoke(app, [
        "prune", str(CONFIGS / "yolo.yaml"), f"model={tmp_path / 'base.pt'}", f"data={data}", "imgsz=64", "batch=8",
        "nbs=8", "prune.sparsity.epochs=0", "prune.finetune.epochs=0", "prune.latency=false", f"project={tmp_path}",
        "name=y"])
    assert prune.exit_code == 0, prune.output
    run = tmp_path / "y"
    result = _export(run)
    assert result.exit_code == 0, result.output
    session = ort.InferenceSession(str(run / "model.onnx"), providers=["CPUExecutionProvider"])
    assert session.get_inputs()[0].shape[-2:] == [64, 64]  # the run's imgsz, read from its config as data
