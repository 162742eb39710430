"""Knowledge distillation from the unpruned model while fine-tuning the pruned one.

Classification: logits KD (Hinton et al.), ``loss = (1 - weight) * CE + weight * T^2 * KL(teacher_T || student_T)``
with both distributions softened by the temperature T. :class:`DistillConfig` is shared by every model family;
the output KD of ultralytics detection heads lives with that integration
(:mod:`prunefx.integrations.ultralytics.distill`).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F

from prunefx._config import ConfigError, check_fields


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


__all__ = ["DistillConfig", "classification_loss", "logits_kd"]
