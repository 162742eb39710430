"""Every torchvision classification model traces and analyses: prunable groups, frozen outputs, a consistent
partition of every layer's channels, and no op without a rule except the ones listed here with the reason.

Models are built with random weights on the meta device (nothing is allocated); RegNet's constructor
computes its widths with tensors (``.tolist()``), which fails on meta, so RegNets are built on the CPU with
weight initialisation skipped (the analysis never reads weight values) and then moved to meta.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch
import torch.fx as fx
import torchvision
from _graph_checks import producers
from torch import nn

import prunefx
from prunefx.analysis.roles import OUT, Kind
from prunefx.spec import meta_torchvision

ZOO = torchvision.models.list_models(module=torchvision.models)
pytestmark = pytest.mark.filterwarnings("ignore:The default weight initialization:FutureWarning")

# Ops without a rule that these models are allowed to hit, and why they are acceptable (channels touching
# them are frozen, never guessed). None today: Swin's patch merging, attention and position bias and MaxViT's
# einsums have rules.
UNKNOWN_OPS_ALLOWED: dict[str, set[str]] = {}

# > 50M parameters (checked in the test) or > 3 s to analyse on 2 shared cores.
SLOW = {
    "alexnet", "convnext_base", "convnext_large", "convnext_small", "efficientnet_b7", "efficientnet_v2_l",
    "efficientnet_v2_m", "regnet_x_16gf", "regnet_x_32gf", "regnet_y_128gf", "regnet_y_16gf", "regnet_y_32gf",
    "resnet152", "resnext101_32x8d", "resnext101_64x4d", "swin_b", "swin_v2_b", "vgg11", "vgg11_bn", "vgg13",
    "vgg13_bn", "vgg16", "vgg16_bn", "vgg19", "vgg19_bn", "vit_b_16", "vit_b_32", "vit_h_14", "vit_l_16",
    "vit_l_32", "wide_resnet101_2", "wide_resnet50_2",
    # slow to analyse (many nodes), under 50M parameters
    "maxvit_t", "swin_s", "swin_v2_s", "densenet161", "densenet201", "efficientnet_b6",
}  # fmt: skip
SLOW_PARAMS = 50_000_000


def build(name: str) -> nn.Module:
    return meta_torchvision(name)


def input_size(name: str) -> int:
    return 299 if name == "inception_v3" else 224


# ---- checks -----------------------------------------------------------------------------------------------
def output_producers(gm: fx.GraphModule) -> set[str]:
    """Convs / Linears whose channels reach a returned tensor (not through size queries)."""
    (out,) = [n for n in gm.graph.nodes if n.op == "output"]
    return producers(gm, list(out.all_input_nodes))


def assert_channels_partitioned(dg, model: nn.Module) -> None:
    """Each position of a layer role / parameter dim belongs to one channel of one group, and every output
    channel of every Conv / Linear in the graph is in some group."""
    seen: dict[tuple, list[np.ndarray]] = {}
    for g in dg.groups:
        for m in g.members:
            assert len(m.offsets) == g.channels + 1, (g.id, m.name, m.role)  # one slot list per channel
            seen.setdefault((m.kind, m.name, m.role), []).append(m.index)
    tensors = {**dict(model.named_parameters()), **dict(model.named_buffers())}
    for (kind, name, role), parts in seen.items():
        pos = np.concatenate(parts)
        assert len(np.unique(pos)) == len(pos), f"{name}.{role}: a position in two channels"
        if kind is Kind.PARAM and name in tensors:
            assert pos.max() < tensors[name].shape[role.dim], (name, role)
    called = {n.target for n in dg.gm.graph.nodes if n.op == "call_module"}
    for name, mod in model.named_modules():
        if name in called and isinstance(mod, (nn.Conv2d, nn.Linear)):
            width = mod.out_channels if isinstance(mod, nn.Conv2d) else mod.out_features
            pos = np.sort(np.concatenate(seen[(Kind.MODULE, name, OUT)]))
            assert np.array_equal(pos, np.arange(width)), name


def analysed(name: str):
    model = build(name)
    return model, prunefx.analyze(model, torch.randn(1, 3, input_size(name), input_size(name)))


@pytest.mark.parametrize("name", [pytest.param(n, marks=pytest.mark.slow) if n in SLOW else n for n in ZOO])
def test_zoo_model_analyses(name):
    model, dg = analysed(name)
    n_params = sum(p.numel() for p in model.parameters())
    assert n_params <= SLOW_PARAMS or name in SLOW, f"{name} has {n_params / 1e6:.0f}M parameters: mark it slow"

    assert dg.auto_leaves == {}
    assert set(dg.unknown_ops.values()) == UNKNOWN_OPS_ALLOWED.get(name, set())
    assert dg.prunable, f"{name}: no prunable group"
    assert sum(g.channels for g in dg.prunable) >= 0.1 * sum(g.channels for g in dg.groups)

    heads = output_producers(dg.gm)
    assert heads
    for head in heads:
        (g,) = dg.groups_of(head, "out")
        assert not g.prunable and any("model output" in r for r in g.reasons), (name, head)

    assert_channels_partitioned(dg, model)
    # a prunable group always touches a layer (a group of bare parameter positions would be kernel taps etc.)
    assert [g.id for g in dg.prunable if not any(m.kind is Kind.MODULE for m in g.members)] == []


def test_zoo_list_is_the_one_tested():
    """The allow-lists name real models (a renamed model must not silently drop out of the list)."""
    assert set(UNKNOWN_OPS_ALLOWED) <= set(ZOO) and SLOW <= set(ZOO)
    assert len(ZOO) >= 80
