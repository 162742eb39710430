"""The pruned model's Hugging Face config, and ``save_pretrained`` that ``from_pretrained`` loads back.

Widths are read from the pruned modules (heads and head_dim from the attention layouts, the MLP width from its
first projection, the residual stream from the input embedding), one value per config field. The candidate config
is then checked by building the model from it on the meta device and comparing every tensor shape: a config that
cannot express the pruned model (layers of different widths; a family whose head_dim is derived from hidden_size
and the head count) is an error naming the tensor, never a file that loads into the wrong shapes.
"""

from __future__ import annotations

import copy
import os
import re
import weakref
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

import torch
from torch import nn

from prunefx._io import storage_error
from prunefx.errors import PrunefxError
from prunefx.integrations.transformers.layouts import attention_widths, expert_width, layout_of


@dataclass(frozen=True)
class ConfigFields:
    """Config field names of one model family (None: that config has no such field)."""

    hidden: str = "hidden_size"
    intermediate: str | None = "intermediate_size"
    heads: str = "num_attention_heads"
    kv_heads: str | None = None
    head_dim: str | None = None
    mlp: tuple[str, ...] = ()  # the MLP's first projection(s), by child name: its out width is the intermediate size
    experts: str | None = None  # the stacked experts' FFN width (MoE), read from their down_proj


_LLAMA = ConfigFields(kv_heads="num_key_value_heads", head_dim="head_dim", mlp=("gate_proj", "up_proj", "fc1"))
FIELDS: dict[str, ConfigFields] = {
    "llama": _LLAMA, "qwen2": _LLAMA, "mistral": _LLAMA, "gemma": _LLAMA, "phi": _LLAMA,
    "gpt2": ConfigFields(hidden="n_embd", intermediate="n_inner", heads="n_head", mlp=("c_fc",)),
    "bert": ConfigFields(mlp=("intermediate.dense",)),
    "roberta": ConfigFields(mlp=("intermediate.dense",)),
    "t5": ConfigFields(hidden="d_model", intermediate="d_ff", heads="num_heads", head_dim="d_kv", mlp=("wi",)),
    "vit": ConfigFields(head_dim="head_dim", mlp=("fc1",)),
    "clip_vision_model": ConfigFields(mlp=("fc1",)),
    "whisper": ConfigFields(
        hidden="d_model", intermediate="encoder_ffn_dim", heads="encoder_attention_heads", mlp=("fc1",)
    ),
}  # fmt: skip


def fields_for(cfg) -> ConfigFields | None:
    """The width fields of ``cfg``: a known family's, else those of a config laid out as Llama's is
    (``hidden_size``, ``num_attention_heads``, ``num_key_value_heads``, ``head_dim``, ``intermediate_size``; MoE:
    ``moe_intermediate_size`` or ``intermediate_size`` for the experts). None for a config that says otherwise
    (a shared expert's own width field)."""
    known = FIELDS.get(getattr(cfg, "model_type", None))
    if known is not None:
        return known
    names = vars(cfg)
    if not {"hidden_size", "num_attention_heads", "num_key_value_heads"} <= set(names) or any(
            "shared_expert" in k for k in names):
        return None
    moe = any(k in names for k in ("num_experts", "num_local_experts", "n_routed_experts"))
    experts = ("moe_intermediate_size" if "moe_intermediate_size" in names else "intermediate_size") if moe else None
    return ConfigFields(kv_heads="num_key_value_heads", head_dim="head_dim" if names.get("head_dim") else None,
                        intermediate="intermediate_size" if "intermediate_size" in names else None,
                        mlp=("gate_proj", "up_proj", "fc1"), experts=experts)


def _out_width(m: nn.Module) -> int:
    return m.weight.shape[1] if type(m).__name__ == "Conv1D" else m.weight.shape[0]


def stream_width(model: nn.Module) -> int | None:
    """Width of the residual stream: what the input embedding (token table, patch or audio conv) produces."""
    emb = model.get_input_embeddings()
    for m in emb.modules() if emb is not None else ():
        if isinstance(m, nn.Embedding):
            return m.embedding_dim
        if isinstance(m, (nn.Linear, nn.modules.conv._ConvNd)):
            return m.weight.shape[0]
    return None


