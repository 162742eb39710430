"""ultralytics plugin: what prunefx needs to know about ultralytics' models, registered when ultralytics is in use."""

from __future__ import annotations

from torch import nn
from ultralytics.nn.modules import block
from ultralytics.nn.tasks import BaseModel

from prunefx.analysis.outputs import register_free_outputs
from prunefx.analysis.roles import ModuleRole
from prunefx.transform.fixers import register_fixer

# Detect returns the neck outputs (``feats``) next to its predictions; the loss and the decoder read only their
# spatial sizes, so their channel counts may change.
register_free_outputs(BaseModel, "feats")


@register_fixer(block.C2f, block.C2PSA, literals=True)
def _halves(m: nn.Module, widths: dict[ModuleRole, int]) -> None:
    # forward_split / C2PSA.forward split cv1's output into (c, c): the analysis ties the halves' counts
    # (chunk(2), or the equal literal sizes of split((c, c))), so c is half of cv1's new width.
    m.c = m.cv1.conv.weight.shape[0] // 2


@register_fixer(block.Attention, literals=True)
def _attention_heads(m: nn.Module, widths: dict[ModuleRole, int]) -> None:
    # forward: qkv.view(B, self.num_heads, 2 * key_dim + head_dim, N): whole heads are pruned (key_dim and head_dim
    # stay), so the head count follows qkv's new width; the output view reads C from its input.
    m.num_heads = m.qkv.conv.weight.shape[0] // (2 * m.key_dim + m.head_dim)


@register_fixer(BaseModel)
def _param_counts(m: nn.Module, widths: dict[ModuleRole, int]) -> None:
    # parse_model stores each layer's parameter count in ``np`` (printed by model.info()): refresh it.
    for layer in getattr(m, "model", ()):
        if isinstance(getattr(layer, "np", None), int):
            layer.np = sum(p.numel() for p in layer.parameters())
