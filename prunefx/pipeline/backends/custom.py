"""The custom-task backend (``task: custom``): the user's trained model, data, metric and loss, recovered by KD.

    prunefx prune configs/sine.yaml trust_code=true

A config names Python callables (``package.module:function``), which run as code, so ``trust_code: true`` must be
given (in the file or as ``trust_code=true`` on the command line):

* ``model``: returns the trained model (``checkpoint:`` a state_dict file loaded into it, weights-only, if given).
* ``data``: returns ``{"train": batches, "val": batches}``, each batch an ``(inputs, targets)`` pair; ``inputs`` is
  the model's one positional input (a tensor), a tuple of them or a dict of keyword inputs. A split is a list or a
  re-iterable with a length (a DataLoader): it is passed over, never copied into memory (only the first batches
  that calibration needs are read ahead).
* ``metric``: ``metric(model, val_batches)`` -> a number or a dict of numbers; the first is the one compared,
  higher is better unless its name says otherwise (``mse``, ``loss``, ``ppl``, ...: ``job.higher_is_better``)
  or ``prune.finetune.metric_goal: min`` is given.
* ``task_loss`` (optional): ``task_loss(outputs, batch)`` -> a scalar tensor, mixed into the recovery.

Stages: **baseline** (the model as given: its metric; nothing is trained from scratch), **prune** (the plan,
rewrite and oracle; ``prune.refit`` / ``scope: sensitivity`` use the first training batches), **finetune**
(:func:`prunefx.train.recover`: distillation from the baseline on the training batches, ``prune.finetune.epochs``
passes over them, mixed with ``task_loss`` when given; ``distill: false`` trains on ``task_loss`` alone; the best
evaluation's state is kept, and when the fine-tuned metric is still worse than the cut's, the cut is kept as the
final weights and the report says so) and
**report** (MACs, params, latency, the metric before, after the cut and after recovery). Resumable like every run.
"""

from __future__ import annotations

import copy
import itertools
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from torch import nn
from torch.utils._pytree import tree_map_only

from prunefx._config import field_names, from_dict
from prunefx.capture.inputs import Inputs, positional
from prunefx.errors import PrunefxError
from prunefx.metrics import Deployment
from prunefx.pipeline.job import (
    RECOVERY_DIR,
    WIDTH_AND_DEPTH,
    Job,
    ModelRole,
    Start,
    Trained,
    higher_is_better,
    saved_plans,
)
from prunefx.pipeline.run_config import RUN_KEYS, ConfigError, PruneSpec, StageSpec, check_keys
from prunefx.pipeline.rundir import RunDir, recovery_checkpoint
from prunefx.pipeline.runner import run_job
from prunefx.spec import SpecError, call_factory, resolve_factory
from prunefx.train.distributed import LOCAL
from prunefx.train.recover import RecoverConfig, recover
from prunefx.train.sparsity import SparsityConfig
from prunefx.train.user_code import UserCodeError, fenced

STAGES = ("baseline", "prune", "finetune", "report")
_CALLABLES = ("model", "data", "metric", "task_loss")
TOP_KEYS = ("task", *_CALLABLES, "checkpoint", "trust_code", "prune", *RUN_KEYS)
# prune.finetune keys: RecoverConfig's, less those the stage derives (steps from epochs, the KD mix from distill_*)
FINETUNE_KEYS = tuple(k for k in field_names(RecoverConfig) if k not in ("steps", "temperature", "task_weight"))


