"""Which pipeline runs a config: one per model family, registered by name and imported on first use.

The config's ``model`` resolves to a family (:func:`prunefx.spec.config_family`); the pipeline registered for that
family's name runs the whole job. An integration that adds a family registers its pipeline the same way::

    register_pipeline("ultralytics", "prunefx.pipeline.backends.yolo:run_yolo_config", needs="ultralytics")
"""

from __future__ import annotations

import importlib
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from prunefx._extras import require
from prunefx.pipeline.run_config import ConfigError

if TYPE_CHECKING:
    from prunefx.pipeline.rundir import RunDir

# config, its name (the run's default name), log -> the finished run directory (None in torchrun ranks > 0)
PipelineRun = Callable[[Mapping[str, Any], str, Callable[[str], None]], "RunDir | None"]


@dataclass(frozen=True)
class Pipeline:
    """A registered pipeline: ``"module:function"`` and the package it needs (one line names the extra if missing)."""

    target: str
    needs: str | None = None
    what: str = ""  # how the missing-package line names the pipeline

    def load(self) -> PipelineRun:
        """The pipeline's run function, its package checked first."""
        if self.needs is not None:
            require(self.needs, self.what or f"the {self.target} pipeline")
        module, _, attr = self.target.partition(":")
        return getattr(importlib.import_module(module), attr)


_PIPELINES: dict[str, Pipeline] = {
    "torch": Pipeline("prunefx.pipeline.backends.classify:run_classify_config"),
    # a config's `task` picks among a family's pipelines: "family/task" is looked up before "family"
    "torch/custom": Pipeline("prunefx.pipeline.backends.custom:run_custom_config", "accelerate", "the custom-task "
                             "pipeline (recovery by prunefx.recover)"),
    "ultralytics": Pipeline("prunefx.pipeline.backends.yolo:run_yolo_config", "ultralytics", "the YOLO pipeline"),
    # "*/task": a task whose model is no factory of a family (a Hugging Face checkpoint directory)
    "*/llm": Pipeline("prunefx.pipeline.backends.llm:run_llm_config", "transformers", "the language-model pipeline "
                      "(task: llm)"),
}


def register_pipeline(family: str, target: str, *, needs: str | None = None, what: str = "",
                      task: str | None = None) -> None:
    """Run configs whose model belongs to ``family`` (``"*"``: any model) and whose ``task`` is ``task``, when
    given, with ``target`` (``"module:function"``, a :data:`PipelineRun`)."""
    _PIPELINES[family if task is None else f"{family}/{task}"] = Pipeline(target, needs, what)


def pipeline_for(family: str, task: str | None = None) -> PipelineRun:
    """The run function registered for ``family`` and ``task`` (else for ``family``); ConfigError names the
    families that have one."""
    try:
        pipeline = _PIPELINES.get(f"{family}/{task}") or _PIPELINES.get(f"*/{task}") or _PIPELINES[family]
    except KeyError:
        known = ", ".join(sorted(k for k in _PIPELINES if not k.startswith("*/")))
        tasks = ", ".join(sorted(k[2:] for k in _PIPELINES if k.startswith("*/")))
        raise ConfigError(f"no pipeline for models of the {family!r} family (pipelines: {known}; for any model, "
                          f"task: {tasks}); register one with prunefx.pipeline.registry.register_pipeline") from None
    return pipeline.load()


__all__ = ["Pipeline", "PipelineRun", "pipeline_for", "register_pipeline"]
