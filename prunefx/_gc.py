"""Pause Python's cyclic garbage collector for a block (below every unit: analysis and latency timing)."""

from __future__ import annotations

import gc
from collections.abc import Iterator
from contextlib import contextmanager


@contextmanager
def gc_paused() -> Iterator[None]:
    """No cyclic collection inside the block; the collector's previous state is restored after it.

    A full collection walks every object the process holds (torch and the model: hundreds of thousands), 100-200 ms
    on a 2-core machine, and the graphs and records an analysis allocates trigger one every few calls: the pause made
    the median of five ResNet-sized analyses twice their minimum. Memory is still freed by reference counting; the
    cycles made in the block wait for the next collection after it.
    """
    was_enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if was_enabled:
            gc.enable()


__all__ = ["gc_paused"]
