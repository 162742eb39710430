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

from prunefx._io import atomic_torch_save, load_torch_file
from prunefx.checkpoint import FORMAT as PRUNED_FORMAT
from prunefx.errors import UntrustedFileError
from prunefx.pipeline.config import ConfigError
from prunefx.spec import exit_message, import_spec_module

WEIGHTS_FORMAT = "prunefx.weights/1"


def is_classifier_spec(model: Any) -> bool:
    """Whether a config's ``model`` names a classifier this pipeline builds (not an ultralytics yaml/checkpoint)."""
    if not isinstance(model, str) or ":" not in model or model.endswith((".pt", ".yaml", ".yml")):
        return False
    prefix = model.partition(":")[0]
    return prefix == "torchvision" or (prefix != "ultralytics" and all(p.isidentifier() for p in prefix.split(".")))


def takes_in_channels(spec: str) -> bool:
    """Whether the SPEC's builder accepts ``in_channels`` (torchvision classifiers take 3-channel images only)."""
    if spec.startswith("torchvision:"):
        return False
    return "in_channels" in _accepted(_resolve_factory(spec))


def classifier_factory(spec: str, *, num_classes: int, in_channels: int) -> Callable[[], nn.Module]:
    """A no-argument callable building a fresh model for ``spec`` (what :func:`prunefx.load` takes)."""
    if spec.startswith("torchvision:"):
        name = spec.partition(":")[2]
        from torchvision import models

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
    module_name, _, attr_path = spec.partition(":")
    try:
        obj: Any = import_spec_module(module_name)  # the current directory too, after installed packages
    except SystemExit as exc:  # a script-like module: exiting means "no model", never a clean exit of prunefx
        raise ConfigError(f"importing {module_name!r} for model {spec!r} {exit_message(exc)}; a factory module "
                          "must not exit") from exc
    except ModuleNotFoundError as exc:
        raise ConfigError(
            f"unknown model {spec!r}: no module named {exc.name!r}; give torchvision:NAME or "
            "package.module:factory importable from here (e.g. prunefx.zoo:bn_cnn)"
        ) from exc
    except Exception as exc:  # the user's module raised while importing
        raise ConfigError(f"importing {module_name!r} for model {spec!r} failed: {type(exc).__name__}: {exc}") from exc
    for part in attr_path.split("."):
        if not hasattr(obj, part):
            close = difflib.get_close_matches(part, [n for n in dir(obj) if not n.startswith("_")], n=3)
            raise ConfigError(
                f"unknown model {spec!r}: {getattr(obj, '__name__', obj)!s} has no {part!r}"
                + (f" (did you mean {', '.join(close)}?)" if close else "")
            )
        obj = getattr(obj, part)
    if isinstance(obj, nn.Module) or not callable(obj):
        raise ConfigError(f"model {spec!r} is a {type(obj).__name__}; name a function that returns a new nn.Module")
    return obj


def _call_factory(spec: str, fn: Callable[..., Any], kwargs: dict[str, Any]) -> nn.Module:
    try:
        model = fn(**kwargs)
    except SystemExit as exc:
        raise ConfigError(f"model factory {spec!r} {exit_message(exc)} instead of returning a model") from exc
    except Exception as exc:  # the user's factory raised
        raise ConfigError(f"model factory {spec!r} raised {type(exc).__name__}: {exc}") from exc
    if not isinstance(model, nn.Module):
        raise ConfigError(f"model factory {spec!r} returned a {type(model).__name__}, not an nn.Module")
    return model


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
