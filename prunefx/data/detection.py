"""Deterministic synthetic detection dataset (colored shapes on a textured background) in YOLO format.

Every image is drawn from its own seed (``seed``, split, index), so the same arguments give byte-identical files.
The dataset is written into a temporary sibling directory and renamed into place as a whole: a directory at
``root`` is either complete (it holds ``manifest.json``) or was not made here.
"""

from __future__ import annotations

import json
import math
import os
import shutil
import tempfile
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import cv2
import numpy as np

# BGR colors, far apart in hue and all saturated, so a grey-ish background never looks like an object.
SHAPE_COLORS: dict[str, tuple[int, int, int]] = {
    "circle": (40, 40, 230),  # red
    "square": (40, 200, 40),  # green
    "triangle": (230, 90, 30),  # blue
    "cross": (20, 220, 240),  # yellow
    "ring": (220, 40, 220),  # magenta
    "star": (230, 230, 40),  # cyan
}
DEFAULT_CLASSES: tuple[str, ...] = ("circle", "square", "triangle", "cross")
MANIFEST = "manifest.json"
# Bump when the drawing changes: a dataset made by another version is not reused.
GENERATOR_VERSION = 1
_SPLITS = {"train": 0, "val": 1}
_JPEG_QUALITY = 95
Label = tuple[int, float, float, float, float]  # class, x_center, y_center, width, height (normalized)


def make_shapes_dataset(
    root: Path,
    *,
    n_train: int = 512,
    n_val: int = 128,
    imgsz: int = 160,
    seed: int = 0,
    classes: Sequence[str] = DEFAULT_CLASSES,
    objects_per_image: tuple[int, int] = (1, 4),
    size_range: tuple[float, float] = (0.15, 0.35),
) -> Path:
    """Create (or reuse) a YOLO-format shapes dataset at ``root`` and return the path of its ``data.yaml``."""
    classes = tuple(classes)
    unknown = [c for c in classes if c not in SHAPE_COLORS]
    if unknown or not classes or len(set(classes)) != len(classes):
        raise ValueError(f"classes must be distinct names from {sorted(SHAPE_COLORS)}, got {list(classes)}")
    params = dataset_params(GENERATOR_VERSION, n_train, n_val, imgsz, seed, classes, objects_per_image, size_range,
                            max_size=0.9, min_imgsz=32)
    return write_yolo_dataset(root, params, None)


def dataset_params(
    version: int,
    n_train: int,
    n_val: int,
    imgsz: int,
    seed: int,
    classes: Sequence[str],
    objects_per_image: tuple[int, int],
    size_range: tuple[float, float],
    *,
    max_size: float,
    min_imgsz: int,
) -> dict[str, Any]:
    """The checked parameters every generated detection set records in its manifest (what decides reuse)."""
    lo, hi = objects_per_image
    if not 1 <= lo <= hi:
        raise ValueError(f"objects_per_image must satisfy 1 <= min <= max, got {objects_per_image}")
    if not 0 < size_range[0] <= size_range[1] <= max_size:
        raise ValueError(f"size_range must satisfy 0 < min <= max <= {max_size:g}, got {size_range}")
    if n_train < 1 or n_val < 1 or imgsz < min_imgsz:
        raise ValueError(f"need n_train >= 1, n_val >= 1 and imgsz >= {min_imgsz}")
    return {
        "version": version,
        "n_train": n_train,
        "n_val": n_val,
        "imgsz": imgsz,
        "seed": seed,
        "classes": list(classes),
        "objects_per_image": [lo, hi],
        "size_range": [float(size_range[0]), float(size_range[1])],
    }


