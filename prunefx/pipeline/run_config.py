"""Pipeline configs: a YAML file plus ``key=value`` overrides, validated before any work starts.

A config keeps the training tool's own keys at the top level (ultralytics' ``epochs``, ``imgsz``, ...; the
classification recipe) and prunefx's keys in one ``prune:`` block, parsed here into a frozen :class:`PruneSpec`
made of the library's own configs: the target and limits are a :class:`~prunefx.plan.PlanConfig`, the sparsity
strength a :class:`~prunefx.train.SparsityConfig`. Only the YAML shape is mapped here (``target: {flops: 0.5}``
onto ``PlanConfig(flops=0.5)``; the stage keys beside each config's own)::

    prune:
      criterion: bn_scale            # bn_scale | l1 | l2 | taylor | random
      target: {flops: 0.5}           # exactly one of ratio / flops / params (default: PlanConfig's)
      scope: global                  # global | local | sensitivity (measured on calibration batches of the data)
                                     # and any other PlanConfig field: round_to, ignore, max_ratio, ...
      steps: 1                       # cuts that reach the target, re-scoring between them
      sparsity: {epochs: 0, start: baseline, s: 1.0e-4, schedule: constant, ...}   # + training keys
      finetune: {epochs: 10, distill: false}   # plus any training key, overriding the top level for fine-tuning
      controls: []                   # narrow, scratch: models trained from scratch beside the pruned one
      refit: false                   # least-squares re-fit after the cut on calibration batches of the data
      depth: {remove: 0, criterion: influence}   # residual blocks (decoder layers) removed before the width cut

>>> raw = load_config("configs/yolo.yaml", ["epochs=3", "prune.target.flops=0.4"])
>>> spec = PruneSpec.parse(raw["prune"], train_keys=ultralytics_keys())
"""

from __future__ import annotations

import copy
import os
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, Literal

import yaml

from prunefx._config import ConfigError, check_fields, check_keys, field_names, from_dict, load_yaml, to_dict
from prunefx.importance import CRITERIA
from prunefx.plan import PlanConfig
from prunefx.plan.config import TARGETS  # PlanConfig's alternative targets, written `target: {flops: 0.5}`
from prunefx.train.distill import DistillConfig
from prunefx.train.sparsity import SparsityConfig

# Target keys are alternatives: an override of one replaces the others (``prune.target.flops=0.4`` on a config
# that says ``target: {ratio: 0.3}`` means "use flops instead", not "give two targets").
_ONE_OF = {("prune", "target"): TARGETS}


def load_config(path: str | os.PathLike[str], overrides: Sequence[str] = ()) -> dict[str, Any]:
    """Read a YAML mapping from ``path`` and apply ``key=value`` overrides (dotted keys reach into blocks)."""
    path = Path(path)
    if not path.is_file():
        raise ConfigError(f"config file {path} does not exist; give the path of a YAML config, e.g. configs/yolo.yaml")
    try:
        raw = load_yaml(path.read_text(), str(path))
    except yaml.YAMLError as exc:
        raise ConfigError(f"{path} is not valid YAML: {exc}") from exc
    if not isinstance(raw, dict):
        raise ConfigError(f"{path} must hold a YAML mapping of keys to values, got {type(raw).__name__}")
    return apply_overrides(raw, overrides)


def apply_overrides(config: Mapping[str, Any], overrides: Sequence[str]) -> dict[str, Any]:
    """A copy of ``config`` with each ``a.b.c=value`` applied; values parse as YAML (``3``, ``0.5``, ``[a, b]``)."""
    out = copy.deepcopy(dict(config))
    for item in overrides:
        key, sep, text = item.partition("=")
        if not sep or not key or any(not part for part in key.split(".")):
            raise ConfigError(f"override {item!r} is not key=value; write e.g. epochs=3 or prune.target.flops=0.5")
        try:
            value = load_yaml(text, f"override {item!r}") if text else None
        except yaml.YAMLError as exc:
            raise ConfigError(f"override {item!r}: the value is not valid YAML ({exc})") from exc
        *parents, leaf = key.split(".")
        node = out
        for depth, part in enumerate(parents):
            child = node.get(part)
            if child is None:
                child = node[part] = {}
            if not isinstance(child, dict):
                where = ".".join(parents[: depth + 1])
                raise ConfigError(f"override {item!r}: {where} is {child!r}, not a block of keys")
            node = child
        for alt in _ONE_OF.get(tuple(parents), ()):
            if alt != leaf:
                node.pop(alt, None)
        node[leaf] = value
    return out


