"""torchvision plugin: ops that torchvision hides from fx with ``torch.fx.wrap`` (they appear as one call)."""

from __future__ import annotations

from typing import Any

import torch
from torchvision.models.detection import roi_heads, transform
from torchvision.models.video import mvit
from torchvision.ops import batched_nms, boxes, nms, roi_align, roi_pool
from torchvision.ops.poolers import _filter_input, _multiscale_roi_align, _setup_scales
from torchvision.ops.stochastic_depth import stochastic_depth

from prunefx.analysis.labels import Lab
from prunefx.analysis.rules import register_rule, register_train_only
from prunefx.analysis.rules._algebra import broadcast_merge, norm_dim, passthrough, pointwise
from prunefx.analysis.rules._context import Ctx
from prunefx.analysis.rules.linalg import _contract
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
def _filter_input_rule(ctx: Ctx) -> list:
    """MultiScaleRoIAlign takes the feature maps it pools from a dict by name, in order: labels pass through."""
    features, names = ctx.aval(ctx.args[0]), ctx.arg(1, "featmap_names")
    return [lab for name, lab in features.items() if name in names]


def _pooled(ctx: Ctx, levels: list) -> Lab:
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
def _multiscale_roi_align_rule(ctx: Ctx) -> Lab:
    return _pooled(ctx, list(ctx.aval(ctx.args[0])))


@register_rule(roi_align, roi_pool, torch.ops.torchvision.roi_align, torch.ops.torchvision.roi_pool)
def _roi_pool_rule(ctx: Ctx) -> Lab:
    return _pooled(ctx, [ctx.lab(ctx.args[0])])


@register_rule(_setup_scales)
def _setup_scales_rule(ctx: Ctx) -> Any:
    """The pooler's scales and level mapper come from the feature maps' spatial sizes, never their channels."""
    return ctx.out


# ---- MViT (video): helpers it hides from fx ---------------------------------------------------------------------
@register_rule(mvit._unsqueeze)
def _mvit_unsqueeze(ctx: Ctx) -> tuple:
    """``(x.unsqueeze(expand_dim) if x.dim() == target_dim - 1 else x, x.dim())``: a new dim of size 1."""
    lab, target, expand = ctx.lab(ctx.args[0]), ctx.arg(1, "target_dim"), ctx.arg(2, "expand_dim")
    if lab.ndim == target - 1:
        d = norm_dim(expand, lab.ndim + 1)
        lab = Lab((*lab.dims[:d], None, *lab.dims[d:]))
    return lab, ctx.out[1]


@register_rule(mvit._squeeze)
def _mvit_squeeze(ctx: Ctx) -> Lab:
    """Undoes ``_unsqueeze``: drops ``expand_dim`` (size 1) when the input had ``target_dim - 1`` dims."""
    lab = ctx.lab(ctx.args[0])
    target, expand, had = ctx.arg(1, "target_dim"), ctx.arg(2, "expand_dim"), ctx.arg(3, "tensor_dim")
    if had != target - 1:
        return lab
    d = norm_dim(expand, lab.ndim)
    if lab.dims[d] is not None:
        ctx.freeze(lab.dims[d], "squeeze of a one-channel dim")
    return Lab(lab.dims[:d] + lab.dims[d + 1 :])


@register_rule(mvit._add_shortcut)
def _mvit_add_shortcut(ctx: Ctx) -> Lab:
    """``x += shortcut`` (all tokens, or all but the class token): element-wise along the channels."""
    return pointwise(ctx, [ctx.args[0], ctx.args[1]])


@register_rule(mvit._add_rel_pos)
def _mvit_add_rel_pos(ctx: Ctx) -> Lab:
    """``attn += einsum(q, R)`` per axis, R rows of a learned table picked by relative position: q's head dim is
    contracted with every table's columns, the heads add element-wise to attn's, the table rows are positions."""
    attn, q = ctx.args[0], ctx.args[1]
    la, lq = ctx.lab(attn), ctx.lab(q)
    for i, key in ((4, "rel_pos_h"), (5, "rel_pos_w"), (6, "rel_pos_t")):
        lt = ctx.lab(ctx.arg(i, key))
        _contract(ctx, lq.dims[-1], lt.dims[1])
        if lt.dims[0] is not None:
            ctx.freeze(lt.dims[0], "relative position bias rows are looked up by position")
    if lq.dims[2] is not None:
        ctx.freeze(lq.dims[2], "relative positions are added along this dim")
    heads = broadcast_merge(ctx, [(Lab(la.dims[:2]), ctx.shape(attn)[:2]), (Lab(lq.dims[:2]), ctx.shape(q)[:2])],
                            tuple(ctx.out.shape[:2]), "relative positions added with heads that cannot be sliced")
    return Lab((*heads, *la.dims[2:]))
