"""Broken inputs: one line saying what is wrong (exit code 2), decided by what the input is, before any work."""

from __future__ import annotations

import pytest
from _hostile import Sandbox, assert_refused, assert_untouched, invoke

# ---- config or SPEC: decided by what the argument is -------------------------------------------------------------

CONFIGS = {
    "missing": (None, r"config file missing\.yaml does not exist"),
    "empty": ("", r"must hold a YAML mapping of keys to values, got NoneType"),
    "unparsable": ("model: [unclosed\n", r"is not valid YAML"),
    "a list": ("- model: yolov8n.yaml\n", r"must hold a YAML mapping of keys to values, got list"),
    "without a model": ("epochs: 3\n", r"model is missing"),
    "binary": (b"\xff\xfe\x00garbage", r"config cfg\.yaml is not a text \(UTF-8 YAML\) file"),
}


@pytest.mark.parametrize("case", CONFIGS)
def test_config_errors_are_the_config_loaders(sandbox: Sandbox, case: str) -> None:
    text, message = CONFIGS[case]
    name = "missing.yaml" if text is None else "cfg.yaml"
    if isinstance(text, bytes):
        (sandbox.root / name).write_bytes(text)
    elif text is not None:
        (sandbox.root / name).write_text(text)
    before = sandbox.snapshot()
    line = assert_refused(invoke("prune", name, "project=runs"), message)
    assert "SPEC" not in line and "not a .pt file" not in line
    assert_untouched(sandbox, before)
    assert not sandbox.project.exists()


# Nine levels of nine aliases each: 9**10 (3.5e9) strings once anything walks `epochs`, from 11 lines.
BILLION_LAUGHS = "model: prunefx.zoo:bn_cnn\nepochs:\n  - &a0 [" + ", ".join(["lol"] * 9) + "]\n" + "".join(
    f"  - &a{i} [" + ", ".join([f"*a{i - 1}"] * 9) + "]\n" for i in range(1, 10)
)


