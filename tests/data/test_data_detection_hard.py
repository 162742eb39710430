"""The hard synthetic detection set: same seed same bytes, valid labels that match what is drawn, the CLI flag."""

from __future__ import annotations

import hashlib
from pathlib import Path

import numpy as np
import pytest

from prunefx.data.detection_hard import HARD_CLASSES, MIN_SIDE_PX, make_hard_shapes_dataset

SMALL = dict(n_train=24, n_val=6, imgsz=96, seed=3)


def _hashes(root: Path) -> dict[str, str]:
    return {str(p.relative_to(root)): hashlib.sha256(p.read_bytes()).hexdigest()
            for p in sorted(root.rglob("*")) if p.is_file() and p.suffix in (".jpg", ".txt")}


def test_hard_set_is_deterministic(tmp_path: Path) -> None:
    a = make_hard_shapes_dataset(tmp_path / "a", **SMALL).parent
    b = make_hard_shapes_dataset(tmp_path / "b", **SMALL).parent
    c = make_hard_shapes_dataset(tmp_path / "c", **{**SMALL, "seed": 4}).parent
    assert len(_hashes(a)) == 2 * (SMALL["n_train"] + SMALL["n_val"])
    assert _hashes(a) == _hashes(b)
    assert _hashes(a) != _hashes(c)
    assert make_hard_shapes_dataset(tmp_path / "a", **SMALL) == a / "data.yaml"  # reused, not rewritten


def test_hard_labels_are_valid(tmp_path: Path) -> None:
    import yaml

    root = make_hard_shapes_dataset(tmp_path / "ds", n_train=60, n_val=10, imgsz=128, seed=0).parent
    names = yaml.safe_load((root / "data.yaml").read_text())["names"]
    assert len(names) == len(HARD_CLASSES) == 20
    rows = np.concatenate([np.loadtxt(p, ndmin=2).reshape(-1, 5) for p in sorted(root.glob("labels/*/*.txt"))])
    cls, x, y, w, h = rows.T
    assert np.all(cls == cls.round()) and cls.min() >= 0 and cls.max() < 20
    eps = 1e-6  # labels are written with 6 decimals
    assert np.all((x - w / 2 >= -eps) & (x + w / 2 <= 1 + eps) & (y - h / 2 >= -eps) & (y + h / 2 <= 1 + eps))
    assert np.all(np.minimum(w, h) * 128 >= MIN_SIDE_PX - 1e-6)
    # hard: several objects per image, most of them small, and many classes in use
    assert len(rows) / 70 >= 3
    assert np.median(np.sqrt(w * h)) < 0.2
    assert len(set(cls.astype(int))) >= 15


def test_hard_boxes_cover_drawn_pixels(tmp_path: Path) -> None:
    # Every labelled box differs from the background around it: something was drawn there.
    import cv2

    root = make_hard_shapes_dataset(tmp_path / "ds", n_train=8, n_val=1, imgsz=128, seed=1).parent
    for label in sorted((root / "labels" / "train").glob("*.txt")):
        image = cv2.imread(str(root / "images" / "train" / f"{label.stem}.jpg"))
        for _, x, y, w, h in np.loadtxt(label, ndmin=2):
            x0, y0, x1, y1 = (round(v * 128) for v in (x - w / 2, y - h / 2, x + w / 2, y + h / 2))
            assert image[y0:y1, x0:x1].std() > 5


def test_cli_hard_flag(tmp_path: Path) -> None:
    from typer.testing import CliRunner

    from prunefx.cli.main import app

    result = CliRunner().invoke(app, ["data", "shapes", str(tmp_path / "h"), "--hard", "--n-train", "4",
                                      "--n-val", "2", "--imgsz", "64"])
    assert result.exit_code == 0, result.output
    assert Path(result.output.strip()) == tmp_path / "h" / "data.yaml"
    assert len(list((tmp_path / "h" / "images" / "train").glob("*.jpg"))) == 4
    assert "20" not in (tmp_path / "h" / "data.yaml").read_text().split("names:")[0]


@pytest.mark.parametrize("bad", [dict(objects_per_image=(0, 2)), dict(size_range=(0.2, 0.1)), dict(imgsz=32)])
def test_bad_arguments_are_refused(tmp_path: Path, bad: dict) -> None:
    with pytest.raises(ValueError):
        make_hard_shapes_dataset(tmp_path / "x", **{**SMALL, **bad})
