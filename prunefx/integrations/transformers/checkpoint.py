"""Prune a Hugging Face checkpoint on disk, one safetensors shard at a time: the model is never in memory.

    model = meta_model("llama-7b/")                                  # the architecture on the meta device
    dg = prunefx.analyze(model, (torch.zeros(1, 8, dtype=torch.long, device="meta"),))
    scores = prunefx.score(model, dg, "l2", weights=CheckpointTensors("llama-7b/", model))   # one tensor at a time
    plan = prunefx.make_plan(dg, scores.values, PlanConfig(params=0.7, uniform_layers=True,
                             ignore=stream_patterns(model)), cost=prunefx.CostModel(model, dg, inputs),
                             owned_constants=prunefx.transform.owned_modules(model))
    prune_checkpoint("llama-7b/", "llama-5b/", model, dg, plan)      # loads with from_pretrained
"""

from __future__ import annotations

import json
import shutil
from collections.abc import Iterator, Mapping
from pathlib import Path

import torch
from safetensors import safe_open
from safetensors.torch import save_file
from torch import nn

from prunefx.analysis.graph import DependencyGraph
from prunefx.analysis.roles import Kind
from prunefx.errors import PrunefxError
from prunefx.integrations.transformers.config import check_config, derived_config
from prunefx.plan import PruningPlan
from prunefx.transform import apply_plan
from prunefx.transform.keep import keep_by_root, kept_positions

_COPIED = ("generation_config.json", "tokenizer.json", "tokenizer_config.json", "special_tokens_map.json",
           "tokenizer.model", "vocab.json", "merges.txt")  # fmt: skip


def shards(path: Path) -> tuple[dict[str, str], Path | None]:
    """Tensor name -> shard file, and the index file (None for a single ``model.safetensors``)."""
    index = path / "model.safetensors.index.json"
    if index.exists():
        return json.loads(index.read_text())["weight_map"], index
    single = path / "model.safetensors"
    if not single.exists():
        raise PrunefxError(f"no safetensors checkpoint in {path} (expected model.safetensors or its index)")
    with safe_open(single, "pt") as f:
        return dict.fromkeys(f.keys(), single.name), None


def tied_names(model: nn.Module) -> dict[str, str]:
    """Parameter names that share a tensor with an earlier name (a checkpoint stores it under the first)."""
    first: dict[int, str] = {}
    alias = {}
    for name, p in model.named_parameters(remove_duplicate=False):
        if id(p) in first:
            alias[name] = first[id(p)]
        else:
            first[id(p)] = name
    return alias


class CheckpointTensors(Mapping):
    """``name -> tensor`` view of a checkpoint on disk for :func:`prunefx.score` (``weights=``): each access reads
    that one tensor from its shard, so scoring holds one tensor at a time."""

    def __init__(self, path, model: nn.Module | None = None) -> None:
        self.path = Path(path)
        self.where, _ = shards(self.path)
        self.aliases = tied_names(model) if model is not None else {}

    def __getitem__(self, name: str) -> torch.Tensor:
        stored = name if name in self.where else self.aliases.get(name, name)
        if stored not in self.where:
            raise KeyError(name)
        with safe_open(self.path / self.where[stored], "pt") as f:
            return f.get_tensor(stored)

    def __iter__(self) -> Iterator[str]:
        return iter(self.where)

    def __len__(self) -> int:
        return len(self.where)


def meta_model(path, cls=None) -> nn.Module:
    """The checkpoint's architecture from its ``config.json``, on the meta device (``cls``: an ``AutoModel*`` or model
    class; default ``AutoModelForCausalLM``)."""
    from transformers import AutoConfig, AutoModelForCausalLM

    config = AutoConfig.from_pretrained(path)
    with torch.device("meta"):
        return (cls or AutoModelForCausalLM).from_config(config)


def prune_checkpoint(src, dst, model: nn.Module, dg: DependencyGraph, plan: PruningPlan) -> Path:
    """Write ``src`` pruned by ``plan`` to ``dst``: every shard is read, its tensors sliced as the plan's parameter
    records say and written before the next shard is read; then the pruned config (``model``, the meta-device model
    ``dg`` analysed, is pruned in place to derive it) and the tokenizer files. ``dst`` must not exist or be empty."""
    src, dst = Path(src), Path(dst)
    if dst.exists() and any(dst.iterdir()):
        raise PrunefxError(f"{dst} is not empty: write the pruned checkpoint to a new directory")
    sorted_roots, keep = keep_by_root(dg, plan)
    slices: dict[str, list[tuple[int, torch.Tensor]]] = {}
    for (kind, name, role), roots in dg.record_roots.items():
        pos = kept_positions(roots, sorted_roots, keep)
        if kind is Kind.PARAM and len(pos) < len(roots):
            slices.setdefault(name, []).append((role.dim, torch.as_tensor(pos)))
    aliases = tied_names(model)
    for name in [n for n in slices if n in aliases]:  # a tied tensor is stored once, under its first name
        slices.setdefault(aliases[name], slices.pop(name))
    where, index = shards(src)
    missing = sorted(set(slices) - set(where))
    if missing:
        raise PrunefxError(f"{src} has no tensor {missing[0]!r}: the plan was made for another architecture")
    # The pruned architecture first (meta tensors, nothing read): a plan the config cannot express fails here.
    apply_plan(model, dg, plan)
    cfg = derived_config(model)
    bad = check_config(model, cfg)
    if bad:
        raise PrunefxError(f"the config cannot express the pruned widths ({bad[0]}); plan with uniform_layers=True")
    dst.mkdir(parents=True, exist_ok=True)
    total = 0
    for shard in sorted(set(where.values())):
        out = {}
        with safe_open(src / shard, "pt") as f:
            metadata = f.metadata() or {"format": "pt"}
            for key in f.keys():
                t = f.get_tensor(key)
                for dim, idx in slices.get(key, ()):
                    t = t.index_select(dim, idx)
                out[key] = t.contiguous()
                total += t.numel() * t.element_size()
        save_file(out, dst / shard, metadata=metadata)
        del out
    if index is not None:
        data = json.loads(index.read_text())
        data.setdefault("metadata", {})["total_size"] = total
        (dst / index.name).write_text(json.dumps(data, indent=2))
    cfg.save_pretrained(dst)
    for name in _COPIED:
        if (src / name).exists():
            shutil.copy(src / name, dst / name)
    return dst