@pytest.fixture
def resolved_aliases(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """Every YAML alias a loader resolves, recorded; the first one fails the test (it would be expanded next)."""
    import yaml

    resolved: list[str] = []
    compose = yaml.composer.Composer.compose_node

    def compose_node(self, parent, index):
        if self.check_event(yaml.AliasEvent):
            resolved.append(self.peek_event().anchor)
            raise AssertionError(f"the alias *{resolved[-1]} was resolved")
        return compose(self, parent, index)

    monkeypatch.setattr(yaml.composer.Composer, "compose_node", compose_node)
    return resolved


def test_a_yaml_alias_bomb_is_refused_before_it_expands(sandbox: Sandbox, resolved_aliases: list[str]) -> None:
    (sandbox.root / "bomb.yaml").write_text(BILLION_LAUGHS)
    before = sandbox.snapshot()
    assert_refused(invoke("prune", "bomb.yaml", "project=runs"),
                   r"bomb\.yaml uses the YAML alias \*a0 \(line 4\); prunefx configs take no anchors or aliases "
                   r".*write the values out")
    assert resolved_aliases == []  # refused at the first alias event: nothing was shared, let alone expanded
    assert_untouched(sandbox, before)
    assert not sandbox.project.exists()


def test_every_yaml_a_user_hands_over_refuses_aliases(sandbox: Sandbox, resolved_aliases: list[str]) -> None:
    from prunefx.pipeline import ConfigError, apply_overrides, load_config
    from prunefx.pipeline.backends.yolo import _check_data_yaml

    bomb = sandbox.root / "bomb.yaml"
    bomb.write_text(BILLION_LAUGHS)
    with pytest.raises(ConfigError, match=r"bomb\.yaml uses the YAML alias \*a0"):
        load_config(bomb)
    data = sandbox.root / "data.yaml"
    data.write_text("path: &p .\ntrain: *p\nval: images/val\nnames: {0: a}\n")
    with pytest.raises(ConfigError, match=r"data yaml .*data\.yaml uses the YAML alias \*p \(line 2\)"):
        _check_data_yaml(data)
    with pytest.raises(ConfigError, match=r"override 'epochs=\*a' uses the YAML alias \*a"):
        apply_overrides({}, ["epochs=*a"])
    assert resolved_aliases == []


def test_a_model_yaml_is_not_a_config(sandbox: Sandbox) -> None:
    (sandbox.root / "net.yaml").write_text("nc: 2\nbackbone: [[-1, 1, Conv, [16, 3, 2]]]\n"
                                           "head: [[-1, 1, Classify, [2]]]\n")
    before = sandbox.snapshot()
    assert_refused(invoke("prune", "net.yaml"), r"net\.yaml is an ultralytics model yaml, not a pipeline config; .*"
                                                r"prunefx prune ultralytics:net\.yaml")
    assert_untouched(sandbox, before)


# ---- user code that misbehaves -----------------------------------------------------------------------------------


def test_a_factory_that_calls_sys_exit(sandbox: Sandbox) -> None:
    before = sandbox.snapshot()
    for command in ("analyze", "flops"):
        assert_refused(invoke(command, "hostile_models:exits", "--imgsz", "16"),
                       r"factory 'hostile_models:exits' called sys\.exit\(0\) instead of returning a model")
    assert_refused(invoke("prune", "digits_cnn.yaml", "model=hostile_models:exits", "project=runs"),
                   r"factory 'hostile_models:exits' called sys\.exit\(0\) instead of returning a model")
    (sandbox.root / "exits_on_import.py").write_text("import sys\nsys.exit(0)\n")
    before = sandbox.snapshot()
    assert_refused(invoke("analyze", "exits_on_import:f"), r"importing 'exits_on_import' called sys\.exit\(0\)")
    assert_untouched(sandbox, before)
    assert not sandbox.project.exists()


def test_an_empty_classification_checkpoint(sandbox: Sandbox) -> None:
    (sandbox.root / "empty.pt").write_bytes(b"")
    before = sandbox.snapshot()
    assert_refused(invoke("prune", "digits_cnn.yaml", "checkpoint=empty.pt", "project=runs"),
                   r"checkpoint empty\.pt is empty \(0 bytes\)")
    assert_refused(invoke("analyze", "empty.pt"), r"cannot load checkpoint empty\.pt: it is empty")
    assert_untouched(sandbox, before)


# ---- image sizes: the model decides ------------------------------------------------------------------------------


def test_small_images_are_the_models_to_refuse(sandbox: Sandbox) -> None:
    for spec, size in (("torchvision:resnet18", "16"), ("hostile_models:big_kernel", "7")):
        result = invoke("analyze", spec, "--imgsz", size)
        assert result.exit_code == 0, result.output
    assert_refused(invoke("analyze", "hostile_models:big_kernel", "--imgsz", "6"),
                   r"the model does not run on example inputs of shape \[\(1, 3, 6, 6\)\]: RuntimeError: .*Kernel size")
    for size in ("0", "-3"):
        assert_refused(invoke("analyze", "torchvision:resnet18", "--imgsz", size), r"imgsz must be a positive integer")


def test_prune_where_the_model_cannot_train_on_the_input(sandbox: Sandbox) -> None:
    """resnet18 at 32 px ends in 1x1 maps: BatchNorm cannot train on one value per channel, the original included."""
    before = sandbox.snapshot()
    result = invoke("prune", "torchvision:resnet18", "--imgsz", "32", "--no-latency", "--out", "runs/r18")
    assert_refused(result, r"torchvision:resnet18 cannot run in train mode on one 1x3x32x32 input \(ValueError: "
                           r"Expected more than 1 value per channel when training.*give a larger --imgsz")
    assert_untouched(sandbox, before)
    assert not sandbox.project.exists()


# ---- one-shot prune that would prune nothing ---------------------------------------------------------------------


@pytest.mark.parametrize(
    "args, message",
    [
        (["hostile_models:tiny", "--flops", "1.0"], r"--flops 1\.0 keeps every channel, so there is nothing to prune"),
        (["hostile_models:tiny", "--params", "1"], r"--params 1\.0 keeps every channel"),
        (["hostile_models:tiny", "--ratio", "0"], r"--ratio 0\.0 keeps every channel"),
        (["hostile_models:frozen"], r"nothing in hostile_models:frozen can be pruned: all \d+ channel groups are "
                                    r"frozen \(.*model (input|output)"),
        (["hostile_models:tiny", "--ignore", "*"], r"none of the 1 prunable groups of hostile_models:tiny may be "
                                                   r"pruned: ignored by pattern '\*'"),
        (["hostile_models:tiny", "--flops", "0.999"], r"the target \(flops 0\.999\) is already met"),
    ],
)
def test_prune_spec_that_prunes_nothing_writes_nothing(sandbox: Sandbox, args: list[str], message: str) -> None:
    before = sandbox.snapshot()
    assert_refused(invoke("prune", *args, "--imgsz", "16", "--no-latency", "--out", "runs/x"), message)
    assert_untouched(sandbox, before)
    assert not (sandbox.project / "x").exists()
