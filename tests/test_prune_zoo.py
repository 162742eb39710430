"""Every torchvision classifier and the ultralytics n-models prune at 30% and 50% (bn_scale, l2 where a group has
no BatchNorm) and equal their masked originals."""

import copy

import pytest
import torch
import torchvision
from _nets import randomize_bn

import prunefx
from prunefx.metrics import measure
from prunefx.plan import CostModel, PlanConfig, make_plan
from prunefx.transform.rewrite import apply_plan
from prunefx.verify import verify

ZOO = torchvision.models.list_models(module=torchvision.models)
FAST = {"resnet18", "mobilenet_v3_small", "shufflenet_v2_x0_5", "squeezenet1_1", "mnasnet0_5", "regnet_x_400mf",
        "efficientnet_b0", "densenet121", "googlenet", "convnext_tiny", "vit_b_32", "swin_t"}
NEEDS_224 = ("vit", "swin", "maxvit")  # fixed patch/window geometry


def _input(name: str) -> torch.Tensor:
    if "inception" in name:
        return torch.randn(2, 3, 299, 299)
    s = 224 if name.startswith(NEEDS_224) else 64
    return torch.randn(2, 3, s, s)


def _check(model, x, ratio):
    original = copy.deepcopy(model)
    dg = prunefx.analyze(model, x)
    assert dg.prunable, "every zoo model has prunable channels"
    scores = prunefx.score(model, dg, "bn_scale", fallback="l2")  # l2 where a group has no BatchNorm
    assert set(scores.values) == {g.id for g in dg.prunable}
    plan = make_plan(dg, scores.values, PlanConfig(ratio=ratio), cost=CostModel(model, dg, x))
    apply_plan(model, dg, plan)
    result = verify(original, model, plan, x)
    assert result.runs_eval and result.runs_train, result.message
    assert result.ok, result.message  # exact, or not-exactly-verifiable groups named and outputs finite
    if not result.exact:
        assert result.inexact_groups
    assert measure(model, x).macs < measure(original, x).macs
    assert sum(p.numel() for p in model.parameters()) < sum(p.numel() for p in original.parameters())
    return result


@pytest.mark.parametrize("name", [pytest.param(n, marks=() if n in FAST else pytest.mark.slow) for n in ZOO])
def test_torchvision_zoo(name):
    torch.set_num_threads(2)
    model = randomize_bn(torchvision.models.get_model(name, weights=None)).eval()
    x = _input(name)
    for ratio in (0.3, 0.5):
        _check(copy.deepcopy(model), x, ratio)


@pytest.mark.parametrize(
    "cfg", ["yolov8n.yaml", "yolo11n.yaml", "yolo11n-seg.yaml", "yolov8n-pose.yaml", "yolo11n-cls.yaml"]
)
def test_ultralytics_models(cfg):
    from ultralytics.nn.tasks import ClassificationModel, DetectionModel, PoseModel, SegmentationModel

    cls = {"seg": SegmentationModel, "pose": PoseModel, "cls": ClassificationModel}.get(
        cfg.split("-")[-1][:-5], DetectionModel
    )
    model = randomize_bn(cls(cfg, verbose=False)).eval()
    x = torch.randn(1, 3, 64, 64)
    for ratio in (0.3, 0.5):
        r = _check(copy.deepcopy(model), x, ratio)
        assert r.exact
