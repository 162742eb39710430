"""After the global threshold: cut the fine units further when coarse steps left a MACs / params target unmet.

One threshold moves every unit together. When some units can only move in large steps (a KV-head group under
``allowed_widths``, widths tied across layers), the bisection ends on the last plan above the target, and the next
threshold value jumps below it. The fill then takes, one step at a time, the unit step (every group of a tie
together, to its next lower allowed width) that removes the least important channels (lowest global rank) without
going below the target's tolerance, until the target is met or no step fits.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence

import numpy as np

TOLERANCE = 0.01  # a plan within 1% of its target is met; the fill runs only beyond it


def units(eligible: Sequence[int], ties: Iterable[tuple[Sequence[int], str]]) -> list[list[int]]:
    """The groups that must keep equal widths, merged where ties overlap; a group in no tie is a unit alone. A tie
    with a partner that cannot be pruned pins its groups: they are in no unit."""
    parent = {g: g for g in eligible}
    pinned: set[int] = set()

    def root(g: int) -> int:
        while parent[g] != g:
            parent[g] = parent[parent[g]]
            g = parent[g]
        return g

    for gids, _ in ties:
        tied = [g for g in gids if g in parent]
        if len(tied) != len(gids):
            pinned.update(tied)
        for g in tied[1:]:
            parent[root(g)] = root(tied[0])
    out: dict[int, list[int]] = {}
    for g in eligible:
        out.setdefault(root(g), []).append(g)
    return [u for u in out.values() if not pinned.intersection(u)]


def fill(masks: dict[int, np.ndarray], ranks: dict[int, np.ndarray], unit_list: list[list[int]],
         lower: Callable[[int, int], int | None], keep: Callable[[int, int], np.ndarray],
         measure: Callable[[dict[int, np.ndarray]], float], goal: float) -> tuple[dict[int, np.ndarray], set[int]]:
    """``masks`` cut further toward ``goal`` (a kept fraction; see the module doc), and the groups the fill cut.

    ``lower(g, n)``: the next allowed count below ``n`` for group ``g`` (None: none); ``keep(g, m)``: the mask of
    its ``m`` kept channels; ``ranks``: the channels' global ranks (higher: more important)."""
    cur, value, cut = dict(masks), measure(masks), set()
    while value > goal * (1 + TOLERANCE):
        best = None
        for unit in unit_list:
            step = {}
            for g in unit:
                n = int(cur[g].sum())
                m = lower(g, n)
                if m is None:
                    step = {}
                    break
                step[g] = keep(g, m)
            if not step:
                continue
            trial = {**cur, **step}
            v = measure(trial)
            if v < goal * (1 - TOLERANCE):
                continue  # past the target: a smaller step elsewhere may still fit
            removed = [ranks[g][cur[g] & ~step[g]] for g in step]
            importance = max(float(r.max()) for r in removed if r.size)
            if best is None or importance < best[0]:
                best = (importance, trial, v, set(step))
        if best is None:
            break
        _, cur, value, groups = best
        cut |= groups
    return cur, cut

