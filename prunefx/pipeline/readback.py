"""A finished run read back as its final model and example inputs, by the pipeline that wrote it; nothing executes.

    final = read_final(Path("runs/prune/digits_cnn"), Given())
    final.family.export_onnx(final.model, final.example_inputs, "model.onnx")

The run's ``config.yaml`` (safe YAML, read as data) says which pipeline wrote it
(:func:`prunefx.pipeline.registry.pipeline_of`: its task, then its model's family) and ``state.json`` which model
is final: the fine-tuned one when the fine-tune stage ran, else the pruned one. Weights are read weights-only
(``torch.load(weights_only=True)``, safetensors). An architecture is built only from fixed registries: torchvision's
builders and prunefx's own factories (:data:`BUILT_IN`). A ``module:function`` read from a run is never imported:
for a model of the user's own code, the user names it (``prunefx export RUN --model SPEC``).
"""

from __future__ import annotations

import importlib
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from torch import nn

from prunefx._extras import require
from prunefx._io import MAX_JSON_BYTES
from prunefx.errors import PrunefxError
from prunefx.family import TORCH, ModelFamily, get_family
from prunefx.pipeline.run_config import ConfigError
from prunefx.pipeline.rundir import CONFIG, RunError, check_finished, read_state

# The factories a run's config may name and export still builds: prunefx's own, imported from these fixed names.
BUILT_IN = frozenset({"prunefx.zoo:bn_cnn", "prunefx.zoo:bn_cnn_small", "prunefx.zoo:bn_cnn_synthetic",
                      "prunefx.examples.sine:trained_regressor", "prunefx.examples.stdlib_lm:trained_lm"})


@dataclass(frozen=True)
class Given:
    """What the user gave on the command line for reading a run back."""

    model: str | None = None  # --model SPEC: the architecture of a run of the user's own code (that code runs)
    imgsz: int | None = None  # another input size than the run's
    trust_checkpoint: bool = False  # a checkpoint may unpickle fully (ultralytics runs; any code in it runs)


@dataclass(frozen=True)
class FinishedRun:
    """A complete run directory: its config and state, as data."""

    root: Path
    config: Mapping[str, Any]
    state: Mapping[str, Any]

    def ran(self, stage: str) -> bool:
        """Whether ``stage`` finished and made a model (it was not skipped)."""
        entry = self.state["stages"].get(stage)
        return isinstance(entry, Mapping) and "skipped" not in entry

    @property
    def final_role(self) -> str:
        """The role of the run's final model: finetuned when the fine-tune stage trained, else pruned."""
        return "finetuned" if self.ran("finetune") else "pruned"


@dataclass(frozen=True)
class FinalModel:
    """A finished run's final model in eval mode, batch-1 example inputs it takes, and the family that exports it."""

    model: nn.Module
    example_inputs: tuple[Any, ...]
    family: ModelFamily
    source: Path  # the file or directory the weights were read from


ReadBack = Callable[[FinishedRun, Given], FinalModel]


def finished_run(root: str | Path) -> FinishedRun:
    """The complete run in ``root``, or a RunError saying why it is not one."""
    import yaml

    from prunefx._config import load_yaml

    root = Path(root)
    state = read_state(root)  # RunError: no state.json, or a damaged one
    check_finished(root)
    path = root / CONFIG
    if not path.is_file() or path.stat().st_size > MAX_JSON_BYTES:  # a FIFO would block, a huge file exhaust memory
        raise RunError(f"{path} is missing, not a regular file or too large; it is the run's config: {root} cannot "
                       "be read back without it")
    try:
        config = load_yaml(path.read_text(), str(path))
    except (OSError, UnicodeDecodeError, ValueError) as exc:
        raise RunError(f"{root / CONFIG} cannot be read ({exc}); it is the run's config: {root} cannot be read "
                       "back without it") from None
    except (yaml.YAMLError, ConfigError, RecursionError) as exc:  # damage, said in one line
        raise RunError(f"{root / CONFIG} is damaged ({str(exc).splitlines()[0] if str(exc) else exc!r})") from None
    if not isinstance(config, dict):
        raise RunError(f"{root / CONFIG} is not a mapping of keys; it is not a run prunefx wrote")
    return FinishedRun(root, config, state)


def read_final(root: str | Path, given: Given = Given()) -> FinalModel:
    """The final model of the finished run in ``root``, read back by the pipeline that wrote it."""
    from prunefx.pipeline.registry import SPEC_RUN, pipeline_of

    run = finished_run(root)
    try:
        pipeline = SPEC_RUN if "spec" in run.config and "model" not in run.config else pipeline_of(run.config)
    except ConfigError as exc:
        raise RunError(f"{run.root}: {exc}") from None
    if not pipeline.read_back:
        raise RunError(f"{run.root} was written by {pipeline.what or pipeline.target}, which does not read its runs "
                       "back; load its weights from Python")
    module, _, name = pipeline.read_back.partition(":")
    reader: ReadBack = getattr(importlib.import_module(module), name)  # a name written in code, never in a run
    return reader(run, given)


# ---- each pipeline's read-back -----------------------------------------------------------------------------------


