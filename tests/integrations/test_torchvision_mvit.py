"""torchvision MViT (video): the helpers it hides from fx (``_unsqueeze`` / ``_squeeze``, ``_add_shortcut``,
``_add_rel_pos``) have rules, so its attention and residual channels are prunable, equal to the masked original."""

import pytest
import torch
from _graph_checks import positions
from torchvision.models.video.mvit import MSBlockConfig, MViT

import prunefx
from prunefx.plan import PlanConfig


def _mvit(cls_embed: bool) -> MViT:
    torch.manual_seed(0)
    blocks = [MSBlockConfig(1, 16, 16, [3, 3, 3], [3, 3, 3], [1, 1, 1], [1, 2, 2]),
              MSBlockConfig(2, 16, 32, [3, 3, 3], [3, 3, 3], [1, 2, 2], [1, 1, 1])]
    return MViT((32, 32), 4, blocks, residual_pool=True, residual_with_cls_embed=cls_embed, rel_pos_embed=True,
                proj_after_attn=True, num_classes=5).eval()


X = torch.randn(1, 3, 4, 32, 32)


def test_relative_position_tables_follow_the_query_head_dim():
    dg = prunefx.analyze(_mvit(False), X)
    assert dg.unknown_ops == {}
    (g,) = [g for g in dg.groups if any(m.name == "blocks.0.attn.rel_pos_h" and str(m.role) == "dim1"
                                        for m in g.members)]
    assert g.prunable
    # one head: head-dim offset d of q (and k) is the unit, the table column d follows it
    cols = positions(g, "blocks.0.attn.rel_pos_h", "dim1", kind="param")
    assert sorted(c for pos in cols for c in pos) == list(range(16))
    rows = [g for g in dg.groups if any(m.name == "blocks.0.attn.rel_pos_h" and str(m.role) == "dim0"
                                        for m in g.members)]
    assert rows and not any(r.prunable for r in rows)
    assert any("relative position bias rows are looked up by position" in r.reasons[0] for r in rows)


@pytest.mark.parametrize("cls_embed", [False, True], ids=["shortcut_without_cls", "shortcut_with_cls"])
def test_pruned_mvit_equals_the_masked_original(cls_embed):
    result = prunefx.prune(_mvit(cls_embed), X, PlanConfig(ratio=0.5), bias_compensation=False)
    assert result.verified.accepted, result.verified.message  # LayerNorm groups: inexact by design
    assert result.frozen_by_check == () and len(result.plan.pruned) >= 3
