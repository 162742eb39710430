"""``prunefx export RUN`` of a classification pipeline run: the ONNX file computes what the run's final model does."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch
from typer.testing import CliRunner

import prunefx
from prunefx.cli.main import app
from prunefx.pipeline import load_config, run_config
from prunefx.pipeline.backends.classify import ClassifyJob

ort = pytest.importorskip("onnxruntime", reason="the deploy extra: pip install -e '.[deploy]'")

TESTS = Path(__file__).resolve().parents[1]
CONFIG = TESTS.parent / "configs" / "digits_cnn.yaml"
# tests/pipeline/test_pipeline_classify.py's tiny run, shorter still: the export is under test, not the training.
TINY = ["model=_classify_factories:tiny_bn_cnn", "dataset.image_size=8", "epochs=1", "lr=0.1",
        "prune.sparsity.epochs=0", "prune.latency=false", "threads=1"]


@pytest.mark.parametrize("finetune_epochs,final", [(1, "finetuned.pt"), (0, "pruned.pt")])
def test_export_of_a_classification_run_equals_its_final_model(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, finetune_epochs: int, final: str
) -> None:
    monkeypatch.syspath_prepend(str(TESTS))  # the run's model is _classify_factories:tiny_bn_cnn
    overrides = [*TINY, f"prune.finetune.epochs={finetune_epochs}", f"project={tmp_path}", "name=run"]
    run = run_config(CONFIG, overrides, log=lambda _: None).root
    assert (run / "weights" / "finetuned.pt").is_file() == bool(finetune_epochs)

    result = CliRunner().invoke(app, ["export", str(run)], env={"COLUMNS": "200"})
    assert result.exit_code == 0, result.output
    assert "wrote" in result.stdout and (run / "model.onnx").is_file()

    job = ClassifyJob.from_config(load_config(CONFIG, overrides))
    model = prunefx.load(run / "weights" / final, job.factory()).eval()
    x = torch.rand(1, *job.example().shape[1:], generator=torch.Generator().manual_seed(0))
    session = ort.InferenceSession(str(run / "model.onnx"), providers=["CPUExecutionProvider"])
    (got,) = session.run(None, {session.get_inputs()[0].name: x.numpy()})
    with torch.no_grad():
        expected = model(x).numpy()
    assert expected.shape == (1, 10) and np.abs(got - expected).max() <= 1e-4 * np.abs(expected).max()
