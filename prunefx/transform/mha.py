"""nn.MultiheadAttention after pruning: attributes from the new weights, and a forward for any inner width.

The stock forward derives head_dim from embed_dim (``embed_dim // num_heads``) and needs the heads to fill the
embedding exactly; once heads (or the embedding around them) are pruned that no longer holds. The layer then becomes
a :class:`PrunedMultiheadAttention`: the same parameters and state_dict keys, still an ``nn.MultiheadAttention``
for isinstance checks, with a forward that takes the head count and head_dim from its attributes and the widths from
its weights. The class is swapped only when the stock forward cannot run the pruned weights.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import nn

from prunefx.analysis.roles import ModuleRole
from prunefx.analysis.rules import register_rule
from prunefx.analysis.rules.mha import multihead_attention
from prunefx.capture.trace import register_leaf
from prunefx.transform.fixers import register_fixer


class PrunedMultiheadAttention(nn.MultiheadAttention):
    """nn.MultiheadAttention whose inner width (num_heads x head_dim) may differ from embed_dim and the output width.

    Same signature and results as the stock module's reference path (``F.multi_head_attention_forward``):
    batch_first, unbatched inputs, key_padding_mask, 2-D and 3-D attn_mask, is_causal, need_weights /
    average_attn_weights, bias_k / bias_v, add_zero_attn, separate kdim / vdim projections, dropout in train mode.
    """

    def forward(  # the branches mirror F.multi_head_attention_forward one to one
        self,
        query: torch.Tensor,
        key: torch.Tensor,
        value: torch.Tensor,
        key_padding_mask: torch.Tensor | None = None,
        need_weights: bool = True,
        attn_mask: torch.Tensor | None = None,
        average_attn_weights: bool = True,
        is_causal: bool = False,
    ) -> tuple[torch.Tensor, torch.Tensor | None]:
        batched = query.dim() == 3
        if self.batch_first and batched:
            query, key, value = (x.transpose(1, 0) for x in (query, key, value))
        if not batched:
            query, key, value = (x.unsqueeze(1) for x in (query, key, value))
            if key_padding_mask is not None:
                key_padding_mask = key_padding_mask.unsqueeze(0)
        tgt_len, bsz, _ = query.shape
        key_padding_mask = F._canonical_mask(
            mask=key_padding_mask, mask_name="key_padding_mask", other_type=F._none_or_dtype(attn_mask),
            other_name="attn_mask", target_type=query.dtype,
        )
        if is_causal and attn_mask is None:
            raise RuntimeError("Need attn_mask if specifying the is_causal hint (as nn.MultiheadAttention).")
        if is_causal and key_padding_mask is None and not need_weights:
            attn_mask = None  # scaled_dot_product_attention applies the causal mask itself
        else:
            attn_mask = F._canonical_mask(
                mask=attn_mask, mask_name="attn_mask", other_type=None, other_name="", target_type=query.dtype,
                check_other=False,
            )
            if key_padding_mask is not None:
                is_causal = False
        heads, hd = self.num_heads, self.head_dim
        if self._qkv_same_embed_dim:
            wq, wk, wv = self.in_proj_weight.chunk(3)
        else:
            wq, wk, wv = self.q_proj_weight, self.k_proj_weight, self.v_proj_weight
        bq, bk, bv = self.in_proj_bias.chunk(3) if self.in_proj_bias is not None else (None, None, None)
        q, k, v = F.linear(query, wq, bq), F.linear(key, wk, bk), F.linear(value, wv, bv)
        if attn_mask is not None and attn_mask.dim() == 2:
            attn_mask = attn_mask.unsqueeze(0)
        if self.bias_k is not None and self.bias_v is not None:
            k = torch.cat([k, self.bias_k.repeat(1, bsz, 1)])
            v = torch.cat([v, self.bias_v.repeat(1, bsz, 1)])
            attn_mask = F.pad(attn_mask, (0, 1)) if attn_mask is not None else None
            key_padding_mask = F.pad(key_padding_mask, (0, 1)) if key_padding_mask is not None else None
        q = q.view(tgt_len, bsz * heads, hd).transpose(0, 1)
        k = k.view(k.shape[0], bsz * heads, hd).transpose(0, 1)
        v = v.view(v.shape[0], bsz * heads, hd).transpose(0, 1)
        if self.add_zero_attn:
            zeros = torch.zeros((bsz * heads, 1, hd), dtype=k.dtype, device=k.device)
            k, v = torch.cat([k, zeros], dim=1), torch.cat([v, zeros], dim=1)
            attn_mask = F.pad(attn_mask, (0, 1)) if attn_mask is not None else None
            key_padding_mask = F.pad(key_padding_mask, (0, 1)) if key_padding_mask is not None else None
        src_len = k.size(1)
        if key_padding_mask is not None:
            kpm = key_padding_mask.view(bsz, 1, 1, src_len).expand(-1, heads, -1, -1).reshape(bsz * heads, 1, src_len)
            attn_mask = kpm if attn_mask is None else attn_mask + kpm
        dropout_p = self.dropout if self.training else 0.0
        weights = None
        if need_weights:
            scores = q * math.sqrt(1.0 / float(hd))
            if attn_mask is not None:
                scores = torch.baddbmm(attn_mask, scores, k.transpose(-2, -1))
            else:
                scores = torch.bmm(scores, k.transpose(-2, -1))
            weights = F.softmax(scores, dim=-1)
            if dropout_p > 0.0:
                weights = F.dropout(weights, p=dropout_p)
            out = torch.bmm(weights, v).transpose(0, 1).reshape(tgt_len * bsz, heads * hd)
            weights = weights.view(bsz, heads, tgt_len, src_len)
            if average_attn_weights:
                weights = weights.mean(dim=1)
            if not batched:
                weights = weights.squeeze(0)
        else:
            if attn_mask is not None:
                if attn_mask.size(0) == 1 and attn_mask.dim() == 3:
                    attn_mask = attn_mask.unsqueeze(0)
                else:
                    attn_mask = attn_mask.view(bsz, heads, -1, src_len)
            q, k, v = q.view(bsz, heads, tgt_len, hd), k.view(bsz, heads, src_len, hd), v.view(bsz, heads, src_len, hd)
            out = F.scaled_dot_product_attention(q, k, v, attn_mask, dropout_p, is_causal)
            out = out.permute(2, 0, 1, 3).reshape(bsz * tgt_len, heads * hd)
        out = F.linear(out, self.out_proj.weight, self.out_proj.bias).view(tgt_len, bsz, -1)
        if not batched:
            out = out.squeeze(1)
        elif self.batch_first:
            out = out.transpose(1, 0)
        return out, weights


# A leaf like the stock layer (fx would otherwise trace its forward), analysed by the same rule.
register_leaf(PrunedMultiheadAttention)
register_rule(PrunedMultiheadAttention)(multihead_attention)


@register_fixer(nn.MultiheadAttention)
def _fix_mha(m: nn.MultiheadAttention, widths: dict[ModuleRole, int]) -> None:
    # head_dim stays (whole heads are pruned): the head count and the widths follow the sliced weights
    same = m._qkv_same_embed_dim
    wq = m.in_proj_weight if same else m.q_proj_weight
    inner = wq.shape[0] // (3 if same else 1)
    m.num_heads = inner // m.head_dim
    m.embed_dim = wq.shape[1]
    m.kdim = m.embed_dim if same else m.k_proj_weight.shape[1]
    m.vdim = m.embed_dim if same else m.v_proj_weight.shape[1]
    m.out_proj.out_features, m.out_proj.in_features = m.out_proj.weight.shape
    if type(m) is nn.MultiheadAttention and not (inner == m.embed_dim == m.out_proj.out_features):
        m.__class__ = PrunedMultiheadAttention


@register_fixer(nn.TransformerEncoderLayer)
def _fix_encoder_layer(m: nn.TransformerEncoderLayer, widths: dict[ModuleRole, int]) -> None:
    # The layer's (and nn.TransformerEncoder's) inference fast path hands self_attn's weights, embed_dim and
    # num_heads to one fused kernel that assumes embed_dim == heads x head_dim. The flag below only selects that
    # path (the slow path reads self.activation), so clearing it makes a pruned layer run its own modules.
    if isinstance(m.self_attn, PrunedMultiheadAttention):
        m.activation_relu_or_gelu = 0
