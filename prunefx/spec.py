"""Resolve a model SPEC into a model plus example inputs, building architectures only (nothing is downloaded).

SPEC forms::

    torchvision:resnet50          torchvision.models.get_model(name, weights=None), random init
    ultralytics:yolov8n.yaml      a model yaml shipped with ultralytics (or a yaml path), nc from the yaml
    runs/detect/train/best.pt     an ultralytics checkpoint on disk (its EMA model, float32)
    package.module:factory        a callable taking no arguments that returns an nn.Module

Checkpoints load weights-only (``trust_checkpoint=True`` unpickles fully: any code in the file runs) and model yamls
may name only torch.nn activations and model layers unless trusted. A factory SPEC runs its module's code: that is
what it is for. Its module is looked up in the current directory too, after installed packages and only while it
is imported, so a file there never shadows a library. The result names its :mod:`~prunefx.family`, which saves,
exports and costs the model as its library does.

>>> loaded = load_spec("torchvision:resnet18", imgsz=64)
>>> prunefx.analyze(loaded.model, loaded.example_inputs)
"""

from __future__ import annotations

import contextlib
import difflib
import importlib
import inspect
import logging
import os
import re
import sys
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

import torch
from torch import nn
from torch.utils._pytree import tree_map_only

from prunefx._defaults import FORMS, TORCHVISION_DEFAULT_SIZE, TORCHVISION_SIZES, YOLO_DEFAULT_SIZE, YOLO_SIZES
from prunefx._extras import require
from prunefx.capture.inputs import Inputs, positional
from prunefx.errors import PrunefxError, SpecError, UntrustedFileError
from prunefx.family import TORCH, ModelFamily, get_family
from prunefx.inputs import as_inputs, example_inputs

SpecForm = Literal["torchvision", "ultralytics", "factory", "checkpoint"]

YOLO_STRIDE = 32  # YOLO feature maps are concatenated across strides up to 32 (64 for -p6 models)
# Heads that need text embeddings (open vocabulary) besides the image, which load_spec does not build.
_TEXT_HEADS = ("World", "YOLOE")
_FACTORY = re.compile(r"[A-Za-z_][\w.]*:[A-Za-z_][\w.]*")


@dataclass(frozen=True)
class LoadedModel:
    """A model in eval mode, one batch of example inputs it accepts, and the family that saves and exports it."""

    model: nn.Module
    example_inputs: tuple[Any, ...]  # one (1, C, H, W) image batch, or the inputs given (``inputs=``)
    name: str  # the SPEC it was loaded from
    kind: SpecForm  # the SPEC's form, for display (flops --json); what to do with the model asks ``family``
    family: ModelFamily
    given: bool = False  # the inputs came from --input (not an image of --imgsz): hints name --input


