"""Scalars computed in the graph from a channel count (``1 / math.sqrt(x.size(1))``) and used as numbers.

Pruning changes such a value and no rule can rewrite it, so the channels it was read from are frozen up front
("unknown means loud"); sizes the rules rewrite (``view(b, c // 4, 4, h, w)``) and scalars read from dims that are
never pruned keep their groups prunable.
"""

from __future__ import annotations

import copy
import math

import torch
from torch import nn

import prunefx
from prunefx.analysis.roles import Kind, Out


class _Block(nn.Module):
    def __init__(self, cin: int, cout: int) -> None:
        super().__init__()
        self.conv = nn.Conv2d(cin, cout, 3, padding=1)
        self.bn = nn.BatchNorm2d(cout)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.relu(self.bn(self.conv(x)))


class SqrtScaled(nn.Module):
    """``b * (1.0 / math.sqrt(b.size(1)))``: the scale follows b's channel count."""

    def __init__(self) -> None:
        super().__init__()
        self.a, self.b, self.head = _Block(3, 16), _Block(16, 16), nn.Conv2d(16, 4, 1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        a = self.a(x)
        b = self.b(a)
        b = b * (1.0 / math.sqrt(b.size(1)))
        return self.head(b)


class CountAsValue(nn.Module):
    """An int channel count used as a number: ``b + b.size(1)``."""

    def __init__(self) -> None:
        super().__init__()
        self.a, self.b, self.head = _Block(3, 16), _Block(16, 16), nn.Conv2d(16, 4, 1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b = self.b(self.a(x))
        return self.head(b + b.size(1))


class Mixed(nn.Module):
    """A scale from a spatial size and a view from a channel count stay prunable; the sqrt scale does not."""

    def __init__(self) -> None:
        super().__init__()
        self.a, self.b, self.c = _Block(3, 16), _Block(16, 16), _Block(16, 16)
        self.head = nn.Conv2d(16, 4, 1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        a = self.a(x)
        a = a * (a.size(2) ** -0.5)  # a spatial size: never pruned
        n, c, h, w = a.shape
        a = a.view(n, c // 4, 4, h, w).flatten(1, 2)  # rewritten by the view rule
        b = self.b(a)
        b = b / math.sqrt(b.size(1))
        return self.head(self.c(b))


def _init(model: nn.Module) -> nn.Module:
    torch.manual_seed(0)
    for m in model.modules():
        if isinstance(m, nn.BatchNorm2d):
            m.weight.data.uniform_(0.1, 1.0)
            m.bias.data.uniform_(-0.5, 0.5)
    return model.eval()


def _group(dg: prunefx.DependencyGraph, module: str):
    """The group of ``module``'s output channels."""
    return next(g for g in dg.groups if any(m.kind == Kind.MODULE and m.name == module and m.role == Out()
                                            for m in g.members))


X = torch.randn(1, 3, 8, 8)


def test_sqrt_of_channel_count_freezes_its_group_with_the_source_line():
    dg = prunefx.analyze(_init(SqrtScaled()), (X,))
    g = _group(dg, "b.conv")
    assert not g.prunable
    (reason,) = g.reasons
    assert "used as a value by node 'mul'" in reason
    assert "test_size_scalars.py" in reason and "math.sqrt(b.size(1))" in reason
    assert _group(dg, "a.conv").prunable


def test_sqrt_scaled_model_prunes_to_the_masked_original_without_the_check():
    model = _init(SqrtScaled())
    original = copy.deepcopy(model)
    result = prunefx.prune(model, X, {"flops": 0.6}, check=False, bias_compensation=False)
    assert model.a.conv.out_channels < 16  # the other group still prunes
    assert model.b.conv.out_channels == 16
    v = prunefx.verify(original, result.model, result.plan, X)
    assert v.ok, v.message


def test_int_channel_count_used_as_a_number_freezes_its_group():
    dg = prunefx.analyze(_init(CountAsValue()), (X,))
    g = _group(dg, "b.conv")
    assert not g.prunable and any("used as a value" in r for r in g.reasons)
    assert _group(dg, "a.conv").prunable


def test_sizes_the_rules_rewrite_and_fixed_dims_stay_prunable():
    model = _init(Mixed())
    dg = prunefx.analyze(model, (X,))
    assert _group(dg, "a.conv").prunable  # spatial scale + view(n, c // 4, 4, h, w)
    assert _group(dg, "c.conv").prunable
    b = _group(dg, "b.conv")
    assert not b.prunable and any("math.sqrt(b.size(1))" in r for r in b.reasons)
    original = copy.deepcopy(model)
    result = prunefx.prune(model, X, {"flops": 0.6}, check=False, bias_compensation=False)
    assert model.a.conv.out_channels < 16 or model.c.conv.out_channels < 16
    assert prunefx.verify(original, result.model, result.plan, X).ok


class SizeScaledAttention(nn.Module):
    """``q * q.size(-1) ** -0.5`` reads head_dim: head_dim is frozen, whole heads stay prunable (as with SDPA)."""

    def __init__(self, dim: int = 32, heads: int = 4) -> None:
        super().__init__()
        self.heads = heads
        self.qkv, self.proj, self.fc = nn.Linear(dim, 3 * dim), nn.Linear(dim, dim), nn.Linear(dim, dim)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, n, _ = x.shape
        q, k, v = self.qkv(x).reshape(b, n, 3, self.heads, -1).permute(2, 0, 3, 1, 4).unbind(0)
        q = q * (q.size(-1) ** -0.5)
        o = (q @ k.transpose(-2, -1)).softmax(-1) @ v
        return self.fc(self.proj(o.transpose(1, 2).reshape(b, n, -1)))


def test_attention_scale_from_head_dim_keeps_heads_prunable():
    model = SizeScaledAttention().eval()
    x = torch.randn(2, 5, 32)
    dg = prunefx.analyze(model, (x,))
    heads = next(g for g in dg.groups if any(m.name == "qkv" and m.role == Out() for m in g.members))
    assert heads.prunable and heads.channels == 4  # one unit per head, not per head_dim offset
