"""transformers plugin: export capture for every ``PreTrainedModel``, fixers for ``Conv1D`` and the attention
layouts, the layer-list compactor of depth pruning (registered when transformers is in use; see
``prunefx.integrations.transformers``)."""

from __future__ import annotations

import torch
from torch import nn
from transformers import PreTrainedModel
from transformers.pytorch_utils import Conv1D

from prunefx.analysis.rules import register_rule
from prunefx.analysis.rules.linalg import grouped_mm
from prunefx.capture.torch_export import register_export
from prunefx.integrations.transformers.depth import compact_layers
from prunefx.integrations.transformers.layouts import adopt_attention, attention_classes, install_layout
from prunefx.metrics.flops import grouped_mm_flops, register_flops
from prunefx.transform.depth import register_compactor
from prunefx.transform.fixers import register_fixer


# transformers' forwards branch on shapes and build masks in Python (no fx tracer since v5); export follows them.
# A DynamicCache in the output is not a pytree: the capture runs without a cache.
def _export_kwargs(model: nn.Module) -> dict:
    """Captured without a cache; its Llama-like attention classes adopted first (their fixers own the literals)."""
    adopt_attention(model)
    return {"use_cache": False}


register_export(PreTrainedModel, _export_kwargs)
# transformers' MoE dispatch on CPU / float32: its own op with torch._grouped_mm's (S, K) x (E, K, N) semantics
if hasattr(torch.ops.transformers, "grouped_mm_fallback"):
    register_rule(torch.ops.transformers.grouped_mm_fallback.default)(grouped_mm)
    register_flops(torch.ops.transformers.grouped_mm_fallback, grouped_mm_flops)
# removed decoder layers leave the layer list; num_hidden_layers, layer_types and layer_idx follow
register_compactor(lambda model, container, positions: compact_layers(model, container, positions)
                   if isinstance(model, PreTrainedModel) else None)


@register_fixer(Conv1D, literals=True)
def _conv1d(m: nn.Module, widths: dict) -> None:
    # forward: x.view(*x.shape[:-1], self.nf) after an addmm with the (in, out) weight
    m.nf = m.weight.shape[1]


for _cls, _layout in attention_classes().items():
    install_layout(_cls, _layout)
