"""Hugging Face transformers integration: capture (``torch.export`` with ``use_cache=False``), attention layouts
(``layouts``), the config rewrite and ``save_pretrained`` round trip (``config``), and pruning a checkpoint on disk
shard by shard (``checkpoint``). The plugin (``plugin``) is imported once transformers is; importing this package
imports nothing from transformers.

    from prunefx.integrations import transformers as pfx_hf
    result = pfx_hf.prune(model, (input_ids,), prunefx.PlanConfig(params=0.7))   # heads + MLP, stream kept
    pfx_hf.save_pretrained(result.model, "pruned/")                            # loads with from_pretrained
"""

from prunefx.integrations.transformers.api import ConfigStaleWarning, prune, stream_patterns, update_config
from prunefx.integrations.transformers.budget import Budget
from prunefx.integrations.transformers.checkpoint import CheckpointTensors, meta_model, prune_checkpoint
from prunefx.integrations.transformers.depth import compact_layers, prune_depth
from prunefx.integrations.transformers.experts import moe_layers, prune_experts
from prunefx.integrations.transformers.pretrained import check_config, derived_config, save_pretrained
from prunefx.integrations.transformers.search import Candidate, SearchResult, search

__all__ = [
    "prune", "prune_depth", "compact_layers", "prune_experts", "moe_layers", "search", "SearchResult", "Candidate",
    "Budget",    "stream_patterns", "update_config", "ConfigStaleWarning",
    "derived_config", "check_config", "save_pretrained", "CheckpointTensors",
    "meta_model", "prune_checkpoint",
]
