"""One validator for every config: from_dict / to_dict / check_fields, and every config round-trips JSON and YAML."""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Literal

import pytest
import yaml

from prunefx._config import ConfigError, check_fields, from_dict, to_dict
from prunefx.pipeline.backends.classify import Processes
from prunefx.pipeline.run_config import PruneSpec, RunOptions
from prunefx.plan import PlanConfig, PlanError
from prunefx.train import SparsityConfig, TrainConfig, TrainError


@dataclass(frozen=True)
class Inner:
    rate: float = 0.1
    mode: Literal["a", "b"] = "a"

    def __post_init__(self) -> None:
        check_fields(self)


@dataclass(frozen=True)
class Outer:
    name: str
    inner: Inner = Inner()
    sizes: tuple[int, ...] = ()
    pairs: tuple[tuple[str, float], ...] = ()
    limit: float | None = None


def test_from_dict_converts_by_annotation() -> None:
    got = from_dict(Outer, {"name": "x", "inner": {"rate": "1e-3", "mode": "b"}, "sizes": [1, 2],
                            "pairs": [["a.*", 0.5]], "limit": 3})
    assert got == Outer("x", Inner(1e-3, "b"), (1, 2), (("a.*", 0.5),), 3.0)
    assert isinstance(got.limit, float) and from_dict(Outer, {"name": "x", "limit": None}).limit is None


@pytest.mark.parametrize(("data", "message"), [
    ({"name": "x", "limt": 1}, r"unknown key in Outer: 'limt' \(did you mean 'limit'\?\)"),
    ({}, r"Outer: missing 'name'"),
    ({"name": "x", "sizes": [1, True]}, r"sizes\[1\] must be an integer, got True"),
    ({"name": "x", "limit": True}, r"limit must be a number or null, got True"),
    ({"name": "x", "limit": "fast"}, r"limit must be a number or null, got 'fast'"),
    ({"name": "x", "inner": {"mode": "B"}}, r"inner.mode must be one of 'a', 'b', got 'B'"),
    ({"name": "x", "inner": 3}, r"inner must be a block of keys"),
    ({"name": "x", "pairs": [["a", 0.5, 1]]}, r"pairs\[0\] must be a list"),
    ({"name": 3}, r"name must be a string, got 3"),
])
def test_from_dict_errors_name_the_key(data: dict, message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        from_dict(Outer, data)


def test_check_fields_gives_python_construction_the_same_checks() -> None:
    assert Inner(rate=1).rate == 1.0 and isinstance(Inner(rate=1).rate, float)
    with pytest.raises(ConfigError, match="mode must be one of 'a', 'b'"):
        Inner(mode="c")  # type: ignore[arg-type]
    with pytest.raises(TrainError, match="lr must be a number"):
        TrainConfig(lr="fast")  # type: ignore[arg-type]
    with pytest.raises(PlanError, match="scope must be one of 'global', 'local'"):
        PlanConfig(scope="layer")  # type: ignore[arg-type]


# Every config class with a non-default value in each field kind it has: scalars, literals, tuples, nested.
CONFIGS = [
    PlanConfig(),
    PlanConfig(ratio=0.3, scope="local", round_to=8, ignore=("model.22.*",), overrides=(("layer1.*", 0.2),)),
    PlanConfig(params=0.4, min_channels=4, max_ratio=0.7, graph_rewrite=True),
    SparsityConfig(),
    SparsityConfig(s=2e-3, schedule="target", target=0.4, s_max=0.2, selective=True, exclude=("a", "b.*")),
    TrainConfig(),
    TrainConfig(optimizer="adamw", schedule="step", lr_steps=(0.3, 0.6), augment=("crop", "flip"), grad_clip=10.0),
    RunOptions(project="runs/x", name="y", resume=True),
    Processes(nproc=2, device="cpu", threads=1, dist_timeout=60.0),
]


@pytest.mark.parametrize("fmt", ["json", "yaml"])
@pytest.mark.parametrize("config", CONFIGS, ids=lambda c: type(c).__name__)
def test_configs_round_trip_through_json_and_yaml(config: object, fmt: str) -> None:
    data = to_dict(config)
    text = json.dumps(data) if fmt == "json" else yaml.safe_dump(data)
    again = json.loads(text) if fmt == "json" else yaml.safe_load(text)
    assert from_dict(type(config), again) == config


@pytest.mark.parametrize("fmt", ["json", "yaml"])
@pytest.mark.parametrize("block", [
    {},
    {"criterion": "l1", "target": {"ratio": 0.3}, "round_to": 8, "ignore": ["model.22.*"], "verify": False,
     "sparsity": {"epochs": 3, "start": "scratch", "schedule": "target", "selective": True, "s_max": 0.2, "lr0": 0.02},
     "finetune": {"epochs": 5, "lr0": 0.001}},
])
def test_prune_block_round_trips_in_its_yaml_shape(block: dict, fmt: str) -> None:
    spec = PruneSpec.parse(block, train_keys={"lr0"})
    text = json.dumps(spec.to_dict()) if fmt == "json" else yaml.safe_dump(spec.to_dict())
    again = json.loads(text) if fmt == "json" else yaml.safe_load(text)
    assert PruneSpec.parse(again, train_keys={"lr0"}) == spec
    assert "plan" not in again and again["target"] == spec.target  # the YAML shape, not the nesting


def test_one_default_per_setting() -> None:
    # The pruning target and the sparsity strength are stated once; the API, CLI and configs read them there.
    spec = PruneSpec.parse({}, train_keys=())
    assert spec.plan == PlanConfig() and spec.target == {"flops": 0.5}
    assert spec.sparsity.config == SparsityConfig()
    from prunefx.train import BNSparsity

    assert BNSparsity.__init__.__defaults__[0] == SparsityConfig().s  # s, the first defaulted parameter