def write_yolo_dataset(
    root: Path, params: dict[str, Any], draw: Callable[[np.random.Generator, dict[str, Any]], Any] | None
) -> Path:
    """Create (or reuse) the dataset ``params`` describes at ``root``, one ``draw(rng, params)`` call per image.

    ``params`` must hold n_train, n_val, seed and classes; it is the manifest's identity (a directory made with
    other params is never reused). ``draw`` None: this module's shapes (looked up at call time).
    """
    root = Path(root).absolute()
    if _reusable(root, params):
        return root / "data.yaml"
    if root.exists() and any(root.iterdir()):
        raise FileExistsError(f"{root} exists and is not a shapes dataset made with these arguments")

    root.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{root.name}.tmp-", dir=root.parent))
    tmp.chmod(0o755)  # mkdtemp makes it private; the renamed dataset should read like any other directory
    try:
        _write_dataset(tmp, root, params, draw or _draw_image)
        try:
            os.replace(tmp, root)  # atomic; replaces only an absent or empty directory
        except OSError:
            # Another process finished first: keep its copy if it matches.
            if not _reusable(root, params):
                raise
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return root / "data.yaml"


def _reusable(root: Path, params: dict[str, Any]) -> bool:
    """Whether ``root`` holds a complete dataset generated with ``params``."""
    try:
        return json.loads((root / MANIFEST).read_text())["params"] == params
    except (OSError, ValueError, KeyError, TypeError):
        return False


def _write_dataset(tmp: Path, final: Path, params: dict[str, Any], draw: Callable[..., Any]) -> None:
    """Write every image and label into ``tmp``; ``data.yaml`` names ``final``, where it will live."""
    for split, n in (("train", params["n_train"]), ("val", params["n_val"])):
        (tmp / "images" / split).mkdir(parents=True)
        (tmp / "labels" / split).mkdir(parents=True)
        for i in range(n):
            rng = np.random.default_rng([params["seed"], _SPLITS[split], i])
            image, labels = draw(rng, params)
            ok, buf = cv2.imencode(".jpg", image, [cv2.IMWRITE_JPEG_QUALITY, _JPEG_QUALITY])
            if not ok:
                raise RuntimeError("cv2 could not encode a JPEG")
            (tmp / "images" / split / f"{i:06d}.jpg").write_bytes(buf.tobytes())
            lines = "".join(f"{c} {x:.6f} {y:.6f} {w:.6f} {h:.6f}\n" for c, x, y, w, h in labels)
            (tmp / "labels" / split / f"{i:06d}.txt").write_text(lines)
    names = "".join(f"  {i}: {name}\n" for i, name in enumerate(params["classes"]))
    (tmp / "data.yaml").write_text(
        f"# prunefx synthetic detection dataset ({params.get('kind', 'shapes')}); regenerate with prunefx.data\n"
        f"path: {json.dumps(str(final))}\ntrain: images/train\nval: images/val\nnames:\n{names}"
    )
    # Written last: its presence marks the directory as complete.
    (tmp / MANIFEST).write_text(json.dumps({"generator": __name__, "params": params}, indent=2) + "\n")


def _draw_image(rng: np.random.Generator, params: dict[str, Any]) -> tuple[np.ndarray, list[Label]]:
    """Draw one BGR image and its YOLO labels."""
    s = params["imgsz"]
    image = _background(rng, s)
    occupied = np.zeros((s, s), dtype=bool)
    labels: list[Label] = []
    lo, hi = params["objects_per_image"]
    for _ in range(int(rng.integers(lo, hi + 1))):
        cls = int(rng.integers(len(params["classes"])))
        name = params["classes"][cls]
        # Rejection-sample a spot clear of earlier objects, so no object hides part of another.
        for _attempt in range(20):
            size = rng.uniform(*params["size_range"]) * s
            cx, cy = rng.uniform(size / 2, s - size / 2, 2)
            mask = _shape_mask(name, s, cx, cy, size, rng.uniform(0, 2 * math.pi))
            grown = cv2.dilate(mask, np.ones((5, 5), np.uint8)).astype(bool)
            if mask.any() and not (grown & occupied).any():
                break
        else:
            continue
        occupied |= mask.astype(bool)
        color = np.clip(np.array(SHAPE_COLORS[name]) + rng.integers(-25, 26, 3), 0, 255)
        image[mask.astype(bool)] = color
        ys, xs = np.nonzero(mask)
        x0, x1, y0, y1 = xs.min(), xs.max() + 1, ys.min(), ys.max() + 1  # pixel edges, tight box
        labels.append((cls, (x0 + x1) / 2 / s, (y0 + y1) / 2 / s, (x1 - x0) / s, (y1 - y0) / s))
    # Sensor-like noise on top of everything, so objects are not perfectly flat patches.
    noisy = image.astype(np.int16) + rng.normal(0, 6, image.shape).round().astype(np.int16)
    return np.clip(noisy, 0, 255).astype(np.uint8), labels


