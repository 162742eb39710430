"""transformers plugin: export capture for every ``PreTrainedModel``, fixers for ``Conv1D`` and the attention
layouts, the layer-list compactor of depth pruning (registered when transformers is in use; see
``prunefx.integrations.transformers``)."""

from __future__ import annotations

from torch import nn
from transformers import PreTrainedModel
from transformers.pytorch_utils import Conv1D

from prunefx.capture.torch_export import register_export
from prunefx.integrations.transformers.depth import compact_layers
from prunefx.integrations.transformers.layouts import attention_classes, rewrite_attributes
from prunefx.transform.depth import register_compactor
from prunefx.transform.fixers import register_fixer

# transformers' forwards branch on shapes and build masks in Python (no fx tracer since v5); export follows them.
# A DynamicCache in the output is not a pytree: the capture runs without a cache.
register_export(PreTrainedModel, lambda model: {"use_cache": False})
# removed decoder layers leave the layer list; num_hidden_layers, layer_types and layer_idx follow
register_compactor(lambda model, container, positions: compact_layers(model, container, positions)
                   if isinstance(model, PreTrainedModel) else None)


@register_fixer(Conv1D, literals=True)
def _conv1d(m: nn.Module, widths: dict) -> None:
    # forward: x.view(*x.shape[:-1], self.nf) after an addmm with the (in, out) weight
    m.nf = m.weight.shape[1]


for _cls, _layout in attention_classes().items():
    register_fixer(_cls, literals=True)(lambda m, widths, layout=_layout: rewrite_attributes(m, layout))
