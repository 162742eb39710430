"""load_spec: every SPEC form builds the right model and inputs offline; every bad SPEC is a SpecError that says why."""

from __future__ import annotations

import copy
from collections.abc import Iterator
from pathlib import Path

import pytest
import torch
import torchvision
from torch import nn

import prunefx.family
from prunefx.errors import SpecError
from prunefx.family import ModelFamily, get_family, register_family
from prunefx.integrations.ultralytics.env import setup_offline
from prunefx.spec import LoadedModel, call_factory, config_family, load_spec, resolve_factory

setup_offline()  # before ultralytics is imported: it reads YOLO_OFFLINE and YOLO_CONFIG_DIR at import

from ultralytics import YOLO
from ultralytics.nn import tasks

TESTS = Path(__file__).resolve().parent
YOLOV8N_PARAMS = 3_157_200  # nc=80, as ultralytics' own summary prints it


@pytest.fixture(autouse=True)
def offline(no_network: list[str]) -> Iterator[list[str]]:
    """Building an architecture must never try to download weights (no_network is in conftest.py)."""
    yield no_network
    assert not no_network, f"load_spec tried the network: {no_network}"


@pytest.fixture(autouse=True)
def factories_importable(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.syspath_prepend(str(TESTS))


def params(model: nn.Module) -> int:
    return sum(p.numel() for p in model.parameters())


def check_loaded(loaded: LoadedModel, kind: str, shape: tuple[int, ...]) -> None:
    assert loaded.kind == kind
    # ultralytics models are saved, exported and costed by ultralytics' family; the rest are plain torch
    assert loaded.family.name == ("ultralytics" if kind in ("ultralytics", "checkpoint") else "torch")
    assert isinstance(loaded.family, ModelFamily)
    assert isinstance(loaded.example_inputs, tuple) and len(loaded.example_inputs) == 1
    assert tuple(loaded.example_inputs[0].shape) == shape
    assert not any(m.training for m in loaded.model.modules())
    with torch.no_grad():
        loaded.model(*loaded.example_inputs)  # the inputs are ones the model accepts


# ---- torchvision -------------------------------------------------------------------------------------


def test_torchvision_classifier() -> None:
    loaded = load_spec("torchvision:resnet18", imgsz=64)
    check_loaded(loaded, "torchvision", (1, 3, 64, 64))
    assert loaded.name == "torchvision:resnet18"
    assert params(loaded.model) == params(torchvision.models.resnet18())
    assert tuple(load_spec("torchvision:resnet18").example_inputs[0].shape) == (1, 3, 224, 224)


@pytest.mark.slow
@pytest.mark.filterwarnings("ignore:The default weight initialization of inception_v3:FutureWarning")
def test_inception_defaults_to_299() -> None:
    assert tuple(load_spec("torchvision:inception_v3").example_inputs[0].shape) == (1, 3, 299, 299)


def test_torchvision_segmentation_builds_without_backbone_weights() -> None:
    # Its builder defaults to ImageNet backbone weights, which no_network would catch being fetched.
    check_loaded(load_spec("torchvision:lraspp_mobilenet_v3_large", imgsz=64), "torchvision", (1, 3, 64, 64))


def test_unknown_torchvision_model_suggests_names() -> None:
    with pytest.raises(SpecError, match=r"unknown torchvision model 'resnet1'.*resnet18.*list_models"):
        load_spec("torchvision:resnet1")


@pytest.mark.parametrize("name, family", [("fasterrcnn_resnet50_fpn", "detection"), ("r3d_18", "video")])
def test_torchvision_models_without_image_batch_inputs(name: str, family: str) -> None:
    with pytest.raises(SpecError, match=rf"is a {family} model.*prunefx.analyze"):
        load_spec(f"torchvision:{name}")


# ---- ultralytics yaml --------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def yolov8n() -> LoadedModel:
    return load_spec("ultralytics:yolov8n.yaml")


def test_yolo_detect_default_imgsz_and_nc_from_yaml(yolov8n: LoadedModel) -> None:
    check_loaded(yolov8n, "ultralytics", (1, 3, 640, 640))
    assert type(yolov8n.model) is tasks.DetectionModel
    assert params(yolov8n.model) == YOLOV8N_PARAMS
    assert yolov8n.model.model[-1].nc == 80


@pytest.mark.parametrize(
    "name, cls, imgsz",
    [
        ("yolov8n-cls.yaml", tasks.ClassificationModel, 224),
        pytest.param("yolov8n-seg.yaml", tasks.SegmentationModel, 640, marks=pytest.mark.slow),
        pytest.param("yolov8n-pose.yaml", tasks.PoseModel, 640, marks=pytest.mark.slow),
        pytest.param("yolov8n-obb.yaml", tasks.OBBModel, 640, marks=pytest.mark.slow),
        pytest.param("yolo11n.yaml", tasks.DetectionModel, 640, marks=pytest.mark.slow),
    ],
)
def test_yolo_task_picks_model_class_and_default_imgsz(name: str, cls: type, imgsz: int) -> None:
    loaded = load_spec(f"ultralytics:{name}")
    check_loaded(loaded, "ultralytics", (1, 3, imgsz, imgsz))
    assert type(loaded.model) is cls


def test_yolo_torchvision_backbone_is_built_without_weights() -> None:
    # The yaml asks for TorchVision(resnet18, weights="DEFAULT"): a download, which no_network would catch.
    loaded = load_spec("ultralytics:yolo11-cls-resnet18.yaml", imgsz=64)
    check_loaded(loaded, "ultralytics", (1, 3, 64, 64))


@pytest.mark.parametrize(
    "spec, imgsz, message",
    [
        ("ultralytics:yolov8q.yaml", None, r"unknown ultralytics model yaml 'yolov8q.yaml'. Did you mean yolov8"),
        ("ultralytics:yolov3n.yaml", None, r"yolov3.yaml has no scale 'n'"),
        ("ultralytics:yolov8n.pt", None, r"never downloads.*ultralytics:yolov8n.yaml"),
        ("ultralytics:yolov8n-world.yaml", None, r"WorldDetect head"),
        ("ultralytics:rtdetr-l.yaml", None, r"RTDETRDecoder head"),
        ("ultralytics:yolov8n.yaml", 100, r"multiple of 32 for YOLO models, got 100; try 96 or 128"),
        ("ultralytics:yolov8n.yaml", 16, r"multiple of 32 for YOLO models, got 16; try 32"),
        ("torchvision:resnet18", 0, r"imgsz must be a positive integer, got 0"),
    ],
)
def test_bad_yolo_and_imgsz_specs(spec: str, imgsz: int | None, message: str) -> None:
    with pytest.raises(SpecError, match=message):
        load_spec(spec, imgsz=imgsz)


@pytest.mark.slow
def test_p6_models_need_a_multiple_of_64() -> None:
    with pytest.raises(SpecError, match=r"multiple of 64 .*stride 64.*got 96; try 64 or 128"):
        load_spec("ultralytics:yolov8n-p6.yaml", imgsz=96)


# ---- checkpoints -------------------------------------------------------------------------------------


def test_checkpoint_saved_by_ultralytics(tmp_path: Path) -> None:
    path = tmp_path / "saved.pt"
    YOLO("yolov8n.yaml").save(path)  # ultralytics' own save: {"model": fp16 module, "ema": None, ...}
    loaded = load_spec(str(path), imgsz=64)
    check_loaded(loaded, "checkpoint", (1, 3, 64, 64))
    assert type(loaded.model) is tasks.DetectionModel and params(loaded.model) == YOLOV8N_PARAMS
    assert all(p.dtype == torch.float32 for p in loaded.model.parameters())


def test_checkpoint_uses_the_ema_model(tmp_path: Path, yolov8n: LoadedModel) -> None:
    # The layout of the trainer's best.pt/last.pt: the fp16 EMA module, "model" None.
    path = tmp_path / "best.pt"
    ema = copy.deepcopy(yolov8n.model).half()
    torch.save({"epoch": 3, "model": None, "ema": ema, "train_args": {"imgsz": 320}}, path)
    loaded = load_spec(str(path))
    check_loaded(loaded, "checkpoint", (1, 3, 640, 640))  # the task's default size, as for the yaml
    expected = {k: v.half().float() for k, v in yolov8n.model.state_dict().items() if v.is_floating_point()}
    got = loaded.model.state_dict()
    assert all(torch.equal(got[k], v) for k, v in expected.items())


@pytest.mark.parametrize("content", ["garbage", "truncated", "state_dict"])
def test_unloadable_checkpoints(tmp_path: Path, yolov8n: LoadedModel, content: str) -> None:
    path = tmp_path / "model.pt"
    if content == "garbage":
        path.write_bytes(b"this is not a checkpoint" * 8)
    else:
        model = yolov8n.model
        torch.save({"ema": copy.deepcopy(model).half()} if content == "truncated" else model.state_dict(), path)
        if content == "truncated":
            path.write_bytes(path.read_bytes()[:100_000])
    with pytest.raises(SpecError, match=r"cannot load checkpoint .*model\.pt.*written by ultralytics"):
        load_spec(str(path))


def test_missing_checkpoint(tmp_path: Path) -> None:
    with pytest.raises(SpecError, match=r"does not exist"):
        load_spec(str(tmp_path / "yolov8n.pt"))  # a downloadable asset name: still never fetched


def test_checkpoint_imgsz_must_fit_yolo(tmp_path: Path) -> None:
    path = tmp_path / "any.pt"
    path.write_bytes(b"unread")  # the size is checked before the file is read
    with pytest.raises(SpecError, match=r"multiple of 32"):
        load_spec(str(path), imgsz=70)


# ---- factories and malformed SPECs -------------------------------------------------------------------


def test_factory() -> None:
    loaded = load_spec("_factories:tiny_cnn", imgsz=32)
    check_loaded(loaded, "factory", (1, 3, 32, 32))
    assert loaded.name == "_factories:tiny_cnn"
    assert tuple(load_spec("_factories:tiny_cnn").example_inputs[0].shape) == (1, 3, 224, 224)


@pytest.mark.parametrize(
    "spec, message",
    [
        ("_factories:tiny_cn", r"'_factories' has no attribute 'tiny_cn'.*Did you mean tiny_cnn"),
        ("_factories:not_a_module", r"returned a dict, not a torch.nn.Module"),
        ("_factories:broken", r"raised RuntimeError: no weights for this architecture"),
        ("_factories:LAYER", r"is a Conv2d object; name a function"),
        ("_no_such_module:build", r"no module named '_no_such_module'"),
        ("resnet50", r"cannot read model SPEC 'resnet50'. Use one of: torchvision:NAME"),
    ],
)
def test_bad_specs(spec: str, message: str) -> None:
    with pytest.raises(SpecError, match=message):
        load_spec(spec)


def test_bad_device() -> None:
    with pytest.raises(SpecError, match=r"unknown device 'gpu0'"):
        load_spec("_factories:tiny_cnn", device="gpu0")


def test_a_factory_that_raises_names_the_arguments_it_was_called_with() -> None:
    fn = resolve_factory("_factories:broken")
    with pytest.raises(SpecError, match=r"raised RuntimeError: .*; it was called with num_classes=10\.$"):
        call_factory("_factories:broken", lambda **kwargs: fn(), {"num_classes": 10})


# ---- model families ----------------------------------------------------------------------------------


@pytest.mark.parametrize("model, family", [
    ("torchvision:resnet18", "torch"), ("prunefx.zoo:bn_cnn", "torch"), ("yolov8n.yaml", "ultralytics"),
    ("ultralytics:yolov8n.yaml", "ultralytics"), ("runs/best.pt", "ultralytics"), (None, "ultralytics"),
])
def test_config_family_from_the_models_form(model: str | None, family: str) -> None:
    assert config_family(model).name == family


def test_family_registry(tmp_path: Path, yolov8n: LoadedModel, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr("prunefx.family._FAMILIES", dict(prunefx.family._FAMILIES))  # registrations stay here
    with pytest.raises(KeyError, match=r"no model family 'keras' \(registered: .*torch.*ultralytics"):
        get_family("keras")
    register_family("mine", "prunefx.family:TORCH")  # "module:attribute", imported on first use
    assert get_family("mine") is get_family("torch")
    # the ultralytics family writes a checkpoint it (and YOLO(path)) reads back weights-only, and costs it
    family = yolov8n.family
    family.save(yolov8n.model, tmp_path / "m.pt", None)
    back = family.load(tmp_path / "m.pt", lambda: nn.Identity())
    assert params(back) == params(yolov8n.model) and type(back) is type(yolov8n.model)
    assert set(family.extra_costs(yolov8n.model, yolov8n.example_inputs)) == {"yolo_gflops@640"}
    assert family.native_gflops(yolov8n.model, yolov8n.example_inputs) == pytest.approx(8.855, abs=1e-3)
