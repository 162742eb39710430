"""Export a (pruned) ultralytics model with ultralytics' own ONNX exporter, then check it with ONNX Runtime.

    result = export_yolo("runs/prune/yolo/weights/best.pt", "best.onnx", imgsz=640)

Ultralytics fuses BatchNorm, wires its head for deployment and slims the graph (onnxslim); prunefx then runs the
file with ONNX Runtime on a random image and compares its output with the checkpoint's own eval forward (the
decoded predictions, ``output0``): a relative error above ``rtol`` is an ExportError and nothing is kept.
"""

from __future__ import annotations

import os
import tempfile
from pathlib import Path

import torch
from torch import nn

from prunefx.metrics.backends import Deployment, check_available, ort_session
from prunefx.metrics.common import MetricsError
from prunefx.onnx_export import Exported, ExportError, rel_error


def export_yolo(
    model: nn.Module | str | os.PathLike[str],
    path: str | os.PathLike[str],
    *,
    imgsz: int,
    opset: int | None = None,
    dynamic_batch: bool = False,
    simplify: bool = True,
    rtol: float = 1e-4,
    trust_checkpoint: bool = False,
) -> Exported:
    """``YOLO(checkpoint).export(format="onnx")`` to ``path``, checked against the checkpoint with ONNX Runtime.

    ``model``: an ultralytics checkpoint path (loaded weights-only unless ``trust_checkpoint``), or a model
    (saved to a temporary checkpoint first). ``opset`` None lets ultralytics choose (its best for the installed onnx).
    """
    from prunefx.integrations.ultralytics.env import setup_offline

    setup_offline()
    try:
        check_available(Deployment(backend="onnxruntime"))
    except MetricsError as exc:
        raise ExportError(f"cannot check the export: {exc}") from None
    from ultralytics import YOLO

    from prunefx.integrations.ultralytics.io import load_yolo, save_yolo, ultralytics_loading

    path = Path(path)
    with tempfile.TemporaryDirectory() as tmp:
        ckpt = Path(tmp) / "model.pt"
        if isinstance(model, nn.Module):
            save_yolo(model, ckpt)
        else:
            reference = load_yolo(model, trust_checkpoint=trust_checkpoint)  # refuses what needs trust, first
            save_yolo(reference, ckpt)  # re-saved by prunefx: what ultralytics then loads is known to be safe
        try:
            with ultralytics_loading():
                out = YOLO(str(ckpt)).export(
                    format="onnx", imgsz=imgsz, opset=opset, dynamic=dynamic_batch, simplify=simplify, device="cpu"
                )
        except Exception as exc:  # ultralytics raises whatever its exporter hit
            raise ExportError(f"ultralytics' ONNX export failed: {type(exc).__name__}: {exc}") from exc
        data = Path(out).read_bytes()
        reference = load_yolo(ckpt).eval()
        x = torch.rand(1, 3, imgsz, imgsz, generator=torch.Generator().manual_seed(0))
        with torch.no_grad():
            expected = reference.fuse(verbose=False)(x)
        first = expected[0] if isinstance(expected, (tuple, list)) else expected
        session = ort_session(data, Deployment(backend="onnxruntime", threads=1))
        got = session.run(None, {session.get_inputs()[0].name: x.numpy()})
        error = rel_error([first.numpy()], got[:1])
        if not error <= rtol:
            raise ExportError(f"the ONNX export differs from the checkpoint: max relative error {error:.3g} > {rtol:g}")
        import onnx

        opset_used = next(o.version for o in onnx.load_from_string(data).opset_import if o.domain in ("", "ai.onnx"))
    path.parent.mkdir(parents=True, exist_ok=True)
    from prunefx._io import atomic_write

    atomic_write(path, data)
    return Exported(path, int(opset_used), dynamic_batch, "ultralytics' exporter (BatchNorm fused)", error, (1,), rtol,
                    len(data))
