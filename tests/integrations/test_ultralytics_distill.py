"""YOLO output distillation (``prunefx.integrations.ultralytics.distill``): it adds a term to ultralytics' loss."""

from __future__ import annotations

import torch

from prunefx.integrations.ultralytics.distill import DetectDistillLoss
from prunefx.train.distill import DistillConfig


def test_yolo_output_kd_adds_a_term_to_ultralytics_loss() -> None:
    from ultralytics.cfg import get_cfg
    from ultralytics.nn.tasks import DetectionModel

    torch.manual_seed(0)
    student, teacher = (DetectionModel("yolov8n.yaml", nc=4, verbose=False) for _ in range(2))
    student.args = get_cfg()
    student.train()
    batch = {"img": torch.rand(2, 3, 64, 64), "cls": torch.tensor([[0.0], [2.0]]),
             "bboxes": torch.tensor([[0.5, 0.5, 0.3, 0.3], [0.3, 0.4, 0.2, 0.2]]),
             "batch_idx": torch.tensor([0.0, 1.0])}
    base = student.init_criterion()
    preds = student(batch["img"])
    plain, items = base(preds, batch)
    record: list[float] = []
    wrapped = DetectDistillLoss(base, teacher, DistillConfig(temperature=1.0, weight=1.0), student.model[-1].reg_max,
                                record=record)
    total, items_kd = wrapped(preds, batch)
    assert torch.allclose(total[: plain.numel()], plain.reshape(-1))  # the task loss is untouched
    assert total.sum() > plain.sum() and len(record) == 1 and record[0] > 0
    assert abs(total[-1].item() - record[0] * 2) < 1e-5  # weight x KD x batch size, ultralytics' loss scale
    assert set(items_kd) == set(items)  # logged loss columns keep the task's names
    total.sum().backward()
    assert any(p.grad is not None and p.grad.abs().sum() > 0 for p in student.model[-1].parameters())
    assert hasattr(wrapped, "update") == hasattr(base, "update")  # the trainer's per-epoch call reaches the task loss
