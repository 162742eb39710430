"""Attention heads of timm and ultralytics models: pruned whole, the head count rewritten, the oracle exact."""

from __future__ import annotations

import pytest
import torch

import prunefx
from prunefx.analysis.roles import Kind


def _head_group(dg, qkv: str):
    (g,) = [g for g in dg.groups_of(qkv) if g.prunable]
    return g


def test_timm_vit_heads_are_pruned_and_num_heads_follows():
    timm = pytest.importorskip("timm")
    torch.manual_seed(0)
    model = timm.create_model("vit_tiny_patch16_224", pretrained=False, img_size=32, patch_size=8).eval()
    x = torch.randn(1, 3, 32, 32)
    dg = prunefx.analyze(model, x)
    g = _head_group(dg, "blocks.0.attn.qkv")
    assert g.channels == 3  # vit_tiny: 3 heads of 64
    config = prunefx.PlanConfig(ratio=0.34, scope="local", ignore=("patch_embed.proj",))  # heads + MLP, not the stream
    result = prunefx.prune(model, x, config, criterion="l2")
    assert all(b.attn.num_heads == 2 and b.attn.attn_dim == 128 for b in model.blocks)
    assert result.verified.ok and result.verified.exact, result.verified.message


def test_yolo11n_c2psa_heads_are_pruned_and_the_oracle_passes():
    from ultralytics.nn.modules.block import Attention
    from ultralytics.nn.tasks import DetectionModel

    torch.manual_seed(0)
    model = DetectionModel("yolo11n.yaml", verbose=False)
    x = torch.randn(1, 3, 64, 64)
    (name, attn), = [(n, m) for n, m in model.named_modules() if isinstance(m, Attention)]
    assert attn.num_heads == 2
    dg = prunefx.analyze(model, x)
    heads = _head_group(dg, f"{name}.qkv.conv")
    assert heads.channels == 2
    plan = prunefx.PlanConfig(ratio=0.5, scope="local", ignore=("model.23.*",))  # leave Detect alone
    result = prunefx.prune(model, x, plan, criterion="l2")
    pruned = {gp.group: gp.after for gp in result.plan.pruned}
    assert pruned.get(heads.id) == 1 and attn.num_heads == 1
    assert any(m.kind is Kind.CONST for m in heads.members)  # the view's head count, rewritten by the plugin's fixer
    assert result.verified.ok and result.verified.exact, result.verified.message
