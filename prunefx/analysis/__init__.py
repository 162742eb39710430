"""Channel-dependency analysis: ``analyze(model, example_inputs) -> DependencyGraph``."""

from __future__ import annotations

import time
from collections.abc import Sequence
from typing import Any

import torch
import torch.fx as fx
from torch import nn

from .. import rules as _rules  # noqa: F401  (fills the op registry)
from ..errors import PrunefxError
from ..rules.registry import RULES, OpRegistry
from ..shapes import propagate
from ..trace import META_KEY, trace
from .engine import Engine
from .graph import DependencyGraph
from .groups import Group, Member, build_groups


def analyze(
    model: nn.Module | fx.GraphModule,
    example_inputs: Sequence[Any] | torch.Tensor,
    *,
    leaves: Sequence[str] = (),
    registry: OpRegistry = RULES,
) -> DependencyGraph:
    """Trace ``model`` (in training mode, flags restored), propagate shapes and group coupled channels.

    >>> dg = analyze(torchvision.models.resnet18(), torch.randn(1, 3, 224, 224))
    >>> print(dg.summary())
    """
    if not isinstance(model, nn.Module):
        raise PrunefxError(f"analyze expects a torch.nn.Module, got {type(model).__name__}")
    if isinstance(example_inputs, torch.Tensor):
        example_inputs = (example_inputs,)
    example_inputs = tuple(example_inputs)
    t0 = time.perf_counter()
    # Train mode exposes every layer that learns (YOLO Detect's raw head, aux classifiers); tracing runs
    # no tensor op, so nothing in the model changes, and each module's flag is restored afterwards.
    gm = model if isinstance(model, fx.GraphModule) else trace(model, example_inputs, leaves=leaves, training=True)
    shape_pass = propagate(gm, example_inputs)
    state = Engine(gm, registry).run()
    grouping = build_groups(state)
    seconds = time.perf_counter() - t0
    return DependencyGraph(
        gm=gm,
        groups=grouping.groups,
        record_roots=grouping.record_roots,
        ties=grouping.ties,
        unknown_ops=state.unknown,
        auto_leaves=gm.meta.get(META_KEY, {}).get("auto_leaves", {}),
        model_name=type(model).__name__,
        seconds=seconds,
        shape_pass=shape_pass,
    )


__all__ = ["analyze", "DependencyGraph", "Group", "Member"]
