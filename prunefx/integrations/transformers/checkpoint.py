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

import contextlib
import json
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

import torch
from safetensors import SafetensorError, safe_open
from safetensors.torch import save_file
from torch import nn

from prunefx._extras import require
from prunefx._io import atomic_path, atomic_write, read_json, safe_name
from prunefx.analysis.graph import DependencyGraph
from prunefx.analysis.roles import Kind
from prunefx.errors import PrunefxError, UntrustedFileError
from prunefx.integrations.transformers.pretrained import (
    check_config,
    check_destination,
    derived_config,
    write_error,
)
from prunefx.plan import PruningPlan
from prunefx.transform import apply_plan
from prunefx.transform.keep import keep_by_root, kept_positions

_COPIED = ("generation_config.json", "tokenizer.json", "tokenizer_config.json", "special_tokens_map.json",
           "tokenizer.model", "vocab.json", "merges.txt")  # fmt: skip


@contextlib.contextmanager
def open_shard(path: Path) -> Iterator[Any]:
    """``safe_open(path)``; a missing, truncated or damaged file is a :class:`PrunefxError` naming it."""
    if not path.is_file():
        raise PrunefxError(f"{path} is missing: the checkpoint's index names it; copy the checkpoint again in full")
    try:
        with safe_open(path, "pt") as f:
            yield f
    except SafetensorError as exc:  # its message names no file: "Error while deserializing header: ..."
        raise PrunefxError(
            f"{path} is not a readable safetensors file ({str(exc).strip()}); it is truncated or damaged: copy or "
            "download the checkpoint again, or re-save it with save_pretrained"
        ) from exc


INDEX = "model.safetensors.index.json"


def read_index(index: Path) -> dict[str, Any]:
    """The safetensors index at ``index``: a JSON object whose ``weight_map`` maps tensor names to shard files, each
    one plain file name beside the index (a name with a separator or ``..`` would read or write outside the
    checkpoint), else one error naming the file."""
    data = read_json(index, PrunefxError, missing=f"{index} is missing", what="is not a safetensors index",
                     fix="it is truncated or damaged: copy the checkpoint again", expect=dict)
    weight_map = data.get("weight_map")
    if not isinstance(weight_map, dict) or not all(isinstance(k, str) for k in weight_map):
        raise PrunefxError(f"{index}: weight_map is not a mapping of tensor names to shard files; copy the "
                           "checkpoint again")
    for key, name in weight_map.items():
        safe_name(name, where=f"{index}: the shard of {key!r}", fix="shard files lie beside the index: fix the index "
                  "or copy the checkpoint again")
    return data


def shards(path: Path) -> tuple[dict[str, str], Path | None]:
    """Tensor name -> shard file, and the index file (None for a single ``model.safetensors``)."""
    index = path / INDEX
    if index.exists():
        return read_index(index)["weight_map"], index
    single = path / "model.safetensors"
    if not single.exists():
        raise PrunefxError(f"no safetensors checkpoint in {path} (expected model.safetensors or its index)")
    with open_shard(single) as f:
        return dict.fromkeys(f.keys(), single.name), None


def check_shapes(path: Path, where: Mapping[str, str], model: nn.Module) -> None:
    """Raise :class:`PrunefxError` naming the first tensor whose shape in the checkpoint differs from ``model``'s."""
    # model is built from config.json; reading shapes from the shards' headers loads no tensor.
    want = {k: tuple(v.shape) for k, v in model.state_dict().items()}
    for shard in sorted(set(where.values())):
        with open_shard(path / shard) as f:
            for key in sorted(f.keys()):  # sorted: the same tensor is named first every time
                if key not in want:
                    continue  # a buffer the model does not keep, or a tensor of another head: not ours to check
                got = tuple(f.get_slice(key).get_shape())
                if got != want[key]:
                    raise PrunefxError(
                        f"{path}: tensor {key!r} is {got} in {shard} but {want[key]} in the {type(model).__name__} "
                        f"its config.json describes; the checkpoint and its config.json disagree: fix config.json "
                        "(or re-save the model with save_pretrained)"
                    )


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
        if model is not None:  # scores of weights the model does not describe would rank the wrong channels
            check_shapes(self.path, self.where, model)

    def __getitem__(self, name: str) -> torch.Tensor:
        stored = name if name in self.where else self.aliases.get(name, name)
        if stored not in self.where:
            raise KeyError(name)
        with open_shard(self.path / self.where[stored]) as f:
            return f.get_tensor(stored)

    def __iter__(self) -> Iterator[str]:
        return iter(self.where)

    def __len__(self) -> int:
        return len(self.where)


