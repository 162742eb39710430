"""Synthetic shapes dataset: determinism, label validity, atomic writes, and offline use with ultralytics."""

from __future__ import annotations

import hashlib
import subprocess
import sys
import textwrap
from pathlib import Path

import cv2
import numpy as np
import pytest

from prunefx.integrations.ultralytics.env import cpu_train_kwargs, setup_offline

# Before any ultralytics import in this process: it reads YOLO_OFFLINE and YOLO_CONFIG_DIR when imported.
setup_offline()

from prunefx.data import detection as shapes
from prunefx.data.detection import SHAPE_COLORS, make_shapes_dataset

SMALL = dict(n_train=12, n_val=4, imgsz=96, seed=7)
# Max per-channel distance from a class's base color that still counts as that class: color jitter (25) plus
# pixel noise and JPEG chroma error.
COLOR_TOL = 70




def _file_hashes(root: Path) -> dict[str, str]:
    """sha256 of every image and label file, by path relative to ``root``."""
    return {
        str(p.relative_to(root)): hashlib.sha256(p.read_bytes()).hexdigest()
        for sub in ("images", "labels")
        for p in sorted((root / sub).rglob("*"))
        if p.is_file() and p.suffix in (".jpg", ".txt")
    }


def _read_labels(path: Path) -> np.ndarray:
    """YOLO label rows ``(class, x, y, w, h)`` of one file as an (n, 5) array."""
    return np.loadtxt(path, ndmin=2).reshape(-1, 5)


def test_same_seed_gives_identical_files(tmp_path: Path) -> None:
    a = make_shapes_dataset(tmp_path / "a", **SMALL).parent
    b = make_shapes_dataset(tmp_path / "b", **SMALL).parent
    c = make_shapes_dataset(tmp_path / "c", **{**SMALL, "seed": 8}).parent

    hashes = _file_hashes(a)
    assert len(hashes) == 2 * (SMALL["n_train"] + SMALL["n_val"])
    assert hashes == _file_hashes(b)
    assert hashes != _file_hashes(c)
    # data.yaml differs only by its absolute path.
    yaml_a = (a / "data.yaml").read_text().replace(str(a), "ROOT")
    assert yaml_a == (b / "data.yaml").read_text().replace(str(b), "ROOT")
    assert (a / "manifest.json").read_bytes() == (b / "manifest.json").read_bytes()


def test_labels_are_valid_and_match_drawn_objects(tmp_path: Path) -> None:
    classes = tuple(SHAPE_COLORS)
    root = make_shapes_dataset(tmp_path / "ds", n_train=40, n_val=8, imgsz=128, seed=1, classes=classes).parent
    n_boxes = 0
    for split in ("train", "val"):
        images = sorted((root / "images" / split).glob("*.jpg"))
        assert len(images) == (40 if split == "train" else 8)
        for image_path in images:
            image = cv2.imread(str(image_path)).astype(np.int16)
            s = image.shape[0]
            labels = _read_labels(root / "labels" / split / f"{image_path.stem}.txt")
            assert len(labels) >= 1
            colored = {
                c: (np.abs(image - np.array(SHAPE_COLORS[name])).max(axis=2) < COLOR_TOL)
                for c, name in enumerate(classes)
            }
            outside = np.ones((s, s), dtype=bool)
            for cls, x, y, w, h in labels:
                assert cls == int(cls) and 0 <= cls < len(classes)
                assert 0 < w <= 1 and 0 < h <= 1
                x0, y0, x1, y1 = x - w / 2, y - h / 2, x + w / 2, y + h / 2
                assert 0 <= x0 < x1 <= 1 and 0 <= y0 < y1 <= 1
                c0, r0, c1, r1 = (round(v * s) for v in (x0, y0, x1, y1))
                inside = colored[int(cls)][r0:r1, c0:c1]
                # A filled shape covers a good part of its box (a thin star or rotated cross the least).
                assert inside.mean() > 0.25, (image_path, cls)
                # Tight box: the object reaches each side of it.
                assert inside[:3].any() and inside[-3:].any() and inside[:, :3].any() and inside[:, -3:].any()
                outside[r0:r1, c0:c1] = False
                n_boxes += 1
            # No object is drawn without a label: outside the boxes nothing has an object color.
            any_colored = np.logical_or.reduce(list(colored.values()))
            assert any_colored[outside].mean() < 0.01, image_path
    assert n_boxes >= 48


