"""Channel-dependency analysis: ``analyze(model, example_inputs) -> DependencyGraph``."""

from __future__ import annotations

import time
from collections.abc import Sequence
from typing import Any

import numpy as np
import torch
import torch.fx as fx
from torch import nn

from prunefx import _plugins
from prunefx._gc import gc_paused
from prunefx.analysis.engine import Engine
from prunefx.analysis.finite import check_finite
from prunefx.analysis.graph import DependencyGraph
from prunefx.analysis.groups import Group, Member, build_groups
from prunefx.analysis.outputs import default_free_outputs, require_tensor_output
from prunefx.analysis.parts import boundary_reasons, find_parts
from prunefx.analysis.roles import Kind
from prunefx.analysis.rules import RULES, OpRegistry
from prunefx.capture.inputs import input_kinds, positional
from prunefx.capture.record import Capture, capture_info
from prunefx.capture.select import CAPTURES, capture_graph
from prunefx.capture.values import propagate
from prunefx.errors import PrunefxError, TraceFailure


def analyze(
    model: nn.Module | fx.GraphModule,
    example_inputs: Sequence[Any] | torch.Tensor,
    *,
    leaves: Sequence[str] = (),
    registry: OpRegistry = RULES,
    free_outputs: Sequence[str] | None = None,
    capture: Capture = "auto",
) -> DependencyGraph:
    """Capture ``model`` as a graph (flags restored), give every node a value and group coupled channels.

    >>> dg = analyze(torchvision.models.resnet18(), torch.randn(1, 3, 224, 224))
    >>> print(dg.summary())

    ``free_outputs``: names of dict entries in the model's output whose channel count may change (only
    their shapes are read downstream); None uses the defaults registered for the model's type.
    ``capture``: "fx" (symbolic trace of the training-mode graph), "export" (``torch.export``'s ATen graph in eval
    mode, for code fx cannot follow) or "auto" (see :func:`prunefx.capture.capture_graph`). Models on the meta device
    work. When the model's own forward cannot be captured at all, the largest submodules that can be are analysed
    instead, with their boundaries frozen (:mod:`prunefx.analysis.parts`); ``DependencyGraph.parts`` says which,
    what stayed opaque and why, and the summary prints it.
    """
    with gc_paused():  # a full collection (100-200 ms with torch loaded) would cost more than the analysis
        return _analyze(model, example_inputs, leaves, registry, free_outputs, capture)


def _analyze(model, example_inputs, leaves, registry, free_outputs, capture) -> DependencyGraph:
    if not isinstance(model, nn.Module):
        raise PrunefxError(f"analyze expects a torch.nn.Module, got {type(model).__name__}")
    check_finite(model)
    example_inputs = positional(model, example_inputs)
    _plugins.activate()  # the model's library is imported by now: its rules, fixers and free outputs register
    t0 = time.perf_counter()
    parts = None
    try:
        gm = model if isinstance(model, fx.GraphModule) else capture_graph(model, example_inputs, capture,
                                                                           leaves=leaves)
    except TraceFailure as failure:  # the last fallback: analyse the submodules that can be captured
        gm, parts = find_parts(model, example_inputs, failure, capture=capture, leaves=leaves)
    graph_inputs = parts.calls if parts is not None else example_inputs
    info = capture_info(gm)
    how = info.capture
    shape_pass = "export" if how == "export" else propagate(gm, graph_inputs)  # export's graph has its values
    require_tensor_output(gm, type(model).__name__)
    if parts is not None:
        free_outputs = ()  # a part's outputs are read by code that was not analysed: all frozen
    elif free_outputs is None:
        free_outputs = default_free_outputs(model)
    engine = Engine(gm, registry, tuple(free_outputs), modules=dict(model.named_modules(remove_duplicate=False)))
    state = engine.run()
    _tie_shared_tensors(gm, state)
    grouping = build_groups(state)
    groups = grouping.groups
    labels = {n.name: v for n, v in engine.env.items()}
    if parts is not None:
        groups = boundary_reasons(gm, groups, labels, state.atoms, parts)
    seconds = time.perf_counter() - t0
    return DependencyGraph(
        gm=gm,
        groups=groups,
        record_roots=grouping.record_roots,
        ties=grouping.ties,
        unknown_ops=state.unknown,
        inferred_ops=dict(state.inferred),
        auto_leaves=info.auto_leaves,
        model_name=type(model).__name__,
        seconds=seconds,
        shape_pass=shape_pass,
        atoms=state.atoms,
        node_labels=labels,
        input_shapes=tuple(tuple(x.shape) for x in example_inputs if isinstance(x, torch.Tensor)),
        input_kinds=input_kinds(example_inputs),
        parts=parts,
        capture=how,
        inside=frozenset(state.inside),
        notes=info.notes + ((parts.describe(),) if parts else ()),
    )


def _tie_shared_tensors(gm: fx.GraphModule, state) -> None:
    """A tensor reachable under two names (tied weights) is one tensor: slice it once, consistently."""
    owner: dict[int, str] = {}
    alias: dict[str, str] = {}
    for name, t in (*gm.named_parameters(remove_duplicate=False), *gm.named_buffers(remove_duplicate=False)):
        first = owner.setdefault(id(t), name)
        if first != name:
            alias[name] = first
    if not alias:
        return
    by_key = {}
    for (kind, name, role), rec in list(state.records.items()):
        if kind is not Kind.PARAM:
            continue
        canon = alias.get(name, name)
        prev = by_key.get((canon, role))
        if prev is None:
            by_key[(canon, role)] = rec
        elif len(prev.atoms) == len(rec.atoms):
            state.atoms.union(prev.atoms, rec.atoms, f"tied tensor {canon}")
        else:
            state.atoms.freeze(
                np.concatenate([prev.atoms, rec.atoms]), f"tied tensor {canon} used with different shapes"
            )


__all__ = ["analyze", "capture_graph", "CAPTURES", "Capture", "DependencyGraph", "Group", "Member"]
