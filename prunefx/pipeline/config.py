"""Pipeline configs: a YAML file plus ``key=value`` overrides, validated before any work starts.

A config keeps the training tool's own keys at the top level (ultralytics' ``epochs``, ``imgsz``, ...)
and prunefx's keys in one ``prune:`` block, parsed here into a frozen :class:`PruneSpec`::

    prune:
      criterion: bn_scale            # bn_scale | l1 | l2 | taylor | random
      target: {flops: 0.5}           # exactly one of ratio / flops / params
      scope: global                  # global | local
      round_to: 1
      ignore: []                     # fnmatch patterns of modules left alone
      sparsity: {epochs: 0, s: 1.0e-3, schedule: constant, exclude_residual: false}
      finetune: {epochs: 10}         # plus any training key, overriding the top level for fine-tuning

>>> raw = load_config("configs/yolo.yaml", ["epochs=3", "prune.target.flops=0.4"])
>>> spec = PruneSpec.parse(raw["prune"], train_keys=ULTRALYTICS_KEYS)
"""

from __future__ import annotations

import copy
import difflib
import os
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import asdict, dataclass, field, fields
from pathlib import Path
from typing import Any

import yaml

from prunefx.errors import PrunefxError
from prunefx.importance import CRITERIA
from prunefx.plan import PlanConfig, PlanError


class ConfigError(PrunefxError):
    """A pipeline config is invalid; the message names the key and the fix."""


# Target keys are alternatives: an override of one replaces the others (``prune.target.flops=0.4`` on a config
# that says ``target: {ratio: 0.3}`` means "use flops instead", not "give two targets").
_ONE_OF = {("prune", "target"): ("ratio", "flops", "params")}


def load_config(path: str | os.PathLike[str], overrides: Sequence[str] = ()) -> dict[str, Any]:
    """Read a YAML mapping from ``path`` and apply ``key=value`` overrides (dotted keys reach into blocks)."""
    path = Path(path)
    if not path.is_file():
        raise ConfigError(f"config file {path} does not exist; give the path of a YAML config, e.g. configs/yolo.yaml")
    try:
        raw = yaml.safe_load(path.read_text())
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
            value = yaml.safe_load(text) if text else None
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


def check_keys(given: Iterable[str], known: Iterable[str], where: str, *, what: str = "key") -> None:
    """Raise :class:`ConfigError` naming every unknown key in ``given`` with the closest known spelling."""
    known = sorted(known)
    bad = [k for k in given if k not in known]
    if not bad:
        return
    hints = []
    for k in bad:
        close = difflib.get_close_matches(str(k), known, n=1, cutoff=0.6)
        hints.append(f"{k!r}" + (f" (did you mean {close[0]!r}?)" if close else ""))
    raise ConfigError(
        f"unknown {what}{'s' if len(bad) > 1 else ''} in {where}: {', '.join(hints)}; known {what}s: {', '.join(known)}"
    )


def _typed(value: Any, kind: type | tuple[type, ...], key: str) -> Any:
    # YAML reads 1e-3 as a string (YAML 1.1 needs a dot: 1.0e-3); accept it as the number the user meant.
    if isinstance(value, str) and float in (kind if isinstance(kind, tuple) else (kind,)):
        try:
            value = float(value)
        except ValueError:
            pass
    if isinstance(value, bool) and bool not in (kind if isinstance(kind, tuple) else (kind,)):
        raise ConfigError(f"{key} must be {_names(kind)}, got {value!r}")
    if isinstance(value, int) and not isinstance(value, bool) and kind is float:
        value = float(value)
    if not isinstance(value, kind):
        raise ConfigError(f"{key} must be {_names(kind)}, got {value!r}")
    return value


def _names(kind: type | tuple[type, ...]) -> str:
    kinds = kind if isinstance(kind, tuple) else (kind,)
    return " or ".join(
        {
            "NoneType": "null",
            "str": "a string",
            "float": "a number",
            "int": "an integer",
            "bool": "true/false",
            "list": "a list",
            "tuple": "a list",
        }.get(k.__name__, k.__name__)
        for k in kinds
    )


