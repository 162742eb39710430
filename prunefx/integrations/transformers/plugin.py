"""transformers plugin: export capture for every ``PreTrainedModel``, fixers for ``Conv1D`` and the attention
layouts, the layer-list compactor of depth pruning (registered when transformers is in use; see
``prunefx.integrations.transformers``)."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

import torch
from torch import nn
from transformers import PreTrainedModel
from transformers.pytorch_utils import Conv1D

from prunefx.analysis.rules import register_rule
from prunefx.analysis.rules.linalg import grouped_mm
from prunefx.capture.torch_export import register_export
from prunefx.capture.trace import register_capture_setting
from prunefx.integrations.transformers.depth import compact_layers
from prunefx.integrations.transformers.layouts import (
    adopt_attention,
    attention_classes,
    expert_widths,
    install_layout,
    mixer_classes,
)
from prunefx.metrics.flops import grouped_mm_flops, register_flops
from prunefx.plan.widths import register_widths
from prunefx.transform.depth import register_compactor
from prunefx.transform.fixers import register_fixer


# transformers' forwards branch on shapes and build masks in Python (no fx tracer since v5); export follows them.
# A DynamicCache in the output is not a pytree: the capture runs without a cache.
def _export_kwargs(model: nn.Module) -> dict:
    """Captured without a cache; its Llama-like attention classes adopted first (their fixers own the literals)."""
    adopt_attention(model)
    return {"use_cache": False}


register_export(PreTrainedModel, _export_kwargs)


@contextmanager
def _no_cache(model: nn.Module) -> Iterator[None]:
    """Every Hugging Face model in ``model`` captured with ``config.use_cache`` off; the configs restored after."""
    # A wrapper (PEFT's PeftModel, a user's module holding a Llama) is no PreTrainedModel, so it gets no
    # use_cache=False argument: with the config's default a DynamicCache is built from traced values, and fx keeps
    # it as a graph constant (a graph that cannot be copied for the check). Setting the config of every inner
    # PreTrainedModel reaches them however they are wrapped.
    configs = {id(m.config): m.config for m in model.modules()
               if isinstance(m, PreTrainedModel) and getattr(m.config, "use_cache", False)}
    saved = {k: c.use_cache for k, c in configs.items()}
    try:
        for c in configs.values():
            c.use_cache = False
        yield
    finally:
        for k, c in configs.items():
            c.use_cache = saved[k]


register_capture_setting(_no_cache)
# transformers' MoE dispatch on CPU / float32: its own op with torch._grouped_mm's (S, K) x (E, K, N) semantics
if hasattr(torch.ops.transformers, "grouped_mm_fallback"):
    register_rule(torch.ops.transformers.grouped_mm_fallback.default)(grouped_mm)
    register_flops(torch.ops.transformers.grouped_mm_fallback, grouped_mm_flops)
# stacked experts run through grouped_mm, whose kernels refuse unaligned rows: every plan keeps aligned widths
register_widths(expert_widths)
# removed decoder layers leave the layer list; num_hidden_layers, layer_types and layer_idx follow
register_compactor(lambda model, container, positions: compact_layers(model, container, positions)
                   if isinstance(model, PreTrainedModel) else None)


@register_fixer(Conv1D, literals=True)
def _conv1d(m: nn.Module, widths: dict) -> None:
    # forward: x.view(*x.shape[:-1], self.nf) after an addmm with the (in, out) weight
    m.nf = m.weight.shape[1]


for _cls, _layout in attention_classes().items():
    install_layout(_cls, _layout)

for _cls, _rewrite in mixer_classes().items():  # Mamba: the mixer's slow forward reads its widths from attributes
    register_fixer(_cls, literals=True)(lambda m, widths, rewrite=_rewrite: rewrite(m))
