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
from prunefx.analysis.engine import Engine
from prunefx.analysis.finite import check_finite
from prunefx.analysis.graph import DependencyGraph
from prunefx.analysis.groups import Group, Member, build_groups
from prunefx.analysis.outputs import default_free_outputs, require_tensor_output
from prunefx.analysis.parts import boundary_reasons, find_parts
from prunefx.analysis.roles import Kind
from prunefx.analysis.rules import RULES, OpRegistry
from prunefx.capture.export import export_graph, prefers_export
from prunefx.capture.trace import META_KEY, trace
from prunefx.capture.values import propagate
from prunefx.errors import PrunefxError, TraceFailure

CAPTURES = ("auto", "fx", "export")


def analyze(
    model: nn.Module | fx.GraphModule,
    example_inputs: Sequence[Any] | torch.Tensor,
    *,
    leaves: Sequence[str] = (),
    registry: OpRegistry = RULES,
    free_outputs: Sequence[str] | None = None,
    capture: str = "auto",
) -> DependencyGraph:
    """Capture ``model`` as a graph (flags restored), give every node a value and group coupled channels.

    >>> dg = analyze(torchvision.models.resnet18(), torch.randn(1, 3, 224, 224))
    >>> print(dg.summary())

    ``free_outputs``: names of dict entries in the model's output whose channel count may change (only
    their shapes are read downstream); None uses the defaults registered for the model's type.
    ``capture``: "fx" (symbolic trace of the training-mode graph), "export" (``torch.export``'s ATen graph in eval
    mode, for code fx cannot follow) or "auto" (see :func:`capture_graph`). Models on the meta device work.
    When the model's own forward cannot be captured at all, the largest submodules that can be are analysed
    instead, with their boundaries frozen (:mod:`prunefx.analysis.parts`); ``DependencyGraph.parts`` says which,
    what stayed opaque and why, and the summary prints it.
    """
    if not isinstance(model, nn.Module):
        raise PrunefxError(f"analyze expects a torch.nn.Module, got {type(model).__name__}")
    check_finite(model)
    if isinstance(example_inputs, torch.Tensor):
        example_inputs = (example_inputs,)
    example_inputs = tuple(example_inputs)
    _plugins.activate()  # the model's library is imported by now: its rules, fixers and free outputs register
    t0 = time.perf_counter()
    parts = None
    try:
        gm = model if isinstance(model, fx.GraphModule) else capture_graph(model, example_inputs, capture,
                                                                           leaves=leaves)
    except TraceFailure as failure:  # the last fallback: analyse the submodules that can be captured
        gm, parts = find_parts(model, example_inputs, failure, capture=capture, leaves=leaves)
    graph_inputs = parts.calls if parts is not None else example_inputs
    how = gm.meta.get(META_KEY, {}).get("capture", "fx")
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
        auto_leaves=gm.meta.get(META_KEY, {}).get("auto_leaves", {}),
        model_name=type(model).__name__,
        seconds=seconds,
        shape_pass=shape_pass,
        atoms=state.atoms,
        node_labels=labels,
        input_shapes=tuple(tuple(x.shape) for x in example_inputs if isinstance(x, torch.Tensor)),
        parts=parts,
        capture=how,
        inside=frozenset(state.inside),
        notes=tuple(gm.meta.get(META_KEY, {}).get("notes", ())) + ((parts.describe(),) if parts else ()),
    )


def capture_graph(
    model: nn.Module, example_inputs: Sequence[Any], capture: str = "auto", *, leaves: Sequence[str] = ()
) -> fx.GraphModule:
    """The model as a graph the analysis walks: torch.fx or torch.export (see :func:`analyze`).

    fx traces the training-mode graph (every layer that learns, e.g. YOLO's raw head, and size provenance such as
    ``x.shape[1] // 2``). When the training-mode forward cannot be traced (a detector asserts that training needs
    ``targets``), fx traces the evaluation-mode forward instead and says so in ``gm.meta["prunefx"]["notes"]``
    (the analysis summary prints it): layers that only training runs are then not in the graph, and verification
    traces the pruned model in the same mode. "auto" uses fx unless a plugin registered the model's type for export
    (transformers), fx cannot trace the model in either mode, or it had to hide parameters inside automatic leaves
    (their channels would all be frozen); then ``torch.export``, which follows Python control flow by running it on
    fake tensors.
    """
    if capture not in CAPTURES:
        raise PrunefxError(f"capture must be one of {', '.join(CAPTURES)}; got {capture!r}")
    example_inputs = tuple(example_inputs)
    if capture == "export" or (capture == "auto" and prefers_export(model)):
        return export_graph(model, example_inputs)
    try:
        # Train mode exposes every layer that learns (YOLO Detect's raw head, aux classifiers); tracing runs
        # no tensor op, so nothing in the model changes, and each module's flag is restored afterwards.
        gm = _trace_train_or_eval(model, example_inputs, leaves)
    except TraceFailure as fx_failure:
        if capture == "fx":
            raise
        try:
            return export_graph(model, example_inputs)
        except TraceFailure as export_failure:
            raise TraceFailure(f"{fx_failure}\nand with torch.export: {export_failure}") from export_failure
    auto = gm.meta[META_KEY]["auto_leaves"]
    if capture == "auto" and any(next(model.get_submodule(n).parameters(), None) is not None for n in auto):
        try:
            return export_graph(model, example_inputs)
        except TraceFailure:
            return gm  # fx with its automatic leaves (reported in DependencyGraph.auto_leaves) is what there is
    return gm


def _trace_train_or_eval(model: nn.Module, example_inputs: tuple, leaves: Sequence[str]) -> fx.GraphModule:
    """The training-mode trace; the evaluation-mode one (with a note) when training's forward cannot be traced."""
    try:
        return trace(model, example_inputs, leaves=leaves, training=True)
    except TraceFailure as train_failure:
        why = str(train_failure).split("\n")
        try:
            gm = trace(model, example_inputs, leaves=leaves, training=False)
        except TraceFailure as eval_failure:
            raise TraceFailure(f"{train_failure}\nand in evaluation mode: {eval_failure}") from eval_failure
    where = next((line.strip()[3:] for line in why if line.strip().startswith("at ")), "")
    gm.meta[META_KEY]["notes"] = (
        f"traced in evaluation mode: the training-mode forward cannot be traced ({why[0]}"
        + (f" at {where}" if where else "") + "); layers only training runs are not analysed",
    )
    return gm


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


__all__ = ["analyze", "DependencyGraph", "Group", "Member"]