def language_model(model: nn.Module) -> tuple[str, tuple[str, ...]]:
    """The path of ``model``'s language model (``get_decoder()``) and ``ignore`` patterns for every module outside
    it (a VLM's vision tower and projector, the output head). One error when it has no separate language model."""
    get = getattr(model, "get_decoder", None)
    try:
        decoder = get() if callable(get) else None
    except Exception:  # noqa: BLE001 - a model without the attribute get_decoder looks for
        decoder = None
    path = next((n for n, m in model.named_modules() if m is decoder), None)
    if not path:
        raise PrunefxError(f"{type(model).__name__} has no separate language model (get_decoder() gives "
                           f"{type(decoder).__name__ if decoder is not None else 'none'}): prune it without "
                           "language_model_only")
    parts, outside = path.split("."), []
    for k in range(len(parts)):
        prefix = ".".join(parts[:k])
        for name, _ in model.get_submodule(prefix).named_children():
            full = f"{prefix}.{name}" if prefix else name
            if full != ".".join(parts[: k + 1]):
                outside += [full, f"{full}.*"]
    return path, tuple(outside)


def derived_config(model: nn.Module):
    """A copy of ``model.config`` whose width fields are the pruned model's (one value each, else an error); for a
    VLM whose own config has no width fields, its text config's, read from the language model's modules."""
    cfg = copy.deepcopy(model.config)
    target, fields, scope = cfg, fields_for(cfg), ""
    text = cfg.get_text_config() if hasattr(cfg, "get_text_config") else cfg
    if fields is None and text is not cfg and fields_for(text):  # a VLM: the language model's widths
        target, fields, scope = text, fields_for(text), language_model(model)[0] + "."
    if fields is None:
        raise PrunefxError(
            f"prunefx knows no config fields for model_type {cfg.model_type!r}; save with prunefx.save(model, plan, "
            "path) (reloaded with prunefx.load)"
        )
    seen: dict[str, set[int]] = {}
    for name, m in model.named_modules():
        if not name.startswith(scope):
            continue
        layout = layout_of(m)
        if layout is not None:
            heads, kv, hd = attention_widths(m, layout)
            seen.setdefault(fields.heads, set()).add(heads)
            if fields.kv_heads:
                seen.setdefault(fields.kv_heads, set()).add(kv)
            if fields.head_dim:
                seen.setdefault(fields.head_dim, set()).add(hd)
        is_mlp = any(name == p or name.endswith("." + p) for p in fields.mlp)
        if fields.intermediate and is_mlp and hasattr(m, "weight"):
            seen.setdefault(fields.intermediate, set()).add(_out_width(m))
        width = expert_width(m) if fields.experts else None
        if width is not None:
            seen.setdefault(fields.experts, set()).add(width)
    hidden = stream_width(model)
    if hidden is not None:
        seen[fields.hidden] = {hidden}
    uneven = {k: sorted(v) for k, v in seen.items() if len(v) > 1}
    if uneven:
        raise PrunefxError(
            f"layers were pruned to different widths ({uneven}) and {type(cfg).__name__} has one value per field; "
            "plan with PlanConfig(uniform_layers=True), or save with prunefx.save(model, plan, path)"
        )
    for k, v in seen.items():
        try:
            setattr(target, k, next(iter(v)))
        except Exception as exc:
            raise PrunefxError(
                f"{type(cfg).__name__} rejects {k}={next(iter(v))}: {str(exc).strip().splitlines()[-1]}; choose a "
                "target it can express, prune MLP widths only, or save with prunefx.save(model, plan, path)"
            ) from exc
    return cfg


_OWNED: weakref.WeakValueDictionary = weakref.WeakValueDictionary()  # id -> a config own_config made (no attribute
# on the config itself: save_pretrained writes every attribute into config.json)


