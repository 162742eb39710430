"""Knowledge distillation: off by default, and when on it changes the loss (classification; YOLO output KD:
tests/integrations/test_ultralytics_distill.py)."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from torch import nn

from prunefx._config import ConfigError
from prunefx.pipeline.run_config import PruneSpec
from prunefx.train.distill import DistillConfig, classification_loss, logits_kd


def test_distillation_is_off_by_default() -> None:
    from prunefx.integrations.ultralytics.train import TrainHooks

    assert PruneSpec().finetune.distill is False
    assert PruneSpec.parse({"finetune": {"epochs": 3}}, train_keys=set()).finetune.distill is False
    assert TrainHooks().teacher is None


def test_logits_kd_changes_the_classification_loss() -> None:
    torch.manual_seed(0)
    student, teacher = torch.randn(8, 10, requires_grad=True), torch.randn(8, 10)
    labels = torch.randint(0, 10, (8,))
    plain = classification_loss(student, labels, None, None)
    assert torch.equal(plain, nn.functional.cross_entropy(student, labels))
    cfg = DistillConfig(temperature=2.0, weight=0.5)
    kd = classification_loss(student, labels, teacher, cfg)
    assert not torch.isclose(kd, plain)
    assert torch.isclose(kd, 0.5 * plain + 0.5 * logits_kd(student, teacher, 2.0))
    assert logits_kd(teacher, teacher, 2.0).abs() < 1e-6  # a student equal to its teacher pays nothing
    kd.backward()
    assert student.grad is not None and student.grad.abs().sum() > 0


def test_fit_with_a_teacher_trains_on_a_different_loss() -> None:
    from prunefx.data.classification import TensorSplit
    from prunefx.train import TrainConfig, fit

    torch.manual_seed(0)
    data = TensorSplit(torch.randn(64, 1, 8, 8), torch.randint(0, 4, (64,)))

    def net() -> nn.Module:
        torch.manual_seed(1)
        return nn.Sequential(nn.Flatten(), nn.Linear(64, 4))

    cfg = TrainConfig(epochs=1, batch=32, augment=())
    plain = fit(net(), data, cfg, log=lambda _: None).history[0]["loss"]
    teacher = nn.Sequential(nn.Flatten(), nn.Linear(64, 4))
    with_kd = fit(net(), data, cfg, log=lambda _: None, teacher=teacher).history[0]["loss"]
    assert with_kd != plain


def test_a_distill_weight_outside_0_1_is_refused_for_classification(tmp_path) -> None:
    from prunefx.data.classification import TensorSplit
    from prunefx.pipeline.backends.classify import ClassifyJob
    from prunefx.pipeline.run_config import load_config
    from prunefx.train import TrainConfig, fit

    digits = Path(__file__).resolve().parents[2] / "configs" / "digits_cnn.yaml"
    message = r"prune\.finetune\.distill_weight must be in \[0, 1\] for classification \(the loss is \(1 - w\) \* CE"
    with pytest.raises(ConfigError, match=message + r".*got 5;"):
        ClassifyJob.from_config(load_config(digits, [f"project={tmp_path}", "prune.finetune.distill_weight=5"]))
    job = ClassifyJob.from_config(load_config(digits, [f"project={tmp_path}", "prune.finetune.distill_weight=1"]))
    assert job.prune.finetune.distill_config.weight == 1.0  # all KD: the edge of the range
    # YOLO adds weight x KD to the task loss: any multiplier >= 0 is meaningful there
    assert PruneSpec.parse({"finetune": {"distill_weight": 5}}, train_keys=set()).finetune.distill_config.weight == 5
    model = nn.Sequential(nn.Flatten(), nn.Linear(64, 4))
    data = TensorSplit(torch.randn(8, 1, 8, 8), torch.zeros(8, dtype=torch.long))
    before = [p.detach().clone() for p in model.parameters()]
    with pytest.raises(ConfigError, match=r"distill\.weight must be in \[0, 1\] for classification .* got 1\.5;"):
        fit(model, data, TrainConfig(epochs=1, batch=8, augment=()), log=lambda _: None,
            teacher=nn.Sequential(nn.Flatten(), nn.Linear(64, 4)), distill=DistillConfig(weight=1.5))
    assert all(torch.equal(p, b) for p, b in zip(model.parameters(), before, strict=True))  # refused before a step
