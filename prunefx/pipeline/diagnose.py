"""Warnings about a pruning decision the numbers cannot support: tied scores, gammas sparsity did not separate.

Both say what to do. The runner logs them and the report carries them (report.md lists them first).

>>> score_warnings(result, "bn_scale", gammas)     # ['the channel scores are (near-)tied: ...']
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import numpy as np

from prunefx.train.sparsity import SparsityConfig

NEAR = 0.01  # a score within 1% of the cut boundary cannot be told from it
TIED = 0.10  # warn when this fraction of the ranked channels sits that close to the boundary
SEPARATED = 0.01  # below this fraction of gammas under the threshold, sparsity separated nothing

_SPARSITY_FIX = ("train the sparse model from the baseline's initialisation with an adapted strength "
                 "(prune.sparsity.start=scratch, schedule=target, selective=true) or for more epochs")


def score_warnings(result: Any, criterion: str, gammas: Mapping[str, float] | None) -> list[str]:
    """Warn when many channels score the same as the cut boundary: which of them go is an accident of order.

    The boundary of a group is the highest score it cut (one global threshold for ``scope: global``); a channel
    within 1% of it is tied with it. Boundaries at ~0 (dead channels cut among dead channels) do not count.
    """
    near = total = 0
    boundaries = []
    for g in result.plan.groups:
        values = np.asarray(result.scores.values[g.group], dtype=np.float64)
        cut = np.ones(len(values), dtype=bool)
        cut[list(g.keep)] = False
        total += len(values)
        if not cut.any():
            continue
        boundary = values[cut].max()
        if abs(boundary) <= 1e-3 * np.abs(values).max():
            continue
        near += int((np.abs(values - boundary) <= NEAR * abs(boundary)).sum())
        boundaries.append(boundary)
    if not total or near < TIED * total:
        return []
    fix = _SPARSITY_FIX if gammas else "train with sparsity first (prune.sparsity.epochs > 0, schedule=target)"
    return [f"the channel scores ({criterion}) are (near-)tied at the cut: {near} of {total} channels score within "
            f"{NEAR:.0%} of it ({float(np.median(boundaries)):.4g}), so the plan cuts among them by position, not "
            f"importance, and the cut may cost most of the accuracy; {fix}, or use another criterion (l1, l2, taylor)"]


def sparsity_warnings(gammas: Mapping[str, float], config: SparsityConfig) -> list[str]:
    """Warn when sparsity training left the gammas where bn_scale cannot tell channels apart."""
    below = gammas.get(f"below_{config.threshold:g}")
    if below is None:
        return []
    quantiles = f"q0.1 {gammas['q0.1']:.4g} .. q0.9 {gammas['q0.9']:.4g}" if "q0.1" in gammas else ""
    if config.schedule == "target" and below < config.target / 2:
        return [f"sparsity reached {below:.1%} of the gammas below {config.threshold:g}, not the target "
                f"{config.target:.0%} ({quantiles}); give it more epochs or steps, or a larger starting s"]
    if below < SEPARATED:
        return [f"sparsity did not separate the gammas: {below:.1%} below {config.threshold:g} ({quantiles}); "
                f"{_SPARSITY_FIX}"]
    return []