def load_spec(
    spec: str, *, imgsz: int | None = None, device: str = "cpu", trust_checkpoint: bool = False,
    inputs: Sequence[str] = (),
) -> LoadedModel:
    """Build the model a SPEC names, in eval mode on ``device``, with a seeded random (1, C, imgsz, imgsz) input.

    ``imgsz`` defaults to the model's native size: 224 for torchvision (299 for inception_v3), 640 for
    YOLO detect/segment/pose/obb, 224 for YOLO classifiers; whether the model takes it is the model's to say (the
    analysis runs it). ``trust_checkpoint`` lets a checkpoint or model yaml run code (see the module docstring).
    ``inputs``: the example inputs instead of an image, as :func:`prunefx.inputs.example_inputs` reads them
    (``["1x1x1024"]``, ``["1x128:int64"]``, ``["input_ids=1x16:int64"]``, a ``.pt`` file, a
    ``package.module:function``), for models whose input is not an image; keyword inputs are bound by position.
    Bad input raises :class:`SpecError` (:class:`~prunefx.errors.UntrustedFileError` for a file that needs trust).
    """
    spec = spec.strip()
    if imgsz is not None and (isinstance(imgsz, bool) or not isinstance(imgsz, int) or imgsz < 1):
        raise SpecError(f"imgsz must be a positive integer, got {imgsz!r}.")
    if inputs and imgsz is not None:
        raise SpecError("give either --imgsz (an image of that size) or --input (the inputs themselves), not both.")
    given = _given_inputs(inputs) if inputs else None  # checked before the model is built
    try:
        target = torch.device(device)
    except RuntimeError as exc:
        raise SpecError(f"unknown device '{device}' ({exc}); use 'cpu' or 'cuda:N'.") from exc
    prefix, colon, rest = spec.partition(":")
    family = TORCH
    if colon and prefix == "torchvision":
        model, size, channels = _torchvision(rest, imgsz)
        kind: SpecForm = "torchvision"
    elif colon and prefix == "ultralytics":
        model, size, channels = _ultralytics_yaml(rest, imgsz, trust_checkpoint)
        kind, family = "ultralytics", get_family("ultralytics")
    elif spec.endswith(".pt") or Path(spec).is_file():
        model, size, channels = _checkpoint(Path(spec), imgsz, trust_checkpoint)
        kind, family = "checkpoint", get_family("ultralytics")
    elif _FACTORY.fullmatch(spec):
        model, size, channels = call_factory(spec, resolve_factory(spec)), imgsz or TORCHVISION_DEFAULT_SIZE, 3
        kind = "factory"
    else:
        raise SpecError(f"cannot read model SPEC '{spec}'. Use one of: {FORMS}.")
    # Seeded so that two runs of the same SPEC see the same input (latency, real-forward fallbacks).
    try:
        xs = (positional(model, given) if given is not None  # keyword inputs bound by the model's forward
              else (torch.rand(1, channels, size, size, generator=torch.Generator().manual_seed(0)),))
    except PrunefxError as exc:
        raise SpecError(f"--input: {exc}") from None
    try:
        model, xs = model.to(target).eval(), tree_map_only(torch.Tensor, lambda t: t.to(target), xs)
    except (RuntimeError, AssertionError) as exc:  # no such device here, or a torch built without CUDA
        raise SpecError(f"cannot use device '{device}': {exc}. Use 'cpu' or an available 'cuda:N'.") from exc
    return LoadedModel(model, xs, spec, kind, family, given=given is not None)


def _given_inputs(items: Sequence[str]) -> Inputs:
    """``--input``'s example inputs: text and files (:func:`prunefx.inputs.example_inputs`), or a factory's."""
    factories = [item.strip() for item in items if _FACTORY.fullmatch(item.strip())]
    if not factories:
        return example_inputs(items)
    if len(items) > 1:
        raise SpecError(f"--input {factories[0]} (a function) builds every input: give it alone")
    spec = factories[0]
    factory = resolve_factory(spec)
    try:
        data = factory()
    except SystemExit as exc:
        raise SpecError(f"--input {spec} {exit_message(exc)} instead of returning inputs.") from exc
    except Exception as exc:  # the user's function raised
        raise SpecError(f"--input {spec} raised {type(exc).__name__}: {exc}; it is called with no arguments."
                        ) from exc
    return as_inputs(data, f"--input {spec} returned")


def config_family(model: Any) -> ModelFamily:
    """The family of a pipeline config's ``model``: torch for ``torchvision:NAME`` and ``package.module:factory``.

    Anything else (a model yaml, with or without ``ultralytics:``, or an ultralytics checkpoint) is ultralytics',
    whose pipeline says what is wrong with a name it cannot build.
    """
    if isinstance(model, str) and ":" in model and not model.endswith((".pt", ".yaml", ".yml")):
        prefix = model.partition(":")[0]
        if prefix == "torchvision" or (prefix != "ultralytics" and all(p.isidentifier() for p in prefix.split("."))):
            return TORCH
    return get_family("ultralytics")


def _check_imgsz(imgsz: int, multiple: int, what: str) -> None:
    if imgsz % multiple:
        lower, upper = imgsz // multiple * multiple, (imgsz // multiple + 1) * multiple
        near = f"{lower} or {upper}" if lower >= multiple else str(upper)
        raise SpecError(f"imgsz must be a positive multiple of {multiple} for {what}, got {imgsz}; try {near}.")


# ---- torchvision ------------------------------------------------------------------------------------


