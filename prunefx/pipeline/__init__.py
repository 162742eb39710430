"""End-to-end pipelines driven by a YAML config: ``prunefx prune configs/yolo.yaml key=value ...``.

``run_config`` reads the config, applies the overrides, validates everything, and runs the one stage loop
(:mod:`prunefx.pipeline.runner`) with the backend the config's ``task`` and model call for
(:mod:`prunefx.pipeline.registry`): ``task: custom`` (:mod:`~prunefx.pipeline.backends.custom`) and ``task: llm``
(:mod:`~prunefx.pipeline.backends.llm`) whatever the model; otherwise ultralytics models (a model yaml or an
ultralytics checkpoint) with :mod:`~prunefx.pipeline.backends.yolo`, classifiers (``torchvision:NAME``,
``package.module:factory``) with :mod:`~prunefx.pipeline.backends.classify`.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Sequence
from pathlib import Path

from prunefx.pipeline.run_config import ConfigError, PruneSpec, apply_overrides, load_config
from prunefx.pipeline.rundir import RunDir


def run_config(path: str | os.PathLike[str], overrides: Sequence[str] = (), *,
               log: Callable[[str], None] = print) -> RunDir | None:
    """Load, validate and run the pipeline config at ``path``; returns the finished run directory.

    None in the ranks other than 0 of a torchrun launch (rank 0 holds the run).
    """
    config = load_config(path, overrides)
    from prunefx.pipeline.registry import pipeline_of

    # the task decides first (an unknown one is an error naming the known ones), then the model's family
    return pipeline_of(config).load()(config, Path(path).stem, log)


__all__ = ["ConfigError", "PruneSpec", "RunDir", "apply_overrides", "load_config", "run_config"]
