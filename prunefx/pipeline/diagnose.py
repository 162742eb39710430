"""Warnings about a pruning decision the numbers cannot support: tied scores, gammas sparsity did not separate.

Both say what to do. The runner logs them and the report carries them (report.md lists them first).

>>> score_warnings(result, "bn_scale", gammas)     # ['the channel scores are (near-)tied: ...']
"""

from __future__ import annotations

from typing import Any

from prunefx.importance import ties_at_cut
from prunefx.train.sparsity import GammaStats, SparsityConfig

SEPARATED = 0.01  # below this fraction of gammas under the threshold, sparsity separated nothing

_SPARSITY_FIX = ("train the sparse model from the baseline's initialisation with an adapted strength "
                 "(prune.sparsity.start=scratch, schedule=target, selective=true) or for more epochs")


def score_warnings(result: Any, criterion: str, gammas: GammaStats | None) -> list[str]:
    """Warn when many channels score the same as the cut boundary: which of them go is an accident of order.

    The library's own test (:func:`prunefx.importance.ties_at_cut`, which ``prunefx.prune`` warns with), phrased
    with the run's fix: the sparsity settings that separate the gammas (``gammas``: None without sparsity).
    """
    ties = ties_at_cut(result.scores, {g.group: g.keep for g in result.plan.groups}, criterion)
    if ties is None:
        return []
    fix = (_SPARSITY_FIX if gammas is not None
           else "train with sparsity first (prune.sparsity.epochs > 0, schedule=target)")
    return [ties.message(f"{fix}, or use another criterion (l1, l2, taylor)")]


def sparsity_warnings(gammas: GammaStats, config: SparsityConfig) -> list[str]:
    """Warn when sparsity training left the gammas where bn_scale cannot tell channels apart."""
    below = gammas.below.get(config.threshold)
    if below is None:
        return []
    q = gammas.quantiles
    quantiles = f"q0.1 {q[0.1]:.4g} .. q0.9 {q[0.9]:.4g}" if 0.1 in q else ""
    if config.schedule == "target" and below < config.target / 2:
        return [f"sparsity reached {below:.1%} of the gammas below {config.threshold:g}, not the target "
                f"{config.target:.0%} ({quantiles}); give it more epochs or steps, or a larger starting s"]
    if below < SEPARATED:
        return [f"sparsity did not separate the gammas: {below:.1%} below {config.threshold:g} ({quantiles}); "
                f"{_SPARSITY_FIX}"]
    return []
