"""Calibration batches as ONNX Runtime feeds: checked, split into calibration and held-out rows, and read by ORT."""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch
from torch.utils._pytree import tree_flatten

from prunefx.errors import PrunefxError

MIN_BATCHES = 2  # one to calibrate on, one held out to check the int8 model


class QuantizeError(PrunefxError, ValueError):
    """A model or its calibration data cannot be quantized; the message names the problem and the fix."""


Feed = dict[str, np.ndarray]


@dataclass(frozen=True)
class Split:
    """Calibration feeds (the quantizer's ranges come from these) and held-out feeds (the checks run on these)."""

    calibrate: tuple[Feed, ...]
    held_out: tuple[Feed, ...]


def as_feed(batch: Any) -> Feed:
    """One batch (a tensor, a tuple of the forward's arguments, or a numpy array) as ``{input0: ..., ...}``."""
    args = tuple(batch) if isinstance(batch, (tuple, list)) else (batch,)
    flat = [t for t in tree_flatten(args)[0] if isinstance(t, (torch.Tensor, np.ndarray))]
    if not flat:
        raise QuantizeError(
            f"a calibration batch holds no tensor (got {type(batch).__name__}); give tensors shaped like the "
            "example inputs, e.g. [torch.randn(8, 3, 32, 32) for _ in range(8)]"
        )
    return {f"input{i}": (t.detach().cpu().numpy() if isinstance(t, torch.Tensor) else np.asarray(t))
            for i, t in enumerate(flat)}


def split(calibration: Iterable[Any] | None, held_out: float = 0.25) -> Split:
    """The user's batches as feeds: the last ``held_out`` share (at least one batch) kept for the checks."""
    if calibration is None or isinstance(calibration, (torch.Tensor, np.ndarray)):
        got = "nothing" if calibration is None else "one tensor"
        raise QuantizeError(
            f"quantize() needs calibration batches, got {got}: pass a list of at least {MIN_BATCHES} batches of "
            "real inputs, e.g. [x for x, _ in itertools.islice(loader, 16)]"
        )
    feeds = [as_feed(b) for b in calibration]
    if len(feeds) < MIN_BATCHES:
        raise QuantizeError(
            f"quantize() got {len(feeds)} calibration batch(es); give at least {MIN_BATCHES} (one is held out to "
            "check the int8 model), e.g. 16 batches of real inputs"
        )
    keys = set(feeds[0])
    if any(set(f) != keys for f in feeds):
        raise QuantizeError("calibration batches differ in their number of inputs; give every batch the same inputs")
    n_held = min(len(feeds) - 1, max(1, round(len(feeds) * held_out)))
    return Split(tuple(feeds[:-n_held]), tuple(feeds[-n_held:]))


def only(feed: Feed, names: Iterable[str]) -> Feed:
    """``feed`` restricted to the inputs a graph kept (the exporter drops unused ones)."""
    keep = set(names)
    return {k: v for k, v in feed.items() if k in keep}


def reader(feeds: tuple[Feed, ...]) -> Any:
    """An ``onnxruntime.quantization.CalibrationDataReader`` yielding ``feeds`` once."""
    from onnxruntime.quantization import CalibrationDataReader

    class _Reader(CalibrationDataReader):
        def __init__(self) -> None:
            self._it: Iterator[Feed] = iter(feeds)

        def get_next(self) -> Feed | None:
            return next(self._it, None)

        def __len__(self) -> int:
            return len(feeds)

        def set_range(self, start_index: int, end_index: int) -> None:
            self._it = iter(feeds[start_index:end_index])

    return _Reader()
