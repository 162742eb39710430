"""Capture: a model as a torch.fx GraphModule, and a value (meta tensor) for every node."""

from prunefx.capture.trace import META_KEY, PrunefxTracer, register_leaf, trace, training_mode
from prunefx.capture.values import VALUE_KEY, propagate, value

__all__ = ["META_KEY", "PrunefxTracer", "register_leaf", "trace", "training_mode", "VALUE_KEY", "propagate", "value"]
