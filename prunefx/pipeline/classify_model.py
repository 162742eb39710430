"""Classifier models for the classification pipeline: build from a SPEC for a dataset, save and load weights.

>>> factory = classifier_factory("torchvision:resnet18", num_classes=10, in_channels=3)
>>> model = factory()                                    # fresh, random init; prunefx.load(path, factory) rebuilds
>>> load_weights(model, "baseline.pt")                   # a state_dict in any of the usual wrappings

SPECs: ``torchvision:NAME`` (a torchvision classifier, ``num_classes`` set, weights=None) and
``package.module:factory`` (called with ``num_classes`` / ``in_channels`` when it takes them).
"""

from __future__ import annotations

import difflib
import functools
import inspect
import os
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

import torch
from torch import nn

from prunefx._extras import require
from prunefx._io import atomic_torch_save, load_torch_file
from prunefx.checkpoint import FORMAT as PRUNED_FORMAT
from prunefx.errors import SpecError, UntrustedFileError
from prunefx.family import TORCH
from prunefx.pipeline.run_config import ConfigError
from prunefx.spec import call_factory, config_family, resolve_factory

WEIGHTS_FORMAT = "prunefx.weights/1"


def is_classifier_spec(model: Any) -> bool:
    """Whether a config's ``model`` names a classifier this pipeline builds (not an ultralytics yaml/checkpoint)."""
    return config_family(model) is TORCH


def takes_in_channels(spec: str) -> bool:
    """Whether the SPEC's builder accepts ``in_channels`` (torchvision classifiers take 3-channel images only)."""
    if spec.startswith("torchvision:"):
        return False
    return "in_channels" in _accepted(_resolve_factory(spec))


def classifier_factory(spec: str, *, num_classes: int, in_channels: int) -> Callable[[], nn.Module]:
    """A no-argument callable building a fresh model for ``spec`` (what :func:`prunefx.load` takes)."""
    if spec.startswith("torchvision:"):
        name = spec.partition(":")[2]
        models = require("torchvision.models", "a torchvision:NAME model")

        known = models.list_models(module=models)  # image classifiers only
        if name not in known:
            close = difflib.get_close_matches(name, known, n=3)
            raise ConfigError(
                f"unknown torchvision classifier {name!r}"
                + (f" (did you mean {', '.join(close)}?)" if close else "")
                + "; torchvision.models.list_models(module=torchvision.models) lists them"
            )
        if in_channels != 3:
            raise ConfigError(f"torchvision:{name} takes 3-channel images; set dataset.channels: 3")
        return functools.partial(models.get_model, name, weights=None, num_classes=num_classes)
    fn = _resolve_factory(spec)
    kwargs = {k: v for k, v in (("num_classes", num_classes), ("in_channels", in_channels)) if k in _accepted(fn)}
    return functools.partial(_call_factory, spec, fn, kwargs)


def _accepted(fn: Callable[..., Any]) -> set[str]:
    try:
        return set(inspect.signature(fn).parameters)
    except (TypeError, ValueError):
        return set()


def _resolve_factory(spec: str) -> Callable[..., Any]:
    try:
        return resolve_factory(spec)  # the one resolver, shared with load_spec
    except SpecError as exc:
        raise ConfigError(str(exc)) from exc


def _call_factory(spec: str, fn: Callable[..., Any], kwargs: dict[str, Any]) -> nn.Module:
    try:
        return call_factory(spec, fn, kwargs)
    except SpecError as exc:
        raise ConfigError(str(exc)) from exc


def check_classifier(model: nn.Module, spec: str, example: torch.Tensor, num_classes: int) -> None:
    """The model takes the dataset's images and predicts one logit per class, or a ConfigError says why not."""
    try:
        with torch.no_grad():
            out = model.eval()(example)
    except Exception as exc:  # any failure means the model and the data do not fit
        raise ConfigError(
            f"model {spec!r} cannot take the dataset's images {tuple(example.shape)}: {type(exc).__name__}: {exc}"
        ) from exc
    if not isinstance(out, torch.Tensor) or tuple(out.shape) != (example.shape[0], num_classes):
        shape = tuple(out.shape) if isinstance(out, torch.Tensor) else type(out).__name__
        raise ConfigError(
            f"model {spec!r} outputs {shape}, but the dataset has {num_classes} classes; give the factory "
            "a num_classes argument (the pipeline passes it) or build it for this dataset"
        )


