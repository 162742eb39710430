"""Export a (pruned) model to ONNX and prove the file computes what the model computes, with ONNX Runtime.

    result = export_onnx(model, torch.randn(1, 3, 224, 224), "model.onnx", dynamic_batch=True)
    result.max_rel_error   # ONNX Runtime's outputs vs PyTorch's, max |a - b| / max |a| per output

The model is exported in eval mode with the TorchScript exporter at opset ``ONNX_OPSET`` (18), eval BatchNorm
folded into the convolutions first (``prunefx.passes.fold_bn``; a model that cannot be traced is exported as
is), then run by ONNX Runtime (CPU) on the example inputs (and, with a dynamic batch, on a batch of another
size) and compared with PyTorch's outputs: a relative error above ``rtol`` is an :class:`ExportError` and no
file is left behind. Ultralytics models keep ultralytics' own exporter
(``prunefx.integrations.ultralytics.yolo_export``).
"""

from __future__ import annotations

import copy
import os
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch import nn
from torch.utils._pytree import tree_flatten, tree_map_only

from prunefx._io import atomic_write
from prunefx.errors import PrunefxError
from prunefx.metrics.backends import ONNX_OPSET, Deployment, check_available, onnx_bytes, ort_session, with_batch
from prunefx.metrics.common import MetricsError, as_args, untouched
from prunefx.passes import FOLD_KEY, fold_bn

__all__ = ["ONNX_OPSET", "ExportError", "Exported", "check_onnx", "export_onnx", "rel_error", "roundoff_rtol"]


class ExportError(PrunefxError):
    """A model could not be exported, or its ONNX file does not compute what the model computes."""


@dataclass(frozen=True)
class Exported:
    """An ONNX file and the proof that it matches the model: outputs compared with ONNX Runtime."""

    path: Path
    opset: int
    dynamic_batch: bool
    folded: str  # "BatchNorm folded (20 of 20)", "as is (...)"
    max_rel_error: float  # worst output over the checked batches
    batches: tuple[int, ...]  # batch sizes checked
    rtol: float
    size_bytes: int

    def describe(self) -> str:
        return (
            f"{self.path} (opset {self.opset}, {'dynamic' if self.dynamic_batch else 'fixed'} batch, {self.folded}, "
            f"{self.size_bytes / 1e6:.2f} MB): ONNX Runtime vs PyTorch max rel. error {self.max_rel_error:.2e} "
            f"at batch {', '.join(map(str, self.batches))} (rtol {self.rtol:g})"
        )


def rel_error(expected: Sequence[np.ndarray], got: Sequence[np.ndarray]) -> float:
    """Worst ``max |a - b| / max |a|`` over paired outputs (0 for all-zero outputs that match)."""
    if len(expected) != len(got):
        raise ExportError(f"the ONNX model has {len(got)} outputs, PyTorch's {len(expected)}")
    worst = 0.0
    for a, b in zip(expected, got, strict=True):
        if a.shape != b.shape:
            raise ExportError(f"an output has shape {list(b.shape)} in ONNX Runtime, {list(a.shape)} in PyTorch")
        scale = float(np.abs(a).max()) if a.size else 0.0
        diff = float(np.abs(a.astype(np.float64) - b.astype(np.float64)).max()) if a.size else 0.0
        worst = max(worst, diff / scale if scale > 0 else diff)
    return worst


def _flat_outputs(model: nn.Module, args: tuple[Any, ...]) -> list[np.ndarray]:
    with untouched(model), torch.no_grad():
        out = model(*args)
    return [t.detach().cpu().float().numpy() for t in tree_flatten(out)[0] if isinstance(t, torch.Tensor)]


