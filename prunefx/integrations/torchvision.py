"""torchvision plugin: ops that torchvision hides from fx with ``torch.fx.wrap`` (they appear as one call)."""

from __future__ import annotations

from typing import Any

import torch
from torchvision.models.detection import roi_heads, transform
from torchvision.ops import batched_nms, boxes, nms, roi_align, roi_pool
from torchvision.ops.poolers import _filter_input, _multiscale_roi_align, _setup_scales
from torchvision.ops.stochastic_depth import stochastic_depth

from prunefx.analysis.labels import Lab
from prunefx.analysis.rules import register_rule, register_train_only
from prunefx.analysis.rules._algebra import passthrough
from prunefx.capture.semantics import register_discrete
from prunefx.capture.trace import register_leaf_function
from prunefx.integrations import swin  # noqa: F401 - Swin attention heads: rules, fixer, pruned forward

# Drops whole samples (rows) at random and rescales: every channel is treated alike; identity in eval mode.
register_rule(stochastic_depth)(passthrough)
register_train_only(stochastic_depth)

# Non-maximum suppression keeps or drops boxes by thresholds: the oracle compares its inputs, then replays it.
# A detector's trace records the operator itself (torchvision.ops.nms is plain Python around it).
register_discrete(nms, batched_nms, torch.ops.torchvision.nms, torch.ops.torchvision.nms.default)
# Detectors call it as ``box_ops.batched_nms``: one node, not its Python loop over the classes present (data).
register_leaf_function(boxes, "batched_nms")
# Post-processing that loops over the detections and rounds box corners to pixels (pastes masks, locates keypoint
# heatmap maxima): one node each, discontinuous (the oracle compares their inputs, then replays them).
register_leaf_function(transform, "paste_masks_in_image")
register_leaf_function(roi_heads, "heatmaps_to_keypoints")
register_discrete(roi_heads.paste_masks_in_image, roi_heads.heatmaps_to_keypoints)


@register_rule(_filter_input)
def _filter_input_rule(ctx: Any) -> list:
    """MultiScaleRoIAlign takes the feature maps it pools from a dict by name, in order: labels pass through."""
    features, names = ctx.aval(ctx.args[0]), ctx.arg(1, "featmap_names")
    return [lab for name, lab in features.items() if name in names]


def _pooled(ctx: Any, levels: list) -> Lab:
    """Pooling boxes out of feature maps keeps their channels: every level's channels are one set, rows are boxes."""
    labeled = [lab.dims[1] for lab in levels if isinstance(lab, Lab) and lab.dims[1] is not None]
    if not labeled:
        return Lab.none(ctx.out.dim())
    for other in labeled[1:]:
        ctx.union(labeled[0], other, "feature maps pooled together by one RoI pooler share their channels")
    if len(labeled) < len(levels):
        ctx.freeze(labeled[0], "pooled together with a feature map whose channels cannot be sliced")
    return Lab((None, labeled[0], *([None] * (ctx.out.dim() - 2))))


@register_rule(_multiscale_roi_align)
def _multiscale_roi_align_rule(ctx: Any) -> Lab:
    return _pooled(ctx, list(ctx.aval(ctx.args[0])))


@register_rule(roi_align, roi_pool, torch.ops.torchvision.roi_align, torch.ops.torchvision.roi_pool)
def _roi_pool_rule(ctx: Any) -> Lab:
    return _pooled(ctx, [ctx.lab(ctx.args[0])])


@register_rule(_setup_scales)
def _setup_scales_rule(ctx: Any) -> Any:
    """The pooler's scales and level mapper come from the feature maps' spatial sizes, never their channels."""
    return ctx.out