def own_config(model: nn.Module) -> None:
    """Give ``model`` (every submodule holding its config or one of its sub-configs) its own copy of the config.

    ``from_config(cfg)`` keeps the caller's object: writing pruned widths into it would change every other model
    built from it. Idempotent: a model whose config prunefx copied already keeps it."""
    top = getattr(model, "config", None)
    if top is None or _OWNED.get(id(top)) is top:
        return
    new = copy.deepcopy(top)
    swap = {id(top): new}
    for key, value in vars(top).items():
        if hasattr(value, "to_dict") and hasattr(value, "model_type"):  # a sub-config (text_config, vision_config)
            swap[id(value)] = getattr(new, key)
    for cfg in swap.values():
        _OWNED[id(cfg)] = cfg
    for m in model.modules():
        held = getattr(m, "config", None)
        if id(held) in swap:
            m.config = swap[id(held)]


def write_fields(old, new) -> None:
    """Set ``old``'s fields to ``new``'s in place; a nested sub-config (a VLM's ``text_config``) field by field, so
    it stays the config object its language model holds (a plain dict there breaks the cache and ``generate``)."""
    for key, value in vars(new).items():
        held = vars(old).get(key)
        if hasattr(held, "to_dict") and hasattr(value, "to_dict"):  # a sub-config: never replaced by another object
            write_fields(held, value)
        elif key not in vars(old) or held != value:  # a field the pruned widths add (head_dim) or change
            setattr(old, key, copy.deepcopy(value))