def dump_config(config: Mapping[str, Any]) -> str:
    """The resolved config as YAML, keys in the order given, every value written out (no anchors or aliases)."""
    return yaml.dump(dict(config), Dumper=_NoAliasDumper, sort_keys=False)


class _NoAliasDumper(yaml.SafeDumper):
    """SafeDumper that writes a value shared by two keys twice: load_yaml refuses aliases (resume reads this)."""

    def ignore_aliases(self, data: Any) -> bool:
        return True


@dataclass(frozen=True)
class RunOptions:
    """Where a run goes and how its directory is opened: the config's top-level run keys."""

    project: str = "runs/prune"  # the run goes to project/name (name2, name3, ... when taken)
    name: str | None = None  # default: the config file's stem
    resume: bool = False  # continue the run project/name after its last finished stage
    exist_ok: bool = False  # replace project/name instead of picking name2
    trust_checkpoint: bool = False  # unpickle checkpoints fully and eval model yamls: they can run code

    def __post_init__(self) -> None:
        check_fields(self)

    @classmethod
    def parse(cls, config: Mapping[str, Any], default_name: str) -> RunOptions:
        given = {k: config[k] for k in RUN_KEYS if config.get(k) is not None}
        opts = from_dict(cls, given)
        return replace(opts, name=str(opts.name or default_name))


RUN_KEYS = field_names(RunOptions)


@dataclass(frozen=True)
class StageSpec:
    """A training stage inside the prune block (fine-tuning): epochs plus training keys overriding the top level."""

    epochs: int = 0  # 0 skips the stage
    overrides: Mapping[str, Any] = field(default_factory=dict, hash=False)


@dataclass(frozen=True)
class SparsityStage(StageSpec):
    """Network-slimming sparsity training: the stage (epochs, start) and the regulariser (``config``)."""

    # baseline: continue from the trained baseline; scratch: train from the same initialisation as the baseline
    # with the penalty on from the first step (network slimming's recipe; a short-trained baseline's gammas sit
    # near 1, and a few appended epochs of plain L1 shrink them all alike instead of separating them)
    start: Literal["baseline", "scratch"] = "baseline"
    config: SparsityConfig = SparsityConfig()


_STAGE_KEYS = ("epochs", "start")
_DISTILL_KEYS = {"distill": "enabled", "distill_temperature": "temperature", "distill_weight": "weight"}


@dataclass(frozen=True)
class FinetuneStage(StageSpec):
    """Fine-tuning of the pruned model, optionally distilling the unpruned (baseline) model's outputs."""

    distill: bool = False  # logits KD (classification) / output KD (YOLO) from the baseline; see prunefx.train.distill
    distill_config: DistillConfig = DistillConfig()


# The controls: models of the pruned model's budget trained from scratch beside it, for the report's verdict.
# narrow: the uniformly narrower model (every prunable group kept at one common fraction, solved so its FLOPs
# equal the pruned model's), trained for the total epochs (baseline + sparsity + fine-tune) and for the
# fine-tune epochs; scratch: the pruned architecture re-initialised, trained for the total epochs.
CONTROLS = ("narrow", "scratch")


DEPTH_CRITERIA = ("influence", "output")  # prunefx.prune_depth's scores: 1 - cosine in/out, output error alone


@dataclass(frozen=True)
class DepthSpec:
    """``prune.depth``: residual blocks (decoder layers, ResNet blocks) removed before the width cut.

    The target stays a fraction of the model given: the width cut is planned for what the removed blocks left."""

    remove: int = 0  # blocks to remove (0: no depth cut)
    criterion: str = "influence"  # DEPTH_CRITERIA: ShortGPT's block influence, or the output error with it removed
    iterative: bool = False  # one block at a time, re-scored on the model without the earlier ones

    def __post_init__(self) -> None:
        check_fields(self)
        if self.remove < 0:
            raise ConfigError(f"prune.depth.remove must be >= 0 (blocks to remove), got {self.remove}")
        if self.criterion not in DEPTH_CRITERIA:
            check_keys([self.criterion], DEPTH_CRITERIA, "criterion", what="value")