def _torchvision(name: str, imgsz: int | None) -> tuple[nn.Module, int, int]:
    models = require("torchvision.models", "a torchvision:NAME model")

    known = models.list_models()
    if name not in known:
        close = difflib.get_close_matches(name, known, n=3)
        hint = f" Did you mean {', '.join(close)}?" if close else ""
        raise SpecError(
            f"unknown torchvision model '{name}'.{hint} "
            "torchvision.models.list_models() lists the names (e.g. torchvision:resnet50)."
        )
    # Detection, video and optical-flow models take lists of images, clips or image pairs, not one batch.
    image_models = {
        n for m in (models, models.quantization, models.segmentation) for n in models.list_models(module=m)
    }
    if name not in image_models:
        family = models.get_model_builder(name).__module__.split(".")[2]
        raise SpecError(
            f"torchvision:{name} is a {family.replace('_', '-')} model, whose inputs are not one (N, 3, H, W) image "
            "batch; SPECs cover image classifiers and segmentation models. Build its inputs yourself and call "
            "prunefx.analyze(model, example_inputs) from Python."
        )
    kwargs: dict[str, Any] = {"weights": None}
    # Segmentation builders default to an ImageNet backbone, which would be downloaded.
    if "weights_backbone" in inspect.signature(models.get_model_builder(name)).parameters:
        kwargs["weights_backbone"] = None
    return models.get_model(name, **kwargs), imgsz or TORCHVISION_SIZES.get(name, TORCHVISION_DEFAULT_SIZE), 3


# ---- ultralytics ------------------------------------------------------------------------------------


def _ultralytics_modules() -> Any:
    """``ultralytics.nn.tasks``, imported offline with its settings inside the project."""
    from prunefx.integrations.ultralytics.env import setup_offline

    setup_offline()
    return require("ultralytics.nn.tasks", "a YOLO model")


def _shipped_yamls() -> dict[str, Path]:
    ultralytics = require("ultralytics", "a YOLO model")

    return {p.name: p for p in sorted((Path(ultralytics.__file__).parent / "cfg" / "models").rglob("*.yaml"))}


def _yaml_names(shipped: dict[str, Path]) -> list[str]:
    """Every name a shipped yaml answers to: its file name and, when it has scales, each scaled name."""
    import yaml

    names = list(shipped)
    for name, path in shipped.items():
        # The C loader when present: the pure-Python one takes seconds for the ~70 files on a busy machine.
        cfg = yaml.load(path.read_text(), Loader=getattr(yaml, "CSafeLoader", yaml.SafeLoader)) or {}
        scales = cfg.get("scales") or {}
        if not re.search(r"\d[nslmx]", name):  # yolov8.yaml -> yolov8n.yaml ...; yolov10n.yaml is already scaled
            names += [re.sub(r"(\d+)", rf"\g<1>{s}", name, count=1) for s in scales]
    return names


def _resolve_yaml(name: str) -> tuple[Path, str | None]:
    """The path for ultralytics' yaml_model_load, plus the shipped yaml's name when ``name`` is a scale of it."""
    if name.endswith(".pt"):
        raise SpecError(
            f"ultralytics:{name} names weights, which prunefx never downloads. Pass the path of a .pt file on disk, "
            f"or build the architecture: ultralytics:{name[:-3]}.yaml."
        )
    if Path(name).is_file():
        return Path(name), None
    shipped = _shipped_yamls()
    if name in shipped:
        return shipped[name], None
    unified = re.sub(r"(\d+)([nslmx])(.+)?$", r"\1\3", name)  # ultralytics' own rule: yolov8n.yaml -> yolov8.yaml
    if unified in shipped:
        # A missing file named like the scale next to the shipped yaml: ultralytics reads the scale from the stem.
        return shipped[unified].with_name(name), unified
    close = difflib.get_close_matches(name, _yaml_names(shipped), n=3, cutoff=0.75)
    hint = f" Did you mean {', '.join(close)}?" if close else ""
    raise SpecError(
        f"unknown ultralytics model yaml '{name}'.{hint} Use a yaml shipped in ultralytics/cfg/models "
        "(e.g. ultralytics:yolov8n.yaml, ultralytics:yolo11s-seg.yaml) or the path of a model yaml."
    )


