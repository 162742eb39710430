"""torchvision's detection ops in a traced graph: the RoI pooler keeps the channels of the feature maps it pools
(one set across the levels), and a whole detector analyses (in eval mode) and prunes with the oracle passing."""

from __future__ import annotations

from collections import OrderedDict

import pytest
import torch
from torch import nn

import prunefx

torchvision = pytest.importorskip("torchvision")
from torchvision.ops import MultiScaleRoIAlign


class TwoLevelPooler(nn.Module):
    """Two feature maps of 8 channels (strides 1 and 2), boxes pooled from both, then a box head."""

    def __init__(self) -> None:
        super().__init__()
        self.p0 = nn.Conv2d(3, 8, 3, padding=1)
        self.p1 = nn.Conv2d(3, 8, 3, stride=2, padding=1)
        self.pool = MultiScaleRoIAlign(["0", "1"], output_size=2, sampling_ratio=2)
        self.head = nn.Linear(8 * 2 * 2, 5)
        self.register_buffer("boxes", torch.tensor([[1.0, 1.0, 9.0, 9.0], [0.0, 2.0, 14.0, 15.0]]))

    def forward(self, x):
        feats = OrderedDict([("0", self.p0(x)), ("1", self.p1(x))])
        pooled = self.pool(feats, [self.boxes], [(x.shape[-2], x.shape[-1])])
        return self.head(pooled.flatten(1))


def test_roi_pooling_couples_the_levels_channels_and_passes_them_to_the_box_head():
    model, x = TwoLevelPooler().eval(), torch.randn(1, 3, 16, 16)
    dg = prunefx.analyze(model, x)
    assert not dg.unknown_ops and not dg.auto_leaves
    (g,) = dg.groups_of("p0")
    assert g.prunable and g.exact and g.channels == 8
    modules = {f"{m.name}.{m.role}" for m in g.members if m.kind.value == "module"}
    assert modules == {"p0.out", "p1.out", "head.in"}
    head_in = next(m for m in g.members if m.kind.value == "module" and m.name == "head")
    assert list(head_in.index) == [c * 4 + k for c in range(8) for k in range(4)]  # channel-major after flatten
    result = prunefx.prune(model, x, prunefx.PlanConfig(ratio=0.5, round_to=1), criterion="l1")
    assert result.verified.ok and result.verified.exact, result.verified.message
    assert result.model.p0.out_channels == result.model.p1.out_channels < 8
    assert result.model.head.in_features == 4 * result.model.p0.out_channels


@pytest.mark.slow
def test_a_faster_rcnn_prunes_its_backbone_fpn_and_heads_verified_on_boxes_and_scores():
    model = torchvision.models.get_model("fasterrcnn_mobilenet_v3_large_320_fpn", weights=None,
                                         weights_backbone=None, min_size=128, max_size=128, box_score_thresh=0.0)
    torch.manual_seed(0)
    images = [torch.rand(3, 128, 128)]
    model.eval()
    dg = prunefx.analyze(model, (images,))
    assert dg.training is False and "traced in evaluation mode" in dg.notes[0]
    pruned_modules = {m.name for g in dg.prunable for m in g.members if m.kind.value == "module"}
    for part in ("backbone.body", "backbone.fpn", "rpn.head", "roi_heads.box_head"):
        assert any(n.startswith(part) for n in pruned_modules), part
    result = prunefx.prune(model, (images,), prunefx.PlanConfig(ratio=0.3))
    assert result.verified.ok, result.verified.message
    assert len(result.verified.errors) == 3  # boxes, scores and labels of the 100 detections were compared
    with torch.no_grad():
        out = result.model(images)
    assert out[0]["boxes"].shape == (100, 4)
    cut = {m.name for gp in result.plan.pruned for m in dg.groups[gp.group].members if m.kind.value == "module"}
    for part in ("backbone.body", "backbone.fpn", "roi_heads.box_head"):
        assert any(n.startswith(part) for n in cut), part