def _background(rng: np.random.Generator, s: int) -> np.ndarray:
    """A low-saturation texture: smooth grey blotches plus a weak tint and fine grain."""
    coarse = rng.uniform(70, 180, (s // 16 + 2, s // 16 + 2, 1))
    grey = cv2.resize(coarse, (s, s), interpolation=cv2.INTER_CUBIC)[..., None]
    tint = rng.uniform(-12, 12, (1, 1, 3))
    grain = rng.normal(0, 10, (s, s, 3))
    return np.clip(grey + tint + grain, 0, 255).astype(np.uint8)


def _shape_mask(name: str, s: int, cx: float, cy: float, size: float, angle: float) -> np.ndarray:
    """A uint8 {0,1} mask of one shape of extent ``size`` centered at ``(cx, cy)``, rotated by ``angle``."""
    mask = np.zeros((s, s), dtype=np.uint8)
    r = size / 2
    if name in ("circle", "ring"):
        center, radius = (round(cx), round(cy)), max(round(r), 2)
        cv2.circle(mask, center, radius, 1, -1)
        if name == "ring":
            cv2.circle(mask, center, max(round(radius * 0.55), 1), 0, -1)
        return mask
    if name == "square":
        pts = [(r, r), (-r, r), (-r, -r), (r, -r)]
        pts = [(x * 0.8, y * 0.8) for x, y in pts]  # side 0.8*size keeps the rotated square within ~size
    elif name == "triangle":
        pts = [(r * math.cos(a), r * math.sin(a)) for a in (0, 2 * math.pi / 3, 4 * math.pi / 3)]
    elif name == "cross":
        pts = cross_points(r)
    elif name == "star":
        pts = star_points(r)
    else:
        raise ValueError(f"unknown shape {name!r}")
    return fill_polygon(mask, pts, cx, cy, angle)


def cross_points(r: float) -> list[tuple[float, float]]:
    """The twelve corners of a plus sign of half-extent ``r`` (arms 0.66 r wide), around the origin."""
    a, b = r, r * 0.33
    pts = [(b, a), (-b, a), (-b, b), (-a, b), (-a, -b), (-b, -b)]
    return pts + [(-x, -y) for x, y in pts]  # the cross is symmetric under a half turn


def star_points(r: float) -> list[tuple[float, float]]:
    """The ten corners of a five-pointed star of outer radius ``r``, around the origin."""
    radii = [r if k % 2 == 0 else r * 0.45 for k in range(10)]  # alternating tips and notches
    return [(rk * math.cos(k * math.pi / 5), rk * math.sin(k * math.pi / 5)) for k, rk in enumerate(radii)]


def fill_polygon(mask: np.ndarray, pts: list[tuple[float, float]], cx: float, cy: float, angle: float) -> np.ndarray:
    """``mask`` with polygon ``pts`` (around the origin), rotated by ``angle`` and centred at ``(cx, cy)``, set to 1."""
    c, sn = math.cos(angle), math.sin(angle)
    poly = np.array([(cx + x * c - y * sn, cy + x * sn + y * c) for x, y in pts])
    cv2.fillPoly(mask, [np.round(poly).astype(np.int32)], 1)
    return mask
