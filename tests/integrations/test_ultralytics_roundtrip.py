"""A pruned YOLO stays an ordinary ultralytics model: saved, reloaded with YOLO(path), predicted, validated."""

import numpy as np
import pytest
import torch

import prunefx
from prunefx.data import make_shapes_dataset
from prunefx.integrations.ultralytics.io import save_yolo


@pytest.fixture(scope="module")
def shapes_yaml(tmp_path_factory):
    return make_shapes_dataset(tmp_path_factory.mktemp("shapes") / "ds", n_train=8, n_val=8, imgsz=64, seed=0)


@pytest.mark.parametrize("cfg", ["yolov8n.yaml", "yolo11n.yaml"])
def test_pruned_yolo_reloads_predicts_and_validates(cfg, shapes_yaml, tmp_path):
    from ultralytics import YOLO
    from ultralytics.nn.tasks import DetectionModel

    model = DetectionModel(cfg, nc=4, verbose=False)
    x = torch.randn(1, 3, 64, 64)
    result = prunefx.prune(model, x, prunefx.PlanConfig(flops=0.5), criterion="l2")
    assert result.verified.ok, result.verified.message
    widths = {n: p.shape for n, p in model.state_dict().items()}
    path = save_yolo(model, tmp_path / "pruned.pt", plan=result.plan)

    yolo = YOLO(str(path))
    assert type(yolo.model) is DetectionModel  # native class, not a GraphModule
    reloaded = {n: p.shape for n, p in yolo.model.state_dict().items()}
    assert reloaded == widths  # the pruned widths survive the checkpoint
    assert sum(p.numel() for p in yolo.model.parameters()) < sum(
        p.numel() for p in DetectionModel(cfg, nc=4, verbose=False).parameters()
    )

    preds = yolo.predict(
        np.random.default_rng(0).integers(0, 255, (80, 96, 3), dtype=np.uint8), imgsz=64, verbose=False
    )
    assert len(preds) == 1 and preds[0].boxes is not None
    metrics = yolo.val(
        data=str(shapes_yaml),
        imgsz=64,
        batch=8,
        device="cpu",
        workers=0,
        plots=False,
        verbose=False,
        project=str(tmp_path),
        name="val",
    )
    assert 0.0 <= metrics.box.map50 <= 1.0
    # train mode forward (what the trainer runs) works on the reloaded module
    yolo.model.train()
    out = yolo.model(torch.randn(2, 3, 64, 64))
    assert isinstance(out, dict) and out["boxes"].shape[1] == 64
