"""Synthetic datasets for quick, offline pruning experiments."""

from prunefx.data.detection import DEFAULT_CLASSES, SHAPE_COLORS, make_shapes_dataset
from prunefx.data.detection_hard import HARD_CLASSES, make_hard_shapes_dataset

__all__ = ["DEFAULT_CLASSES", "HARD_CLASSES", "SHAPE_COLORS", "make_hard_shapes_dataset", "make_shapes_dataset"]
