"""``prunefx quantize``: a model SPEC quantized from the command line, its table printed; bad input is one line."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from typer.testing import CliRunner

from prunefx.cli.main import app

TESTS = Path(__file__).resolve().parents[1]


def _run(*args: str):
    return CliRunner().invoke(app, ["quantize", *args], env={"COLUMNS": "200", "NO_COLOR": "1"})


def test_quantize_a_spec_prints_the_table(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.syspath_prepend(str(TESTS))
    result = _run("_classify_factories:tiny_bn_cnn", "--input", "1x1x8x8", "--out", str(tmp_path / "q"),
                  "--method", "minmax", "--batches", "3", "--batch", "2")
    assert result.exit_code == 0, result.output
    assert result.output.splitlines()[0].split()[:3] == ["layer", "op", "int8"]
    assert "int8 vs float on 1 held-out batch(es): output0: rel. RMS" in result.output
    assert sorted(p.name for p in (tmp_path / "q").iterdir()) == ["model.float.onnx", "model.int8.onnx"]


def test_calibration_file_of_the_wrong_kind_is_one_line(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.syspath_prepend(str(TESTS))
    torch.save({"x": torch.randn(4, 3, 8, 8)}, tmp_path / "calib.pt")
    result = _run("_classify_factories:tiny_bn_cnn", "--input", "1x1x8x8", "--out", str(tmp_path / "q"),
                  "--calib", str(tmp_path / "calib.pt"))
    assert result.exit_code == 2
    assert result.output.strip().startswith("error:") and len(result.output.strip().splitlines()) == 1
    assert "holds a dict" in result.output


def test_inputs_the_model_rejects_are_one_line(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.syspath_prepend(str(TESTS))
    result = _run("_classify_factories:tiny_bn_cnn", "--imgsz", "8", "--out", str(tmp_path / "q"))
    assert result.exit_code == 2 and len(result.output.strip().splitlines()) == 1
    assert "failed on the example inputs" in result.output