def _ultralytics_yaml(name: str, imgsz: int | None, trust: bool) -> tuple[nn.Module, int, int]:
    if imgsz is not None:  # fail before the (seconds-long) build
        _check_imgsz(imgsz, YOLO_STRIDE, "YOLO models")
    if not Path(name).suffix:
        name += ".yaml"
    tasks = _ultralytics_modules()
    path, base = _resolve_yaml(name)
    try:
        cfg = tasks.yaml_model_load(path)
        head = str(cfg["head"][-1][2])  # the output module, which decides the task
    except Exception as exc:  # a user's yaml can be malformed in any way
        raise SpecError(f"cannot read model yaml '{name}': {type(exc).__name__}: {exc}") from exc
    if base and cfg["scale"] not in (cfg.get("scales") or {}):
        have = ", ".join(cfg.get("scales") or {}) or "none"
        raise SpecError(f"ultralytics:{name}: {base} has no scale '{cfg['scale']}' (its scales: {have}).")
    task = tasks.guess_model_task(cfg)
    builders = {
        "detect": tasks.DetectionModel,
        "segment": tasks.SegmentationModel,
        "pose": tasks.PoseModel,
        "classify": tasks.ClassificationModel,
        "obb": tasks.OBBModel,
    }
    from prunefx.integrations.ultralytics.io import ultralytics_loading
    from prunefx.integrations.ultralytics.model_yaml import check_model_yaml

    try:
        check_model_yaml(cfg, name, trust_checkpoint=trust)
    except UntrustedFileError:
        raise
    except PrunefxError as exc:
        raise SpecError(str(exc)) from exc
    if task not in builders or head.startswith(_TEXT_HEADS):
        raise SpecError(
            f"ultralytics:{name} has a {head} head (task {task}); SPECs build {', '.join(builders)} models, "
            "which take one image batch. Load a checkpoint of it instead, or call prunefx.analyze from Python."
        )
    for layer in (*cfg.get("backbone", []), *cfg["head"]):
        if layer[2] == "TorchVision":  # args [c2, model, weights, ...]: weights "DEFAULT" would be downloaded
            layer[3][2:3] = [None]
    try:
        with _quiet_ultralytics(), ultralytics_loading(trust_checkpoint=trust):  # no eval unless trusted
            model = builders[task](cfg, verbose=False)
    except Exception as exc:  # any failure of ultralytics' builder means an unusable yaml
        raise SpecError(f"ultralytics could not build {name}: {type(exc).__name__}: {exc}") from exc
    return model, _yolo_size(model, task, imgsz, name), _channels(model)


@contextlib.contextmanager
def _quiet_ultralytics() -> Iterator[None]:
    """Silence ultralytics' info logging: ClassificationModel prints a model summary even with verbose=False."""
    from ultralytics.utils import LOGGER

    level = LOGGER.level
    LOGGER.setLevel(logging.WARNING)
    try:
        yield
    finally:
        LOGGER.setLevel(level)


# ---- checkpoints and factories ----------------------------------------------------------------------


def _checkpoint(path: Path, imgsz: int | None, trust: bool) -> tuple[nn.Module, int, int]:
    if not path.is_file():
        raise SpecError(f"checkpoint '{path}' does not exist; pass the path of a .pt file written by ultralytics.")
    if path.suffix != ".pt":
        raise SpecError(f"'{path}' is not a .pt file; checkpoints are ultralytics .pt files (best.pt, last.pt).")
    if imgsz is not None:
        _check_imgsz(imgsz, YOLO_STRIDE, "YOLO models")
    _ultralytics_modules()
    from ultralytics.utils.checks import check_yolov5u_filename

    from prunefx.integrations.ultralytics.io import load_yolo

    # A yolov5s.pt-like name would be renamed to yolov5su.pt and downloaded.
    weight = str(path.resolve())
    if check_yolov5u_filename(weight, verbose=False) != weight:
        raise SpecError(f"rename '{path}': ultralytics maps files named like yolov5s.pt to downloadable assets.")
    try:
        model = load_yolo(path, trust_checkpoint=trust)
    except UntrustedFileError:
        raise
    except PrunefxError as exc:
        raise SpecError(str(exc)) from exc
    return model, _yolo_size(model, getattr(model, "task", None), imgsz, str(path)), _channels(model)


def _yolo_size(model: nn.Module, task: str | None, imgsz: int | None, name: str) -> int:
    size = imgsz or YOLO_SIZES.get(task or "", YOLO_DEFAULT_SIZE)
    stride = int(max(getattr(model, "stride", torch.tensor([YOLO_STRIDE]))))
    if stride > YOLO_STRIDE:  # -p6 models downsample 64x
        _check_imgsz(size, stride, f"{name} (stride {stride})")
    return size


def _channels(model: nn.Module) -> int:
    cfg = getattr(model, "yaml", None)
    if isinstance(cfg, dict) and "channels" in cfg:
        return int(cfg["channels"])
    return next((m.in_channels for m in model.modules() if isinstance(m, nn.Conv2d)), 3)


