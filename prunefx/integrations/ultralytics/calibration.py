"""Calibration batches for a re-fit or a sensitivity measurement: a dataset's first training images, as fed to a model.

Read through ultralytics' own datasets without augmentation, so the model sees what its validator gives it:
detection-family tasks (detect, segment, pose, obb) letterboxed to ``imgsz`` square and scaled to [0, 1]
(``YOLODataset`` in evaluation mode, as ``batch["img"].float() / 255``); classify through ``ClassificationDataset``'s
evaluation transforms. Training images, not validation ones: the metric a run reports stays measured on images the
re-fit never saw.

    batches = calibration_images("data.yaml", "detect", 640, batches=8)   # -> 8 tensors (16, 3, 640, 640)
"""

from __future__ import annotations

import torch

from prunefx.errors import PrunefxError

BATCH = 16  # images per calibration batch


def calibration_images(data: str, task: str, imgsz: int, batches: int, batch_size: int = BATCH) -> list[torch.Tensor]:
    """Up to ``batches`` batches of ``batch_size`` of the first training images of the ultralytics dataset ``data``."""
    from ultralytics.cfg import get_cfg

    cfg = get_cfg(overrides={"imgsz": imgsz, "task": task})
    if task == "classify":
        from ultralytics.data.dataset import ClassificationDataset
        from ultralytics.data.utils import check_cls_dataset

        info = check_cls_dataset(data)
        dataset = ClassificationDataset(root=str(info["train"]), args=cfg, augment=False)
        scale = 1.0  # its transforms already give floats in [0, 1]
    else:
        from ultralytics.data.build import build_yolo_dataset
        from ultralytics.data.utils import check_det_dataset

        info = check_det_dataset(data)
        dataset = build_yolo_dataset(cfg, info["train"], batch_size, info, mode="val", rect=False)
        scale = 1 / 255  # uint8 images: the validator's own preprocessing
    n = min(batches * batch_size, len(dataset))
    if n == 0:
        raise PrunefxError(f"the dataset {data} has no training images to calibrate on; add images to its train split")
    images = torch.stack([dataset[i]["img"] for i in range(n)]).float() * scale
    return list(images.split(batch_size))