def test_data_yaml_passes_check_det_dataset_offline(tmp_path: Path, no_network: list[str]) -> None:
    from ultralytics.data.utils import check_det_dataset

    data_yaml = make_shapes_dataset(tmp_path / "ds", **SMALL)
    data = check_det_dataset(str(data_yaml))
    assert data["nc"] == 4
    assert data["names"] == {0: "circle", 1: "square", 2: "triangle", 3: "cross"}
    assert Path(data["path"]).is_absolute()
    assert Path(data["train"]) == data_yaml.parent / "images" / "train"
    assert Path(data["val"]).is_dir()
    assert no_network == []


def test_complete_dataset_is_reused(tmp_path: Path) -> None:
    data_yaml = make_shapes_dataset(tmp_path / "ds", **SMALL)
    before = {p: p.stat().st_mtime_ns for p in data_yaml.parent.rglob("*")}
    assert make_shapes_dataset(tmp_path / "ds", **SMALL) == data_yaml
    assert {p: p.stat().st_mtime_ns for p in data_yaml.parent.rglob("*")} == before
    with pytest.raises(FileExistsError):
        make_shapes_dataset(tmp_path / "ds", **{**SMALL, "n_train": 13})


def test_half_written_dataset_is_not_taken_for_complete(tmp_path: Path) -> None:
    # A crashed writer leaves its temporary sibling behind; it must neither be used nor block a new dataset.
    stale = tmp_path / ".ds.tmp-crashed"
    (stale / "images" / "train").mkdir(parents=True)
    (stale / "images" / "train" / "000000.jpg").write_bytes(b"partial")
    data_yaml = make_shapes_dataset(tmp_path / "ds", **SMALL)
    assert data_yaml == tmp_path / "ds" / "data.yaml"
    assert len(list((tmp_path / "ds" / "images" / "train").glob("*.jpg"))) == SMALL["n_train"]
    assert (stale / "images" / "train" / "000000.jpg").read_bytes() == b"partial"

    # A directory at the target without a manifest was not finished by the generator: refuse it.
    partial = tmp_path / "partial"
    (partial / "images" / "train").mkdir(parents=True)
    with pytest.raises(FileExistsError):
        make_shapes_dataset(partial, **SMALL)


def test_failed_generation_leaves_nothing(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    calls = 0
    draw = shapes._draw_image

    def failing_draw(rng, params):
        nonlocal calls
        calls += 1
        if calls == 5:
            raise RuntimeError("simulated crash")
        return draw(rng, params)

    monkeypatch.setattr(shapes, "_draw_image", failing_draw)
    with pytest.raises(RuntimeError, match="simulated crash"):
        make_shapes_dataset(tmp_path / "ds", **SMALL)
    assert list(tmp_path.iterdir()) == []


def test_setup_offline_blocks_network_at_import(tmp_path: Path) -> None:
    # A fresh interpreter, since this one has imported ultralytics already.
    script = textwrap.dedent(
        f"""
        import socket
        attempts = []
        def refuse(*args, **kwargs):
            attempts.append(args)
            raise OSError("network disabled in tests")
        socket.getaddrinfo = refuse
        socket.socket.connect = refuse
        import sys
        from prunefx.integrations.ultralytics.env import setup_offline
        assert "ultralytics" not in sys.modules, (
            "importing prunefx imported ultralytics, so setup_offline() cannot run first: import it lazily"
        )
        first = setup_offline({str(tmp_path / "cfg")!r})
        assert setup_offline() == first, "second call must keep the config dir"
        import ultralytics.utils
        from ultralytics.utils.checks import check_font
        assert ultralytics.utils.USER_CONFIG_DIR == first / "Ultralytics"
        assert not ultralytics.utils.ONLINE
        assert check_font("Arial.ttf") == first / "Ultralytics" / "Arial.ttf"
        assert attempts == [], attempts
        """
    )
    subprocess.run([sys.executable, "-c", script], check=True, cwd=tmp_path, timeout=120)
    assert (tmp_path / "cfg" / "Ultralytics" / "Arial.Unicode.ttf").stat().st_size > 100_000


@pytest.mark.slow
def test_yolov8n_trains_and_validates_offline(tmp_path: Path, no_network: list[str]) -> None:
    from ultralytics import YOLO

    data_yaml = make_shapes_dataset(tmp_path / "ds", n_train=16, n_val=8, imgsz=64, seed=0)
    model = YOLO("yolov8n.yaml")
    model.train(**cpu_train_kwargs(data=str(data_yaml), epochs=1, imgsz=64, batch=8, project=str(tmp_path), name="run"))
    assert (tmp_path / "run" / "weights" / "last.pt").is_file()
    metrics = model.val(data=str(data_yaml), imgsz=64, batch=8, device="cpu", plots=False, project=str(tmp_path))
    assert {"metrics/mAP50(B)", "metrics/mAP50-95(B)", "fitness"} <= set(metrics.results_dict)
    assert 0.0 <= metrics.box.map50 <= 1.0
    assert no_network == []
