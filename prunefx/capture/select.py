"""Which capture a model gets: torch.fx (training mode, else evaluation mode) or torch.export."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import replace
from typing import Any, get_args

import torch.fx as fx
from torch import nn

from prunefx.capture.inputs import positional
from prunefx.capture.record import Capture, capture_info, set_capture_info
from prunefx.capture.torch_export import export_graph, prefers_export
from prunefx.capture.trace import trace
from prunefx.errors import PrunefxError, TraceFailure

CAPTURES: tuple[str, ...] = get_args(Capture)


def capture_graph(
    model: nn.Module, example_inputs: Sequence[Any], capture: Capture = "auto", *, leaves: Sequence[str] = ()
) -> fx.GraphModule:
    """The model as a graph the analysis walks: torch.fx or torch.export (see :func:`prunefx.analyze`).

    fx traces the training-mode graph (every layer that learns, e.g. YOLO's raw head, and size provenance such as
    ``x.shape[1] // 2``). When the training-mode forward cannot be traced (a detector asserts that training needs
    ``targets``), fx traces the evaluation-mode forward instead and says so in ``capture_info(gm).notes``
    (the analysis summary prints it): layers that only training runs are then not in the graph, and verification
    traces the pruned model in the same mode. "auto" uses fx unless a plugin registered the model's type for export
    (transformers), fx cannot trace the model in either mode, or it had to hide parameters inside automatic leaves
    (their channels would all be frozen); then ``torch.export``, which follows Python control flow by running it on
    fake tensors.
    """
    if capture not in CAPTURES:
        raise PrunefxError(f"capture must be one of {', '.join(CAPTURES)}; got {capture!r}")
    example_inputs = positional(model, example_inputs)
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
    auto = capture_info(gm).auto_leaves
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
    set_capture_info(gm, replace(capture_info(gm), notes=(
        f"traced in evaluation mode: the training-mode forward cannot be traced ({why[0]}"
        + (f" at {where}" if where else "") + "); layers only training runs are not analysed",
    )))
    return gm


__all__ = ["CAPTURES", "Capture", "capture_graph"]
