"""ONNX export: the file ONNX Runtime runs equals the PyTorch model (1e-4, checked here independently of the export's
own check) for ResNet-18, MobileNetV2, a pruned ResNet-18, a pruned ViT-B/16 (attention heads, as
PrunedMultiheadAttention, and MLP widths) and a pruned YOLOv8n (ultralytics' exporter); bad input is one clear error."""

import sys

import numpy as np
import onnxruntime as ort
import pytest
import torch
import torchvision
from _nets import randomize_bn

import prunefx
from prunefx.onnx_export import ExportError, export_onnx


def _ort(path, *inputs: torch.Tensor) -> list[np.ndarray]:
    session = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    names = [i.name for i in session.get_inputs()]
    return session.run(None, {n: t.numpy() for n, t in zip(names, inputs, strict=True)})


def _rel(expected: torch.Tensor, got: np.ndarray) -> float:
    a = expected.detach().numpy().astype(np.float64)
    return float(np.abs(a - got).max() / np.abs(a).max())


@pytest.mark.parametrize("name,prune", [("resnet18", None), ("mobilenet_v2", None), ("resnet18", 0.5)])
def test_torchvision_export_equals_pytorch(tmp_path, name: str, prune: float | None) -> None:
    model = randomize_bn(torchvision.models.get_model(name, weights=None)).eval()
    x = torch.randn(1, 3, 64, 64)
    if prune:
        prunefx.prune(model, x, prunefx.PlanConfig(flops=prune, round_to=8))
    result = export_onnx(model, x, tmp_path / "m.onnx", dynamic_batch=True)
    assert result.opset == 18 and result.dynamic_batch and result.batches == (1, 2)
    assert result.folded.startswith("BatchNorm folded") and result.max_rel_error <= 1e-4
    x3 = torch.randn(3, 3, 64, 64)  # another batch size than either the export or its check used
    with torch.no_grad():
        expected = model(x3)
    (got,) = _ort(result.path, x3)
    assert _rel(expected, got) <= 1e-4


@pytest.mark.slow
def test_pruned_vit_b16_export_equals_pytorch(tmp_path) -> None:
    model = torchvision.models.vit_b_16(weights=None).eval()
    torch.nn.init.normal_(model.heads.head.weight, std=0.02)  # torchvision zero-initialises the head
    x = torch.randn(1, 3, 224, 224)
    result = prunefx.prune(model, x, prunefx.PlanConfig(ratio=0.5, scope="local"), criterion="l2")
    labels = [result.graph.groups[g.group].label for g in result.plan.pruned]
    assert sum("self_attention" in s for s in labels) == 12 and sum("mlp" in s for s in labels) == 12  # heads, MLPs
    exported = export_onnx(model, x, tmp_path / "vit.onnx")
    with torch.no_grad():
        expected = model(x)
    (got,) = _ort(exported.path, x)
    assert _rel(expected, got) <= 1e-4


@pytest.mark.slow
def test_pruned_yolov8n_export_with_ultralytics_equals_pytorch(tmp_path) -> None:
    from ultralytics.nn.tasks import DetectionModel

    from prunefx.integrations.ultralytics.io import load_yolo
    from prunefx.integrations.ultralytics.yolo_export import export_yolo

    model = randomize_bn(DetectionModel("yolov8n.yaml", nc=4, verbose=False)).eval()
    prunefx.prune(model, torch.zeros(1, 3, 64, 64), prunefx.PlanConfig(flops=0.5), criterion="l1")
    exported = export_yolo(model, tmp_path / "yolo.onnx", imgsz=64)
    assert exported.path.is_file() and exported.max_rel_error <= 1e-4
    # what ultralytics saves is fp16: compare with the checkpoint as YOLO(path) loads it
    from prunefx.integrations.ultralytics.io import save_yolo

    reference = load_yolo(save_yolo(model, tmp_path / "m.pt")).eval().fuse(verbose=False)
    x = torch.rand(1, 3, 64, 64)
    with torch.no_grad():
        expected = reference(x)[0]
    got = _ort(exported.path, x)[0]
    assert _rel(expected, got) <= 1e-4
    assert expected.shape[1] == 4 + 4  # boxes + the 4 classes: the pruned head kept its outputs


def test_an_export_that_differs_is_refused_and_not_written(tmp_path) -> None:
    model = randomize_bn(torchvision.models.resnet18(weights=None)).eval()
    with pytest.raises(ExportError, match=r"differs from the model: max relative error .* > 0"):
        export_onnx(model, torch.randn(1, 3, 32, 32), tmp_path / "m.onnx", rtol=0.0)
    assert not (tmp_path / "m.onnx").exists()


def test_onnxruntime_missing_is_one_clear_error(tmp_path, monkeypatch) -> None:
    monkeypatch.setitem(sys.modules, "onnxruntime", None)
    with pytest.raises(ExportError, match=r"onnxruntime, which is not installed: pip install 'prunefx\[deploy\]'"):
        export_onnx(torch.nn.Conv2d(3, 3, 1), torch.randn(1, 3, 4, 4), tmp_path / "m.onnx")
    with pytest.raises(ExportError, match="needs a torch.nn.Module"):
        export_onnx("resnet18", torch.randn(1, 3, 4, 4), tmp_path / "m.onnx")
