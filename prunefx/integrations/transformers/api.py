"""Prune a Hugging Face model with transformer defaults: heads and MLP widths, residual stream kept, uniform layers."""

from __future__ import annotations

import re
import warnings
from collections.abc import Sequence
from dataclasses import replace
from typing import Any

import torch
from torch import nn

from prunefx.api import PruneResult
from prunefx.api import prune as _prune
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
    **kwargs: Any,
) -> PruneResult:
    """:func:`prunefx.prune` for transformers: attention heads (whole KV groups under GQA) and MLP widths at
    ``config``'s target, every layer as wide as its peers (``uniform_layers``: the config has one value per field),
    the residual stream untouched unless ``hidden=True``, weight-norm importance by default (``criterion="activation"``
    with ``calibration=[input_ids, ...]`` or ``"taylor"`` with ``loss_fn`` use data)."""
    config = config or PlanConfig(ratio=0.3)
    stream = () if hidden else stream_patterns(model)
    config = replace(config, ignore=(*config.ignore, *stream), uniform_layers=True)
    with warnings.catch_warnings():  # a base model's stream is its output, frozen already: nothing to ignore
        for pattern in stream:
            warnings.filterwarnings("ignore", message=f"ignore pattern {re.escape(repr(pattern))} matches no module")
        return _prune(model, example_inputs, config, criterion=criterion, **kwargs)
