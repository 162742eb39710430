"""A harder deterministic detection set in YOLO format, where model capacity matters.

20 classes: 10 shapes, each solid or as an outline; the colour says nothing about the class (every object gets a
random hue, saturation, brightness and a shading gradient). Objects are small to medium (log-uniform scale, so
most are small), several per image, and may occlude each other (each keeps at least ``MIN_VISIBLE`` of its pixels;
its box is the tight box of what is visible). The background is cluttered (coloured blotches, stripes) and
holds unlabelled decoys in the same colours: irregular blobs, strokes and arcs. Some images are blurred.

Same arguments, same bytes (every image is drawn from its own seed); written atomically like the plain shapes set
(:func:`prunefx.data.detection.write_yolo_dataset`), generated in seconds, nothing downloaded.
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

import cv2
import numpy as np

from prunefx.data.detection import Label, cross_points, dataset_params, fill_polygon, star_points, write_yolo_dataset

SHAPES: tuple[str, ...] = ("circle", "triangle", "square", "pentagon", "hexagon", "star", "cross", "arrow",
                           "crescent", "lshape")
HARD_CLASSES: tuple[str, ...] = tuple(f"{s}_{style}" for s in SHAPES for style in ("solid", "outline"))
HARD_VERSION = 1  # bump when the drawing changes: a dataset made by another version is not reused
MIN_VISIBLE = 0.6  # an object keeps at least this fraction of its pixels when later ones cover it
MIN_SIDE_PX = 6  # an object whose visible box is smaller than this in either direction is not placed


def make_hard_shapes_dataset(
    root: Path,
    *,
    n_train: int = 1200,
    n_val: int = 300,
    imgsz: int = 160,
    seed: int = 0,
    objects_per_image: tuple[int, int] = (3, 10),
    size_range: tuple[float, float] = (0.06, 0.32),
    decoys_per_image: tuple[int, int] = (2, 6),
) -> Path:
    """Create (or reuse) the hard shapes set at ``root`` and return the path of its ``data.yaml``."""
    if not 0 <= decoys_per_image[0] <= decoys_per_image[1]:
        raise ValueError(f"decoys_per_image must satisfy 0 <= min <= max, got {decoys_per_image}")
    checked = dataset_params(HARD_VERSION, n_train, n_val, imgsz, seed, HARD_CLASSES, objects_per_image, size_range,
                             max_size=0.6, min_imgsz=64)
    params = {"kind": "hard", **checked, "decoys_per_image": list(decoys_per_image)}
    return write_yolo_dataset(root, params, draw_hard_image)


def draw_hard_image(rng: np.random.Generator, params: dict[str, Any]) -> tuple[np.ndarray, list[Label]]:
    """Draw one BGR image of the hard set and its YOLO labels (visible-pixel boxes)."""
    s = params["imgsz"]
    image = _cluttered_background(rng, s)
    for _ in range(int(rng.integers(params["decoys_per_image"][0], params["decoys_per_image"][1] + 1))):
        _draw_decoy(rng, image)
    owner = np.full((s, s), -1, dtype=np.int32)  # which object shows at each pixel (-1: none)
    objects: list[tuple[int, int]] = []  # (class, pixel count when drawn)
    lo, hi = params["objects_per_image"]
    log_lo, log_hi = (math.log(v * s) for v in params["size_range"])
    for _ in range(int(rng.integers(lo, hi + 1))):
        cls = int(rng.integers(len(HARD_CLASSES)))
        for _attempt in range(15):
            size = math.exp(rng.uniform(log_lo, log_hi))
            cx, cy = rng.uniform(size / 2, s - size / 2, 2)
            mask = _hard_mask(cls, s, cx, cy, size, rng.uniform(0, 2 * math.pi)).astype(bool)
            if mask.sum() < MIN_SIDE_PX ** 2 / 2 or not _keeps_visible(owner, mask, objects):
                continue
            break
        else:
            continue
        owner[mask] = len(objects)
        objects.append((cls, int(mask.sum())))
        image[mask] = _shaded_colour(rng, mask)
    labels: list[Label] = []
    for k, (cls, _) in enumerate(objects):
        ys, xs = np.nonzero(owner == k)
        x0, x1, y0, y1 = xs.min(), xs.max() + 1, ys.min(), ys.max() + 1  # pixel edges, tight visible box
        if x1 - x0 < MIN_SIDE_PX or y1 - y0 < MIN_SIDE_PX:
            continue  # cannot happen for placed objects (checked), kept as a guard for the labels' validity
        labels.append((cls, (x0 + x1) / 2 / s, (y0 + y1) / 2 / s, (x1 - x0) / s, (y1 - y0) / s))
    if rng.random() < 0.3:  # some images slightly out of focus
        image = cv2.GaussianBlur(image, (3, 3), float(rng.uniform(0.5, 1.0)))
    noisy = image.astype(np.int16) + rng.normal(0, rng.uniform(3, 9), image.shape).round().astype(np.int16)
    return np.clip(noisy, 0, 255).astype(np.uint8), labels


def _keeps_visible(owner: np.ndarray, mask: np.ndarray, objects: list[tuple[int, int]]) -> bool:
    """Whether every earlier object keeps MIN_VISIBLE of its pixels, and a box of MIN_SIDE_PX, under ``mask``."""
    covered = owner[mask]
    hit = np.unique(covered[covered >= 0])
    for k in hit:
        left = (owner == k) & ~mask
        if left.sum() < MIN_VISIBLE * objects[k][1]:
            return False
        ys, xs = np.nonzero(left)
        if xs.max() - xs.min() + 1 < MIN_SIDE_PX or ys.max() - ys.min() + 1 < MIN_SIDE_PX:
            return False
    ys, xs = np.nonzero(mask)
    return xs.max() - xs.min() + 1 >= MIN_SIDE_PX and ys.max() - ys.min() + 1 >= MIN_SIDE_PX


def _random_bgr(rng: np.random.Generator) -> np.ndarray:
    """A random colour of any hue, fairly saturated and bright (objects and decoys draw from the same pool)."""
    hsv = np.array([[[rng.integers(0, 180), rng.integers(90, 256), rng.integers(110, 256)]]], dtype=np.uint8)
    return cv2.cvtColor(hsv, cv2.COLOR_HSV2BGR)[0, 0].astype(np.float64)


def _shaded_colour(rng: np.random.Generator, mask: np.ndarray) -> np.ndarray:
    """Per-pixel colours of one object: a random colour under a linear brightness gradient."""
    ys, xs = np.nonzero(mask)
    angle = rng.uniform(0, 2 * math.pi)
    t = xs * math.cos(angle) + ys * math.sin(angle)
    t = (t - t.min()) / max(1.0, float(t.max() - t.min()))
    gain = 1.0 + rng.uniform(-0.35, 0.35) * (t - 0.5)
    return np.clip(_random_bgr(rng)[None, :] * gain[:, None], 0, 255).astype(np.uint8)


def _cluttered_background(rng: np.random.Generator, s: int) -> np.ndarray:
    """Grey blotches, a few coloured low-contrast blotches and stripes, and fine grain."""
    coarse = rng.uniform(60, 190, (s // 12 + 2, s // 12 + 2, 1))
    image = np.repeat(cv2.resize(coarse, (s, s), interpolation=cv2.INTER_CUBIC)[..., None], 3, axis=2)
    tint = cv2.resize(rng.uniform(-30, 30, (4, 4, 3)), (s, s), interpolation=cv2.INTER_CUBIC)
    image = image + tint
    for _ in range(int(rng.integers(0, 4))):  # stripes: long thin bands of a muted colour
        p0, p1 = rng.uniform(-0.2 * s, 1.2 * s, (2, 2))
        colour = 0.5 * _random_bgr(rng) + 0.5 * image.mean((0, 1))
        cv2.line(image, tuple(np.round(p0).astype(int)), tuple(np.round(p1).astype(int)), colour.tolist(),
                 int(rng.integers(2, max(3, s // 24))))
    image = image + rng.normal(0, 8, image.shape)
    return np.clip(image, 0, 255).astype(np.uint8)


def _draw_decoy(rng: np.random.Generator, image: np.ndarray) -> None:
    """One unlabelled distractor in an object colour: an irregular blob, a stroke or an arc."""
    s = image.shape[0]
    colour = _random_bgr(rng).tolist()
    kind = rng.integers(3)
    if kind == 0:  # blob: thresholded smooth noise, no straight edges and no symmetry
        side = int(rng.uniform(0.06, 0.25) * s) + 4
        field = cv2.resize(rng.uniform(0, 1, (4, 4)), (side, side), interpolation=cv2.INTER_CUBIC)
        yy, xx = np.mgrid[:side, :side]
        fall = 1 - (((yy - side / 2) ** 2 + (xx - side / 2) ** 2) / (side / 2) ** 2)
        blob = (field * fall) > 0.35
        y, x = rng.integers(0, s - side, 2)
        image[y:y + side, x:x + side][blob] = colour
    elif kind == 1:  # stroke
        p0 = rng.uniform(0, s, 2)
        p1 = p0 + rng.uniform(-0.3 * s, 0.3 * s, 2)
        cv2.line(image, tuple(np.round(p0).astype(int)), tuple(np.round(p1).astype(int)), colour,
                 int(rng.integers(1, 4)))
    else:  # open arc: part of a ring, never a closed shape
        centre = tuple(np.round(rng.uniform(0, s, 2)).astype(int))
        axes = tuple(int(v) for v in rng.uniform(0.03, 0.12, 2) * s + 2)
        start = float(rng.uniform(0, 360))
        cv2.ellipse(image, centre, axes, 0, start, start + float(rng.uniform(60, 200)), colour,
                    int(rng.integers(1, 4)))


def _hard_mask(cls: int, s: int, cx: float, cy: float, size: float, angle: float) -> np.ndarray:
    """A uint8 {0,1} mask of class ``cls``: its shape, solid or as an outline."""
    shape, style = HARD_CLASSES[cls].rsplit("_", 1)
    mask = _solid(shape, s, cx, cy, size, angle)
    if style == "outline":
        width = max(2, round(size * 0.16))
        inner = cv2.erode(mask, np.ones((2 * width + 1, 2 * width + 1), np.uint8))
        if inner.any():  # an outline with a hole; a shape too small to hollow stays solid-looking but is rare
            mask = mask - inner
    return mask


def _solid(shape: str, s: int, cx: float, cy: float, size: float, angle: float) -> np.ndarray:
    mask = np.zeros((s, s), dtype=np.uint8)
    r = size / 2
    if shape == "circle":
        cv2.circle(mask, (round(cx), round(cy)), max(round(r), 2), 1, -1)
        return mask
    if shape == "crescent":
        cv2.circle(mask, (round(cx), round(cy)), max(round(r), 2), 1, -1)
        off = (cx + 0.45 * r * math.cos(angle), cy + 0.45 * r * math.sin(angle))
        cv2.circle(mask, (round(off[0]), round(off[1])), max(round(r * 0.85), 1), 0, -1)
        return mask
    polygons = {"triangle": 3, "square": 4, "pentagon": 5, "hexagon": 6}
    if shape in polygons:
        n = polygons[shape]
        pts = [(r * math.cos(2 * math.pi * k / n), r * math.sin(2 * math.pi * k / n)) for k in range(n)]
    elif shape == "star":
        pts = star_points(r)
    elif shape == "cross":
        pts = cross_points(r)
    elif shape == "arrow":
        pts = [(r, 0), (0, r * 0.8), (0, r * 0.3), (-r, r * 0.3), (-r, -r * 0.3), (0, -r * 0.3), (0, -r * 0.8)]
    elif shape == "lshape":
        pts = [(-r, -r), (-r * 0.2, -r), (-r * 0.2, r * 0.2), (r, r * 0.2), (r, r), (-r, r)]
    else:
        raise ValueError(f"unknown shape {shape!r}")
    return fill_polygon(mask, pts, cx, cy, angle)
