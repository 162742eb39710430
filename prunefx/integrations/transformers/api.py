"""Prune a Hugging Face model with transformer defaults: heads and MLP widths, residual stream kept, uniform layers."""

from __future__ import annotations

import copy
import re
import warnings
from collections.abc import Sequence
from dataclasses import replace
from typing import Any

import torch
from torch import nn

from prunefx.api import PruneResult
from prunefx.api import prune as _prune
from prunefx.errors import PrunefxError, VerificationError
from prunefx.integrations.transformers.layouts import adopt_attention
from prunefx.integrations.transformers.pretrained import (
    check_config,
    derived_config,
    head_widths,
    language_model,
    own_config,
    write_fields,
)
from prunefx.integrations.transformers.runs import broken_call, calls_that_run
from prunefx.plan import PlanConfig


def stream_patterns(model: nn.Module) -> tuple[str, ...]:
    """``ignore`` patterns that keep the residual stream (hidden size): the group of the input embedding's output
    (the embedding module itself, or the layers inside a patch / audio embedding)."""
    emb = model.get_input_embeddings()
    names = [n for n, m in model.named_modules() if m is emb]
    return tuple(f"{n}.*" if any(True for _ in emb.children()) else n for n in names)


def prune(
    model: nn.Module,
    example_inputs: Sequence[Any] | torch.Tensor,
    config: PlanConfig | None = None,
    *,
    hidden: bool = False,
    criterion: str = "l2",
    language_model_only: bool = False,
    per_layer: bool = False,
    **kwargs: Any,
) -> PruneResult:
    """:func:`prunefx.prune` for transformers: attention heads (whole KV groups under GQA) and MLP widths at
    ``config``'s target, every layer as wide as its peers (``uniform_layers``: the config has one value per field),
    the residual stream untouched unless ``hidden=True``, weight-norm importance by default (``criterion="activation"``
    with ``calibration=[input_ids, ...]`` or ``"taylor"`` with ``loss_fn`` use data). ``language_model_only``: a
    VLM's vision tower and projector keep their shapes (only the language model is cut). ``per_layer=True``: each
    layer gets its own widths (the global ranking decides; often better at a budget, FLAP-like), which a config with
    one value per field cannot hold: ``model.config`` is left as it was (ConfigStaleWarning) and the model is saved
    with ``prunefx.save(model, result.plan, path)``, reloaded with ``prunefx.load``."""
    config = config or PlanConfig(ratio=0.3)
    own_config(model)  # the widths are written into model.config: not into a config object other models share
    adopt_attention(model)  # before head_widths: a Llama-like attention class of another name has its layout
    stream = () if hidden else stream_patterns(model)
    if language_model_only:
        stream = (*stream, *language_model(model)[1])
    # head counts the config can write (Llama: hidden_size % heads == 0), so the user's save_pretrained works
    config = replace(config, ignore=(*config.ignore, *stream), uniform_layers=not per_layer,
                     allowed_widths=(*config.allowed_widths, *head_widths(model)))  # experts': registered
    # the calls the model passes now (its default call, a cached generation) must pass after the config rewrite
    ran = calls_that_run(model, example_inputs) if kwargs.get("check", True) else ()
    with warnings.catch_warnings():  # a base model's stream is its output, frozen already: nothing to ignore
        for pattern in stream:
            warnings.filterwarnings("ignore", message=f"ignore pattern {re.escape(repr(pattern))} matches no module")
        result = _prune(model, example_inputs, config, criterion=criterion, **kwargs)
    said = update_config(result.model)
    why = broken_call(result.model, example_inputs, ran)
    if why is not None:
        raise VerificationError(f"{why}; the cut is not returned as verified and the model was pruned in place: "
                                "start again from the unpruned model (check=False skips this check)")
    return replace(result, warnings=(*result.warnings, said)) if said else result


def update_config(model: nn.Module) -> str | None:
    """Write the pruned widths into ``model.config`` in place, checked against the modules, so the user's own
    ``model.save_pretrained(d)`` and ``from_pretrained(d)`` round-trip without prunefx; when the config cannot
    express them, leave it, warn (ConfigStaleWarning) and return why."""
    old = getattr(model, "config", None)
    if old is None or not hasattr(old, "model_type"):
        return None
    try:
        cfg = derived_config(model)
        bad = check_config(model, cfg)
    except PrunefxError as exc:
        bad = [str(exc).split(";")[0]]
    if bad:
        message = (f"model.config still holds the unpruned widths: {type(old).__name__} cannot express the pruned "
                   f"model ({bad[0]}); model.save_pretrained would write a checkpoint that does not load: save with "
                   "prunefx.save(model, plan, path), or prune with widths the config accepts")
        warnings.warn(message, ConfigStaleWarning, stacklevel=3)
        return message
    write_fields(old, cfg)
    return None


def stale_config(model: nn.Module, what: str, fix: str) -> str | None:
    """Why ``model.config`` would not rebuild ``model`` (pruned by ``what``), warned as ConfigStaleWarning with
    ``fix``; None when it does (or the model has no HF config)."""
    if not hasattr(getattr(model, "config", None), "model_type"):
        return None
    bad = check_config(model, copy.deepcopy(model.config))
    if not bad:
        return None
    message = (f"model.config does not rebuild the {what} model ({bad[0]}); model.save_pretrained would write a "
               f"checkpoint that does not load: {fix}")
    warnings.warn(message, ConfigStaleWarning, stacklevel=4)
    return message


class ConfigStaleWarning(UserWarning):
    """A pruned Hugging Face model's config could not be updated to its widths."""
