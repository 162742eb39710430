"""Partial capture: a model whose own forward cannot be captured is analysed and pruned part by part."""

from __future__ import annotations

import copy

import pytest
import torch
from torch import nn

import prunefx
from prunefx import PlanConfig
from prunefx.analysis.roles import CHANNEL, IN, OUT, Kind
from prunefx.errors import TraceFailure


class Block(nn.Module):
    def __init__(self, c: int) -> None:
        super().__init__()
        self.conv1 = nn.Conv2d(c, c, 3, padding=1, bias=False)
        self.bn1 = nn.BatchNorm2d(c)
        self.conv2 = nn.Conv2d(c, c, 3, padding=1, bias=False)
        self.bn2 = nn.BatchNorm2d(c)

    def forward(self, x):
        y = torch.relu(self.bn1(self.conv1(x)))
        return torch.relu(x + self.bn2(self.conv2(y)))


class Backbone(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.stem = nn.Conv2d(3, 8, 3, padding=1, bias=False)
        self.bn = nn.BatchNorm2d(8)
        self.block = Block(8)
        self.mid = nn.Conv2d(8, 16, 1, bias=False)
        self.bn_mid = nn.BatchNorm2d(16)

    def forward(self, x):
        x = self.block(torch.relu(self.bn(self.stem(x))))
        return torch.relu(self.bn_mid(self.mid(x)))


def _head(c: int) -> nn.Sequential:
    return nn.Sequential(nn.Conv2d(c, 12, 1), nn.BatchNorm2d(12), nn.ReLU(), nn.Conv2d(12, 4, 1))


class Detector(nn.Module):
    """Tensor-dependent control flow in the root forward: fx (both modes) and torch.export fail on it."""

    def __init__(self) -> None:
        super().__init__()
        self.backbone = Backbone()
        self.head = _head(16)

    def forward(self, x):
        scores = self.head(self.backbone(x))
        if scores.max() > 0.0:  # the opaque line the summary must name
            return scores * 2
        return scores


class Neck(nn.Module):
    """Untraceable itself (a branch on tensor data); its children trace. ``b`` is called twice per forward."""

    def __init__(self) -> None:
        super().__init__()
        self.a = nn.Sequential(nn.Conv2d(16, 10, 1, bias=False), nn.BatchNorm2d(10), nn.ReLU())
        self.b = nn.Sequential(nn.Conv2d(10, 6, 1, bias=False), nn.BatchNorm2d(6), nn.ReLU(),
                               nn.Conv2d(6, 10, 1, bias=False), nn.BatchNorm2d(10))

    def forward(self, x):
        y = self.a(x)
        if y.mean() > -10.0:
            y = y * 1.0
        return self.b(self.b(y))


class Nested(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.backbone = Backbone()
        self.neck = Neck()
        self.head = _head(10)

    def forward(self, x):
        f = self.backbone(x)
        if f.mean() < -10.0:  # fails before the neck runs (a failing child would make later decisions concrete)
            f = -f
        return self.head(self.neck(f))


class ReadsWeight(Detector):
    """The opaque root reads a part's weight directly: pruning that layer changes the result."""

    def forward(self, x):
        scores = self.head(self.backbone(x))
        if scores.max() > 0.0:
            scores = scores * self.backbone.stem.weight.abs().mean()
        return scores


class Scaled(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.scale = nn.Parameter(torch.ones(3))

    def forward(self, x):
        return x * self.scale if x.sum() > 0 else x


class Opaque(nn.Module):
    """Nothing with parameters can be captured: the root and its one child branch on tensor data."""

    def __init__(self) -> None:
        super().__init__()
        self.inner = Scaled()

    def forward(self, x):
        if x.mean() > 0:
            return self.inner(x)
        return -self.inner(x)


class Functional(nn.Module):
    """A convolution written functionally behind a branch on data: opaque, and half of the model's MACs."""

    def __init__(self) -> None:
        super().__init__()
        self.w = nn.Parameter(torch.randn(64, 3, 3, 3))

    def forward(self, x):
        y = nn.functional.conv2d(x, self.w, padding=1)
        return y if y.mean() > -100.0 else -y


class WithOpaqueChild(Detector):
    def __init__(self) -> None:
        super().__init__()
        self.big = Functional()

    def forward(self, x):
        if x.mean() > -100.0:
            x = x * 1.0
        return self.head(self.backbone(x)), self.big(x)


def _randomised(model: nn.Module) -> nn.Module:
    torch.manual_seed(0)
    for m in model.modules():
        if isinstance(m, nn.BatchNorm2d):  # distinct gammas and statistics: a ranking, and non-trivial masking
            m.weight.data.uniform_(0.2, 1.0)
            m.bias.data.uniform_(-0.2, 0.2)
            m.running_mean.uniform_(-0.1, 0.1)
            m.running_var.uniform_(0.5, 1.5)
    return model.eval()


X = torch.randn(2, 3, 8, 8, generator=torch.Generator().manual_seed(1))


def _modules(group) -> set[tuple[str, object]]:
    return {(m.name, m.role) for m in group.members if m.kind is Kind.MODULE}


def _masked_by_bn(original: nn.Module, dg, plan) -> nn.Module:
    """An independent masked original: every removed channel's BatchNorm outputs 0 (gamma and beta zeroed).

    In these models every pruned channel passes a BatchNorm and then ReLU or a sum with other masked channels,
    so this is the original with the removed channels masked; it shares no code with prunefx's oracle."""
    masked = copy.deepcopy(original)
    for gp in plan.pruned:
        gone = sorted(set(range(gp.before)) - set(gp.keep))
        for m in dg.groups[gp.group].members:
            mod = masked.get_submodule(m.name) if m.kind is Kind.MODULE else None
            if isinstance(mod, nn.BatchNorm2d):
                idx = torch.as_tensor(m.index)[gone]
                with torch.no_grad():
                    mod.weight[idx] = 0.0
                    mod.bias[idx] = 0.0
    return masked


def test_root_control_flow_analyses_the_parts() -> None:
    model = _randomised(Detector())
    dg = prunefx.analyze(model, X)
    assert [p.path for p in dg.parts.parts] == ["backbone", "head"]
    assert [o.path for o in dg.parts.opaque] == [""]
    assert "if scores.max() > 0.0:" in dg.parts.opaque[0].why and "test_partial_capture.py" in dg.parts.opaque[0].why
    assert dg.parts.opaque_params_share == pytest.approx(0.0)
    # the residual add couples the stem, the block's output and the next conv's input: one group
    residual = dg.group_of("backbone.stem")
    assert _modules(residual) == {
        ("backbone.stem", OUT), ("backbone.bn", CHANNEL), ("backbone.block.conv1", IN), ("backbone.block.conv2", OUT),
        ("backbone.block.bn2", CHANNEL), ("backbone.mid", IN),
    }
    assert residual.prunable and residual.channels == 8
    inner = dg.group_of("backbone.block.conv1")
    assert _modules(inner) == {("backbone.block.conv1", OUT), ("backbone.block.bn1", CHANNEL),
                               ("backbone.block.conv2", IN)}
    assert _modules(dg.group_of("head.0")) == {("head.0", OUT), ("head.1", CHANNEL), ("head.3", IN)}
    assert dg.group_of("head.0").prunable
    # the boundary: each part's output is read by the opaque root, so frozen, with the part named
    for name, part in (("backbone.mid", "backbone"), ("head.3", "head")):
        g = dg.group_of(name)
        assert not g.prunable and g.reasons[0].startswith(f"boundary of part '{part}'"), g.reasons
    assert len(dg.groups) == 5 and len(dg.prunable) == 3
    text = dg.summary()
    assert "partial capture" in text and "opaque forward of <root>" in text and "if scores.max() > 0.0:" in text


def test_fully_traceable_model_is_not_partial() -> None:
    dg = prunefx.analyze(Backbone().eval(), X)
    assert dg.parts is None and "partial capture" not in dg.summary()


@pytest.mark.parametrize("compensate", [False, True])
def test_prune_parts_equals_masked_original(compensate: bool) -> None:
    model = _randomised(Detector())
    original = copy.deepcopy(model)
    result = prunefx.prune(model, X, PlanConfig(flops=0.6), bias_compensation=compensate)
    assert result.verified.ok and "end to end" in result.verified.message
    assert [p.path for p in result.parts.parts] == ["backbone", "head"]
    assert "partial capture" in result.plan.summary() and "<root>" in result.plan.summary()
    pruned = {m.name.split(".")[0] for gp in result.plan.pruned for m in result.graph.groups[gp.group].members}
    assert pruned == {"backbone", "head"}
    # the joint plan meets the whole model's FLOPs target (the opaque root holds no MACs here)
    assert result.plan.estimate["macs_after"] / result.plan.estimate["macs_before"] == pytest.approx(0.6, abs=0.08)
    if not compensate:  # an independent masked original (compensation shifts biases: prunefx's oracle covers it)
        masked = _masked_by_bn(original, result.graph, result.plan)
        with torch.no_grad():
            torch.testing.assert_close(model(X), masked(X), rtol=1e-5, atol=1e-6)
            assert not torch.allclose(original(X), masked(X))  # the comparison can fail: channels did matter


def test_verify_catches_a_wrong_pruned_model() -> None:
    model = _randomised(Detector())
    original = copy.deepcopy(model)
    result = prunefx.prune(model, X, PlanConfig(flops=0.6), bias_compensation=False)
    broken = copy.deepcopy(model)
    with torch.no_grad():
        broken.backbone.block.conv1.weight[0].mul_(1.5)
    # without dg the oracle analyses the original again (partial again) and compares the whole models end to end
    good = prunefx.verify(copy.deepcopy(original), model, result.plan, X)
    assert good.ok and good.max_rel_error < 1e-5
    bad = prunefx.verify(copy.deepcopy(original), broken, result.plan, X)
    assert not bad.ok and bad.max_rel_error > 1e-3


def test_untraceable_child_is_opened_and_a_shared_part_checked_on_every_call() -> None:
    model = _randomised(Nested())
    original = copy.deepcopy(model)
    dg = prunefx.analyze(model, X)
    assert [p.path for p in dg.parts.parts] == ["backbone", "neck.a", "neck.b", "head"]
    assert [o.path for o in dg.parts.opaque] == ["", "neck"]
    assert "if y.mean() > -10.0:" in dg.parts.opaque[1].why
    assert {p.path: p.calls for p in dg.parts.parts}["neck.b"] == 2
    assert _modules(dg.group_of("neck.b.0")) == {("neck.b.0", OUT), ("neck.b.1", CHANNEL), ("neck.b.3", IN)}
    assert not dg.group_of("neck.a.0").prunable  # neck.a's output: read by neck's opaque forward
    result = prunefx.prune(model, X, PlanConfig(ratio=0.5), bias_compensation=False)
    assert result.verified.ok
    assert model.neck.b[0].out_channels == 3 and model.neck.b[3].out_channels == 10
    masked = _masked_by_bn(original, result.graph, result.plan)
    with torch.no_grad():
        torch.testing.assert_close(model(X), masked(X), rtol=1e-5, atol=1e-6)


def test_parts_captured_with_torch_export() -> None:
    """torch.export's graph takes the calls' tensors flat and returns flat outputs: the oracle rebuilds them."""
    model = _randomised(Nested())
    original = copy.deepcopy(model)
    result = prunefx.prune(model, X, PlanConfig(flops=0.6), capture="export", bias_compensation=False)
    assert result.graph.capture == "export" and result.verified.ok
    assert [p.path for p in result.parts.parts] == ["backbone", "neck.a", "neck.b", "head"]
    assert "cannot capture Neck" in result.parts.opaque[1].why
    assert result.graph.group_of("neck.a.0").reasons[0].startswith("boundary of part 'neck.a'")
    assert len(result.plan.pruned) >= 2
    masked = _masked_by_bn(original, result.graph, result.plan)
    with torch.no_grad():
        torch.testing.assert_close(model(X), masked(X), rtol=1e-5, atol=1e-6)


def test_opaque_code_reading_a_weight_freezes_that_group() -> None:
    model = _randomised(ReadsWeight())
    before = copy.deepcopy(model)
    result = prunefx.prune(model, X, PlanConfig(ratio=0.5), bias_compensation=False)
    assert result.verified.ok
    stem = result.graph.group_of("backbone.stem").id
    assert stem in dict(result.frozen_by_check)
    assert model.backbone.stem.out_channels == 8  # the weight the root reads is whole
    assert model.head[0].out_channels < 12
    masked = _masked_by_bn(before, result.graph, result.plan)
    with torch.no_grad():
        torch.testing.assert_close(model(X), masked(X), rtol=1e-5, atol=1e-6)


def test_nothing_capturable_is_one_clear_error() -> None:
    model = Opaque()
    with pytest.raises(TraceFailure, match="partial capture: no submodule of Opaque"):
        prunefx.analyze(model, torch.randn(2, 3))
    with pytest.raises(TraceFailure, match=r"x.mean\(\) > 0"):
        prunefx.prune(model, torch.randn(2, 3))
    assert model.inner.scale.shape == (3,)
    with torch.device("meta"):  # no data to branch on: the root's failure, and why the fallback cannot help
        on_meta = Detector()
    with pytest.raises(TraceFailure, match=r"(?s)if scores.max\(\) > 0.0:.*partial capture is not possible"):
        prunefx.analyze(on_meta, torch.randn(2, 3, 8, 8, device="meta"))


def test_opaque_share_of_parameters_and_macs() -> None:
    model = _randomised(WithOpaqueChild())
    dg = prunefx.analyze(model, X)
    assert [p.path for p in dg.parts.parts] == ["backbone", "head"]
    assert [o.path for o in dg.parts.opaque] == ["", "big"]
    assert "return y if y.mean() > -100.0 else -y" in dg.parts.opaque[1].why
    total = sum(p.numel() for p in model.parameters())
    assert dg.parts.opaque_params_share == pytest.approx(model.big.w.numel() / total)
    macs = {}  # by hand: every conv's output elements x its kernel volume x input channels per group
    hooks = [m.register_forward_hook(lambda m, a, out, n=n: macs.__setitem__(
        n, out.numel() * m.in_channels // m.groups * m.kernel_size[0] * m.kernel_size[1]))
        for n, m in model.named_modules() if isinstance(m, nn.Conv2d)]
    with torch.no_grad():
        model(X)
    for h in hooks:
        h.remove()
    opaque = X.shape[0] * 64 * X.shape[2] * X.shape[3] * 27
    assert dg.parts.opaque_macs_share == pytest.approx(opaque / (opaque + sum(macs.values())), rel=1e-6)
    assert "opaque forward of big" in dg.summary()
    # a FLOPs target is the whole model's: the opaque half stays, so 0.7 of all MACs means pruning the parts hard
    result = prunefx.prune(model, X, PlanConfig(flops=0.7))
    assert result.verified.ok
    # the whole model's MACs (BatchNorm's 1.5% counted too), not only the parts'
    assert result.plan.estimate["macs_before"] == pytest.approx(opaque + sum(macs.values()), rel=0.02)
    assert result.plan.estimate["macs_after"] / result.plan.estimate["macs_before"] == pytest.approx(0.7, abs=0.05)


def test_latency_target_with_parts_is_refused() -> None:
    with pytest.raises(prunefx.PrunefxError, match="only parts of it were"):
        prunefx.prune(_randomised(Detector()), X, PlanConfig(latency=0.5))


class Padded(nn.Module):
    """Scales its input in place, and writes its result into a fresh buffer in place (no ancestor of the output)."""

    def __init__(self) -> None:
        super().__init__()
        self.body = nn.Sequential(nn.Conv2d(16, 12, 1, bias=False), nn.BatchNorm2d(12), nn.ReLU(),
                                  nn.Conv2d(12, 4, 1))

    def forward(self, x):
        x.mul_(2.0)  # in place on its input: the oracle must feed the part its input as it was on entry
        out = x.new_zeros(x.shape[0], 6, x.shape[2], x.shape[3])
        out[:, :4].copy_(self.body(x))
        return out


class PaddedHead(Detector):
    def __init__(self) -> None:
        super().__init__()
        self.head = Padded()


def test_part_writing_in_place_is_checked_whole() -> None:
    model = _randomised(PaddedHead())
    original = copy.deepcopy(model)
    result = prunefx.prune(model, X, PlanConfig(ratio=0.5), bias_compensation=False)
    assert [p.path for p in result.parts.parts] == ["backbone", "head"]
    assert result.verified.ok and model.head.body[0].out_channels == 6
    masked = _masked_by_bn(original, result.graph, result.plan)
    with torch.no_grad():
        out = model(X)
        torch.testing.assert_close(out, masked(X), rtol=1e-5, atol=1e-6)
        assert out[:, :4].abs().sum() > 0  # the in-place write is there


@pytest.mark.slow
def test_torchvision_detector_behind_root_control_flow() -> None:
    """A real detector whose own forward branches on the images: backbone + FPN, RPN and box heads are pruned."""
    tv = pytest.importorskip("torchvision")
    from torchvision.models.detection import FasterRCNN

    class Gated(FasterRCNN):
        def forward(self, images, targets=None):
            if images[0].mean() > 2.0:  # 0-255 images rescaled: a decision on data, before anything else
                images = [i / 255.0 for i in images]
            return super().forward(images, targets)

    torch.manual_seed(0)
    model = tv.models.detection.fasterrcnn_mobilenet_v3_large_320_fpn(
        weights=None, weights_backbone=None, num_classes=5, box_score_thresh=0.0)
    model.__class__ = Gated
    model = _randomised(model)  # fresh BatchNorms wash the features out: boxes and scores would barely move
    images = [torch.rand(3, 160, 160, generator=torch.Generator().manual_seed(2))]
    original = copy.deepcopy(model)
    result = prunefx.prune(model, (images,), PlanConfig(flops=0.7), bias_compensation=False)
    assert [p.path for p in result.parts.parts] == ["backbone", "rpn", "roi_heads"]
    assert "if images[0].mean() > 2.0:" in result.parts.opaque[0].why
    assert result.verified.ok, result.verified.message
    where = {m.name.split(".")[0] + "." + m.name.split(".")[1] for gp in result.plan.pruned
             for m in result.graph.groups[gp.group].members if m.kind is Kind.MODULE}
    assert {"backbone.body", "backbone.fpn"} <= where and "roi_heads.box_head" in where, where
    # the end-to-end check (boxes, labels, scores) sees a 1% change of one head layer: it is not vacuous here
    broken = copy.deepcopy(model)
    with torch.no_grad():
        broken.roi_heads.box_head.fc6.weight.mul_(1.01)
    assert not prunefx.verify(copy.deepcopy(original), broken, result.plan, (images,)).ok
    with torch.no_grad():
        got, want = model(images)[0], original(images)[0]
    assert got.keys() == want.keys() and all(got[k].shape == want[k].shape for k in got)


def test_save_and_load_a_partially_captured_model(tmp_path) -> None:
    model = _randomised(Detector())
    result = prunefx.prune(model, X, PlanConfig(ratio=0.5))
    path = prunefx.save(model, result.plan, tmp_path / "pruned.pt")
    loaded = prunefx.load(path, Detector)  # re-analysed (partially again) and pruned by the saved plan
    assert loaded.state_dict().keys() == model.state_dict().keys()
    with torch.no_grad():
        torch.testing.assert_close(loaded.eval()(X), model(X))