def classify_final(run: FinishedRun, given: Given) -> FinalModel:
    """A classification run: ``weights/{finetuned,pruned}.pt`` (prunefx.save) on the run's classifier."""
    from prunefx.pipeline.classify_model import classifier_factory

    spec = _architecture(run, given)  # first: a run of the user's own code needs --model, whatever else it holds
    path = _weights(run, f"{run.final_role}.pt")
    inputs = _recorded_inputs(run, given.imgsz)
    meta = _torch_file(run.root / "weights" / "baseline.pt")  # save_weights: the classes the run trained for
    classes = meta.get("num_classes") if isinstance(meta, Mapping) else None
    if isinstance(classes, bool) or not isinstance(classes, int) or classes < 1:
        raise RunError(f"{run.root / 'weights' / 'baseline.pt'} does not record the number of classes; it is not a "
                       "baseline this pipeline wrote")
    try:
        factory = classifier_factory(spec, num_classes=classes, in_channels=int(inputs[0].shape[1]))
    except ConfigError as exc:
        raise RunError(f"{spec}: {exc}") from None
    return FinalModel(_load(path, factory), inputs, TORCH, path)


def custom_final(run: FinishedRun, given: Given) -> FinalModel:
    """A custom-task run: ``weights/{finetuned,pruned}.pt`` (prunefx.save) on the task's model."""
    factory = _factory(_architecture(run, given))
    path = _weights(run, f"{run.final_role}.pt")
    return FinalModel(_load(path, factory), _recorded_inputs(run, given.imgsz), TORCH, path)


def spec_final(run: FinishedRun, given: Given) -> FinalModel:
    """A ``prunefx prune SPEC`` run: ``pruned.pt`` as the SPEC's family wrote it."""
    from prunefx.spec import config_family

    spec = run.config.get("spec")
    if not isinstance(spec, str) or not spec:
        raise RunError(f"{run.root / CONFIG} names no spec: it is not a run prunefx prune SPEC wrote")
    path = run.root / "pruned.pt"
    if config_family(spec) is not TORCH:  # an ultralytics checkpoint: its module travels with it, weights-only
        return _yolo(run, path, given, _plan_imgsz(run))
    factory = _factory(_architecture(run, given, key="spec"))
    return FinalModel(_load(path, factory), _recorded_inputs(run, given.imgsz), TORCH, path)


def yolo_final(run: FinishedRun, given: Given) -> FinalModel:
    """A YOLO run: ``weights/best.pt`` after a fine-tune, else ``weights/pruned.pt`` (ultralytics checkpoints)."""
    path = _weights(run, "best.pt" if run.final_role == "finetuned" else "pruned.pt")
    imgsz = run.config.get("imgsz", 640)
    return _yolo(run, path, given, imgsz if isinstance(imgsz, int) and not isinstance(imgsz, bool) else 640)


def llm_final(run: FinishedRun, given: Given) -> FinalModel:
    """An llm run: the ``save_pretrained`` directory ``weights/{finetuned,pruned}``, read from safetensors, never
    with its own modelling code; its default call gives the logits of token ids."""
    if given.model is not None:
        raise RunError(f"--model applies to runs of your own model code; {run.root} is an llm run, whose model is "
                       f"its checkpoint in weights/{run.final_role}: drop --model")
    transformers = require("transformers", "reading back an llm run")
    path = run.root / "weights" / run.final_role
    if not (path / "config.json").is_file():
        raise RunError(f"{path} holds no config.json: the run's {run.final_role} checkpoint is missing")
    try:
        model = transformers.AutoModelForCausalLM.from_pretrained(
            path, local_files_only=True, trust_remote_code=False, use_safetensors=True, dtype=torch.float32)
    except Exception as exc:  # noqa: BLE001 - whatever transformers raises, the checkpoint does not load
        why = (str(exc).strip().splitlines() or [type(exc).__name__])[0][:300]
        raise RunError(f"{path} does not load as a causal LM from its safetensors without running its own code "
                       f"({why})") from None
    return FinalModel(_Logits(model.eval()), _recorded_inputs(run, None), TORCH, path)


class _Logits(nn.Module):
    """A causal LM called on token ids alone, returning its logits (no cache): what ONNX exports."""

    def __init__(self, lm: nn.Module) -> None:
        super().__init__()
        self.lm = lm

    def forward(self, input_ids: torch.Tensor) -> torch.Tensor:
        # an explicit all-ones mask: without one, transformers looks for packed sequences with aten::diff, which
        # torch.onnx does not export
        return self.lm(input_ids=input_ids, attention_mask=torch.ones_like(input_ids), use_cache=False).logits


# ---- shared steps --------------------------------------------------------------------------------------------------


def _architecture(run: FinishedRun, given: Given, key: str = "model") -> str:
    """The SPEC that builds the run's architecture: the user's ``--model``, else the run's own when a fixed registry
    builds it (``torchvision:NAME``, :data:`BUILT_IN`); a ``module:function`` read from the run is never imported."""
    if given.model is not None:
        return given.model
    spec = run.config.get(key)
    if isinstance(spec, str) and (spec.startswith("torchvision:") or spec in BUILT_IN):
        return spec
    raise RunError(f"the model of {run.root} is {spec!r}, code named in its {CONFIG}, which prunefx never imports "
                   f"from a run directory; give the factory the run used: prunefx export {run.root} --model "
                   "package.module:function")


