"""open_clip plugin: ModifiedResNet's attention pool passes ``self.num_heads`` to F.multi_head_attention_forward."""

from __future__ import annotations

from open_clip.modified_resnet import AttentionPool2d
from torch import nn

from prunefx.transform.fixers import LiteralCount, register_fixer


@register_fixer(AttentionPool2d, literals=True)
def _attention_pool(m: nn.Module, widths: dict) -> None:
    # whole heads go (head_dim = embed width // num_heads stays); the literal comes back with its new value
    m.num_heads = widths.get(LiteralCount(m.num_heads), m.num_heads)
