"""Attention layouts of Hugging Face models: where the projections are and which attributes count heads.

The analysis finds heads from the graph (a reshape into heads x head_dim whose head dim is a batch dim of the
attention product); what it cannot know is which Python attributes a class keeps about them. A layout names them,
and its fixer re-derives them from the projections' new widths after slicing. An attention class without a layout
keeps its literals unclaimed, so its heads are left alone with a reason naming the node and the module.
State-space mixers (Mamba) have no heads: ``MIXERS`` holds the rewrite of the widths their forward reads.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable
from dataclasses import dataclass
from typing import TypeVar

import torch
from torch import nn

T = TypeVar("T")


@dataclass(frozen=True)
class AttentionLayout:
    """Projections and head attributes of one attention class.

    ``q`` / ``k``: child projections (``fused``: one child holding q, k and v side by side, GPT-2's ``c_attn``);
    ``head_dim``: the attribute holding the per-head width (kept: whole heads are pruned). The attribute tuples are
    set from the new widths: ``heads`` = q width / head_dim, ``kv_heads`` = k width / head_dim, ``groups`` =
    heads / kv_heads, ``widths`` = q width.
    """

    q: str = "q_proj"
    k: str = "k_proj"
    fused: str | None = None
    head_dim: str = "head_dim"
    heads: tuple[str, ...] = ()
    kv_heads: tuple[str, ...] = ()
    groups: tuple[str, ...] = ()
    widths: tuple[str, ...] = ()


def _out_width(m: nn.Module) -> int:
    return m.weight.shape[1] if type(m).__name__ == "Conv1D" else m.weight.shape[0]  # Conv1D stores (in, out)


def attention_widths(m: nn.Module, layout: AttentionLayout) -> tuple[int, int, int]:
    """(query heads, key/value heads, head_dim) of attention module ``m``, read from its weights."""
    hd = int(getattr(m, layout.head_dim))
    if layout.fused:
        q = k = _out_width(m.get_submodule(layout.fused)) // 3
    else:
        q, k = _out_width(m.get_submodule(layout.q)), _out_width(m.get_submodule(layout.k))
    return q // hd, k // hd, hd


def expert_width(experts: nn.Module) -> int | None:
    """The FFN width of each expert of a stacked experts module: ``down_proj``'s input dim (None: no such weight)."""
    down = getattr(experts, "down_proj", None)
    if not isinstance(down, torch.Tensor) or down.dim() != 3:
        return None
    return int(down.shape[-2] if getattr(experts, "is_transposed", False) else down.shape[-1])


EXPERT_WIDTH_STEP = 8  # stacked expert weights run through grouped_mm, whose kernels want 16-byte rows (bf16: 8)


def expert_widths(model: nn.Module) -> tuple[tuple[str, tuple[int, ...]], ...]:
    """``PlanConfig.allowed_widths`` of the experts' FFN widths: multiples of :data:`EXPERT_WIDTH_STEP` (or all of
    it), so the pruned experts still run through ``grouped_mm`` (torch's kernel refuses other row strides).
    Registered for every plan (``prunefx.plan.widths.register_widths``): a kernel's limit, whoever prunes."""
    out = []
    for name, m in model.named_modules():  # a stacked experts module: it counts its experts and has a down_proj
        width = expert_width(m) if isinstance(getattr(m, "num_experts", None), int) else None
        if width:
            out.append((f"{name}.*", (*range(EXPERT_WIDTH_STEP, width, EXPERT_WIDTH_STEP), width)))
    return tuple(out)


def rewrite_attributes(m: nn.Module, layout: AttentionLayout) -> None:
    """Set the layout's head attributes of ``m`` from its projections' widths."""
    heads, kv, hd = attention_widths(m, layout)
    for a in layout.heads:
        setattr(m, a, heads)
    for a in layout.kv_heads:
        setattr(m, a, kv)
    for a in layout.groups:
        setattr(m, a, heads // kv)
    for a in layout.widths:
        setattr(m, a, heads * hd)


_LLAMA = AttentionLayout(groups=("num_key_value_groups",))  # views use -1 for the head count; n_rep is an attribute
_BERT = AttentionLayout(
    q="query", k="key", head_dim="attention_head_size", heads=("num_attention_heads",), widths=("all_head_size",)
)
LAYOUTS: dict[str, AttentionLayout] = {
    "transformers.models.llama.modeling_llama.LlamaAttention": _LLAMA,
    "transformers.models.qwen2.modeling_qwen2.Qwen2Attention": _LLAMA,
    "transformers.models.mistral.modeling_mistral.MistralAttention": _LLAMA,
    "transformers.models.gemma.modeling_gemma.GemmaAttention": _LLAMA,
    "transformers.models.phi.modeling_phi.PhiAttention": _LLAMA,
    "transformers.models.gpt2.modeling_gpt2.GPT2Attention": AttentionLayout(
        fused="c_attn", heads=("num_heads",), widths=("embed_dim", "split_size")
    ),
    "transformers.models.bert.modeling_bert.BertSelfAttention": _BERT,
    "transformers.models.roberta.modeling_roberta.RobertaSelfAttention": _BERT,
    "transformers.models.t5.modeling_t5.T5Attention": AttentionLayout(
        q="q", k="k", head_dim="key_value_proj_dim", heads=("n_heads",), widths=("inner_dim",)
    ),
    "transformers.models.vit.modeling_vit.ViTAttention": AttentionLayout(heads=("num_attention_heads",)),
    "transformers.models.clip.modeling_clip.CLIPAttention": AttentionLayout(
        heads=("num_heads",), widths=("embed_dim",)
    ),
    "transformers.models.whisper.modeling_whisper.WhisperAttention": AttentionLayout(
        heads=("num_heads",), widths=("embed_dim",)
    ),
}


def layout_of(module: nn.Module) -> AttentionLayout | None:
    for cls in type(module).__mro__:
        layout = LAYOUTS.get(f"{cls.__module__}.{cls.__qualname__}")
        if layout is not None:
            return layout
    return None


def llama_like(module: nn.Module) -> bool:
    """Whether ``module`` is built as Llama's attention is: ``q_proj``, ``k_proj``, ``v_proj``, ``o_proj`` linear
    children, an int ``head_dim`` and ``num_key_value_groups`` (its views use -1 for the head count). transformers
    writes most families this way (Qwen 3, Gemma 2 / 3, OLMo, Mixtral, ...), each under its own class name."""
    if not all(isinstance(getattr(module, p, None), nn.Linear) for p in ("q_proj", "k_proj", "v_proj", "o_proj")):
        return False
    return all(type(getattr(module, a, None)) is int for a in ("head_dim", "num_key_value_groups"))


def install_layout(cls: type, layout: AttentionLayout) -> None:
    """Register ``layout`` for ``cls``: its fixer re-derives the head attributes and owns its forward's literals."""
    from prunefx.transform.fixers import register_fixer

    LAYOUTS[f"{cls.__module__}.{cls.__qualname__}"] = layout
    register_fixer(cls, literals=True)(lambda m, widths, layout=layout: rewrite_attributes(m, layout))


def adopt_attention(model: nn.Module) -> None:
    """Give every Llama-like attention class of ``model`` without a layout the Llama layout; the oracle still
    checks every plan through it, so a class whose forward reads another head attribute fails there."""
    for m in model.modules():
        if layout_of(m) is None and llama_like(m):
            install_layout(type(m), _LLAMA)


def rewrite_mamba(m: nn.Module) -> None:
    """Set a Mamba mixer's width attributes (and its conv1d's and dt_proj's) from its weights."""
    # its slow forward splits x_proj's output by time_step_rank and ssm_state_size, and runs conv1d and dt_proj
    # through their weights alone, so no module fixer sees those two
    inner, state = m.A_log.shape
    m.intermediate_size, m.ssm_state_size = int(inner), int(state)
    m.time_step_rank = m.dt_proj.in_features = int(m.dt_proj.weight.shape[1])
    m.dt_proj.out_features = int(inner)
    m.conv1d.in_channels = m.conv1d.out_channels = m.conv1d.groups = int(m.conv1d.weight.shape[0])  # depthwise
    m.hidden_size = int(m.out_proj.weight.shape[0])


# state-space mixers: the fixer that re-derives their width attributes (and owns their forward's literals)
MIXERS: dict[str, Callable[[nn.Module], None]] = {
    "transformers.models.mamba.modeling_mamba.MambaMixer": rewrite_mamba,
}


def mixer_classes() -> dict[type, Callable[[nn.Module], None]]:
    """The installed transformers' state-space mixer classes with their attribute rewrite."""
    return _installed(MIXERS)


def attention_classes() -> dict[type, AttentionLayout]:
    """The installed transformers' classes that have a layout (a family missing from this version is skipped)."""
    return _installed(LAYOUTS)


def _installed(table: dict[str, T]) -> dict[type, T]:
    """The classes of ``table`` (by dotted path) this transformers version has, with their values."""
    found = {}
    for path, layout in table.items():
        module, _, name = path.rpartition(".")
        try:
            found[getattr(importlib.import_module(module), name)] = layout
        except (ImportError, AttributeError):
            continue
    return found