EXPERT_CRITERIA = ("contribution", "reap", "frequency")  # prunefx.integrations.transformers.prune_experts'


@dataclass(frozen=True)
class ExpertSpec:
    """``prune.experts``: whole experts removed from every MoE layer first (the llm task)."""

    keep: float = 1.0  # fraction of each layer's experts kept (1: no expert cut)
    criterion: str = "contribution"  # EXPERT_CRITERIA

    def __post_init__(self) -> None:
        check_fields(self)
        if not 0 < self.keep <= 1:
            raise ConfigError(f"prune.experts.keep must be a fraction in (0, 1] of the experts, got {self.keep}")
        if self.criterion not in EXPERT_CRITERIA:
            check_keys([self.criterion], EXPERT_CRITERIA, "criterion", what="value")


@dataclass(frozen=True)
class PruneSpec:
    """The ``prune:`` block of a pipeline config, validated: what to prune to, and the stages around the cut."""

    criterion: str = "bn_scale"  # a registered importance (prunefx.importance.CRITERIA)
    plan: PlanConfig = field(default_factory=PlanConfig)
    sparsity: SparsityStage = SparsityStage()
    finetune: FinetuneStage = FinetuneStage()
    controls: tuple[Literal["narrow", "scratch"], ...] = ()  # CONTROLS trained from scratch for the verdict
    bias_compensation: bool | None = None  # default: on for bn_scale
    refit: bool = False  # least-squares re-fit of the layers that read pruned channels, on calibration batches
    verify: bool = True  # the oracle: the pruned model equals the masked original
    latency: bool = True  # time the models for the report
    # the report's latency timing stops after the round that passes this many seconds (or after all its rounds)
    latency_max_s: float = 120.0
    steps: int = 1  # cuts that reach the target, re-scoring between them (prunefx.prune(steps=))
    depth: DepthSpec = DepthSpec()  # blocks removed before the width cut (prunefx.prune_depth)
    experts: ExpertSpec = ExpertSpec()  # MoE experts removed first (the llm task)

    def __post_init__(self) -> None:
        if self.criterion not in CRITERIA:
            check_keys([self.criterion], CRITERIA, "prune.criterion", what="value")
        if len(set(self.controls)) != len(self.controls):
            raise ConfigError(f"prune.controls lists a control twice: {list(self.controls)}")
        if self.refit and self.bias_compensation:
            raise ConfigError("prune.refit replaces bias compensation (it re-solves each bias); leave "
                              "prune.bias_compensation unset or false")
        if isinstance(self.latency_max_s, bool) or not self.latency_max_s > 0:
            raise ConfigError(f"prune.latency_max_s must be a positive number of seconds, got {self.latency_max_s}")
        if isinstance(self.steps, bool) or not isinstance(self.steps, int) or self.steps < 1:
            raise ConfigError(f"prune.steps must be >= 1 (the number of cuts that reach the target), got {self.steps}")
        if self.depth.remove and self.controls:
            raise ConfigError("prune.controls train the width plan's architecture from scratch, which a depth cut "
                              "changes; remove prune.controls or prune.depth")
        if self.depth.remove and self.plan.latency is not None:
            raise ConfigError("prune.target.latency plans widths against measured latency, not after a depth "
                              "cut; give a flops or params target with prune.depth")

    @classmethod
    def parse(cls, block: Any, *, train_keys: Iterable[str]) -> PruneSpec:
        """Validate a ``prune:`` mapping; ``train_keys`` are the keys the sparsity/finetune blocks may override."""
        block = {} if block is None else block
        if not isinstance(block, Mapping):
            raise ConfigError(f"prune must be a block of keys (criterion, target, ...), got {block!r}")
        plan_keys = [k for k in field_names(PlanConfig) if k not in TARGETS]
        own = [k for k in field_names(cls) if k not in ("plan", "sparsity", "finetune", "depth", "experts")]
        check_keys(block, [*own, *plan_keys, "target", "sparsity", "finetune", "depth", "experts"], "prune")
        target = block.get("target")
        if isinstance(target, (int, float)) and not isinstance(target, bool):
            target = {"flops": target}  # a bare number is the FLOPs fraction kept
        if target is not None and (not isinstance(target, Mapping) or len(target) != 1):
            raise ConfigError(
                f"prune.target must name exactly one of {', '.join(TARGETS)} (e.g. {{flops: 0.5}}), got {target!r}"
            )
        if target is not None:
            check_keys(target, TARGETS, "prune.target")
        plan = {k: block[k] for k in plan_keys if k in block} | dict(target or {})
        train_keys = set(train_keys)
        return from_dict(cls, {
            **{k: block[k] for k in own if k in block},
            "plan": from_dict(PlanConfig, plan, "prune"),
            "sparsity": _stage(block.get("sparsity"), "prune.sparsity", train_keys, sparsity=True),
            "finetune": _stage(block.get("finetune"), "prune.finetune", train_keys, sparsity=False),
            "depth": _block(DepthSpec, block.get("depth"), "prune.depth"),
            "experts": _block(ExpertSpec, block.get("experts"), "prune.experts"),
        }, "prune")

    @property
    def target(self) -> dict[str, float]:
        return {k: v for k in TARGETS if (v := getattr(self.plan, k)) is not None}

    def to_dict(self) -> dict[str, Any]:
        """The ``prune:`` block as YAML writes it: ``PruneSpec.parse(spec.to_dict(), ...) == spec``."""
        plan = {k: v for k, v in to_dict(self.plan).items() if k not in TARGETS}
        own = {k: list(v) if isinstance(v := getattr(self, k), tuple) else v
               for k in field_names(type(self)) if k not in ("plan", "sparsity", "finetune", "depth", "experts")}
        sp = self.sparsity
        return {
            **own,
            "target": self.target,
            **plan,
            "sparsity": {"epochs": sp.epochs, "start": sp.start, **to_dict(sp.config), **sp.overrides},
            "finetune": {"epochs": self.finetune.epochs, **_distill_keys(self.finetune), **self.finetune.overrides},
            "depth": to_dict(self.depth),
            "experts": to_dict(self.experts),
        }


