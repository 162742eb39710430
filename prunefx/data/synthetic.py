"""A deterministic synthetic image-classification set, hard enough that pruning losses show.

Each image holds one large object: a shape (disk, square, triangle, cross, ring) filled with stripes. The class
is the shape *and* the stripes' orientation group (around 45 or 135 degrees), so 10 classes. What makes it
harder than digits: the orientation is jittered across the group boundary (an irreducible overlap, the
``overlap`` knob), the object's colour, size, rotation, position and stripe period are random, the background is a
low-contrast grating of random orientation (a decoy for the stripe filters), small solid distractor blobs
clutter it, and pixel noise is added. A small BN CNN reaches roughly 85-95% top-1, not 100%.

>>> x, y = make_synthetic(1000, size=32, seed=0, split="train")   # uint8 (1000, 3, 32, 32), int64 (1000,)

Every split is drawn from its own generator (``seed``, split), so the same arguments give identical arrays.
"""

from __future__ import annotations

import math

import numpy as np

SHAPES = ("disk", "square", "triangle", "cross", "ring")
ORIENTATIONS = (45.0, 135.0)  # degrees; the two stripe groups, 90 degrees apart
CLASSES = tuple(f"{s}-{int(o)}" for o in ORIENTATIONS for s in SHAPES)  # class = orientation group * 5 + shape
SPLITS = {"train": 0, "val": 1, "test": 2}
GENERATOR_VERSION = 1  # bump when the drawing changes: cached arrays made by another version are not reused
_CHUNK = 1024  # images drawn at once: (chunk, size, size) float32 arrays stay small


def make_synthetic(n: int, *, size: int = 32, seed: int = 0, split: str = "train",
                   overlap: float = 22.0, noise: float = 0.08, distractors: int = 3) -> tuple[np.ndarray, np.ndarray]:
    """``n`` images (uint8, N x 3 x size x size) and labels (int64) of ``split``; see the module docstring.

    ``overlap``: standard deviation (degrees) of the stripe orientation around its group's centre; at 22 about
    4% of the images have stripes closer to the other group. ``noise``: pixel noise std (images in [0, 1]).
    """
    if split not in SPLITS:
        raise ValueError(f"split must be one of {', '.join(SPLITS)}, got {split!r}")
    if n < 1 or size < 16:
        raise ValueError(f"need n >= 1 and size >= 16, got n={n}, size={size}")
    rng = np.random.default_rng([seed, SPLITS[split], GENERATOR_VERSION])
    labels = rng.integers(0, len(CLASSES), n)
    images = np.empty((n, 3, size, size), dtype=np.uint8)
    for start in range(0, n, _CHUNK):
        y = labels[start:start + _CHUNK]
        images[start:start + len(y)] = _draw(rng, y, size, overlap, noise, distractors)
    return images, labels.astype(np.int64)


