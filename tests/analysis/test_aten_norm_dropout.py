"""ATen ops of a torch.export capture that keep channels apart: ``instance_norm`` (per-channel statistics and affine
weight) and in-place dropout (``dropout_``, what ``nn.Dropout(inplace=True)`` leaves in an eval-mode graph)."""

from __future__ import annotations

import torch
from torch import nn

import prunefx


class NormDrop(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.conv1 = nn.Conv2d(3, 16, 3, padding=1)
        self.norm = nn.InstanceNorm2d(16, affine=True)
        self.drop = nn.Dropout(0.1, inplace=True)
        self.conv2 = nn.Conv2d(16, 4, 1)

    def forward(self, x):
        return self.conv2(self.drop(torch.relu(self.norm(self.conv1(x)))))


def test_instance_norm_and_inplace_dropout_pass_channels_through_in_an_export_graph():
    model, x = NormDrop().eval(), torch.randn(1, 3, 6, 6)
    dg = prunefx.analyze(model, x, capture="export")
    targets = {str(n.target) for n in dg.gm.graph.nodes if n.op == "call_function"}
    assert {"aten.instance_norm.default", "aten.dropout_.default"} <= targets  # the ops under test are there
    assert not dg.unknown_ops
    (g,) = dg.groups_of("conv1")
    assert g.prunable and g.channels == 16 and g.exact
    modules = {f"{m.name}.{m.role}" for m in g.members if m.kind.value == "module"}
    assert modules == {"conv1.out", "norm.channel", "conv2.in"}
    assert {m.name for m in g.members if m.kind.value == "param"} == {"conv1.weight", "conv1.bias", "norm.weight",
                                                                      "norm.bias", "conv2.weight"}
    result = prunefx.prune(model, x, prunefx.PlanConfig(ratio=0.5, round_to=1), criterion="l1", capture="export")
    assert result.verified.ok and result.verified.exact, result.verified.message
    assert result.model.norm.num_features == result.model.conv1.out_channels < 16


class InPlaceBicubic(nn.Module):
    """In-place scalings of an activation (ConViT's ``div_``) and bicubic upsampling (YOLOS's position grid)."""

    def __init__(self) -> None:
        super().__init__()
        self.conv1 = nn.Conv2d(3, 16, 3, padding=1)
        self.conv2 = nn.Conv2d(16, 4, 1)
        self.register_buffer("scale", torch.linspace(1.0, 2.0, 16).view(1, 16, 1, 1))

    def forward(self, x):
        y = torch.relu(self.conv1(x))
        y.div_(self.scale)
        y.mul_(3.0)
        y.sub_(self.scale)
        y = nn.functional.interpolate(y, scale_factor=2.0, mode="bicubic", align_corners=False)
        return self.conv2(y)


def test_inplace_elementwise_and_bicubic_upsampling_keep_channels_in_an_export_graph():
    model, x = InPlaceBicubic().eval(), torch.randn(1, 3, 5, 5)
    dg = prunefx.analyze(model, x, capture="export")
    targets = {str(n.target) for n in dg.gm.graph.nodes if n.op == "call_function"}
    assert {"aten.div_.Tensor", "aten.sub_.Tensor", "aten.upsample_bicubic2d.vec"} <= targets
    assert not dg.unknown_ops
    (g,) = dg.groups_of("conv1")
    assert g.prunable and g.exact and g.channels == 16
    assert {f"{m.name}.{m.role}" for m in g.members if m.kind.value == "module"} == {"conv1.out", "conv2.in"}
    assert ("scale", "dim1") in {(m.name, str(m.role)) for m in g.members if m.kind.value == "param"}
    result = prunefx.prune(model, x, prunefx.PlanConfig(ratio=0.5, round_to=1), criterion="l1", capture="export")
    assert result.verified.ok and result.verified.exact, result.verified.message
    assert result.model.scale.shape[1] == result.model.conv1.out_channels < 16
