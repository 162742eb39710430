"""Learning-rate multipliers by optimiser step: linear warm-up, then cosine, step decay or constant."""

from __future__ import annotations

import math
from collections.abc import Sequence

SCHEDULES = ("cosine", "step", "constant")


def lr_multiplier(step: int, total: int, warmup: int, schedule: str, milestones: Sequence[float] = (0.5, 0.75),
                  gamma: float = 0.1) -> float:
    """Multiplier of the peak lr at 0-based optimiser step ``step`` of ``total`` (``warmup`` of them warming up).

    ``cosine`` falls to 0 at ``total``; ``step`` multiplies by ``gamma`` at each of ``milestones`` (fractions of the
    steps after warm-up); ``constant`` stays at 1.
    """
    if step < warmup:
        return (step + 1) / warmup
    done = (step - warmup) / max(1, total - warmup)
    if schedule == "cosine":
        return 0.5 * (1 + math.cos(math.pi * min(1.0, done)))
    if schedule == "step":
        return gamma ** sum(done >= m for m in milestones)
    if schedule == "constant":
        return 1.0
    raise ValueError(f"unknown lr schedule {schedule!r}; one of {', '.join(SCHEDULES)}")


__all__ = ["SCHEDULES", "lr_multiplier"]
