"""Knowledge distillation from the unpruned model while fine-tuning the pruned one.

Classification: logits KD (Hinton et al.), ``loss = (1 - weight) * CE + weight * T^2 * KL(teacher_T || student_T)``
with both distributions softened by the temperature T. Detection (ultralytics heads): output KD added to the
task loss, :class:`DetectDistillLoss` (class scores: BCE against the teacher's probabilities; box distributions:
KL between the DFL bin distributions), installed as the model's criterion inside ultralytics' own trainer.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from prunefx._config import ConfigError, check_fields
from prunefx.errors import PrunefxError


@dataclass(frozen=True)
class DistillConfig:
    """How strongly the student follows the teacher (``prune.finetune.distill_*`` in pipeline configs)."""

    temperature: float = 4.0  # softens both distributions; the KD term is scaled by T^2 to keep its gradients
    weight: float = 0.5  # classification: share of the KD term; detection: multiplier of the KD term

    def __post_init__(self) -> None:
        check_fields(self)
        if self.temperature <= 0 or self.weight < 0:
            raise ConfigError(f"distillation needs distill_temperature > 0 and distill_weight >= 0, got {self}")

    def check_share(self, where: str = "distill_weight") -> DistillConfig:
        """This config, refused unless ``weight`` is a share in [0, 1], as classification's blend needs."""
        if not 0.0 <= self.weight <= 1.0:  # (1 - weight) * CE: above 1 the loss rewards wrong labels
            raise ConfigError(f"{where} must be in [0, 1] for classification (the loss is (1 - w) * CE + w * KD, "
                              f"so w > 1 makes the cross-entropy term negative), got {self.weight:g}; "
                              "e.g. 0.5 weighs them equally")
        return self


def logits_kd(student: torch.Tensor, teacher: torch.Tensor, temperature: float) -> torch.Tensor:
    """T^2 * KL(softmax(teacher / T) || softmax(student / T)), averaged over the batch."""
    t = temperature
    return F.kl_div(F.log_softmax(student / t, dim=1), F.log_softmax(teacher / t, dim=1), reduction="batchmean",
                    log_target=True) * t * t


def classification_loss(student: torch.Tensor, labels: torch.Tensor, teacher: torch.Tensor | None,
                        config: DistillConfig | None, label_smoothing: float = 0.0) -> torch.Tensor:
    """Cross-entropy, blended with logits KD when a teacher's logits are given."""
    ce = F.cross_entropy(student, labels, label_smoothing=label_smoothing)
    if teacher is None or config is None:
        return ce
    return (1 - config.weight) * ce + config.weight * logits_kd(student, teacher, config.temperature)


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


__all__ = ["DetectDistillLoss", "DistillConfig", "classification_loss", "detect_kd", "logits_kd"]
