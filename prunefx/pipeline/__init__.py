"""End-to-end pipelines driven by a YAML config: ``prunefx prune configs/yolo.yaml key=value ...``.

``run_config`` reads the config, applies the overrides, validates everything, and runs the pipeline the config's
model calls for: ultralytics models (a model yaml or an ultralytics checkpoint) go through
:mod:`prunefx.pipeline.yolo`, classifiers (``torchvision:NAME``, ``package.module:factory``) through
:mod:`prunefx.pipeline.classify`.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Sequence
from pathlib import Path

from prunefx.pipeline.config import ConfigError, PruneSpec, apply_overrides, load_config
from prunefx.pipeline.rundir import RunDir


def is_config(path: str | os.PathLike[str]) -> bool:
    """True for an existing YAML file that is a pipeline config (it names a ``model``), not a model yaml."""
    p = Path(path)
    if p.suffix not in (".yaml", ".yml") or not p.is_file():
        return False
    import yaml

    try:
        d = yaml.safe_load(p.read_text())
    except yaml.YAMLError:
        return False
    return isinstance(d, dict) and ("model" in d or "prune" in d)


def run_config(path: str | os.PathLike[str], overrides: Sequence[str] = (), *,
               log: Callable[[str], None] = print) -> RunDir:
    """Load, validate and run the pipeline config at ``path``; returns the finished run directory."""
    config = load_config(path, overrides)
    from prunefx.pipeline.classify_model import is_classifier_spec

    if is_classifier_spec(config.get("model")):  # torchvision:NAME or package.module:factory
        from prunefx.pipeline.classify import ClassifyJob, run_classify

        return run_classify(ClassifyJob.from_config(config, config_name=Path(path).stem), log=log)
    from prunefx.pipeline.yolo import YoloJob, run_yolo

    job = YoloJob.from_config(config, config_name=Path(path).stem)
    return run_yolo(job, log=log)


__all__ = ["ConfigError", "PruneSpec", "RunDir", "apply_overrides", "is_config", "load_config", "run_config"]
