"""GFLOPs the way ultralytics reports them (model summaries, ``get_flops``), for comparable numbers.

Ultralytics counts with its fork of thop (package ``ultralytics-thop``, installed with ultralytics):
per-leaf-module forward hooks plus a function-level counter for matmuls outside counted modules, then
reports ``MACs / 1e9 * 2`` for one batch-1 ``imgsz x imgsz`` image. Its rules, read from thop 2.2.3's
``vision/basic_hooks.py`` and ``profile.py`` (MACs):

* Conv/ConvTranspose: out.numel() x Cin/groups x prod(kernel); the bias is ignored.
* BatchNorm (and Layer/Group/InstanceNorm): 2 x numel, doubled to **4 x numel** when affine.
* Linear: in_features x out.numel(); the bias is ignored.
* matmul/bmm/einsum/F.linear and scaled-dot-product attention called outside counted modules: one MAC
  per output element per contracted element (this is what yolo11's C2PSA attention adds).
* Softmax, AvgPool/AdaptiveAvgPool, non-nearest Upsample and PReLU have formulas; ReLU, SiLU and
  other activations, MaxPool, nearest Upsample, Concat and elementwise adds count zero.

Rather than re-deriving those rules (and drifting from them), this runs thop itself, so the numbers
are the ones ultralytics prints. It differs from :func:`prunefx.metrics.measure` mainly in normalisation
(8 FLOPs per BN element here, 2 there) and in the function-level matmul rule.
"""

from __future__ import annotations

import copy
import inspect
import itertools
from collections.abc import Sequence
from typing import Any

import torch
from torch import nn

from prunefx.metrics.common import MetricsError, check_model, meta_forward, rejected, untouched


class _OnMeta(nn.Module):
    """Forward the wrapped model on meta tensors, so thop's hooks see every shape without any compute."""

    def __init__(self, model: nn.Module) -> None:
        super().__init__()
        self.model = model

    def forward(self, *args: Any) -> Any:
        return meta_forward(self.model, args)


def report_gflops(model: nn.Module, imgsz: int) -> dict[str, float]:
    """The report's ultralytics costs: GFLOPs at 640 (what ultralytics prints) and at the size the model runs at."""
    return {"yolo_gflops@640": ultralytics_gflops(model, 640), f"yolo_gflops@{imgsz}": ultralytics_gflops(model, imgsz)}


def _fused_copy(model: nn.Module) -> nn.Module:
    fuse = getattr(model, "fuse", None)
    if not callable(fuse):
        raise MetricsError(
            f"fused=True needs a model with a .fuse() method (an ultralytics model); {type(model).__name__} has "
            "none. Measure it unfused, or fold Conv+BN yourself and pass the folded model."
        )
    clone = copy.deepcopy(model)
    # ultralytics' fuse(verbose=True) prints a model summary, which itself profiles the model.
    kwargs = {"verbose": False} if "verbose" in inspect.signature(clone.fuse).parameters else {}
    return clone.fuse(**kwargs) or clone


def _input_channels(model: nn.Module) -> int:
    for m in model.modules():
        if isinstance(m, nn.modules.conv._ConvNd):
            return m.in_channels
    raise MetricsError(
        f"cannot tell how many input channels {type(model).__name__} takes: it has no convolution. "
        "Pass channels=..., e.g. ultralytics_gflops(model, imgsz=640, channels=3)."
    )


def ultralytics_gflops(
    model: nn.Module, imgsz: int | Sequence[int] = 640, fused: bool = False, *, channels: int | None = None
) -> float:
    """GFLOPs (2 x GMACs) of one ``1 x channels x H x W`` image as ultralytics counts them.

    ``imgsz`` is an int or ``(H, W)``; ``channels`` defaults to the first convolution's input channels.
    Equal to ``ultralytics.utils.torch_utils.get_flops(model, imgsz)``; ``fused=True`` measures a fused
    deep copy (ultralytics ``model.fuse()``), as the "(fused)" summary line does. ``model`` is unchanged.

    >>> ultralytics_gflops(DetectionModel("yolov8n.yaml"))  # 8.855 (8.744 fused)
    """
    check_model(model, "ultralytics_gflops")
    try:
        import thop
    except ImportError as exc:
        raise MetricsError(
            "the ultralytics GFLOPs view needs the ultralytics-thop package; install it with "
            "`pip install ultralytics-thop` (ultralytics depends on it)."
        ) from exc
    height, width = (imgsz, imgsz) if isinstance(imgsz, int) else tuple(imgsz)
    target = _fused_copy(model) if fused else model
    reference = next(itertools.chain(target.parameters(), target.buffers()), torch.empty(0))
    image = torch.zeros(
        (1, channels or _input_channels(target), height, width), dtype=reference.dtype, device=reference.device
    )
    # thop removes its hooks and restores modes itself; untouched() also undoes forward caches.
    # Its rules read only shapes, so a meta pass counts the same; a real one is the fallback.
    with untouched(target):
        try:
            macs, _ = thop.profile(_OnMeta(target), inputs=(image,), verbose=False)
        except Exception:  # noqa: BLE001 - no meta kernel or data-dependent shapes: count on a real forward
            try:
                macs, _ = thop.profile(target, inputs=(image,), verbose=False)
            except Exception as exc:  # any failure of the forward is a bad-input error
                raise rejected(exc, (image,)) from exc
    return macs / 1e9 * 2  # get_flops' exact expression, so the floats match bit for bit