def check_onnx(
    data: bytes, model: nn.Module, example_inputs: Any, *, batches: Sequence[int | None] = (None,)
) -> float:
    """Worst relative error between ONNX Runtime running ``data`` and ``model`` (eval) on the example inputs."""
    session = ort_session(data, Deployment(backend="onnxruntime", threads=1))
    names = [i.name for i in session.get_inputs()]
    worst = 0.0
    for batch in batches:
        args = with_batch(as_args(example_inputs, model), batch)
        flat = [t for t in tree_flatten(args)[0] if isinstance(t, torch.Tensor)]
        feed = {f"input{i}": t.detach().cpu().numpy() for i, t in enumerate(flat)}
        got = session.run(None, {n: feed[n] for n in names})
        worst = max(worst, rel_error(_flat_outputs(model, args), got))
    return worst


ROUNDOFF_FACTOR = 8.0  # another runtime sums in another order: its round-off may be a few times torch's own


def roundoff_rtol(model: nn.Module, args: tuple[Any, ...], floor: float = 1e-4) -> float:
    """The relative error float32 round-off gives this model on ``args``: torch float32 vs float64, times 8.

    A fixed 1e-4 refused correct exports whose outputs sum long accumulations or pass a softmax (1.49e-4 on a
    1-D conv net): the round-off of the model's own arithmetic, measured here, is what two runtimes may differ by.
    A model that cannot run in float64 keeps the floor.
    """
    try:
        with untouched(model):
            wide = copy.deepcopy(model).double()
        wide_args = tree_map_only(torch.Tensor, lambda t: t.double() if t.is_floating_point() else t, args)
        error = rel_error(_flat_outputs(wide, wide_args), _flat_outputs(model, args))
    except Exception:  # noqa: BLE001 - no float64 kernel for an op, a model that cannot be copied: the floor
        return floor
    return max(floor, ROUNDOFF_FACTOR * error) if np.isfinite(error) else floor


def export_onnx(
    model: nn.Module,
    example_inputs: Any,
    path: str | os.PathLike[str],
    *,
    opset: int = ONNX_OPSET,
    dynamic_batch: bool = False,
    fold: bool = True,
    rtol: float | None = None,
) -> Exported:
    """Write ``model`` as ONNX to ``path`` and check ONNX Runtime's outputs equal PyTorch's within ``rtol``.

    ``dynamic_batch`` names dim 0 of every input and output ``batch`` and checks a second batch size too.
    ``fold``: fold eval BatchNorm into convolutions first (what deployment runtimes do anyway).
    ``rtol`` None: what float32 round-off allows on this model (:func:`roundoff_rtol`), at least 1e-4.
    Raises :class:`ExportError` (nothing written) when the export fails or the outputs differ.
    """
    if not isinstance(model, nn.Module):
        raise ExportError(f"export_onnx() needs a torch.nn.Module, got {type(model).__name__}")
    try:
        check_available(Deployment(backend="onnxruntime"))
    except MetricsError as exc:
        raise ExportError(f"cannot check the export: {exc}") from None
    args = as_args(example_inputs, model)
    folded, how = model, "as is"
    if fold and any(isinstance(m, nn.modules.batchnorm._BatchNorm) for m in model.modules()):
        try:
            with untouched(model):
                folded = fold_bn(model, args)
            info = folded.meta[FOLD_KEY]
            how = f"BatchNorm folded ({len(info['folded'])} of {len(info['folded']) + len(info['kept'])})"
        except PrunefxError as exc:
            how = f"as is (BatchNorm not folded: {str(exc).splitlines()[0][:120]})"
    try:
        data, _, _ = onnx_bytes(folded, args, opset=opset, dynamic_batch=dynamic_batch)
    except MetricsError as exc:
        raise ExportError(str(exc)) from exc
    batch0 = int(next(t for t in tree_flatten(args)[0] if isinstance(t, torch.Tensor)).shape[0])
    batches = (None, batch0 + 1) if dynamic_batch else (None,)
    error = check_onnx(data, model, args, batches=batches)
    if rtol is None:
        rtol = roundoff_rtol(model, args)
    if not error <= rtol:
        raise ExportError(
            f"the ONNX export differs from the model: max relative error {error:.3g} > {rtol:g}; "
            "export with fold=False or report the model"
        )
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    atomic_write(path, data)
    return Exported(path, opset, dynamic_batch, how, error, (batch0, *batches[1:]), rtol, len(data))