@dataclass(frozen=True)
class CustomJob(Job):
    """A validated custom-task config."""

    model: str = ""
    data: str = ""
    metric: str = ""
    task_loss: str | None = None
    checkpoint: str | None = None
    distill: bool = True  # prune.finetune.distill, default on here: recovery is distillation unless told otherwise

    @classmethod
    def from_config(cls, config: Mapping[str, Any], *, config_name: str = "custom") -> CustomJob:
        """Check every key and that the callables resolve, before any work; raises :class:`ConfigError`."""
        check_keys(config, TOP_KEYS, "the config (custom task: model, data, metric, task_loss, trust_code, prune:)")
        if config.get("trust_code") is not True:
            raise ConfigError("a custom-task config runs the Python it names (model, data, metric, task_loss); "
                              "add trust_code: true to the config, or trust_code=true on the command line, if you "
                              "trust that code")
        for key in ("model", "data", "metric"):
            if not isinstance(config.get(key), str) or ":" not in config[key]:
                raise ConfigError(f"{key} must name a function as package.module:function, got {config.get(key)!r}")
        spec, distill = cls.recovery_spec(config, "a custom task")
        if not distill and config.get("task_loss") is None:
            raise ConfigError("prune.finetune.distill is false and no task_loss is given: nothing to recover with; "
                              "set distill: true or name a task_loss")
        checkpoint = config.get("checkpoint")
        job = cls.build(config, config_name, spec, model=config["model"], data=config["data"],
                        metric=config["metric"], task_loss=config.get("task_loss"),
                        checkpoint=None if checkpoint is None else str(checkpoint), distill=bool(distill),
                        stages=STAGES)
        job.recover_config()  # the finetune block's keys are RecoverConfig's: checked now, not after the cut
        return job

    @staticmethod
    def recovery_spec(config: Mapping[str, Any], what: str, **defaults: Any) -> tuple[PruneSpec, bool]:
        """The ``prune:`` block of a task whose model comes trained (nothing from scratch: no sparsity, no
        controls), its fine-tuning a recovery that distills unless told ``distill: false``; and that flag.

        ``refit`` defaults to true here (unless bias compensation is asked for, which it replaces): a trained
        model's data is at hand, and the re-fit kept 95-99% of trained CNNs' top-1 right after the cut where
        every plan without it fell near chance (``experiments/trained_plans.py``), the sine regressor's R^2 0.998
        instead of 0.879, in about a second."""
        block = dict(config.get("prune") or {})
        if not block.get("bias_compensation"):
            defaults = {"refit": True, **defaults}
        finetune = dict(block.get("finetune") or {})
        for key in ("sparsity", "controls"):
            if block.get(key):
                raise ConfigError(f"prune.{key} trains from scratch, which {what} does not (the model comes "
                                  f"trained); remove prune.{key}")
        distill = finetune.get("distill", True)
        spec = PruneSpec.parse({**defaults, **block, "finetune": {**finetune, "distill": distill}},
                               train_keys=FINETUNE_KEYS)
        return spec, bool(distill)

    def check_inputs(self) -> None:
        for key in _CALLABLES:
            spec = getattr(self, key)
            if spec is not None:
                try:
                    resolve_factory(spec)
                except SpecError as exc:
                    raise ConfigError(f"{key}: {exc}") from exc
        if self.checkpoint is not None and not Path(self.checkpoint).is_file():
            raise ConfigError(f"checkpoint {self.checkpoint} not found; give the path of a state_dict file")

    def recover_config(self, batches: int = 1, metric_goal: str = "max") -> RecoverConfig:
        """The recovery of ``prune.finetune``: its keys, ``epochs`` passes over ``batches`` training batches; the
        best evaluation by the metric going ``metric_goal`` unless ``prune.finetune.metric_goal`` says otherwise."""
        ft = self.prune.finetune
        mix = {"temperature": ft.distill_config.temperature,
               "task_weight": 1.0 - ft.distill_config.weight if self.distill else 1.0}
        if self.task_loss is None:
            mix["task_weight"] = 0.0
        try:
            # a checkpoint every epoch unless the config says otherwise: resume=true continues from the last one
            return from_dict(RecoverConfig, {"checkpoint_every": batches, "metric_goal": metric_goal,
                                             **ft.overrides, **mix,
                                             "steps": max(1, ft.epochs * batches)}, "prune.finetune")
        except PrunefxError as exc:
            raise ConfigError(str(exc)) from exc


