"""Train with ultralytics' own trainer: a pruned module handed over (never rebuilt from yaml), optional BN sparsity.

``YOLO("pruned.pt").train()`` rebuilds the *unpruned* architecture from ``model.yaml`` and copies the tensors that
still fit. Instead the task's trainer is built from arguments and given the module itself: ``setup_model()``
keeps a ready ``nn.Module``, and for multi-GPU runs ultralytics pickles ``trainer.model`` and the callbacks into the
DDP workers' state file, so every worker trains this module. :class:`TrainHooks` is such a callback: it checks
in every process, after setup, that the model being trained is the one handed over (same parameter count) and
fails loudly otherwise; and it attaches network-slimming sparsity to the trainer's optimizer as an optimizer
pre-hook, i.e. after ultralytics' gradient clipping and AMP unscaling (see ``prunefx.train.BNSparsity``).

    best = train_yolo(pruned_model, {"data": "data.yaml", "epochs": 10, ...}, hooks=TrainHooks.for_model(pruned_model))
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from torch import nn

from prunefx.errors import PrunefxError
from prunefx.integrations.ultralytics.distill import DetectDistillLoss
from prunefx.integrations.ultralytics.io import load_yolo
from prunefx.train.distill import DistillConfig
from prunefx.train.loop import epoch_ended
from prunefx.train.sparsity import BNSparsity, SparsityConfig, sparsity_stats


def trainer_class(task: str) -> type:
    """The ultralytics trainer class of a task (detect, segment, pose, obb, classify)."""
    from ultralytics.models import yolo

    trainers = {
        "detect": yolo.detect.DetectionTrainer,
        "segment": yolo.segment.SegmentationTrainer,
        "pose": yolo.pose.PoseTrainer,
        "obb": yolo.obb.OBBTrainer,
        "classify": yolo.classify.ClassificationTrainer,
    }
    if task not in trainers:
        raise PrunefxError(f"no ultralytics trainer for task {task!r}; known: {', '.join(trainers)}")
    return trainers[task]


@dataclass
class TrainHooks:
    """Ultralytics callbacks (picklable, so DDP workers get them): model identity check and BN sparsity."""

    expected_params: int | None = None
    sparsity: SparsityConfig | None = None
    teacher: nn.Module | None = field(default=None, repr=False)  # output KD from it (prune.finetune.distill)
    distill: DistillConfig | None = None
    log: list[dict[str, Any]] = field(default_factory=list)
    _sp: BNSparsity | None = field(default=None, repr=False)
    _kd: list[float] = field(default_factory=list, repr=False)

    @classmethod
    def for_model(cls, model: nn.Module, sparsity: SparsityConfig | None = None, *, teacher: nn.Module | None = None,
                  distill: DistillConfig | None = None) -> TrainHooks:
        return cls(expected_params=param_count(model), sparsity=sparsity, teacher=teacher, distill=distill)

    def register(self, trainer: Any) -> None:
        trainer.add_callback("on_pretrain_routine_end", self.on_pretrain_routine_end)
        trainer.add_callback("on_train_epoch_end", self.on_train_epoch_end)

    def on_pretrain_routine_end(self, trainer: Any) -> None:
        from ultralytics.utils.torch_utils import unwrap_model

        model = unwrap_model(trainer.model)
        n = param_count(model)
        if self.expected_params is not None and n != self.expected_params:
            raise PrunefxError(
                f"the trainer is about to train a model with {n:,} parameters, not the {self.expected_params:,} of the "
                "model handed to it: ultralytics rebuilt it (e.g. from model.yaml). Hand the module over with "
                "prunefx.integrations.ultralytics.train.train_yolo instead of YOLO(path).train()"
            )
        if self.teacher is not None:
            self._attach_distillation(model, trainer)
        if self.sparsity is None:
            return
        steps_per_epoch = max(1, len(trainer.train_loader) // max(1, trainer.accumulate))
        total = steps_per_epoch * (trainer.epochs - trainer.start_epoch)
        self._sp = self.sparsity.regularizer(model, total).attach(trainer.optimizer)

    def _attach_distillation(self, model: nn.Module, trainer: Any) -> None:
        """The model's loss becomes task loss + output KD against the teacher (after EMA was copied, so the
        EMA model used for validation and saved checkpoints keeps the plain criterion)."""
        head = model.model[-1]
        if not hasattr(head, "reg_max"):
            raise PrunefxError(f"prune.finetune.distill: output KD needs a detection head (Detect and its subclasses); "
                               f"{type(head).__name__} is not one")
        teacher = self.teacher.to(trainer.device).float().eval().requires_grad_(False)
        model.criterion = DetectDistillLoss(model.init_criterion(), teacher, self.distill or DistillConfig(),
                                            int(head.reg_max), record=self._kd)

    def on_train_epoch_end(self, trainer: Any) -> None:
        if self._kd:
            self.log.append({"epoch": trainer.epoch + 1, "kd_loss": sum(self._kd) / len(self._kd)})
            self._kd.clear()
        if self._sp is None:
            return
        from ultralytics.utils.torch_utils import unwrap_model

        stats = sparsity_stats(unwrap_model(trainer.model), modules=list(self._sp.modules))
        self.log.append({"epoch": trainer.epoch + 1, "s": self._sp.step_s, **stats})

    def __getstate__(self) -> dict[str, Any]:
        state = dict(self.__dict__)
        state["_sp"] = None  # hooks on the parent's optimizer do not travel to DDP workers
        state["_kd"] = []
        return state


def train_yolo(
    model: nn.Module | str, args: Mapping[str, Any], *, task: str = "detect", hooks: TrainHooks | None = None
) -> tuple[Path, Path]:
    """Train ``model`` (a module, trained as is; or a model yaml, built by ultralytics); returns (best.pt, last.pt).

    ``args`` are ultralytics train arguments (data, epochs, imgsz, project, name, ...).
    """
    overrides = dict(args)
    overrides.setdefault("mode", "train")
    if isinstance(model, nn.Module):
        overrides["model"] = str(overrides.get("model") or getattr(model, "yaml_file", "") or "pruned")
        overrides["task"] = task
    else:
        overrides["model"] = str(model)
    trainer = trainer_class(task)(overrides=overrides)
    if isinstance(model, nn.Module):
        for p in model.parameters():
            p.requires_grad_(True)
        trainer.model = model.float().train()
    if hooks is not None:
        hooks.register(trainer)
    # after validation and the checkpoint: the epoch's bars are closed, so a job progress line prints cleanly
    trainer.add_callback("on_fit_epoch_end", _fit_epoch_ended)
    trainer.train()
    best, last = Path(trainer.best), Path(trainer.last)
    if not last.is_file():
        raise PrunefxError(f"ultralytics training finished without writing {last}")
    return (best if best.is_file() else last), last


def _fit_epoch_ended(trainer: Any) -> None:
    """Report the trainer's finished epoch to whoever listens (``prunefx.train.loop.listening_to_epochs``)."""
    # a module-level function: DDP workers unpickle callbacks by reference, and hear no listener there
    if trainer.epoch < trainer.epochs:  # final_eval runs this callback once more, at epoch epochs + 1
        epoch_ended(trainer.epoch + 1, trainer.epochs)


def param_count(model: nn.Module) -> int:
    return sum(p.numel() for p in model.parameters())


# load_yolo lives with save_yolo in io.py; pipelines import it from here too.
__all__ = ["SparsityConfig", "TrainHooks", "load_yolo", "param_count", "train_yolo", "trainer_class"]
