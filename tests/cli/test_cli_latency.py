"""The latency and export commands: `flops --latency --backend onnxruntime`, `prune --latency-target`,
`prune --round-to auto`, `export`; bad input (a device that is not there, an unknown backend, onnxruntime missing)
is one error line with exit code 2."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import numpy as np
import onnxruntime as ort
import pytest
import torch
from typer.testing import CliRunner

import prunefx
from prunefx.integrations.ultralytics.env import setup_offline
from prunefx.spec import load_spec

setup_offline()

from prunefx.cli.main import app

TESTS = Path(__file__).resolve().parents[1]
TINY = ["_factories:tiny_cnn", "--imgsz", "32"]
runner = CliRunner()


@pytest.fixture(autouse=True)
def isolated(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.syspath_prepend(str(TESTS))
    monkeypatch.setenv("PRUNEFX_CACHE_DIR", str(tmp_path / "cache"))  # latency tables of this test only


def invoke(*args: str):
    return runner.invoke(app, list(args), env={"COLUMNS": "200"})


def one_error_line(result, text: str) -> None:
    assert result.exit_code == 2, result.output
    lines = [line for line in result.stderr.splitlines() if line.strip()]
    assert len(lines) == 1 and lines[0].startswith("error: ") and text in lines[0], result.stderr


def test_flops_latency_on_onnxruntime(tmp_path: Path) -> None:
    out = tmp_path / "flops.json"
    result = invoke("flops", *TINY, "--latency", "--backend", "onnxruntime", "--threads", "1", "--json", str(out))
    assert result.exit_code == 0, result.output
    timed = json.loads(out.read_text())["latency"]
    assert timed["backend"] == "onnxruntime" and timed["deployed"].startswith("ONNX Runtime 1.31.1, opset 18")
    assert timed["threads"] == 1 and "onnxruntime: ONNX Runtime" in result.stdout


@pytest.mark.parametrize(
    "args,text",
    [
        (["--latency", "--device", "cuda:7"], "cuda:7"),
        (["--latency", "--backend", "onnxruntime", "--device", "mps"], "'cpu' or 'cuda'"),
    ],
    ids=["missing-device", "not-a-latency-device"],
)
def test_flops_latency_on_a_device_that_is_not_there(args, text) -> None:
    if torch.cuda.device_count() >= 8:
        pytest.skip("this machine has a cuda:7")
    one_error_line(invoke("flops", *TINY, *args), text)


def test_unknown_backend_and_backend_without_latency() -> None:
    result = invoke("flops", *TINY, "--latency", "--backend", "tensorrt")
    assert result.exit_code == 2 and "tensorrt" in result.stderr and "onnxruntime" in result.stderr
    result = invoke("flops", *TINY, "--backend", "onnxruntime")
    assert result.exit_code == 2 and "--latency" in result.stderr


def test_onnxruntime_missing(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setitem(sys.modules, "onnxruntime", None)
    install = "pip install 'prunefx[deploy]'"
    one_error_line(invoke("flops", *TINY, "--latency", "--backend", "onnxruntime"), install)
    one_error_line(invoke("prune", *TINY, "--latency-target", "0.5", "--backend", "onnxruntime",
                          "--out", str(tmp_path / "run")), install)  # fmt: skip
    one_error_line(invoke("export", *TINY, "--out", str(tmp_path / "m.onnx")), install)
    assert not (tmp_path / "run").exists() and not (tmp_path / "m.onnx").exists()


def test_prune_latency_target_writes_the_rounds(tmp_path: Path) -> None:
    run = tmp_path / "run"
    result = invoke("prune", *TINY, "--latency-target", "0.7", "--threads", "1", "--out", str(run))
    assert result.exit_code == 0, result.output
    plan = json.loads((run / "plan.json").read_text())
    assert plan["target"]["latency"] == 0.7 and "torch eager" in plan["target"]["deployment"]
    settings = json.loads((run / "report.json").read_text())["settings"]
    rounds = settings["latency_target"]["rounds"]
    assert 1 <= len(rounds) <= 4 and {"asked", "predicted", "measured", "noise"} <= set(rounds[0])
    assert "latency target: measured" in result.stdout
    timing = json.loads((run / "report.json").read_text())["timing"]
    assert timing["threads"] == 1 and timing["alternating"]  # baseline and pruned timed in alternating rounds
    assert len(list((tmp_path / "cache" / "latency").glob("torch-cpu-b1-float32-t1-*.json"))) == 1


def test_prune_round_to(tmp_path: Path) -> None:
    out = str(tmp_path / "r")
    result = invoke("prune", *TINY, "--round-to", "auto", "--threads", "1", "--no-latency", "--out", out)
    assert result.exit_code == 0, result.output
    assert json.loads((tmp_path / "r" / "plan.json").read_text())["target"]["round_to"] == "auto"
    result = invoke("prune", *TINY, "--round-to", "fast", "--out", str(tmp_path / "r2"))
    assert result.exit_code == 2 and "positive integer or 'auto'" in result.stderr


def test_export_spec_and_run(tmp_path: Path) -> None:
    result = invoke("export", *TINY, "--out", str(tmp_path / "tiny.onnx"), "--dynamic-batch")
    assert result.exit_code == 0, result.output
    assert "opset 18, dynamic batch" in result.stdout and (tmp_path / "tiny.onnx").is_file()

    run = tmp_path / "run"
    assert invoke("prune", *TINY, "--flops", "0.5", "--no-latency", "--out", str(run)).exit_code == 0
    refused = invoke("export", str(run))  # the run names a user factory: never imported from the run's files
    assert refused.exit_code == 2 and "--model" in refused.stderr, refused.output
    result = invoke("export", str(run), "--model", TINY[0])
    assert result.exit_code == 0, result.output
    pruned = prunefx.load(run / "pruned.pt", lambda: load_spec("_factories:tiny_cnn", imgsz=32).model).eval()
    x = torch.rand(1, 3, 32, 32)
    session = ort.InferenceSession(str(run / "model.onnx"), providers=["CPUExecutionProvider"])
    (got,) = session.run(None, {session.get_inputs()[0].name: x.numpy()})
    with torch.no_grad():
        expected = pruned(x).numpy()
    assert expected.shape[1] == 10 and np.abs(got - expected).max() <= 1e-4 * np.abs(expected).max()


def test_export_of_a_directory_that_is_no_run(tmp_path: Path) -> None:
    one_error_line(invoke("export", str(tmp_path)), "it is not a prunefx run directory")