def save_weights(model: nn.Module, path: str | os.PathLike[str], **meta: Any) -> Path:
    """An unpruned model's weights, atomically: ``{"format", "state_dict", **meta}``."""
    return atomic_torch_save({"format": WEIGHTS_FORMAT, "state_dict": model.state_dict(), **meta}, Path(path))


def read_state_dict(path: str | os.PathLike[str], *, trust_checkpoint: bool = False) -> Mapping[str, torch.Tensor]:
    """The state_dict in ``path``: prunefx weights, a training checkpoint, {"state_dict"|"model": ...} or a bare one.

    Weights-only; ``trust_checkpoint`` unpickles fully (any code in the file runs), which also accepts a pickled
    module (its state_dict is taken).
    """
    path = Path(path)
    if not path.is_file():
        raise ConfigError(f"checkpoint {path} not found; give the path of a state_dict .pt file on disk")
    if path.stat().st_size == 0:
        raise ConfigError(f"checkpoint {path} is empty (0 bytes); save the weights again with "
                          "torch.save(model.state_dict(), path)")
    try:
        payload = load_torch_file(path, trust_checkpoint=trust_checkpoint)
    except UntrustedFileError:
        raise
    except Exception as exc:  # truncated or foreign file
        detail = (str(exc).strip().splitlines() or [""])[0][:300]
        raise ConfigError(
            f"checkpoint {path} is not a readable weights file ({type(exc).__name__}{': ' + detail if detail else ''})"
            "; save it with torch.save(model.state_dict(), path)"
        ) from exc
    if isinstance(payload, dict) and payload.get("format") == PRUNED_FORMAT:
        raise ConfigError(
            f"checkpoint {path} is an already pruned model (prunefx.save); the pipeline starts from an "
            "unpruned model's weights; load it with prunefx.load(path, factory) from Python instead"
        )
    if isinstance(payload, dict):
        for key in ("state_dict", "model"):
            if isinstance(payload.get(key), (Mapping, nn.Module)):
                payload = payload[key]
                break
    if isinstance(payload, nn.Module):  # only a trusted, fully unpickled file holds a module
        payload = payload.state_dict()
    if (
        not isinstance(payload, Mapping)
        or not payload
        or not all(isinstance(v, torch.Tensor) for v in payload.values())
    ):
        raise ConfigError(f"checkpoint {path} holds no state_dict (a mapping of names to tensors)")
    return {str(k).removeprefix("module."): v for k, v in payload.items()}  # DDP-saved names


def load_weights(
    model: nn.Module, path: str | os.PathLike[str], spec: str = "the model", *, trust_checkpoint: bool = False
) -> nn.Module:
    """Load ``path``'s state_dict into ``model``; a mismatch is a ConfigError naming the differing keys."""
    state = read_state_dict(path, trust_checkpoint=trust_checkpoint)
    own = model.state_dict()
    missing = [k for k in own if k not in state]
    unexpected = [k for k in state if k not in own]
    shapes = [
        f"{k} {tuple(state[k].shape)} vs {tuple(v.shape)}"
        for k, v in own.items()
        if k in state and state[k].shape != v.shape
    ]
    if missing or unexpected or shapes:
        parts = [
            f"{name}: {', '.join(items[:4])}{' ...' if len(items) > 4 else ''}"
            for name, items in (("missing", missing), ("unexpected", unexpected), ("shape mismatch", shapes))
            if items
        ]
        raise ConfigError(
            f"checkpoint {path} does not match {spec} ({'; '.join(parts)}); give weights trained for this "
            "model and dataset (same num_classes and input channels), or drop checkpoint to train one"
        )
    model.load_state_dict(state)
    return model


def arch_signature(model: nn.Module) -> list[tuple[str, tuple[int, ...]]]:
    """Every parameter's and buffer's name and shape: equal signatures mean the same (pruned) architecture."""
    return [(k, tuple(v.shape)) for k, v in model.state_dict().items()]


__all__ = [
    "WEIGHTS_FORMAT",
    "arch_signature",
    "check_classifier",
    "classifier_factory",
    "is_classifier_spec",
    "load_weights",
    "read_state_dict",
    "save_weights",
    "takes_in_channels",
]