def head_widths(model: nn.Module) -> tuple[tuple[str, tuple[int, ...]], ...]:
    """``PlanConfig.allowed_widths`` of the attention groups: the KV-head counts the model's config can express.

    A count is kept when the config, given that many heads (query heads in proportion), passes its own
    validation and, for a family that derives head_dim from hidden_size / heads, still gives the heads' width.
    """
    base = getattr(model, "config", None)
    fields, scope = fields_for(base) if base is not None else None, ""
    text = base.get_text_config() if hasattr(base, "get_text_config") else base
    if fields is None and text is not base and fields_for(text):  # a VLM: its language model's heads
        base, fields, scope = text, fields_for(text), language_model(model)[0] + "."
    if fields is None:
        return ()
    known: dict[tuple[int, int, int], tuple[int, ...]] = {}
    out = []
    for name, m in model.named_modules():
        layout = layout_of(m) if name.startswith(scope) else None
        if layout is None:
            continue
        heads, kv, hd = attention_widths(m, layout)
        if (heads, kv, hd) not in known:
            known[heads, kv, hd] = tuple(k for k in range(1, kv + 1)
                                         if k == kv or _expressible(base, fields, k * heads // kv, k, hd))
        out.append((f"{name}.{layout.fused or layout.k}", known[heads, kv, hd]))
    return tuple(out)


def _expressible(base, fields: ConfigFields, heads: int, kv: int, hd: int) -> bool:
    """Whether ``base`` with ``heads`` query / ``kv`` key-value heads of width ``hd`` is a valid config."""
    if fields.head_dim is None:  # head_dim = hidden / heads: only the unpruned count keeps the heads' width
        hidden = getattr(base, fields.hidden)
        return hidden % heads == 0 and hidden // heads == hd
    cfg = copy.deepcopy(base)
    try:
        setattr(cfg, fields.heads, heads)
        if fields.kv_heads:
            setattr(cfg, fields.kv_heads, kv)
        setattr(cfg, fields.head_dim, hd)
        if callable(getattr(cfg, "validate", None)):
            cfg.validate()
    except Exception:  # noqa: BLE001 - the config class's own rules decide; any refusal means "not this count"
        return False
    return True


def check_config(model: nn.Module, cfg) -> list[str]:
    """Tensors whose shape a model built from ``cfg`` would not have (empty when ``cfg`` describes ``model``)."""
    try:
        if callable(getattr(cfg, "validate", None)):  # what save_pretrained and from_pretrained will check
            cfg.validate()
        with torch.device("meta"):
            fresh = type(model)(cfg)
    except Exception as exc:  # noqa: BLE001 - the config class's own validation; its message names the field
        return [f"{type(cfg).__name__} cannot be built: {str(exc).strip().splitlines()[-1]}"]
    want = {k: tuple(v.shape) for k, v in model.state_dict().items()}
    got = {k: tuple(v.shape) for k, v in fresh.state_dict().items()}
    bad = [f"{k}: pruned {want[k]}, config gives {got.get(k)}" for k in want if got.get(k) != want[k]]
    return bad + [f"{k}: the config builds it, the pruned model has none" for k in got if k not in want]


def source_paths(model: nn.Module) -> list[Path]:
    """The local directories ``model`` was loaded from (``from_pretrained``'s ``name_or_path``), if any."""
    names = {getattr(getattr(model, "config", None), "_name_or_path", None), getattr(model, "name_or_path", None)}
    return [Path(n) for n in names if isinstance(n, (str, os.PathLike)) and str(n) and Path(n).is_dir()]


def _same(a: Path, b: Path) -> bool:
    try:
        return os.path.samefile(a, b)
    except OSError:  # one of them does not exist (yet)
        return a.resolve() == b.resolve()


def check_destination(path: Path, *, overwrite: bool, sources: Iterable[Path], what: str) -> None:
    """Refuse ``path`` for ``what`` if it is a file, one of ``sources``, or (unless ``overwrite``) not empty."""
    # transformers' save_pretrained replaces config.json and deletes the shards it finds; the checkpoint the model
    # was loaded from is refused even with overwrite, since its weights are what is being pruned.
    if path.exists() and not path.is_dir():
        raise PrunefxError(f"{path} is a file, not a directory; give a directory for {what}")
    for src in sources:
        if _same(path, Path(src)):
            raise PrunefxError(
                f"{path} is the checkpoint the model was loaded from ({src}); writing {what} there would replace "
                "its weights and config.json (also with overwrite=True): give another directory"
            )
    if not overwrite and path.is_dir() and any(path.iterdir()):
        held = sorted(p.name for p in path.iterdir())
        listed = ", ".join(held[:3]) + (", ..." if len(held) > 3 else "")
        raise PrunefxError(
            f"{path} is not empty (it holds {listed}); writing {what} there would replace or delete those files: "
            "give a new or empty directory, or pass overwrite=True to replace them"
        )


def save_pretrained(model: nn.Module, path, *, overwrite: bool = False, **kwargs) -> None:
    """``model.save_pretrained(path)`` with ``model.config`` rewritten to the pruned widths and checked first.

    ``AutoModel*.from_pretrained(path)`` then rebuilds the pruned architecture and loads its weights. ``path`` must
    be new or empty unless ``overwrite``; the checkpoint the model was loaded from is never written to.
    """
    path = Path(path)
    check_destination(path, overwrite=overwrite, sources=source_paths(model), what="the pruned model")
    cfg = derived_config(model)
    bad = check_config(model, cfg)
    if bad:
        raise PrunefxError(
            f"the pruned model cannot be written as a {type(cfg).__name__} ({bad[0]}). Some configs derive head_dim "
            "from hidden_size / heads (GPT-2, BERT, CLIP, Whisper) or require hidden_size % heads == 0 (Llama): prune "
            "MLP widths only, choose a head count the config accepts, or save with prunefx.save(model, plan, path)"
        )
    own_config(model)  # the widths are written into model.config in place: its sub-configs stay the objects the
    write_fields(model.config, cfg)  # submodules hold, and no other model's config changes
    try:
        model.save_pretrained(path, **kwargs)
    except Exception as exc:  # a full or read-only disk: one line naming the directory and the fix
        error = write_error(exc, path)
        if error is None:
            raise PrunefxError(f"transformers could not write the pruned model to {path} ({type(exc).__name__}: "
                               f"{_first_line(exc)}); save with prunefx.save(model, plan, path) instead") from exc
        raise error from exc


def _first_line(exc: BaseException) -> str:
    lines = str(exc).strip().splitlines()
    return lines[0][:300] if lines else ""


def write_error(exc: BaseException, path) -> Exception | None:
    """The one-line error for a write under ``path`` that failed on a full, read-only or forbidden disk: an
    OSError, or safetensors' own error, which carries the OS error only in its text ("(os error 28)"); None for
    any other failure."""
    if not isinstance(exc, OSError):
        found = re.search(r"\(os error (\d+)\)", str(exc))
        if found is None:
            return None
        code = int(found.group(1))
        exc = OSError(code, os.strerror(code))
    return storage_error(exc, exc.filename or path, writing=True)
