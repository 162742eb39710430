"""einops rearrange / Rearrange: patchify and attention-head reshapes analyse as block structure."""

from __future__ import annotations

import pytest
import torch
from _graph_checks import positions, the_group
from torch import nn

import prunefx

einops = pytest.importorskip("einops")
from einops import rearrange, repeat
from einops.layers.torch import Rearrange

HEADS, DIM_HEAD = 4, 8


class Attention(nn.Module):
    """vit-pytorch's attention: heads split and merged by rearrange, the head count given, head_dim computed."""

    def __init__(self, dim: int):
        super().__init__()
        self.norm, self.scale = nn.LayerNorm(dim), DIM_HEAD**-0.5
        self.to_qkv = nn.Linear(dim, HEADS * DIM_HEAD * 3, bias=False)
        self.to_out = nn.Linear(HEADS * DIM_HEAD, dim)

    def forward(self, x):
        q, k, v = (rearrange(t, "b n (h d) -> b h n d", h=HEADS) for t in self.to_qkv(self.norm(x)).chunk(3, dim=-1))
        attn = (q @ k.transpose(-1, -2) * self.scale).softmax(dim=-1)
        return self.to_out(rearrange(attn @ v, "b h n d -> b n (h d)"))


class ViT(nn.Module):
    """A two-layer vit-pytorch ViT: Rearrange patchify, class token, positions, pre-norm blocks."""

    def __init__(self, dim: int = 32, p: int = 4, img: int = 16):
        super().__init__()
        self.to_patch = nn.Sequential(Rearrange("b c (h p1) (w p2) -> b (h w) (p1 p2 c)", p1=p, p2=p),
                                      nn.LayerNorm(3 * p * p), nn.Linear(3 * p * p, dim), nn.LayerNorm(dim))
        self.pos = nn.Parameter(torch.randn(1, (img // p) ** 2 + 1, dim))
        self.cls = nn.Parameter(torch.randn(1, 1, dim))
        self.layers = nn.ModuleList(
            nn.ModuleList([Attention(dim), nn.Sequential(nn.LayerNorm(dim), nn.Linear(dim, 64), nn.GELU(),
                                                         nn.Linear(64, dim))])
            for _ in range(2)
        )
        self.head = nn.Linear(dim, 10)

    def forward(self, img):
        x = self.to_patch(img)
        b, n, _ = x.shape
        x = torch.cat((repeat(self.cls, "1 1 d -> b 1 d", b=b), x), dim=1) + self.pos[:, : n + 1]
        for attn, ff in self.layers:
            x = attn(x) + x
            x = ff(x) + x
        return self.head(x[:, 0])


def _share(dg) -> float:
    return sum(g.channels for g in dg.prunable) / sum(g.channels for g in dg.groups)


def test_einops_vit_prunes_the_same_offsets_in_every_head() -> None:
    dg = prunefx.analyze(ViT().eval(), (torch.randn(2, 3, 16, 16),))
    # was 0.48: einops writes head merges as ``1 * h`` products, which froze every attention (now 0.87; what stays
    # frozen is the 10 classes and the 17 token positions of ``pos``)
    assert _share(dg) > 0.85
    for i in range(2):
        g = the_group(dg, f"layers.{i}.0.to_out", "in")
        assert g.prunable and g.exact and g.channels == DIM_HEAD
        # channel d is offset d of every head (h outer, d inner), in q, k and v alike
        assert positions(g, f"layers.{i}.0.to_out", "in") == tuple(
            tuple(h * DIM_HEAD + d for h in range(HEADS)) for d in range(DIM_HEAD))
        qkv = positions(g, f"layers.{i}.0.to_qkv", "out")
        assert qkv == tuple(tuple(s * 32 + h * DIM_HEAD + d for s in range(3) for h in range(HEADS))
                            for d in range(DIM_HEAD))
    # the Rearrange patchify is traced through (its ``_multirecipe[input.ndim]`` lookup gets the rank as an int)
    assert not dg.unknown_ops and not dg.inferred_ops
    assert not any(n.op == "call_module" and n.target == "to_patch.0" for n in dg.gm.graph.nodes)


def test_a_pruned_einops_vit_equals_the_masked_original() -> None:
    torch.manual_seed(0)
    model, x = ViT().eval(), torch.randn(2, 3, 16, 16)
    # the residual stream passes LayerNorms (never exact): left alone, so every pruned group must match exactly
    result = prunefx.prune(model, x, prunefx.PlanConfig(ratio=0.5, ignore=("to_patch.2",)), criterion="l1")
    assert result.verified.ok and result.verified.exact, result.verified.message
    kept = [result.model.layers[i][0].to_out.in_features for i in range(2)]
    assert all(k < HEADS * DIM_HEAD and k % HEADS == 0 for k in kept), kept  # whole offsets, every head alike
    assert [result.model.layers[i][0].to_qkv.out_features for i in range(2)] == [3 * k for k in kept]
    assert result.model(x).shape == (2, 10)


class Stem(nn.Module):
    """Conv channels merged inner-most with patch offsets ``(p1 p2 c)``, then tokens folded back to a map."""

    def __init__(self):
        super().__init__()
        self.conv, self.fc, self.out = nn.Conv2d(3, 8, 3, padding=1), nn.Linear(8 * 4, 16), nn.Conv2d(16, 6, 1)

    def forward(self, x):
        y = self.fc(rearrange(self.conv(x), "b c (h p1) (w p2) -> b (h w) (p1 p2 c)", p1=2, p2=2))
        return self.out(rearrange(y, "b (h w) c -> b c h w", h=x.shape[2] // 2))


def test_patch_merge_keeps_conv_channels_as_one_block_per_offset() -> None:
    dg = prunefx.analyze(Stem().eval(), (torch.randn(2, 3, 8, 8),))
    g = the_group(dg, "conv")
    assert g.prunable and g.exact and g is the_group(dg, "fc", "in")
    assert positions(g, "fc", "in") == tuple(tuple(o * 8 + c for o in range(4)) for c in range(8))
    assert the_group(dg, "fc").prunable and the_group(dg, "fc") is the_group(dg, "out", "in")
    result = prunefx.prune(Stem().eval(), torch.randn(2, 3, 8, 8), prunefx.PlanConfig(ratio=0.5), criterion="l1")
    assert result.verified.ok and result.verified.exact, result.verified.message
    assert result.model.fc.in_features == 4 * result.model.conv.out_channels < 32


class ConvTokens(nn.Module):
    """Conv feature map flattened to tokens by the Rearrange layer, then a Linear over the channels."""

    def __init__(self):
        super().__init__()
        self.conv = nn.Conv2d(3, 8, 3, padding=1)
        self.tokens = Rearrange("b c h w -> b (h w) c")
        self.fc, self.head = nn.Linear(8, 12), nn.Linear(12, 5)

    def forward(self, x):
        return self.head(torch.relu(self.fc(self.tokens(torch.relu(self.conv(x))))))


def test_the_rearrange_layer_is_traced_through_and_conv_channels_reach_the_linear() -> None:
    dg = prunefx.analyze(ConvTokens().eval(), (torch.randn(2, 3, 6, 6),))
    assert not dg.unknown_ops and not dg.inferred_ops  # was: the Rearrange module frozen as an unknown op
    g = the_group(dg, "conv")
    assert g.prunable and g.exact and g.channels == 8 and g is the_group(dg, "fc", "in")
    assert positions(g, "fc", "in") == tuple((c,) for c in range(8))  # c is the last dim: channel c is column c
    assert the_group(dg, "fc").prunable and the_group(dg, "fc").channels == 12
    torch.manual_seed(0)
    model, x = ConvTokens().eval(), torch.randn(2, 3, 6, 6)
    result = prunefx.prune(model, x, prunefx.PlanConfig(ratio=0.5), criterion="l1")
    assert result.verified.ok and result.verified.exact, result.verified.message
    assert result.model.conv.out_channels == result.model.fc.in_features == 4
    assert result.model.fc.out_features == 6 and result.model(x).shape == (2, 36, 5)
