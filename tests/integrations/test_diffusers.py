"""diffusers plugin: a UNet's attention loses whole heads (``attn.heads`` follows) and stays a diffusers model."""

from __future__ import annotations

import pytest
import torch

import prunefx
from prunefx.analysis.roles import Kind

diffusers = pytest.importorskip("diffusers")


def _unet():
    torch.manual_seed(0)
    model = diffusers.UNet2DModel(
        sample_size=16, in_channels=3, out_channels=3, block_out_channels=(32, 64), layers_per_block=1,
        down_block_types=("DownBlock2D", "AttnDownBlock2D"), up_block_types=("AttnUpBlock2D", "UpBlock2D"),
        norm_num_groups=8, attention_head_dim=8,
    ).eval()  # fmt: skip
    return model, (torch.randn(1, 3, 16, 16), torch.tensor([10]))


def test_unet_attention_heads_are_groups_of_whole_heads():
    model, inputs = _unet()
    dg = prunefx.analyze(model, inputs)
    attentions = [n for n, m in model.named_modules() if isinstance(m, diffusers.models.attention_processor.Attention)]
    assert attentions
    for name in attentions:
        (g,) = dg.groups_of(f"{name}.to_v", "out")
        assert g.prunable and g.channels == 8, (name, g.reasons)  # 64 channels = 8 heads of 8
        for child, role in (("to_q", "out"), ("to_k", "out"), ("to_out.0", "in")):
            assert dg.groups_of(f"{name}.{child}", role) == [g]
        (v,) = [m for m in g.members if m.kind is Kind.MODULE and m.name == f"{name}.to_v"]
        assert [sorted(p) for p in v.positions] == [list(range(h * 8, h * 8 + 8)) for h in range(8)]


def test_pruned_unet_keeps_head_dim_and_runs_as_a_diffusers_model():
    model, inputs = _unet()
    result = prunefx.prune(model, inputs, prunefx.PlanConfig(ratio=0.5, scope="local"), criterion="l2")
    assert result.verified.accepted, result.verified.message  # GroupNorm groups: inexact by design
    assert result.model is model and isinstance(model, diffusers.UNet2DModel)
    cut = 0
    for m in model.modules():
        if isinstance(m, diffusers.models.attention_processor.Attention):
            assert m.to_q.weight.shape[0] == m.heads * 8 == m.inner_dim  # head_dim (the SDPA scale) unchanged
            cut += m.heads < 8
    assert cut, "no attention lost a head"
    assert model(*inputs).sample.shape == (1, 3, 16, 16)