@dataclass(frozen=True)
class TrainSpec:
    """A training stage inside the prune block (sparsity, fine-tuning): epochs plus training-key overrides."""

    epochs: int = 0
    overrides: Mapping[str, Any] = field(default_factory=dict, hash=False)

    def to_dict(self) -> dict[str, Any]:
        return {"epochs": self.epochs, **self.overrides}


@dataclass(frozen=True)
class SparsitySpec(TrainSpec):
    """Network-slimming sparsity training: L1 on BatchNorm gammas, ``s`` fixed or adapted to a target."""

    s: float = 1e-3
    # baseline: continue from the trained baseline; scratch: train from the same initialisation as the baseline
    # with the penalty on from the first step (network slimming's recipe; a short-trained baseline's gammas sit
    # near 1, and a few appended epochs of plain L1 shrink them all alike instead of separating them)
    start: str = "baseline"
    schedule: str = "constant"  # constant | target (prunefx.train.TargetSparsity)
    target: float = 0.5  # schedule=target: fraction of gammas driven below threshold
    threshold: float = 1e-2
    s_max: float = 3e-2  # schedule=target: the largest s it may reach (keep s_max * lr well below threshold)
    selective: bool = False  # penalise only the `target` fraction with the smallest gammas (BNSparsity select)
    exclude_residual: bool = False  # leave BNs that feed residual adds unpenalised
    exclude: tuple[str, ...] = ()  # fnmatch patterns of BatchNorm names left unpenalised

    def to_dict(self) -> dict[str, Any]:
        own = {f.name: getattr(self, f.name) for f in fields(self) if f.name not in ("epochs", "overrides")}
        own["exclude"] = list(self.exclude)
        return {"epochs": self.epochs, **own, **self.overrides}


_SPARSITY_OWN = {
    "s": float,
    "start": str,
    "schedule": str,
    "target": float,
    "threshold": float,
    "s_max": float,
    "selective": bool,
    "exclude_residual": bool,
    "exclude": list,
}


