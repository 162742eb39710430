"""A task that is not an image classifier: estimate a sine's frequency from raw samples (``configs/sine.yaml``).

    model = trained_regressor()          # a 1-D conv net, trained here on first use (about 20 s), then cached
    data = make_data()                   # {"train": [(signals, frequencies), ...], "val": [...]}
    metric(model, data["val"])           # {"r2": ..., "mae_hz": ...}

Signals: 256 samples of ``sin(2 pi f t + phase)`` plus Gaussian noise (sigma 0.3), f uniform in [1, 20] cycles per
window; the target is f. Everything is generated from seeds: the training set (seed 0) and the validation set
(seed 1) never share a signal. The trained model is cached as a state_dict under ``$PRUNEFX_CACHE_DIR/examples``
(default ``.cache/examples`` in the working directory), keyed by :data:`VERSION`, the seed and the step count.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import nn

from prunefx.examples._cache import cached

VERSION = 1  # bump when the data, the model or the recipe changes: the cache key
LENGTH, LOW, HIGH, NOISE = 256, 1.0, 20.0, 0.3
STEPS, BATCH, LR = 600, 64, 3e-3  # the recipe: Adam, cosine decay; the validation R^2 has plateaued by then


def signals(n: int, seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    """``n`` noisy sines (n, 1, LENGTH) and their frequencies (n, 1), from ``seed``."""
    g = torch.Generator().manual_seed(seed)
    f = torch.rand(n, 1, generator=g) * (HIGH - LOW) + LOW
    phase = torch.rand(n, 1, generator=g) * 2 * math.pi
    t = torch.arange(LENGTH) / LENGTH
    x = torch.sin(2 * math.pi * f * t + phase) + NOISE * torch.randn(n, LENGTH, generator=g)
    return x.unsqueeze(1), f


def make_data(n_train: int = 1024, n_val: int = 256, batch: int = BATCH) -> dict[str, list[tuple]]:
    """Training and validation batches of (signals, frequencies)."""
    out = {}
    for split, n, seed in (("train", n_train, 0), ("val", n_val, 1)):
        x, f = signals(n, seed)
        out[split] = list(zip(x.split(batch), f.split(batch), strict=True))
    return out


def regressor(width: int = 32) -> nn.Sequential:
    """Four Conv1d-BN-ReLU blocks (stride 2 after the first), global average pool, a Linear to one number."""
    layers: list[nn.Module] = []
    cin = 1
    for i, cout in enumerate((width, width, 2 * width, 2 * width)):
        layers += [nn.Conv1d(cin, cout, 7 if i == 0 else 5, stride=1 if i == 0 else 2, padding=3 if i == 0 else 2,
                             bias=False), nn.BatchNorm1d(cout), nn.ReLU()]
        cin = cout
    return nn.Sequential(*layers, nn.AdaptiveAvgPool1d(1), nn.Flatten(), nn.Linear(cin, 1))


def trained_regressor(seed: int = 0, steps: int = STEPS) -> nn.Module:
    """:func:`regressor` trained on :func:`make_data`'s training set (cached; see the module docstring)."""
    torch.manual_seed(seed)

    def train(model: nn.Module) -> None:
        x, f = signals(1024, 0)
        optimizer = torch.optim.Adam(model.parameters(), lr=LR)
        schedule = torch.optim.lr_scheduler.CosineAnnealingLR(optimizer, steps)
        g = torch.Generator().manual_seed(seed)
        for _ in range(steps):
            pick = torch.randint(0, len(x), (BATCH,), generator=g)
            loss = task_loss(model(x[pick]), (x[pick], f[pick]))
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
            schedule.step()

    return cached(regressor(), f"sine-v{VERSION}-seed{seed}-steps{steps}", train)


def task_loss(out: torch.Tensor, batch: tuple[torch.Tensor, torch.Tensor]) -> torch.Tensor:
    """Mean squared error in (cycles per window / 10)^2, a scale near 1."""
    return F.mse_loss(out / 10, batch[1] / 10)


def metric(model: nn.Module, batches: list[tuple[torch.Tensor, torch.Tensor]]) -> dict[str, float]:
    """R^2 of the frequency estimate (1 is perfect, 0 is guessing the mean) and its mean absolute error in Hz."""
    device = next(model.parameters()).device  # recovery may evaluate it on its accelerator
    with torch.no_grad():
        pred = torch.cat([model(x.to(device)).cpu() for x, _ in batches])
    f = torch.cat([f for _, f in batches])
    r2 = 1 - float((pred - f).square().sum() / (f - f.mean()).square().sum())
    return {"r2": r2, "mae_hz": float((pred - f).abs().mean())}