class CustomBackend:
    """The runner's view of a custom task (see :class:`prunefx.pipeline.job.Backend`)."""

    dist = LOCAL
    cuts = WIDTH_AND_DEPTH  # saved with prunefx.save, which takes [DepthPlan, PruningPlan]
    baseline_epochs = 0
    chance = None
    _first: Any = None  # the first training batch, read ahead by _load_data

    def __init__(self, job: CustomJob, log: Callable[[str], None] = print) -> None:
        self.job, self.log = job, log
        self.root: Path | None = None
        self.name = job.model
        self.checkpoint = job.checkpoint or job.model  # the baseline is the model as given: never trained here
        self._model = self._build()
        self._data = self._load_data()
        # user code: whatever it raises (or a sys.exit) is one line naming it, never a traceback or a silent exit
        self._metric = fenced(resolve_factory(job.metric), "metric", name=job.metric)
        self._task_loss = (fenced(resolve_factory(job.task_loss), "task_loss", name=job.task_loss) if job.task_loss
                           else None)
        self._models: dict[str, nn.Module] = {}
        # The metric checked on the model as given before any run directory exists; the baseline stage reuses it.
        self._baseline_metrics = self._evaluate(self._model)
        self.primary_metric = next(iter(self._baseline_metrics))  # the key the recovery's evaluations report

    @property
    def metric_goal(self) -> str | None:
        """Which way the metric improves: ``prune.finetune.metric_goal`` when given, else None (by its name, as
        :func:`prunefx.pipeline.job.higher_is_better` reads it)."""
        return self.job.prune.finetune.overrides.get("metric_goal")

    def _build(self) -> nn.Module:
        from prunefx.pipeline.classify_model import load_weights

        model = call_factory(self.job.model, resolve_factory(self.job.model))
        if self.job.checkpoint is not None:
            load_weights(model, self.job.checkpoint, self.job.model, trust_checkpoint=self.job.run.trust_checkpoint)
        return model.eval()

    def _load_data(self) -> dict[str, Iterable[Any]]:
        spec = self.job.data
        data = fenced(resolve_factory(spec), "data function", name=spec)()
        if not isinstance(data, Mapping) or not {"train", "val"} <= set(data):
            raise ConfigError(f"data: {spec} returned {type(data).__name__}; return a dict with 'train' and 'val' "
                              "batches, each batch an (inputs, targets) pair")
        out, firsts = {}, {}
        for split in ("train", "val"):
            batches = data[split]
            # passed over once per epoch and by the metric (a generator would be empty the second time), and the
            # recovery's step count is epochs x batches: a re-iterable with a length
            reading = {"name": f"{spec}'s {split} split", "fix": "fix the dataset or loader"}
            try:
                size = (fenced(len, "data", **reading)(batches)
                        if not isinstance(batches, Iterator) and isinstance(batches, Iterable) else None)
            except UserCodeError as exc:
                if not isinstance(exc.__cause__, TypeError):
                    raise
                size = None  # a DataLoader over an IterableDataset without a length
            if size is None:
                raise ConfigError(f"data: {spec}'s {split} split is a {type(batches).__name__} without a length or "
                                  "that passes only once; give a list of batches or a DataLoader over a Dataset")
            first = fenced(lambda b: next(iter(b), None), "data", **reading)(batches) if size else None
            if first is None:
                raise ConfigError(f"data: {spec}'s {split} split has no batch")
            held = batches if isinstance(batches, Sequence) else [first]  # a loader's batches are read when used
            bad = next((i for i, b in enumerate(held) if not (isinstance(b, (tuple, list)) and len(b) == 2)), None)
            if bad is not None:
                raise ConfigError(f"data: {spec}'s {split} batch {bad} is a {type(held[bad]).__name__}, not an "
                                  "(inputs, targets) pair; yield (x, y) batches")
            out[split], firsts[split] = batches, first
        first_train = self._first = firsts["train"]  # the example inputs: fixed even if the loader shuffles
        try:
            with torch.no_grad():
                self._model(*_positional(self._model, first_train[0]))
        except (Exception, SystemExit) as exc:  # the model cannot take the data's inputs
            raise ConfigError(f"data: the model {self.job.model} cannot take {spec}'s training inputs "
                              f"({type(exc).__name__}: {str(exc).splitlines()[0][:200]}); yield batches of "
                              "(model inputs, targets)") from exc
        return out

    def _evaluate(self, model: nn.Module) -> dict[str, float]:
        from prunefx.train.recover import _number

        was = model.training
        model.eval()
        try:
            raw = self._metric(model, self._data["val"])  # fenced: its own failures name it already
        finally:
            model.train(was)
        try:
            value = _number(raw)
        except PrunefxError as exc:
            raise ConfigError(f"metric: {self.job.metric}: {exc}") from exc
        metrics = dict(value) if isinstance(value, dict) else {"metric": value}
        if not metrics:
            raise ConfigError(f"metric: {self.job.metric} returned an empty dict; return a number or a dict of them")
        return metrics

    # ---- the runner's Backend --------------------------------------------------------------------------------

    def architecture(self) -> nn.Module:
        return self._model

    def example_inputs(self) -> tuple[Any, ...]:
        return tree_map_only(torch.Tensor, lambda t: t[:1], self.prune_inputs())

    def prune_inputs(self) -> tuple[Any, ...]:
        # the batch _load_data read ahead (a shuffling loader yields another first batch on every pass); a subclass
        # loading its own lists of batches has none: its first batch is the same on every pass
        first = self._first if self._first is not None else next(iter(self._data["train"]))
        return _positional(self._model, first[0])

    def score_kwargs(self, criterion: str) -> dict[str, Any]:
        return {}

    @property
    def calibration_source(self) -> str:
        return f"the first training batches of {self.job.data}"

    def calibration(self, batches: int) -> list[Any]:
        # lists: positional inputs, never read as an (inputs, targets) pair however many the model takes
        read = fenced(lambda n: list(itertools.islice(self._data["train"], n)), "data",
                      name=f"{self.job.data}'s train split", fix="fix the dataset or loader")
        return [list(_positional(self._model, x)) for x, _ in read(batches)]

    def from_checkpoint(self) -> nn.Module:
        return copy.deepcopy(self._model)

    def fresh(self) -> nn.Module:
        raise PrunefxError("a custom task trains nothing from scratch (prune.controls is refused)")

    def train(self, out: ModelRole, start: Start, stage: StageSpec, sparsity: SparsityConfig | None) -> Trained:
        if out != "finetuned" or start != "pruned":
            raise PrunefxError(f"a custom task trains only the recovery of the pruned model, not {out} from {start}")
        train = self._data["train"]
        config = self.job.recover_config(len(train), "max" if higher_is_better(self) else "min")
        student = self.load("pruned")
        ckpt = self.path("finetuned").with_name(RECOVERY_DIR)
        result = recover(student, self.load("baseline"), train, config=config, inputs=lambda batch: batch[0],
                         task_loss=self._task_loss, eval_data=self._data["val"],
                         metric=lambda model: self._evaluate(model)[self.primary_metric], log=self.log,
                         checkpoint_dir=ckpt, resume=recovery_checkpoint(ckpt))
        self.save(student, "finetuned", self._pruned_plan())
        history = [{"step": h["step"], "loss": h["loss"], "lr": h["lr"]} for h in result.history]
        distill = {"teacher": "baseline", "losses": dict(result.losses), "steps": result.steps,
                   "task_weight": config.task_weight, "temperature": config.temperature,
                   "outputs": dict(result.outputs or {}), "kept": result.kept,
                   "worse_than_start": result.worse_than_start}
        return Trained(student, history, distill)

    def load(self, role: ModelRole) -> nn.Module:
        if role == "baseline":
            return copy.deepcopy(self._model)
        if role not in self._models:
            from prunefx import load

            self._models[role] = load(self.path(role), lambda: copy.deepcopy(self._model))
        return copy.deepcopy(self._models[role])

    def save(self, model: nn.Module, role: ModelRole, plan: Any = None) -> None:
        if role == "baseline":
            return  # the user's model, as given
        from prunefx import save

        save(model, plan, self.path(role))
        self._models[role] = copy.deepcopy(model)

    def path(self, role: ModelRole) -> Path:
        assert self.root is not None, "the runner sets root once the run directory is open"
        (self.root / "weights").mkdir(exist_ok=True)
        return self.root / "weights" / f"{role}.pt"

    def evaluate(self, role: ModelRole, model: nn.Module, *, alone: bool = False) -> dict[str, float]:
        metrics = dict(self._baseline_metrics) if role == "baseline" else self._evaluate(model)
        self.log(f"  {role}: " + ", ".join(f"{k} {v:.4g}" for k, v in metrics.items()))
        return metrics

    def extra_costs(self, model: nn.Module) -> dict[str, float]:
        return {}

    def deployment(self) -> Deployment | None:
        return None

    def settings(self) -> dict[str, Any]:
        return {"model": self.job.model, "data": self.job.data, "metric": self.job.metric,
                "task_loss": self.job.task_loss, "batches": {k: len(v) for k, v in self._data.items()},
                "input_shapes": [list(x.shape) for x in self.example_inputs()]}

    def _pruned_plan(self) -> Any:
        """The prune stage's plan(s), as it wrote them (also after a resume)."""
        assert self.root is not None
        return saved_plans(self.root)


def _positional(model: nn.Module, inputs: Any) -> tuple[Any, ...]:
    """A batch's model inputs as ``model(*inputs)`` takes them (keyword inputs bound by its forward)."""
    if isinstance(inputs, (torch.Tensor, tuple, list, Mapping, Inputs)):
        try:
            return positional(model, inputs)
        except PrunefxError as exc:
            raise ConfigError(f"data: {exc}") from None
    raise ConfigError(f"a batch's inputs are a {type(inputs).__name__}; the custom pipeline takes a tensor, a "
                      "tuple of positional inputs or a dict of keyword inputs")


def run_custom_config(config: Mapping[str, Any], config_name: str, log: Callable[[str], None]) -> RunDir:
    """The custom-task pipeline of a loaded config (``task: custom``)."""
    return run_custom(CustomJob.from_config(config, config_name=config_name), log=log)


def run_custom(job: CustomJob, *, log: Callable[[str], None] = print) -> RunDir:
    """Run (or resume) every stage of ``job``; returns the finished run directory."""
    return run_job(job, CustomBackend(job, log), log=log)


__all__ = ["STAGES", "CustomBackend", "CustomJob", "run_custom", "run_custom_config"]
