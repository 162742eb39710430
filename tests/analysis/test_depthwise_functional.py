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
    assert {"pw1.out", "pw2.in"} <= _modules(g)
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