def _factory(spec: str) -> Callable[[], nn.Module]:
    """A no-argument builder of ``spec`` (given by the user, or a fixed registry's name)."""
    from prunefx.spec import call_factory, resolve_factory

    if spec.startswith("torchvision:"):
        models = require("torchvision.models", "a torchvision:NAME model")
        name = spec.partition(":")[2]
        if name not in models.list_models():
            raise RunError(f"unknown torchvision model {name!r}; torchvision.models.list_models() lists the names")
        return lambda: models.get_model(name, weights=None)
    fn = resolve_factory(spec)
    return lambda: call_factory(spec, fn)


def _load(path: Path, factory: Callable[[], nn.Module]) -> nn.Module:
    """``prunefx.load`` (weights-only), with a model that does not fit said in one line."""
    from prunefx import load

    try:
        return load(path, factory).eval()
    except PrunefxError:
        raise
    except Exception as exc:  # noqa: BLE001 - a factory that builds another architecture fails in many ways
        why = (str(exc).strip().splitlines() or [type(exc).__name__])[0][:300]
        raise RunError(f"{path} does not load on the model given ({type(exc).__name__}: {why}); --model must build "
                       "the architecture the run pruned") from None


def _weights(run: FinishedRun, name: str) -> Path:
    path = run.root / "weights" / name
    if not path.is_file():
        raise RunError(f"{path} is missing: the run's {run.final_role} model, which its state.json says was saved")
    return path


def _torch_file(path: Path) -> Any:
    from prunefx._io import load_torch_file

    try:
        return load_torch_file(path)  # weights-only
    except Exception as exc:  # noqa: BLE001 - missing, truncated, pickled beyond plain data: one line each
        why = (str(exc).strip().splitlines() or [type(exc).__name__])[0][:300]
        raise RunError(f"{path} cannot be read weights-only ({type(exc).__name__}: {why})") from None


def _plan(run: FinishedRun) -> Any:
    from prunefx._io import read_json
    from prunefx.plan import PruningPlan

    path = run.root / "plan.json"
    data = read_json(path, RunError, missing=f"{path} is missing: the run's plan", what="is damaged",
                     fix="the run cannot be read back")
    try:
        return PruningPlan.from_dict(data)
    except Exception as exc:  # noqa: BLE001 - a plan of the wrong shape: one line
        raise RunError(f"{path} is not a pruning plan ({type(exc).__name__}: {exc})") from None


def _recorded_inputs(run: FinishedRun, imgsz: int | None) -> tuple[Any, ...]:
    """Batch-1 inputs of the shapes and dtypes the run pruned with (plan.json): floats seeded random, integers
    zero (valid token ids); ``imgsz`` resizes an image input."""
    plan = _plan(run)
    shapes, kinds = list(plan.input_shapes), list(plan.input_kinds) or ["float32"] * len(plan.input_shapes)
    if "none" in kinds or "other" in kinds or len(kinds) != len(shapes):
        raise RunError(f"{run.root}: the run's example inputs were not plain tensors; export its model from Python "
                       "(prunefx.load, then prunefx.export_onnx with its inputs)")
    gen, out = torch.Generator().manual_seed(0), []
    for shape, kind in zip(shapes, kinds, strict=True):
        dtype = getattr(torch, kind, None)
        if not isinstance(dtype, torch.dtype) or not shape:
            raise RunError(f"{run.root / 'plan.json'} records an input it cannot rebuild ({kind} {list(shape)})")
        size = (1, *shape[1:])
        if imgsz is not None and len(size) == 4:
            size = (*size[:2], imgsz, imgsz)
        out.append(torch.rand(size, generator=gen).to(dtype) if dtype.is_floating_point
                   else torch.zeros(size, dtype=dtype))
    return tuple(out)


def _plan_imgsz(run: FinishedRun) -> int:
    shapes = _plan(run).input_shapes
    return int(shapes[0][-1]) if shapes and shapes[0] else 640


def _yolo(run: FinishedRun, path: Path, given: Given, imgsz: int) -> FinalModel:
    if not path.is_file():
        raise RunError(f"{path} is missing: the run's {run.final_role} model, which its state.json says was saved")
    family = get_family("ultralytics")
    size = given.imgsz or imgsz
    model = family.load(path, _no_build, trust_checkpoint=given.trust_checkpoint).eval()
    return FinalModel(model, (torch.rand(1, 3, size, size, generator=torch.Generator().manual_seed(0)),), family,
                      path)


def _no_build() -> nn.Module:
    raise AssertionError("an ultralytics checkpoint carries its module")  # never called by that family's load


__all__ = ["BUILT_IN", "FinalModel", "FinishedRun", "Given", "ReadBack", "classify_final", "custom_final",
           "finished_run", "llm_final", "read_final", "spec_final", "yolo_final"]
