"""Which pipeline runs a config, and reads its finished runs back: registered by name, imported on first use.

A config's ``task`` decides first: a task that owns its pipeline (``custom``, ``llm``) runs it whatever the model
is, an unknown task is an error with the known ones; otherwise the family the ``model`` resolves to
(:func:`prunefx.spec.config_family`, by the string's form: nothing is imported) picks it. An integration that adds
a family registers its pipeline the same way::

    register_pipeline("ultralytics", "prunefx.pipeline.backends.yolo:run_yolo_config", needs="ultralytics",
                      read_back="prunefx.pipeline.readback:yolo_final")

The targets are ``"module:function"`` strings written in code, never names read from a config or a run.
"""

from __future__ import annotations

import difflib
import importlib
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from prunefx._extras import require
from prunefx._registry import put
from prunefx.pipeline.run_config import ConfigError

if TYPE_CHECKING:
    from prunefx.pipeline.rundir import RunDir

# config, its name (the run's default name), log -> the finished run directory (None in torchrun ranks > 0)
PipelineRun = Callable[[Mapping[str, Any], str, Callable[[str], None]], "RunDir | None"]
# the tasks a family's own pipeline serves (ultralytics' tasks; a torch classifier's "classify")
FAMILY_TASKS = ("classify", "detect", "segment", "pose", "obb")


@dataclass(frozen=True)
class Pipeline:
    """A registered pipeline: its run and read-back functions (``"module:function"``), the package it needs."""

    target: str
    needs: str | None = None
    what: str = ""  # how the missing-package line names the pipeline
    # "module:function", a prunefx.pipeline.readback.ReadBack: the final model of a finished run of this pipeline
    read_back: str = ""
    marks: tuple[str, ...] = ()  # config keys only this task's configs have: a config without task: is told so

    def load(self) -> PipelineRun:
        """The pipeline's run function, its package checked first."""
        return self._import(self.target)

    def _import(self, target: str) -> Any:
        if self.needs is not None:
            require(self.needs, self.what or f"the {self.target} pipeline")
        module, _, attr = target.partition(":")
        return getattr(importlib.import_module(module), attr)


_READ = "prunefx.pipeline.readback"
_PIPELINES: dict[str, Pipeline] = {}
_BUILT_IN: dict[str, Pipeline] = {
    "torch": Pipeline("prunefx.pipeline.backends.classify:run_classify_config", read_back=f"{_READ}:classify_final"),
    "ultralytics": Pipeline("prunefx.pipeline.backends.yolo:run_yolo_config", "ultralytics", "the YOLO pipeline",
                            f"{_READ}:yolo_final"),
    # "*/task": a task that owns its pipeline, whatever the model (an LLM's model is a checkpoint directory)
    "*/custom": Pipeline("prunefx.pipeline.backends.custom:run_custom_config", "accelerate", "the custom-task "
                         "pipeline (recovery by prunefx.recover)", f"{_READ}:custom_final",
                         marks=("metric", "task_loss")),
    "*/llm": Pipeline("prunefx.pipeline.backends.llm:run_llm_config", "transformers", "the language-model pipeline "
                      "(task: llm)", f"{_READ}:llm_final", marks=("text", "tokenizer", "seq_len", "train_batches",
                                                                   "val_batches")),
}
for _key, _pipeline in _BUILT_IN.items():
    put(_PIPELINES, _key, _pipeline, what="register_pipeline", depth=1)  # recorded as prunefx's own
# `prunefx prune SPEC`: no config to run, a one-shot run directory to read back (its config.yaml has `spec:`)
SPEC_RUN = Pipeline("prunefx.pipeline.backends.spec:run_spec", read_back=f"{_READ}:spec_final")


def register_pipeline(family: str, target: str, *, needs: str | None = None, what: str = "",
                      task: str | None = None, read_back: str = "", marks: tuple[str, ...] = (),
                      replace: bool = False) -> None:
    """Run configs whose model belongs to ``family`` (``"*"``: any model, the task decides) and whose ``task`` is
    ``task``, when given, with ``target`` (``"module:function"``, a :data:`PipelineRun`); ``read_back`` reads its
    finished runs (:class:`prunefx.pipeline.readback.ReadBack`; empty: ``prunefx export`` says it cannot).
    Replacing a built-in pipeline warns (:class:`~prunefx.errors.RegistryOverrideWarning`) unless ``replace``."""
    put(_PIPELINES, family if task is None else f"{family}/{task}", Pipeline(target, needs, what, read_back, marks),
        what="register_pipeline", replace=replace)


def known_tasks() -> tuple[str, ...]:
    """Every ``task:`` a config may give."""
    return tuple(sorted({*FAMILY_TASKS, *(k.partition("/")[2] for k in _PIPELINES if "/" in k)}))


def pipeline_of(config: Mapping[str, Any]) -> Pipeline:
    """The pipeline that runs ``config``: its ``task`` first (ConfigError for an unknown one), then its model's
    family; nothing is imported."""
    from prunefx.spec import config_family

    task = config.get("task")
    if task is not None:
        tasks = known_tasks()
        if not isinstance(task, str):
            raise ConfigError(f"task must be one name, got {task!r}; task is one of: {', '.join(tasks)}")
        if task not in tasks:
            close = difflib.get_close_matches(task, tasks, n=1)
            hint = f" (did you mean {close[0]!r}?)" if close else ""
            raise ConfigError(f"unknown task {task!r}{hint}; task is one of: {', '.join(tasks)}")
        if f"*/{task}" in _PIPELINES:
            return _PIPELINES[f"*/{task}"]
    else:
        for key, pipeline in _PIPELINES.items():
            found = [k for k in pipeline.marks if k in config]
            if key.startswith("*/") and found:
                own = key[2:]
                raise ConfigError(f"the config has no task:, but {', '.join(found)} belong to task: {own}; add "
                                  f"task: {own} (or task=classify / task=detect for the model's own pipeline)")
    family = config_family(config.get("model")).name
    return _family_pipeline(family, task)


def _family_pipeline(family: str, task: str | None) -> Pipeline:
    try:
        return _PIPELINES.get(f"{family}/{task}") or _PIPELINES[family]
    except KeyError:
        known = ", ".join(sorted(k for k in _PIPELINES if not k.startswith("*/")))
        tasks = ", ".join(sorted(k[2:] for k in _PIPELINES if k.startswith("*/")))
        raise ConfigError(f"no pipeline for models of the {family!r} family (pipelines: {known}; for any model, "
                          f"task: {tasks}); register one with prunefx.pipeline.registry.register_pipeline") from None


def pipeline_for(family: str, task: str | None = None) -> PipelineRun:
    """The run function registered for ``task`` (a task that owns its pipeline), else for ``family`` and
    ``task``, else for ``family``; ConfigError names the families that have one."""
    pipeline = _PIPELINES.get(f"*/{task}") or _family_pipeline(family, task)
    return pipeline.load()


__all__ = ["FAMILY_TASKS", "SPEC_RUN", "Pipeline", "PipelineRun", "known_tasks", "pipeline_for", "pipeline_of",
           "register_pipeline"]
