"""Capture: a model as a GraphModule (torch.fx symbolic trace, or torch.export's ATen graph), and a value (meta
tensor) for every node."""

from prunefx.capture.record import META_KEY, Capture, CapturedBy, CaptureInfo, capture_info, set_capture_info
from prunefx.capture.select import CAPTURES, capture_graph
from prunefx.capture.torch_export import export_graph, prefers_export, register_export
from prunefx.capture.trace import (
    PrunefxTracer,
    register_capture_setting,
    register_leaf,
    register_leaf_function,
    trace,
    training_mode,
)
from prunefx.capture.values import VALUE_KEY, propagate, value

__all__ = [
    "META_KEY", "PrunefxTracer", "register_leaf", "register_leaf_function", "register_capture_setting",
    "trace", "training_mode", "VALUE_KEY", "propagate", "value",
    "export_graph", "prefers_export", "register_export",
    "Capture", "CapturedBy", "CaptureInfo", "capture_info", "set_capture_info", "CAPTURES", "capture_graph",
]
