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
                   r"model factory 'hostile_models:exits' called sys\.exit\(0\)")
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
