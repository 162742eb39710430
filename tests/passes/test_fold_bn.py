"""fold_bn: BatchNorm folded into the conv / linear that feeds it equals the unfolded model, and it refuses what it
cannot fold exactly (training mode, a conv output with other users, a conv called twice, batch statistics, a
BatchNorm1d over something other than a linear's features)."""

import copy

import pytest
import torch
import torchvision
from _nets import Patterns, randomize_bn
from torch import nn

from prunefx.passes import FOLD_KEY, FoldError, fold_bn

ZOO = torchvision.models.list_models(module=torchvision.models)
FAST = {"resnet18", "mobilenet_v2", "mobilenet_v3_small", "shufflenet_v2_x0_5", "squeezenet1_1", "mnasnet0_5",
        "regnet_x_400mf", "efficientnet_b0", "densenet121", "googlenet", "convnext_tiny", "vit_b_32", "swin_t"}
NEEDS_224 = ("vit", "swin", "maxvit")  # fixed patch/window geometry


def _rel(a: torch.Tensor, b: torch.Tensor) -> float:
    return float((a - b).abs().max() / a.abs().max().clamp_min(1e-12))


def _bn_calls(gm: torch.fx.GraphModule) -> int:
    modules = dict(gm.named_modules())
    return sum(
        1 for n in gm.graph.nodes
        if n.op == "call_module" and isinstance(modules[n.target], nn.modules.batchnorm._BatchNorm)
    )  # fmt: skip


def _outputs(out) -> list[torch.Tensor]:
    return [t for t in torch.utils._pytree.tree_flatten(out)[0] if isinstance(t, torch.Tensor)]


def _check_equal(model: nn.Module, x: torch.Tensor) -> torch.fx.GraphModule:
    before = copy.deepcopy(model.state_dict())
    gm = fold_bn(model, x)
    with torch.no_grad():
        for a, b in zip(_outputs(model(x)), _outputs(gm(x)), strict=True):
            assert _rel(a, b) < 1e-5
    info = gm.meta[FOLD_KEY]
    assert _bn_calls(gm) == len(info["kept"])  # every BatchNorm call is either folded away or listed with a reason
    after = model.state_dict()  # the caller's model is untouched
    assert before.keys() == after.keys() and all(torch.equal(before[k], after[k]) for k in before)
    return gm


@pytest.mark.parametrize("name", [pytest.param(n, marks=() if n in FAST else pytest.mark.slow) for n in ZOO])
def test_torchvision_zoo_folds_to_an_equal_model(name: str) -> None:
    model = randomize_bn(torchvision.models.get_model(name, weights=None)).eval()
    size = 299 if "inception" in name else 224 if name.startswith(NEEDS_224) else 64
    gm = _check_equal(model, torch.randn(1, 3, size, size))
    has_bn = any(isinstance(m, nn.modules.batchnorm._BatchNorm) for m in model.modules())
    assert bool(gm.meta[FOLD_KEY]["folded"]) == has_bn or gm.meta[FOLD_KEY]["kept"]


@pytest.mark.parametrize("cfg", ["yolov8n.yaml", pytest.param("yolo11n-seg.yaml", marks=pytest.mark.slow)])
def test_ultralytics_models_fold_to_equal_models(cfg: str) -> None:
    from ultralytics.nn.tasks import DetectionModel, SegmentationModel

    cls = SegmentationModel if "seg" in cfg else DetectionModel
    model = randomize_bn(cls(cfg, verbose=False)).eval()
    x = torch.rand(1, 3, 64, 64)
    gm = _check_equal(model, x)
    assert not gm.meta[FOLD_KEY]["kept"]  # every ultralytics Conv block is conv -> bn -> act
    with torch.no_grad():  # the meta pass left no meta tensors cached in the model (Detect's anchors)
        model(x)


