"""Which positions of each analysed record survive a plan (shared by the rewrite and bias compensation)."""

from __future__ import annotations

import numpy as np

from prunefx.analysis.graph import DependencyGraph
from prunefx.plan import PruningPlan


def keep_by_root(dg: DependencyGraph, plan: PruningPlan) -> tuple[np.ndarray, np.ndarray]:
    """Sorted class ids of every pruned group's channels and whether each is kept."""
    roots, keep = [], []
    for gp in plan.groups:
        g = dg.groups[gp.group]
        mask = np.zeros(g.channels, dtype=bool)
        mask[list(gp.keep)] = True
        roots.append(g.roots)
        keep.append(mask)
    if not roots:
        return np.empty(0, np.int64), np.empty(0, bool)
    r, k = np.concatenate(roots), np.concatenate(keep)
    order = np.argsort(r)
    return r[order], k[order]


def kept_positions(roots: np.ndarray, sorted_roots: np.ndarray, keep: np.ndarray) -> np.ndarray:
    """Positions of a record that survive: never-pruned (-1 or untouched classes) or kept."""
    mask = np.ones(len(roots), dtype=bool)
    if len(sorted_roots):
        idx = np.clip(np.searchsorted(sorted_roots, roots), 0, len(sorted_roots) - 1)
        hit = (sorted_roots[idx] == roots) & (roots >= 0)
        mask[hit] = keep[idx[hit]]
    return np.flatnonzero(mask)
