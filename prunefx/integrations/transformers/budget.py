"""What a budget counts of a Hugging Face model: parameters, without embeddings, active per token, or memory.

    Budget("memory", batch=8, context=4096).of(model)   # weight bytes + KV-cache bytes at that batch and context
    search(model, ids, keep=0.6, budget=Budget("memory", context=4096))

Memory is the weights at ``bytes_per_param`` plus the KV cache at ``bytes_per_kv``: per attention layer, keys and
values of ``num_key_value_heads x head_dim`` for ``batch x context`` tokens (a sliding-window layer, named so in
``layer_types``, holds at most ``sliding_window`` of them). The counts are read from the model's (text) config,
which prunefx's cuts keep equal to the modules.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Literal

from torch import nn

from prunefx.errors import PrunefxError

Measure = Literal["params", "params_no_embeddings", "active_params", "memory"]
MEASURES: tuple[Measure, ...] = ("params", "params_no_embeddings", "active_params", "memory")


@dataclass(frozen=True)
class Budget:
    """A quantity of a model that a search keeps a fraction of (see the module doc)."""

    measure: Measure = "params"
    batch: int = 1  # memory: sequences held in the KV cache at once
    context: int = 2048  # memory: tokens per sequence
    bytes_per_param: float = 2.0  # memory: bf16 / fp16 weights
    bytes_per_kv: float = 2.0  # memory: bf16 / fp16 cache

    def __post_init__(self) -> None:
        if self.measure not in MEASURES:
            raise PrunefxError(f"unknown budget measure {self.measure!r}; give one of {', '.join(MEASURES)}")
        # NaN compares false both ways, and a float context is no count of tokens: both are refused by name.
        counts = {"batch": self.batch, "context": self.context}
        sizes = {"bytes_per_param": self.bytes_per_param, "bytes_per_kv": self.bytes_per_kv}
        for name, value in counts.items():
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise PrunefxError(f"Budget {name}={value!r}: it must be a whole number >= 1 (e.g. {name}=1)")
        for name, value in sizes.items():
            if isinstance(value, bool) or not isinstance(value, (int, float)) or not 0 < value < math.inf:
                raise PrunefxError(f"Budget {name}={value!r}: it must be a positive finite number of bytes (e.g. 2 "
                                   "for bf16 / fp16)")

    def of(self, model: nn.Module) -> float:
        """The quantity in ``model`` (parameters, or bytes for memory)."""
        if self.measure == "params":
            return float(sum(p.numel() for p in model.parameters()))
        if self.measure == "params_no_embeddings":
            return float(params_without_embeddings(model))
        if self.measure == "active_params":
            from prunefx.integrations.transformers.experts import active_params

            return float(active_params(model))
        weights = sum(p.numel() for p in model.parameters()) * self.bytes_per_param
        return weights + kv_cache_tokens(model, self.context) * self.batch * self.bytes_per_kv

    def describe(self) -> str:
        """The measure in words, for tables and errors."""
        if self.measure != "memory":
            return {"params": "parameters", "params_no_embeddings": "parameters without embeddings",
                    "active_params": "active parameters"}[self.measure]
        return f"memory (weights + KV cache, batch {self.batch}, context {self.context})"


def params_without_embeddings(model: nn.Module) -> int:
    """Parameters of ``model`` less the input embedding and the output head (shared tables counted once)."""
    n = sum(p.numel() for p in model.parameters())
    tables = {id(p): p for m in (model.get_input_embeddings(), model.get_output_embeddings()) if m is not None
              for p in m.parameters()}
    return n - sum(p.numel() for p in tables.values())


def kv_cache_tokens(model: nn.Module, context: int) -> int:
    """Cached key + value entries for one sequence of ``context`` tokens, over every attention layer."""
    config = model.config.get_text_config() if hasattr(model.config, "get_text_config") else model.config
    layers = getattr(config, "num_hidden_layers", None)
    heads = getattr(config, "num_attention_heads", None)
    kv = getattr(config, "num_key_value_heads", None) or heads
    head_dim = getattr(config, "head_dim", None) or (
        config.hidden_size // heads if isinstance(heads, int) and heads and hasattr(config, "hidden_size") else None)
    if not all(isinstance(v, int) and v > 0 for v in (layers, kv, head_dim)):
        raise PrunefxError(f"{type(config).__name__} does not say its KV cache (num_hidden_layers, "
                           "num_key_value_heads, head_dim): give a params or active_params budget")
    if hasattr(config, "kv_lora_rank"):  # multi-head latent attention caches a compressed latent, not K and V
        raise PrunefxError(f"{type(config).__name__} caches a latent (kv_lora_rank), which this memory budget does not "
                           "count yet: give a params or active_params budget")
    types = list(getattr(config, "layer_types", None) or ["full_attention"] * layers)[:layers]
    window = getattr(config, "sliding_window", None)
    other = sorted({t for t in types if t not in ("full_attention", "sliding_attention")})
    if other:
        raise PrunefxError(f"{type(config).__name__} has {', '.join(other)} layers, whose cache this memory budget "
                           "does not count: give a params or active_params budget")
    per_layer = [min(context, window) if t == "sliding_attention" and isinstance(window, int) else context
                 for t in types]
    return 2 * kv * head_dim * sum(per_layer)


__all__ = ["MEASURES", "Budget", "Measure", "kv_cache_tokens", "params_without_embeddings"]