@dataclass(frozen=True)
class PruneSpec:
    """The ``prune:`` block of a pipeline config, validated."""

    criterion: str = "bn_scale"
    ratio: float | None = None
    flops: float | None = None
    params: float | None = None
    scope: str = "global"
    round_to: int = 1
    min_channels: int = 1
    max_ratio: float = 0.9
    ignore: tuple[str, ...] = ()
    bias_compensation: bool | None = None  # default: on for bn_scale
    verify: bool = True
    latency: bool = True
    sparsity: SparsitySpec = SparsitySpec()
    finetune: TrainSpec = TrainSpec()

    _SCALARS = {
        "criterion": str,
        "scope": str,
        "round_to": int,
        "min_channels": int,
        "max_ratio": float,
        "ignore": list,
        "bias_compensation": (bool, type(None)),
        "verify": bool,
        "latency": bool,
    }

    @classmethod
    def parse(cls, block: Any, *, train_keys: Iterable[str]) -> PruneSpec:
        """Validate a ``prune:`` mapping; ``train_keys`` are the keys the sparsity/finetune blocks may override."""
        if block is None:
            block = {}
        if not isinstance(block, dict):
            raise ConfigError(f"prune must be a block of keys (criterion, target, ...), got {block!r}")
        check_keys(block, [*cls._SCALARS, "target", "sparsity", "finetune"], "prune")
        kw: dict[str, Any] = {}
        for key, kind in cls._SCALARS.items():
            if key in block:
                kw[key] = _typed(block[key], kind, f"prune.{key}")
        if "ignore" in kw:
            kw["ignore"] = tuple(str(p) for p in kw["ignore"])
        if kw.get("criterion", "bn_scale") not in CRITERIA:
            check_keys([kw["criterion"]], CRITERIA, "prune.criterion", what="value")
        target = block.get("target", {"flops": 0.5})
        if isinstance(target, (int, float)) and not isinstance(target, bool):
            target = {"flops": target}  # a bare number is the FLOPs fraction kept
        if not isinstance(target, dict) or len(target) != 1:
            raise ConfigError(
                f"prune.target must name exactly one of ratio, flops, params (e.g. {{flops: 0.5}}), got {target!r}"
            )
        check_keys(target, ("ratio", "flops", "params"), "prune.target")
        ((tkey, tval),) = target.items()
        kw[tkey] = _typed(tval, float, f"prune.target.{tkey}")
        train_keys = set(train_keys)
        kw["sparsity"] = _parse_train(block.get("sparsity"), "prune.sparsity", train_keys, SparsitySpec, _SPARSITY_OWN)
        kw["finetune"] = _parse_train(block.get("finetune"), "prune.finetune", train_keys, TrainSpec, {})
        spec = cls(**kw)
        spec.plan_config()  # the planner's own range checks, now rather than after training
        if spec.sparsity.start not in ("baseline", "scratch"):
            raise ConfigError(f"prune.sparsity.start must be 'baseline' or 'scratch', got {spec.sparsity.start!r}")
        if spec.sparsity.schedule not in ("constant", "target"):
            raise ConfigError(f"prune.sparsity.schedule must be 'constant' or 'target', got {spec.sparsity.schedule!r}")
        if not 0 < spec.sparsity.target < 1:
            raise ConfigError(f"prune.sparsity.target must be in (0, 1), got {spec.sparsity.target}")
        if spec.sparsity.s < 0:
            raise ConfigError(f"prune.sparsity.s must be >= 0, got {spec.sparsity.s}")
        return spec

    def plan_config(self) -> PlanConfig:
        try:
            return PlanConfig(
                ratio=self.ratio,
                flops=self.flops,
                params=self.params,
                scope=self.scope,
                round_to=self.round_to,
                min_channels=self.min_channels,
                max_ratio=self.max_ratio,
                ignore=self.ignore,
            )
        except PlanError as exc:
            raise ConfigError(f"prune: {exc}") from exc

    @property
    def target(self) -> dict[str, float]:
        return {k: v for k in ("ratio", "flops", "params") if (v := getattr(self, k)) is not None}

    def to_dict(self) -> dict[str, Any]:
        out = {k: v for k, v in asdict(self).items() if k not in ("ratio", "flops", "params", "sparsity", "finetune")}
        out["ignore"] = list(self.ignore)
        return {**out, "target": self.target, "sparsity": self.sparsity.to_dict(), "finetune": self.finetune.to_dict()}


def _parse_train(block: Any, where: str, train_keys: set[str], cls: type[TrainSpec], own: dict[str, Any]) -> TrainSpec:
    if block is None:
        return cls()
    if not isinstance(block, dict):
        raise ConfigError(f"{where} must be a block of keys (epochs, ...), got {block!r}")
    check_keys(block, {"epochs", *own, *train_keys}, where)
    kw: dict[str, Any] = {"epochs": _typed(block.get("epochs", 0), int, f"{where}.epochs")}
    if kw["epochs"] < 0:
        raise ConfigError(f"{where}.epochs must be >= 0 (0 skips the stage), got {kw['epochs']}")
    for key, kind in own.items():
        if key in block:
            kw[key] = _typed(block[key], kind, f"{where}.{key}")
    if "exclude" in kw:
        kw["exclude"] = tuple(str(p) for p in kw["exclude"])
    kw["overrides"] = {k: v for k, v in block.items() if k not in own and k != "epochs"}
    return cls(**kw)


def dump_config(config: Mapping[str, Any]) -> str:
    """The resolved config as YAML, keys in the order given."""
    return yaml.safe_dump(dict(config), sort_keys=False)
