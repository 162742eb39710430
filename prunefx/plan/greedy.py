"""The greedy allocation's choice of the next jump: least loss per unit saved, or the cheapest that finishes."""

from __future__ import annotations

from collections.abc import Callable, Hashable, Iterable

Jump = tuple[float, float, int]  # (added loss, saved, width) of moving a unit to a lower width


def next_jump(
    units: Iterable[Hashable], jumps: Callable[[Hashable], Iterable[Jump]], now: float, goal: float
) -> tuple[Hashable, int, float] | None:
    """(unit, width, saved) of the jump to make next, or None when no jump saves anything.

    Among every unit's jumps that save something: the least added loss per unit saved, unless a jump that reaches
    ``goal`` from ``now`` adds no more loss than that one does in total (then the least lossy such jump: the last
    step need not be the most efficient, only the cheapest that finishes).
    """
    best = finish = None
    for u in units:
        for loss, saved, w in jumps(u):
            if saved <= 1e-12:
                continue
            if best is None or loss / saved < best[0]:
                best = (loss / saved, u, w, saved)
            if saved >= now - goal - 1e-12 and (finish is None or loss < finish[0]):
                finish = (loss, u, w, saved)
    if best is None:
        return None
    if finish is not None and finish[0] <= best[0] * best[3]:
        best = finish
    return best[1], best[2], best[3]
