"""Output distillation of ultralytics detection heads, installed as the model's criterion inside ultralytics' own
trainer (see :mod:`prunefx.integrations.ultralytics.train`).

:class:`DetectDistillLoss` adds output KD to the task loss: class scores, BCE against the teacher's
probabilities; box distributions, KL between the DFL bin distributions. It knows ultralytics' Detect output dict
(``boxes`` / ``scores``, ``one2many`` of end-to-end heads), its DFL bins (``reg_max``) and its loss scale (the loss
vector times the batch size). The model-family-free part (:class:`~prunefx.train.distill.DistillConfig`,
classification's logits KD) stays in :mod:`prunefx.train.distill`.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from prunefx.errors import PrunefxError
from prunefx.train.distill import DistillConfig


def _raw(preds: Any) -> Mapping[str, torch.Tensor]:
    """The raw head outputs of an ultralytics detection model (train-mode dict, or the dict of an eval tuple)."""
    preds = preds[1] if isinstance(preds, tuple) else preds
    if not isinstance(preds, Mapping) or not {"boxes", "scores"} <= set(preds.get("one2many", preds)):
        raise PrunefxError("output distillation needs a detection head that returns boxes and scores "
                           f"(ultralytics Detect); got {type(preds).__name__}")
    return preds.get("one2many", preds)


def detect_kd(student: Any, teacher: Any, reg_max: int, temperature: float) -> torch.Tensor:
    """Output KD of a detection head: BCE of class logits against the teacher's probabilities plus the KL of
    the box-edge distributions (DFL bins), both averaged over anchors."""
    s, t = _raw(student), _raw(teacher)
    cls = F.binary_cross_entropy_with_logits(s["scores"], torch.sigmoid(t["scores"] / temperature))
    if reg_max > 1:
        b, _, a = s["boxes"].shape
        sb = s["boxes"].view(b, 4, reg_max, a) / temperature
        tb = t["boxes"].view(b, 4, reg_max, a) / temperature
        box = (F.kl_div(F.log_softmax(sb, 2), F.log_softmax(tb, 2), reduction="none", log_target=True)
               .sum(2).mean()) * temperature ** 2
    else:
        box = F.mse_loss(s["boxes"], t["boxes"])
    return cls + box


class DetectDistillLoss:
    """An ultralytics criterion wrapper: the task loss plus ``weight`` x output KD against a frozen teacher.

    The KD term (times the batch size, ultralytics' loss scale) is appended to the loss vector the trainer sums;
    the logged loss items stay the task's own, so training and validation columns keep their names.
    """

    def __init__(self, base: Callable[..., Any], teacher: nn.Module, config: DistillConfig, reg_max: int,
                 record: list[float] | None = None) -> None:
        self.base, self.teacher, self.config, self.reg_max = base, teacher, config, reg_max
        self.record = record  # the KD term of every step is appended here (the trainer logs its epoch mean)

    def __getattr__(self, name: str) -> Any:
        # the trainer calls criterion.update() each epoch (end-to-end heads): the task loss's own attributes
        if name == "base":
            raise AttributeError(name)
        return getattr(self.base, name)

    def __call__(self, preds: Any, batch: Mapping[str, torch.Tensor]) -> tuple[torch.Tensor, Any]:
        loss, items = self.base(preds, batch)
        img = batch["img"]
        teacher = self.teacher.to(img.device).eval()
        with torch.no_grad():
            t = teacher(img)
        kd = detect_kd(preds, t, self.reg_max, self.config.temperature)
        if self.record is not None:
            self.record.append(float(kd.detach()))
        extra = (self.config.weight * kd * img.shape[0]).reshape(1).to(loss.dtype)
        return torch.cat([loss.reshape(-1), extra]), items


__all__ = ["DetectDistillLoss", "detect_kd"]