def _block(cls: type, block: Any, where: str) -> Any:
    """A block of ``cls``'s keys (absent: its defaults, no cut)."""
    if block is None:
        return cls()
    if not isinstance(block, Mapping):
        raise ConfigError(f"{where} must be a block of keys ({', '.join(field_names(cls))}), got {block!r}")
    return from_dict(cls, block, where)


def _distill_keys(ft: FinetuneStage) -> dict[str, Any]:
    """The fine-tuning block's distillation keys, as YAML writes them."""
    return {key: (ft.distill if name == "enabled" else getattr(ft.distill_config, name))
            for key, name in _DISTILL_KEYS.items()}


def _stage(block: Any, where: str, train_keys: set[str], *, sparsity: bool) -> StageSpec:
    """A sparsity / fine-tuning block: its stage keys, the regulariser's keys, the rest training overrides."""
    block = {} if block is None else block
    if not isinstance(block, Mapping):
        raise ConfigError(f"{where} must be a block of keys (epochs, ...), got {block!r}")
    own = (*_STAGE_KEYS, *field_names(SparsityConfig)) if sparsity else ("epochs", *_DISTILL_KEYS)
    check_keys(block, {*own, *train_keys}, where)
    overrides = {k: v for k, v in block.items() if k not in own}
    epochs = from_dict(StageSpec, {"epochs": block.get("epochs", 0)}, where).epochs
    if epochs < 0:
        raise ConfigError(f"{where}.epochs must be >= 0 (0 skips the stage), got {epochs}")
    if not sparsity:
        distill = from_dict(FinetuneStage, {"distill": block.get("distill", False)}, where).distill
        config = from_dict(DistillConfig, {name: block[key] for key, name in _DISTILL_KEYS.items()
                                           if key in block and name != "enabled"}, where)
        return FinetuneStage(epochs, overrides, distill=distill, distill_config=config)
    config = from_dict(SparsityConfig, {k: v for k, v in block.items() if k in field_names(SparsityConfig)}, where)
    start = from_dict(SparsityStage, {"start": block.get("start", "baseline")}, where).start
    return SparsityStage(epochs, overrides, start=start, config=config)


__all__ = [
    "CONTROLS",
    "DEPTH_CRITERIA",
    "RUN_KEYS",
    "TARGETS",
    "ConfigError",
    "DepthSpec",
    "EXPERT_CRITERIA",
    "ExpertSpec",
    "FinetuneStage",
    "PruneSpec",
    "RunOptions",
    "SparsityStage",
    "StageSpec",
    "apply_overrides",
    "check_keys",
    "dump_config",
    "load_config",
]
