"""Depthwise convolution written functionally (``F.conv2d(..., groups=C)``) and in torch.export's ATen graph
(``aten.conv2d``, every layer functional): input channel c and its outputs are one class, the ``groups`` literal
follows the kept count, and the pruned model equals its masked original."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

import prunefx


class DWBlock(nn.Module):
    """pointwise 4 -> 16, depthwise 16 (nn.Conv2d, groups=16), pointwise 16 -> 4: ConvNeXt's and MobileNet's
    pattern."""

    def __init__(self) -> None:
        super().__init__()
        self.pw1 = nn.Conv2d(4, 16, 1)
        self.dw = nn.Conv2d(16, 16, 3, padding=1, groups=16)
        self.pw2 = nn.Conv2d(16, 4, 1)

    def forward(self, x):
        return self.pw2(torch.relu(self.dw(self.pw1(x))))


class FunctionalDW(nn.Module):
    """The same, the depthwise conv a weight and an F.conv2d call with a literal ``groups``."""

    def __init__(self) -> None:
        super().__init__()
        self.pw1 = nn.Conv2d(4, 16, 1)
        self.w = nn.Parameter(torch.randn(16, 1, 3, 3))
        self.b = nn.Parameter(torch.randn(16))
        self.pw2 = nn.Conv2d(16, 4, 1)

    def forward(self, x):
        return self.pw2(torch.relu(F.conv2d(self.pw1(x), self.w, self.b, 1, 1, 1, 16)))


def _modules(group) -> set[str]:
    return {f"{m.name}.{m.role}" for m in group.members if m.kind.value == "module"}


def test_depthwise_conv_in_an_export_graph_is_one_prunable_group_with_its_producer_and_consumer():
    model, x = DWBlock().eval(), torch.randn(1, 4, 6, 6)
    dg = prunefx.analyze(model, x, capture="export")
    assert dg.capture == "export"
    (g,) = dg.groups_of("pw1")
    assert g.prunable and g.channels == 16, g.reasons
    assert {"pw1.out", "dw.in", "dw.out", "pw2.in"} <= _modules(g)
    result = prunefx.prune(model, x, prunefx.PlanConfig(ratio=0.5, round_to=1), criterion="l1", capture="export")
    assert result.verified.ok, result.verified.message
    assert result.model.dw.groups == result.model.dw.in_channels == result.model.dw.out_channels < 16


def test_functional_depthwise_conv_rewrites_its_groups_literal():
    model, x = FunctionalDW().eval(), torch.randn(1, 4, 6, 6)
    dg = prunefx.analyze(model, x, capture="fx")
    (g,) = dg.groups_of("pw1")
    assert g.prunable and g.channels == 16
    assert _modules(g) == {"pw1.out", "pw2.in"}  # the root owns w: no conv module to record
    assert any(m.kind.value == "const" for m in g.members)  # the groups literal
    assert any(m.kind.value == "param" and m.name == "w" for m in g.members)
    result = prunefx.prune(model, x, prunefx.PlanConfig(ratio=0.5, round_to=1, graph_rewrite=True), criterion="l1")
    assert result.verified.ok, result.verified.message
    assert result.model.w.shape[0] < 16


def test_depthwise_on_a_model_input_is_frozen():
    class OnInput(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.w = nn.Parameter(torch.randn(3, 1, 3, 3))

        def forward(self, x):
            return F.conv2d(x, self.w, None, 1, 1, 1, 3)

    dg = prunefx.analyze(OnInput(), torch.randn(1, 3, 5, 5), capture="fx")
    assert not dg.prunable


class FunctionalGrouped(nn.Module):
    """pointwise 4 -> 16, a functional grouped conv (4 groups of 4 -> 4), pointwise 16 -> 4."""

    def __init__(self) -> None:
        super().__init__()
        self.pw1 = nn.Conv2d(4, 16, 1)
        self.w = nn.Parameter(torch.randn(16, 4, 3, 3))
        self.pw2 = nn.Conv2d(16, 4, 1)

    def forward(self, x):
        return self.pw2(torch.relu(F.conv2d(self.pw1(x), self.w, None, 1, 1, 1, 4)))


def test_functional_grouped_conv_keeps_the_same_positions_in_every_group():
    model, x = FunctionalGrouped().eval(), torch.randn(1, 4, 6, 6)
    dg = prunefx.analyze(model, x, capture="fx")
    (g_in,) = dg.groups_of("pw1")
    assert g_in.prunable and g_in.channels == 4  # position j of each of the 4 input blocks is one channel class
    assert {f"{m.name}.{m.role}" for m in g_in.members if m.kind.value == "module"} == {"pw1.out"}
    assert {(m.name, str(m.role)) for m in g_in.members if m.kind.value == "param"} >= {("w", "dim1")}
    (g_out,) = dg.groups_of("pw2", "in")
    assert g_out.prunable and g_out.channels == 4 and g_out is not g_in
    result = prunefx.prune(model, x, prunefx.PlanConfig(ratio=0.5, round_to=1), criterion="l1")
    assert result.verified.ok and result.verified.exact, result.verified.message
    w = result.model.w
    assert w.shape[0] < 16 and w.shape[0] % 4 == 0 and w.shape[1] * 4 == result.model.pw1.out_channels < 16


class StdConv(nn.Conv2d):
    """Weight standardisation as timm's ScaledStdConv2d: batch_norm of the weight over each filter's fan-in."""

    def forward(self, x):
        w = F.batch_norm(self.weight.reshape(1, self.out_channels, -1), None, None, training=True, momentum=0.0,
                         eps=1e-6).reshape_as(self.weight)
        return F.conv2d(x, w, self.bias, self.stride, self.padding, self.dilation, self.groups)


def test_weight_standardisation_makes_input_channels_inexact_and_records_the_module():
    model = nn.Sequential(StdConv(3, 16, 3, padding=1), nn.ReLU(), StdConv(16, 8, 1)).eval()
    x = torch.randn(1, 3, 6, 6)
    dg = prunefx.analyze(model, x)
    (g,) = dg.groups_of("0")
    assert g.prunable and not g.exact  # the second conv's fan-in statistics span these channels
    assert {f"{m.name}.{m.role}" for m in g.members if m.kind.value == "module"} == {"0.out", "2.in"}
    result = prunefx.prune(model, x, prunefx.PlanConfig(ratio=0.5, round_to=1), criterion="l1")
    assert result.verified.state == "inexact" and not result.verified.exact, result.verified.message
    assert result.model[0].out_channels == result.model[2].in_channels == result.model[2].weight.shape[1] < 16
