"""What every pipeline does around ``prunefx.prune``: pick the weights to prune, check the result, describe it."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from prunefx.api import PruneResult
from prunefx.errors import PrunefxError
from prunefx.pipeline.config import ConfigError, PruneSpec
from prunefx.pipeline.rundir import RunDir


def prune_source(run: RunDir, weights: Path) -> Path:
    """The sparsity stage's weights when it ran, else the baseline's."""
    return weights / ("baseline.pt" if run.done("sparsity").get("skipped") else "sparse.pt")


def check_pruned(result: PruneResult, spec: PruneSpec, source: Path) -> dict[str, Any]:
    """Refuse a plan that prunes nothing or a model that differs from its masked original; the stage's record.

    Returns ``{"source", "verify", "widths", "frozen_by_check"}`` for ``state.json`` (widths per group, labelled by
    group; the groups prune() froze because pruning them failed the oracle, with the reason).
    """
    if not result.plan.pruned:
        raise ConfigError(f"the target {spec.target} is already met: the plan removes no channel from {source.name}; "
                          "lower prune.target (e.g. prune.target.flops=0.5)")
    if result.verified is not None and not result.verified.ok:
        raise PrunefxError(f"the pruned model differs from the masked original: {result.verified.message}")
    return {
        "source": source.name,
        "verify": result.verified.message if result.verified is not None else "skipped (prune.verify=false)",
        "widths": [{"name": result.graph.groups[g.group].label, "before": g.before, "after": g.after}
                   for g in result.plan.groups],
        "frozen_by_check": [{"name": result.graph.groups[g].label, "reason": why} for g, why in result.frozen_by_check],
    }
