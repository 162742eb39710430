"""Synthetic datasets for quick, offline pruning experiments."""

from __future__ import annotations

from typing import Any

# The detection sets draw with OpenCV (the yolo extra): imported on first use, so the classification data needs none.
_LAZY = {
    "DEFAULT_CLASSES": "detection", "SHAPE_COLORS": "detection", "make_shapes_dataset": "detection",
    "HARD_CLASSES": "detection_hard", "make_hard_shapes_dataset": "detection_hard",
}


def __getattr__(name: str) -> Any:
    if name not in _LAZY:
        raise AttributeError(f"module 'prunefx.data' has no attribute {name!r}")
    from prunefx._extras import require

    require("cv2", "the synthetic detection set")
    module = require(f"prunefx.data.{_LAZY[name]}", "the synthetic detection set")
    return getattr(module, name)


__all__ = ["DEFAULT_CLASSES", "HARD_CLASSES", "SHAPE_COLORS", "make_hard_shapes_dataset", "make_shapes_dataset"]
