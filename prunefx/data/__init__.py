"""Synthetic datasets for quick, offline pruning experiments."""

from prunefx.data.detection import DEFAULT_CLASSES, SHAPE_COLORS, make_shapes_dataset

__all__ = ["DEFAULT_CLASSES", "SHAPE_COLORS", "make_shapes_dataset"]