def meta_model(path, cls=None, *, trust_remote_code: bool = False) -> nn.Module:
    """The checkpoint's architecture from its ``config.json``, on the meta device (``cls``: an ``AutoModel*`` or model
    class; default ``AutoModelForCausalLM``); ``trust_remote_code``: run the modelling code the checkpoint ships."""
    # Always an explicit True/False: with None transformers asks on stdin, and a "y" runs the checkpoint's files.
    require("transformers", "a Hugging Face checkpoint")
    from transformers import AutoConfig, AutoModelForCausalLM

    cls = cls or AutoModelForCausalLM
    try:
        config = AutoConfig.from_pretrained(path, trust_remote_code=trust_remote_code)
        with torch.device("meta"):
            if hasattr(cls, "from_config"):  # an AutoModel* class: it may resolve to the checkpoint's own code
                return cls.from_config(config, trust_remote_code=trust_remote_code)
            return cls(config)  # a model class: transformers' own code
    except Exception as exc:  # whatever transformers raises on a config.json: one line naming it
        if not trust_remote_code and "trust_remote_code" in str(exc):
            raise UntrustedFileError(
                f"{path} was not loaded: its config.json names an architecture defined by Python files in the "
                "checkpoint, which would run to build it; if you trust its source, pass trust_remote_code=True"
            ) from exc
        lines = str(exc).strip().splitlines()
        raise PrunefxError(f"{Path(path) / 'config.json'} does not describe a model {getattr(cls, '__name__', cls)} "
                           f"builds ({type(exc).__name__}: {lines[0][:300] if lines else ''}); fix config.json or "
                           "copy the checkpoint again") from exc


def prune_checkpoint(src, dst, model: nn.Module, dg: DependencyGraph, plan: PruningPlan) -> Path:
    """Write ``src`` pruned by ``plan`` to ``dst``: every shard is read, its tensors sliced as the plan's parameter
    records say and written before the next shard is read; then the pruned config (``model``, the meta-device model
    ``dg`` analysed, is pruned in place to derive it) and the tokenizer files. ``dst`` must not exist or be empty."""
    src, dst = Path(src), Path(dst)
    check_destination(dst, overwrite=False, sources=(src,), what="the pruned checkpoint")
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
    check_shapes(src, where, model)  # before apply_plan narrows it: the unpruned model is what config.json says
    # The pruned architecture first (meta tensors, nothing read): a plan the config cannot express fails here.
    apply_plan(model, dg, plan)
    cfg = derived_config(model)
    bad = check_config(model, cfg)
    if bad:
        raise PrunefxError(f"the config cannot express the pruned widths ({bad[0]}); plan with uniform_layers=True")
    try:
        dst.mkdir(parents=True, exist_ok=True)
    except OSError as exc:  # a read-only or full disk: one line naming the directory
        error = write_error(exc, dst)
        if error is None:
            raise
        raise error from exc
    total = 0
    for shard in sorted(set(where.values())):
        out = {}
        with open_shard(src / shard) as f:
            metadata = f.metadata() or {"format": "pt"}
            for key in f.keys():
                t = f.get_tensor(key)
                for dim, idx in slices.get(key, ()):
                    t = t.index_select(dim, idx)
                out[key] = t.contiguous()
                total += t.numel() * t.element_size()
        # confined to dst: a link planted there is refused, never written through; a full disk is one line naming
        # the shard, with no half-written file left
        with atomic_path(dst / shard, root=dst) as tmp:
            try:
                save_file(out, tmp, metadata=metadata)
            except SafetensorError as exc:  # safetensors' writer names the OS error only in its text
                error = write_error(exc, dst / shard)
                if error is None:
                    raise PrunefxError(f"{dst / shard} could not be written ({str(exc).strip()})") from exc
                raise error from exc
        del out
    if index is not None:
        data = read_index(index)
        if not isinstance(data.get("metadata"), dict):
            data["metadata"] = {}
        data["metadata"]["total_size"] = total
        atomic_write(dst / index.name, json.dumps(data, indent=2).encode(), root=dst)
    if getattr(cfg, "_auto_class", None) is not None:  # a checkpoint's own config class: its code file goes along
        cfg.save_pretrained(dst)
    else:  # what cfg.save_pretrained writes (validated above), without following a link planted in dst
        if hasattr(cfg, "transformers_weights"):  # a load-time attribute save_pretrained drops too
            delattr(cfg, "transformers_weights")
        atomic_write(dst / "config.json", cfg.to_json_string(use_diff=True).encode(), root=dst)
    for name in _COPIED:
        if (src / name).is_file():
            atomic_write(dst / name, (src / name).read_bytes(), root=dst)
    return dst