def _draw(
    rng: np.random.Generator, y: np.ndarray, s: int, overlap: float, noise: float, distractors: int
) -> np.ndarray:
    n = len(y)
    grid = np.arange(s, dtype=np.float32) + 0.5
    yy, xx = grid[None, :, None], grid[None, None, :]  # broadcast to (n, s, s)

    def col(v: np.ndarray) -> np.ndarray:
        return v.astype(np.float32)[:, None, None]

    # Background: a tinted grey with a low-contrast grating of random orientation and period (a decoy).
    bg_color = rng.uniform(0.25, 0.65, (n, 3)).astype(np.float32)
    ang = rng.uniform(0, math.pi, n)
    period = rng.uniform(3.0, 8.0, n)
    phase = rng.uniform(0, 2 * math.pi, n)
    bg_wave = np.sin(2 * math.pi * (xx * col(np.cos(ang)) + yy * col(np.sin(ang))) / col(period) + col(phase))
    img = bg_color[:, :, None, None] * (1 + col(rng.uniform(0.1, 0.3, n))[:, None] * bg_wave[:, None])

    # Distractors: small solid blobs of random colour, drawn before (so under) the object.
    for _ in range(distractors):
        cx, cy = rng.uniform(0, s, n), rng.uniform(0, s, n)
        r = rng.uniform(0.05, 0.11, n) * s
        square = rng.random(n) < 0.5
        dx, dy = np.abs(xx - col(cx)), np.abs(yy - col(cy))
        dist = np.where(col(square), np.maximum(dx, dy), np.sqrt(dx**2 + dy**2)) - col(r)
        m = np.clip(0.5 - dist, 0, 1)[:, None]
        img = img * (1 - m) + rng.uniform(0, 1, (n, 3, 1, 1)).astype(np.float32) * m

    # The object: shape mask (soft 1-pixel edge) filled with stripes whose orientation carries half the class.
    shape, group = y % len(SHAPES), y // len(SHAPES)
    r = rng.uniform(0.2, 0.32, n) * s
    cx, cy = (rng.uniform(0.35, 0.65, n) * s for _ in range(2))
    rot = rng.uniform(0, 2 * math.pi, n)
    dx, dy = xx - col(cx), yy - col(cy)
    u = (dx * col(np.cos(rot)) + dy * col(np.sin(rot))) / col(r)
    v = (-dx * col(np.sin(rot)) + dy * col(np.cos(rot))) / col(r)
    dist = _shape_distance(shape, u, v) * col(r)  # in pixels
    mask = np.clip(0.5 - dist, 0, 1)[:, None]
    theta = np.radians(np.asarray(ORIENTATIONS)[group] + rng.normal(0, overlap, n))
    period = rng.uniform(3.0, 5.0, n)
    phase = rng.uniform(0, 2 * math.pi, n)
    wave = 0.5 + 0.5 * np.sin(
        2 * math.pi * (xx * col(np.cos(theta)) + yy * col(np.sin(theta))) / col(period) + col(phase)
    )
    color = _saturated(rng, n)
    obj = color[:, :, None, None] * (0.3 + 0.7 * wave[:, None])
    img = img * (1 - mask) + obj * mask
    img = img + rng.normal(0, noise, img.shape).astype(np.float32)
    return (np.clip(img, 0, 1) * 255 + 0.5).astype(np.uint8)


def _shape_distance(shape: np.ndarray, u: np.ndarray, v: np.ndarray) -> np.ndarray:
    """Approximate signed distance (in object radii, < 0 inside) of every pixel to each image's shape."""
    radius = np.sqrt(u**2 + v**2)
    k = [
        np.cos(a) * u + np.sin(a) * v
        for a in (math.pi / 2, math.pi / 2 + 2 * math.pi / 3, math.pi / 2 + 4 * math.pi / 3)
    ]
    d = {
        0: radius - 0.85,  # disk
        1: np.maximum(np.abs(u), np.abs(v)) - 0.7,  # square
        2: np.maximum(np.maximum(k[0], k[1]), k[2]) - 0.5,  # triangle (inradius 0.5, circumradius 1)
        3: np.minimum(np.maximum(np.abs(u) - 0.95, np.abs(v) - 0.32), np.maximum(np.abs(u) - 0.32, np.abs(v) - 0.95)),
        4: np.abs(radius - 0.7) - 0.25,  # ring
    }
    out = np.empty_like(u)
    for i, di in d.items():
        sel = shape == i
        out[sel] = di[sel]
    return out


def _saturated(rng: np.random.Generator, n: int) -> np.ndarray:
    """Random bright, saturated RGB colours (hue uniform), so the object stands out from the greyish background."""
    hue = rng.uniform(0, 6, n)
    x = 1 - np.abs(hue % 2 - 1)
    sector = hue.astype(int) % 6
    rgb = np.zeros((n, 3), dtype=np.float32)
    order = [(0, 1), (1, 0), (1, 2), (2, 1), (2, 0), (0, 2)]  # (channel at 1, channel at x) per hue sector
    for i, (full, part) in enumerate(order):
        sel = sector == i
        rgb[sel, full] = 1.0
        rgb[sel, part] = x[sel]
    value = rng.uniform(0.7, 1.0, n).astype(np.float32)
    return rgb * value[:, None]
