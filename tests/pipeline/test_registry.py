"""The config's task, then its model's family, picks the pipeline that runs a config and reads its runs back
(prunefx.pipeline.registry)."""

from __future__ import annotations

import sys
import types
import warnings
from pathlib import Path

import pytest

from prunefx._extras import MissingExtraError
from prunefx.pipeline import registry, run_config
from prunefx.pipeline.backends.classify import run_classify_config
from prunefx.pipeline.run_config import ConfigError

CONFIGS = Path(__file__).resolve().parents[2] / "configs"


def test_builtin_families_have_their_pipelines() -> None:
    assert registry.pipeline_for("torch") is run_classify_config
    assert registry._PIPELINES["ultralytics"].target.endswith(":run_yolo_config")


def test_a_configs_task_picks_among_its_familys_pipelines() -> None:
    pytest.importorskip("accelerate")
    from prunefx.pipeline.backends.classify import run_classify_config
    from prunefx.pipeline.backends.custom import run_custom_config

    assert registry.pipeline_for("torch", "custom") is run_custom_config
    assert registry.pipeline_for("torch", "classify") is run_classify_config  # no entry of its own: the family's


def test_unknown_family_is_one_config_error_naming_the_known_ones() -> None:
    with pytest.raises(ConfigError, match=r"the .jax. family \(pipelines: torch, ultralytics; for any model, task: "
                                          r"custom, llm\)"):
        registry.pipeline_for("jax")


def test_a_task_for_any_model_is_found_whatever_the_models_family() -> None:
    # `task: llm` with a checkpoint directory as the model: no family claims a directory, the task does
    from prunefx.pipeline.backends.llm import run_llm_config
    from prunefx.spec import config_family

    family = config_family("path/to/checkpoint").name
    assert registry.pipeline_for(family, "llm") is run_llm_config
    assert registry.pipeline_for(family, None) is not run_llm_config


@pytest.mark.parametrize("config,family", [("digits_cnn.yaml", "torch"), ("yolo.yaml", "ultralytics")])
def test_run_config_calls_the_pipeline_registered_for_the_models_family(
    config: str, family: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    seen: list[tuple[str, str]] = []
    fake = types.ModuleType("_fake_pipeline")
    fake.run = lambda cfg, name, log: seen.append((cfg["model"], name)) or "the run"  # type: ignore[attr-defined]
    monkeypatch.setitem(sys.modules, "_fake_pipeline", fake)
    monkeypatch.setattr(registry, "_PIPELINES", dict(registry._PIPELINES))
    registry.register_pipeline(family, "_fake_pipeline:run")
    assert run_config(CONFIGS / config, [], log=lambda _: None) == "the run"
    assert len(seen) == 1 and seen[0][1] == Path(config).stem


def test_a_missing_package_is_named_before_the_pipeline_is_imported(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(registry, "_PIPELINES", dict(registry._PIPELINES))
    monkeypatch.setitem(sys.modules, "ultralytics", None)  # import ultralytics now fails as if not installed
    registry.register_pipeline("torch", "no_such_module_xyz:run", needs="ultralytics", what="the X pipeline")
    with pytest.raises(MissingExtraError, match=r"the X pipeline needs ultralytics.*prunefx\[yolo\]"):
        registry.pipeline_for("torch")


@pytest.mark.parametrize(("config", "key"), [
    ({"model": "torchvision:resnet18"}, "torch"),
    ({"task": "classify", "model": "prunefx.zoo:bn_cnn"}, "torch"),
    ({"task": "classify", "model": "yolov8n-cls.yaml"}, "ultralytics"),  # ultralytics' classify task
    ({"model": "yolov8n.yaml"}, "ultralytics"),
    ({"task": "custom", "model": "yolov8n.yaml"}, "*/custom"),  # the task owns its pipeline, whatever the model
    ({"task": "llm", "model": "prunefx.zoo:bn_cnn"}, "*/llm"),
])
def test_the_task_decides_before_the_family_and_nothing_is_imported(config: dict, key: str) -> None:
    before = set(sys.modules)
    assert registry.pipeline_of(config) is registry._PIPELINES[key]
    assert not {m for m in set(sys.modules) - before if "backends" in m or m.startswith("ultralytics")}


def test_every_built_in_pipeline_reads_its_runs_back() -> None:
    from prunefx.pipeline import readback

    for pipeline in (*registry._PIPELINES.values(), registry.SPEC_RUN):
        module, _, name = pipeline.read_back.partition(":")
        assert module == readback.__name__ and callable(getattr(readback, name)), pipeline


def test_replacing_a_built_in_pipeline_warns_unless_asked() -> None:
    from prunefx.errors import RegistryOverrideWarning

    saved = dict(registry._PIPELINES)
    try:
        with pytest.warns(RegistryOverrideWarning, match=r"register_pipeline\('torch'\) replaces the entry prunefx"):
            registry.register_pipeline("torch", "mine:run")
        with warnings.catch_warnings():
            warnings.simplefilter("error")
            registry.register_pipeline("torch", "mine:run2", replace=True)
            registry.register_pipeline("jax", "mine:run")  # a new family: nothing replaced
    finally:
        registry._PIPELINES.clear()
        registry._PIPELINES.update(saved)