def import_spec_module(module_name: str) -> Any:
    """Import a factory SPEC's module, looking in the current directory after every installed package.

    The directory is on ``sys.path`` only while this import runs (and last), so a ``sklearn.py`` next to the user
    never replaces a library, now or in a later import. Exceptions are the module's own; ``sys.exit`` during the
    import raises :class:`SystemExit` as usual.
    """
    cwd = os.getcwd()
    added = cwd not in sys.path
    if added:
        sys.path.append(cwd)
    try:
        return importlib.import_module(module_name)
    finally:
        if added:
            with contextlib.suppress(ValueError):
                sys.path.remove(cwd)


def exit_message(exc: SystemExit) -> str:
    """How a SystemExit raised by user code is described in an error."""
    return f"called sys.exit({exc.code!r})" if exc.code is not None else "called sys.exit()"


def resolve_factory(spec: str) -> Callable[..., Any]:
    """The callable a ``package.module:factory`` SPEC names (its module imported), or a SpecError saying why not."""
    module_name, _, attr_path = spec.partition(":")
    try:
        obj: Any = import_spec_module(module_name)
    except SystemExit as exc:  # a script-like module: exit means "no model", never a clean exit of prunefx
        raise SpecError(f"importing '{module_name}' {exit_message(exc)}; a factory module must not exit.") from exc
    except ModuleNotFoundError as exc:
        if exc.name and (module_name == exc.name or module_name.startswith(exc.name + ".")):
            raise SpecError(
                f"no module named '{module_name}' for factory SPEC '{spec}'; run from the directory that holds it, "
                "or install or add it to PYTHONPATH."
            ) from exc
        raise SpecError(f"importing '{module_name}' failed: {exc}.") from exc
    except Exception as exc:  # the user's module raised while importing
        raise SpecError(f"importing '{module_name}' failed: {type(exc).__name__}: {exc}.") from exc
    for i, part in enumerate(attr_path.split(".")):
        if not hasattr(obj, part):
            where = ".".join([module_name, *attr_path.split(".")[:i]])
            close = difflib.get_close_matches(part, [n for n in dir(obj) if not n.startswith("_")], n=3)
            hint = f" Did you mean {', '.join(close)}?" if close else ""
            raise SpecError(f"'{where}' has no attribute '{part}' (factory SPEC '{spec}').{hint}")
        obj = getattr(obj, part)
    if isinstance(obj, nn.Module) or not callable(obj):  # a module instance is callable, but calling runs forward
        raise SpecError(f"'{spec}' is a {type(obj).__name__} object; name a function that returns a new nn.Module.")
    return obj


def call_factory(spec: str, factory: Callable[..., Any], kwargs: dict[str, Any] | None = None) -> nn.Module:
    """``factory(**kwargs)``, which must return a new nn.Module, or a SpecError saying what it did instead."""
    try:
        model = factory(**(kwargs or {}))
    except SystemExit as exc:
        raise SpecError(f"factory '{spec}' {exit_message(exc)} instead of returning a model.") from exc
    except Exception as exc:  # the user's factory raised
        called = (f"it was called with {', '.join(f'{k}={v!r}' for k, v in kwargs.items())}" if kwargs
                  else "it must build the model with no arguments")
        raise SpecError(f"factory '{spec}' raised {type(exc).__name__}: {exc}; {called}.") from exc
    if not isinstance(model, nn.Module):
        raise SpecError(f"factory '{spec}' returned a {type(model).__name__}, not a torch.nn.Module.")
    return model


@contextlib.contextmanager
def _skip_init() -> Iterator[None]:
    """torch.nn.init's in-place initialisers as no-ops (weights stay uninitialised)."""
    names = [n for n in dir(torch.nn.init) if n.endswith("_") and not n.startswith("_")]
    saved = {n: getattr(torch.nn.init, n) for n in names}
    try:
        for n in names:
            setattr(torch.nn.init, n, lambda t, *args, **kwargs: t)
        yield
    finally:
        for n, f in saved.items():
            setattr(torch.nn.init, n, f)


def meta_torchvision(name: str) -> nn.Module:
    """A torchvision classifier on the meta device (no memory), for analysis of any size.

    Built on meta directly; models whose constructors compute with tensors (RegNet's widths) are built on
    the CPU with initialisation skipped, then moved to meta.
    """
    models = require("torchvision.models", "a torchvision:NAME model")

    try:
        with torch.device("meta"):
            return models.get_model(name, weights=None)
    except NotImplementedError:  # "Cannot copy out of meta tensor"
        with _skip_init():
            return models.get_model(name, weights=None).to("meta")
