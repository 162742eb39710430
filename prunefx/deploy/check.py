"""The int8 model checked against the float one: both ONNX files run by ONNX Runtime, outputs compared in numpy.

This module imports nothing of the quantizer it checks (``quantize.py``): it reads two ONNX files, runs each in
its own ``onnxruntime.InferenceSession`` on the same feeds and compares the outputs.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np


@dataclass(frozen=True)
class OutputError:
    """How far one output of the int8 model is from the float model's, over the held-out rows."""

    name: str
    rel_rms: float  # ||int8 - float||_2 / ||float||_2 over every element of every held-out batch
    max_abs: float  # max |int8 - float|
    max_rel: float  # max |int8 - float| / max |float|

    def describe(self) -> str:
        """One line: the output and its three errors."""
        return f"{self.name}: rel. RMS {self.rel_rms:.3g}, max abs {self.max_abs:.3g}, max rel {self.max_rel:.3g}"


def run_onnx(path: str | Path | bytes, feeds: Sequence[Mapping[str, np.ndarray]]) -> list[list[np.ndarray]]:
    """Every output of the ONNX model at ``path`` for each feed (one thread, CPU)."""
    import onnxruntime as ort

    so = ort.SessionOptions()
    so.intra_op_num_threads = 1
    so.log_severity_level = 3
    session = ort.InferenceSession(path if isinstance(path, bytes) else str(path), so,
                                   providers=["CPUExecutionProvider"])
    names = {i.name for i in session.get_inputs()}
    return [list(session.run(None, {k: v for k, v in feed.items() if k in names})) for feed in feeds]


def output_names(path: str | Path) -> list[str]:
    """The graph output names of the ONNX file at ``path``."""
    import onnx

    return [o.name for o in onnx.load(str(path), load_external_data=False).graph.output]


def compare(expected: Sequence[Sequence[np.ndarray]], got: Sequence[Sequence[np.ndarray]],
            names: Sequence[str]) -> tuple[OutputError, ...]:
    """Per-output errors of ``got`` against ``expected`` (lists of per-batch output lists)."""
    errors = []
    for k, name in enumerate(names):
        a = np.concatenate([np.asarray(b[k], np.float64).ravel() for b in expected])
        b = np.concatenate([np.asarray(g[k], np.float64).ravel() for g in got])
        diff = np.abs(a - b)
        norm = float(np.sqrt(np.sum(a * a)))
        rms = float(np.sqrt(np.sum(diff * diff)))
        peak = float(np.abs(a).max()) if a.size else 0.0
        max_abs = float(diff.max()) if diff.size else 0.0
        errors.append(OutputError(name, rms / norm if norm > 0 else rms, max_abs,
                                  max_abs / peak if peak > 0 else max_abs))
    return tuple(errors)


def error_of(reference: Sequence[Sequence[np.ndarray]], candidate: str | Path | bytes,
             feeds: Sequence[Mapping[str, np.ndarray]], names: Sequence[str]) -> tuple[OutputError, ...]:
    """Per-output errors of the ONNX model ``candidate`` against the ``reference`` outputs on ``feeds``."""
    return compare(reference, run_onnx(candidate, feeds), names)


def worst(errors: Sequence[OutputError]) -> float:
    """The headline number: the worst output's relative RMS error."""
    return max((e.rel_rms for e in errors), default=0.0)
