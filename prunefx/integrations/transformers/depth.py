"""Depth pruning of Hugging Face models: removed decoder layers leave the layer list, and the config says so.

The compactor (registered with :func:`prunefx.transform.depth.register_compactor`) takes a ``ModuleList`` whose
parent module has a config counting it (``num_hidden_layers == len(list)``): it drops the removed layers, renumbers
every ``layer_idx`` (the KV cache's index), sets ``num_hidden_layers``, drops the removed places from every
per-layer list of that config (``layer_types``) and renumbers its lists of layer indices (``mlp_only_layers``).
The model then stays an ordinary HF model: ``model.save_pretrained`` and ``from_pretrained`` rebuild it (checked
by rebuilding it from the config on the meta device).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import replace
from typing import Any

from torch import nn

from prunefx.depth import DepthResult
from prunefx.depth import prune_depth as _prune_depth
from prunefx.errors import PrunefxError
from prunefx.integrations.transformers.api import language_model, stale_config
from prunefx.integrations.transformers.pretrained import own_config
from prunefx.integrations.transformers.runs import broken_call, calls_that_run
from prunefx.transform.depth import Undo

LAYERS = "num_hidden_layers"


def _owner_config(model: nn.Module, container: str, n: int):
    """The config of the module holding ``container`` when it counts ``n`` layers, else None.

    Only the list's own parent counts: a list of sub-layers inside a layer (T5's ``block.k.layer``) may have as
    many entries as the model has layers, but its owner is no model with a config."""
    parent = model.get_submodule(container.rpartition(".")[0])
    cfg = getattr(parent, "config", None)
    return cfg if cfg is not None and getattr(cfg, LAYERS, None) == n else None


def compact_layers(model: nn.Module, container: str, positions: Sequence[int]) -> Undo | None:
    """Drop ``positions`` from the layer list at ``container`` (see the module doc); None when it is no such list."""
    layers = model.get_submodule(container)
    if not isinstance(layers, nn.ModuleList) or _owner_config(model, container, len(layers)) is None:
        return None
    own_config(model)  # the new depth is written into the config: not into an object other models share
    cfg = _owner_config(model, container, len(layers))
    drop = set(positions)
    n = len(layers)
    kept = [m for i, m in enumerate(layers) if i not in drop]
    renumbered = []
    for i, layer in enumerate(kept):
        for m in layer.modules():
            if isinstance(getattr(m, "layer_idx", None), int):
                renumbered.append((m, m.layer_idx))
                m.layer_idx = i
    lists = {k: v for k, v in vars(cfg).items() if isinstance(v, (list, tuple)) and len(v) == n}
    # lists of layer indices (Qwen-MoE's mlp_only_layers): the kept ones renumbered, the removed ones gone
    indices = {k: v for k, v in vars(cfg).items() if k.endswith("_layers") and k not in lists
               and isinstance(v, (list, tuple)) and all(type(i) is int and 0 <= i < n for i in v)}
    new_index = {old: new for new, old in enumerate(i for i in range(n) if i not in drop)}
    for k, v in lists.items():
        setattr(cfg, k, type(v)(x for i, x in enumerate(v) if i not in drop))
    for k, v in indices.items():
        setattr(cfg, k, type(v)(new_index[i] for i in v if i in new_index))
    setattr(cfg, LAYERS, len(kept))
    parent_path, _, key = container.rpartition(".")
    parent = model.get_submodule(parent_path)
    setattr(parent, key, nn.ModuleList(kept))

    def undo() -> None:
        setattr(parent, key, layers)
        for m, idx in renumbered:
            m.layer_idx = idx
        for k, v in (*lists.items(), *indices.items()):
            setattr(cfg, k, v)
        setattr(cfg, LAYERS, n)

    return undo


def layer_kinds(model: nn.Module, under: str | None = None) -> dict[str, tuple[str, ...]]:
    """Every decoder layer list's layers by kind (its name in words -> the layers' paths): by the config's per-layer
    names (``layer_types``: full / sliding attention, mamba, conv, ...), else by class where the classes differ.
    Each kind keeps one layer: the model's cache and masks are built per kind (a hybrid model without its only
    attention layer fails its default call), and a list of one kind keeps one layer at least."""
    kinds: dict[str, tuple[str, ...]] = {}
    for container, layers in model.named_modules():
        if not container or not isinstance(layers, nn.ModuleList) or (under and not container.startswith(under + ".")):
            continue
        cfg = _owner_config(model, container, len(layers))
        if cfg is None:
            continue
        n = len(layers)
        names = {k: v for k, v in sorted(vars(cfg).items()) if isinstance(v, (list, tuple)) and len(v) == n
                 and all(isinstance(x, str) for x in v)}
        classes = [type(m).__name__ for m in layers]
        for i in range(n):
            if names:
                kind = f"{'/'.join(repr(v[i]) for v in names.values())} layer ({', '.join(names)})"
            else:
                kind = f"{classes[i]} layer" if len(set(classes)) > 1 else "decoder layer"
            key = f"{kind} of {container}"
            kinds[key] = (*kinds.get(key, ()), f"{container}.{i}")
    return kinds


def check_depth(model: nn.Module, remove: int | None = None, blocks: Sequence[str] | None = None, *,
                language_model_only: bool = False) -> None:
    """Refuse, before any compute, a depth cut that would take the last layer of a kind (see :func:`layer_kinds`):
    ``remove`` more layers than that leaves, or ``blocks`` naming the only layer of its kind."""
    kinds = layer_kinds(model, language_model(model)[0] if language_model_only else None)
    only = {g[0]: k for k, g in kinds.items() if len(g) == 1}
    for path in blocks or ():
        if path in only:
            raise PrunefxError(f"{path} cannot be removed: it is the only {only[path]}, which the model's cache and "
                               "masks need; name other blocks")
    if not isinstance(remove, int) or isinstance(remove, bool) or not kinds or blocks is not None:
        return  # no count to check here (the depth cut phrases a wrong type)
    total = sum(len(g) for g in kinds.values())
    most = total - len(kinds)
    if remove > most:
        listed = "; ".join(f"{k}: {len(g)}" for k, g in kinds.items())
        raise PrunefxError(f"remove={remove}, but {type(model).__name__} can lose at most {most} of its {total} "
                           f"decoder layers: one of each kind stays, which its cache and masks need ({listed}); "
                           f"give remove <= {most}")


def prune_depth(model: nn.Module, example_inputs: Any, *, language_model_only: bool = False,
                **kwargs: Any) -> DepthResult:
    """:func:`prunefx.prune_depth` for transformers: removed decoder layers leave the layer list and the config
    (``num_hidden_layers``, ``layer_types``, ``layer_idx`` renumbered), checked to rebuild the pruned model.
    ``language_model_only``: only the layers of the language model (a VLM's vision tower keeps its depth).
    The last layer of each kind (:func:`layer_kinds`) is never removed, and with ``check`` the pruned model must
    pass the calls it passed before: its default call and, if it generates, a cached generation."""
    check_depth(model, kwargs.get("remove"), kwargs.get("blocks"), language_model_only=language_model_only)
    if language_model_only:
        kwargs["under"] = language_model(model)[0]
    kwargs.setdefault("keep_one", layer_kinds(model, kwargs.get("under")))
    if kwargs.get("check", True):
        ran = calls_that_run(model, example_inputs)
        kwargs.setdefault("after", lambda pruned: broken_call(pruned, example_inputs, ran))
    result = _prune_depth(model, example_inputs, **kwargs)
    said = stale_config(result.model, "depth-pruned", "save with prunefx.save(model, result.plan, path), reloaded "
                        "with prunefx.load")
    return replace(result, warnings=(*result.warnings, said)) if said else result
