"""timm plugin: attention modules whose forward writes the head count and width as attributes."""

from __future__ import annotations

from timm.layers.attention import Attention
from torch import nn

from prunefx.transform.fixers import register_fixer


@register_fixer(Attention, literals=True)
def _attention_heads(m: nn.Module, widths: dict) -> None:
    # forward: qkv.reshape(B, N, 3, self.num_heads, self.head_dim) ... reshape(B, N, self.attn_dim): whole heads
    # are pruned (head_dim stays), so both follow proj's new input width.
    width = m.proj.weight.shape[1]
    m.num_heads = width // m.head_dim
    if hasattr(m, "attn_dim"):
        m.attn_dim = width
