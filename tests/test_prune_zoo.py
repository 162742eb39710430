"""Every torchvision classifier and the ultralytics n-models prune at 30% and 50% (bn_scale, l2 where a group has
no BatchNorm) and equal their masked originals."""

import copy

import pytest
import torch
import torchvision
from _nets import randomize_bn

import prunefx
from prunefx.metrics import measure
from prunefx.plan import PlanConfig, make_plan
from prunefx.transform.rewrite import apply_plan
from prunefx.verify import verify

ZOO = torchvision.models.list_models(module=torchvision.models)
FAST = {"resnet18", "mobilenet_v3_small", "shufflenet_v2_x0_5", "squeezenet1_1", "mnasnet0_5", "regnet_x_400mf",
        "efficientnet_b0", "densenet121", "googlenet", "convnext_tiny", "vit_b_32", "swin_t"}
# Smallest inputs the architectures take: vision transformers at a smaller image_size (fewer tokens, same layers
# and widths), MaxViT's partitions need 224, inception 299 (its stem shrinks too fast below).
SIZE = {"maxvit_t": 224, "inception_v3": 299}
KWARGS = {"vit_b_16": {"image_size": 64}, "vit_b_32": {"image_size": 64}, "vit_l_16": {"image_size": 64},
          "vit_l_32": {"image_size": 64}, "vit_h_14": {"image_size": 56}}


def _input(name: str) -> torch.Tensor:
    s = KWARGS.get(name, {}).get("image_size") or SIZE.get(name, 64)
    return torch.randn(2, 3, s, s)


def _check(model, x, ratios=(0.3, 0.5)):
    """Analyse once, then prune a copy at each ratio and check it against the masked original."""
    dg = prunefx.analyze(model, x)
    assert dg.prunable, "every zoo model has prunable channels"
    scores = prunefx.score(model, dg, "bn_scale", fallback="l2")  # l2 where a group has no BatchNorm
    assert set(scores.values) == {g.id for g in dg.prunable}
    macs, params = measure(model, x).macs, sum(p.numel() for p in model.parameters())
    results = []
    for ratio in ratios:
        plan = make_plan(dg, scores, PlanConfig(ratio=ratio))
        pruned = apply_plan(copy.deepcopy(model), dg, plan)
        result = verify(model, pruned, plan, x, dg=dg)
        assert result.runs_eval and result.runs_train, result.message
        assert result.accepted, result.message  # exact, or not-exactly-verifiable groups named and outputs finite
        assert result.ok == result.exact  # an inexact cut is never called proven
        if not result.exact:
            assert result.inexact_groups and result.state == "inexact"
        assert measure(pruned, x).macs < macs
        assert sum(p.numel() for p in pruned.parameters()) < params
        results.append(result)
        del pruned
    return results


@pytest.mark.parametrize("name", [pytest.param(n, marks=() if n in FAST else pytest.mark.slow) for n in ZOO])
def test_torchvision_zoo(name):
    model = randomize_bn(torchvision.models.get_model(name, weights=None, **KWARGS.get(name, {}))).eval()
    _check(model, _input(name))


@pytest.mark.parametrize(
    "cfg", ["yolov8n.yaml", "yolo11n.yaml", "yolo11n-seg.yaml", "yolov8n-pose.yaml", "yolo11n-cls.yaml"]
)
def test_ultralytics_models(cfg):
    from ultralytics.nn.tasks import ClassificationModel, DetectionModel, PoseModel, SegmentationModel

    cls = {"seg": SegmentationModel, "pose": PoseModel, "cls": ClassificationModel}.get(
        cfg.split("-")[-1][:-5], DetectionModel
    )
    model = randomize_bn(cls(cfg, verbose=False)).eval()
    for r in _check(model, torch.randn(1, 3, 64, 64)):
        assert r.exact
