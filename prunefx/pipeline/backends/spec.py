"""The one-shot backend of ``prunefx prune SPEC``: a model already in memory, pruned once, nothing trained.

    job = Job(prune=PruneSpec(plan=PlanConfig(flops=0.5)), run=RunOptions(name="r18"), stages=ONE_SHOT)
    run = run_spec(job, load_spec("torchvision:resnet18"), Path("runs/prune/r18"))

The runner's baseline, prune and report stages do the work; this backend only holds the model and writes
``pruned.pt`` next to the report, as the model's family writes it (an ultralytics checkpoint for YOLO, else a
``prunefx.save`` file). The run is built in a sibling temp directory and moved into place once complete: a refusal
or a failure leaves nothing.
"""

from __future__ import annotations

import copy
import shutil
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
from torch import nn
from torch.utils._pytree import tree_leaves

from prunefx._io import storage_error
from prunefx.errors import PrunefxError
from prunefx.metrics import Deployment
from prunefx.pipeline.job import WIDTH_ONLY, Job, ModelRole, Start, Trained
from prunefx.pipeline.run_config import StageSpec
from prunefx.pipeline.rundir import RunDir, install
from prunefx.pipeline.runner import execute, preflight
from prunefx.spec import LoadedModel
from prunefx.train.distributed import LOCAL
from prunefx.train.sparsity import SparsityConfig


class SpecBackend:
    """Hands the runner a loaded SPEC's model; costs only, no task metrics (see ``prunefx.pipeline.job.Backend``)."""

    dist = LOCAL
    cuts = WIDTH_ONLY
    baseline_epochs = 0

    def __init__(self, loaded: LoadedModel, deployment: Deployment | None = None) -> None:
        self.loaded = loaded
        self._deployment = deployment
        self.root: Path | None = None
        self.name = loaded.name
        self.checkpoint = loaded.name  # the baseline is the model as loaded
        self._pruned: nn.Module | None = None

    def architecture(self) -> nn.Module:
        return self.loaded.model

    def example_inputs(self) -> tuple[torch.Tensor, ...]:
        return self.loaded.example_inputs

    def prune_inputs(self) -> tuple[torch.Tensor, ...]:
        return self.loaded.example_inputs

    def score_kwargs(self, criterion: str) -> dict[str, Any]:
        return {}

    calibration_source = "the example input only: a SPEC comes with no data"

    def calibration(self, batches: int) -> list[Any]:
        return [self.loaded.example_inputs]  # a SPEC comes with no data: its example input is the one batch

    def from_checkpoint(self) -> nn.Module:
        return self.loaded.model

    def train(self, out: ModelRole, start: Start, stage: StageSpec, sparsity: SparsityConfig | None) -> Trained:
        raise PrunefxError("prunefx prune SPEC trains nothing; give a pipeline config to train")

    def load(self, role: ModelRole) -> nn.Module:
        if role == "baseline":  # a copy: the prune stage rewrites what it loads, the report measures the original
            return copy.deepcopy(self.loaded.model)
        if self._pruned is None:
            raise PrunefxError(f"no {role} model in this one-shot run")
        return self._pruned

    def save(self, model: nn.Module, role: ModelRole, plan: Any = None) -> None:
        if role != "pruned":
            return  # the baseline is the SPEC itself: nothing to write
        self._pruned = model
        self.loaded.family.save(model, self.root / "pruned.pt", plan)

    def evaluate(self, role: ModelRole, model: nn.Module, *, alone: bool = False) -> dict[str, float]:
        return {}  # no data: the report compares costs

    def extra_costs(self, model: nn.Module) -> dict[str, float]:
        return self.loaded.family.extra_costs(model, self.loaded.example_inputs)

    def deployment(self) -> Deployment | None:
        return self._deployment

    def settings(self) -> dict[str, Any]:
        shapes = [list(x.shape) for x in tree_leaves(self.loaded.example_inputs) if isinstance(x, torch.Tensor)]
        return {"spec": self.loaded.name, "input_shapes": shapes}


def run_spec(job: Job, loaded: LoadedModel, out: Path, *, deployment: Deployment | None = None,
             log: Callable[[str], None] = print) -> RunDir:
    """Prune ``loaded`` once as ``job`` says (stages ``ONE_SHOT``) into ``out``; returns the complete run there."""
    backend = SpecBackend(loaded, deployment)
    preflight(job.prune, backend)
    try:
        out.parent.mkdir(parents=True, exist_ok=True)
        tmp = Path(tempfile.mkdtemp(dir=out.parent, prefix=f".{out.name}."))
    except OSError as exc:  # a read-only or forbidden directory: name --out, not the temp directory's name
        error = storage_error(exc, out, writing=True)
        if error is None:
            raise
        raise error from exc
    try:
        run = RunDir.open(tmp.parent, tmp.name, job.config, exist_ok=True)  # the empty temp directory, locked
        execute(job, backend, run, log=log)
        install(tmp, out)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    return RunDir.reload(out)


__all__ = ["SpecBackend", "run_spec"]