def test_structure_bn_calls_are_gone() -> None:
    model = randomize_bn(nn.Sequential(nn.Conv2d(3, 8, 3), nn.BatchNorm2d(8), nn.ReLU(), nn.Flatten(),
                                       nn.Linear(8 * 14 * 14, 6), nn.BatchNorm1d(6))).eval()  # fmt: skip
    gm = _check_equal(model, torch.randn(2, 3, 16, 16))
    assert _bn_calls(gm) == 0
    assert gm.meta[FOLD_KEY]["folded"] == [("1", "0"), ("5", "4")]
    assert not gm.training


def test_patterns_shared_conv_is_kept() -> None:
    gm = _check_equal(randomize_bn(Patterns()).eval(), torch.randn(2, 3, 16, 16))
    kept = dict(gm.meta[FOLD_KEY]["kept"])
    assert set(kept) == {"shared.1"} and "called 2 times" in kept["shared.1"]
    assert len(gm.meta[FOLD_KEY]["folded"]) == 7


class _Residual(nn.Module):
    """The conv output feeds the BatchNorm and the add: folding would change what the add sees."""

    def __init__(self) -> None:
        super().__init__()
        self.conv, self.bn = nn.Conv2d(4, 4, 3, padding=1), nn.BatchNorm2d(4)

    def forward(self, x):
        y = self.conv(x)
        return self.bn(y) + y


class _Tokens(nn.Module):
    """Linear on (N, L, C) tokens then BatchNorm1d over dim 1 (L): not the linear's features."""

    def __init__(self) -> None:
        super().__init__()
        self.fc, self.bn = nn.Linear(8, 8), nn.BatchNorm1d(5)

    def forward(self, x):
        return self.bn(self.fc(x))


@pytest.mark.parametrize(
    "model,x,reason",
    [
        (_Residual(), torch.randn(2, 4, 8, 8), "has other users"),
        (nn.Sequential(nn.Conv2d(3, 4, 3), nn.BatchNorm2d(4, track_running_stats=False)), torch.randn(2, 3, 8, 8),
         "no running statistics"),
        (_Tokens(), torch.randn(2, 5, 8), "normalise dim 1"),
        (nn.Sequential(nn.ReLU(), nn.BatchNorm2d(3)), torch.randn(2, 3, 8, 8), "not a convolution or linear"),
    ],
    ids=["other-users", "batch-statistics", "bn1d-over-tokens", "after-relu"],
)
def test_refusals_keep_the_batchnorm_and_say_why(model: nn.Module, x: torch.Tensor, reason: str) -> None:
    tracked = all(m.track_running_stats for m in model.modules() if isinstance(m, nn.modules.batchnorm._BatchNorm))
    model = (randomize_bn(model) if tracked else model).eval()
    gm = _check_equal(model, x)
    assert not gm.meta[FOLD_KEY]["folded"]
    ((_, why),) = gm.meta[FOLD_KEY]["kept"]
    assert reason in why


def test_training_mode_is_refused() -> None:
    model = nn.Sequential(nn.Conv2d(3, 4, 3), nn.BatchNorm2d(4)).train()
    with pytest.raises(FoldError, match=r"eval mode \(1 is training.*call model.eval\(\) first"):
        fold_bn(model, torch.randn(1, 3, 8, 8))


def test_not_a_module_is_refused() -> None:
    with pytest.raises(FoldError, match="needs a torch.nn.Module, got dict"):
        fold_bn({"conv": nn.Conv2d(3, 3, 1)})


def test_linear_bn_without_inputs_is_kept_conv_bn_folded() -> None:
    """Without example inputs the linear's output shape is unknown: its BatchNorm1d is kept, the conv's folded."""
    model = randomize_bn(nn.Sequential(nn.Conv2d(3, 4, 1), nn.BatchNorm2d(4), nn.Flatten(), nn.Linear(4, 3),
                                       nn.BatchNorm1d(3))).eval()  # fmt: skip
    gm = fold_bn(model)
    assert gm.meta[FOLD_KEY]["folded"] == [("1", "0")]
    assert "shape is unknown" in dict(gm.meta[FOLD_KEY]["kept"])["4"]
    x = torch.randn(2, 3, 1, 1)
    with torch.no_grad():
        assert _rel(model(x), gm(x)) < 1e-5
