"""diffusers plugin: attention and resampling modules whose forward reads channel counts from attributes."""

from __future__ import annotations

from diffusers.models.attention_processor import Attention
from diffusers.models.downsampling import Downsample2D
from diffusers.models.upsampling import Upsample2D
from torch import nn

from prunefx.transform.fixers import LiteralCount, register_fixer


@register_fixer(Attention, literals=True)
def _attention(m: Attention, widths: dict) -> None:
    # The processors compute head_dim = key width // self.heads: when the analysis pruned whole heads, the literal
    # ``heads`` was recorded and comes back here with its new value; otherwise heads stay and head_dim shrinks.
    # Read the sliced weights: the children's own fixers run after this one.
    m.heads = widths.get(LiteralCount(m.heads), m.heads)
    m.inner_dim, m.query_dim = m.to_q.weight.shape
    if isinstance(m.to_k, nn.Linear):
        m.inner_kv_dim, m.cross_attention_dim = m.to_k.weight.shape
    if isinstance(m.to_out, nn.ModuleList) and isinstance(m.to_out[0], nn.Linear):
        m.out_dim = m.to_out[0].weight.shape[0]


@register_fixer(Downsample2D, Upsample2D, literals=True)
def _resample(m: nn.Module, widths: dict) -> None:
    # forward asserts ``hidden_states.shape[1] == self.channels``
    # without a conv (Upsample2D, use_conv=False) that assert freezes the channels: nothing to follow
    conv = getattr(m, "conv", None)
    if isinstance(conv, nn.modules.conv._ConvNd):
        m.out_channels, m.channels = conv.weight.shape[:2]  # groups == 1: diffusers builds them so
