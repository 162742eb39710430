"""open_clip plugin: ModifiedResNet's attention pool loses whole heads in the module itself (``num_heads`` follows)."""

from __future__ import annotations

import pytest
import torch

import prunefx

modified_resnet = pytest.importorskip("open_clip.modified_resnet")


def test_attention_pool_heads_are_pruned_in_place_and_the_result_is_exact():
    torch.manual_seed(0)
    model = modified_resnet.ModifiedResNet(layers=(1, 1, 1, 1), output_dim=32, heads=4, image_size=64, width=8).eval()
    x = torch.randn(1, 3, 64, 64)
    pool = model.attnpool
    width = pool.q_proj.weight.shape[0]  # the trunk: 8 * 32 channels, 4 heads of 64
    dg = prunefx.analyze(model, x)
    (heads,) = dg.groups_of("attnpool.q_proj", "out")
    assert heads.prunable and heads.channels == 4
    assert dg.groups_of("attnpool.c_proj", "in") == [heads] == dg.groups_of("layer4.0.conv3", "out")
    result = prunefx.prune(model, x, prunefx.PlanConfig(ratio=0.5, scope="local"), criterion="l2")
    assert result.model is model and result.verified.ok and result.verified.exact, result.verified.message
    assert pool.num_heads == 2 and pool.q_proj.weight.shape == (width // 2, width // 2)
    assert pool.positional_embedding.shape[1] == width // 2
    assert model(x).shape == (1, 32)
