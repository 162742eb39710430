"""Which kept widths a group may take beyond the planner's own limits: ``PlanConfig.allowed_widths``."""

from __future__ import annotations

import fnmatch

from prunefx.analysis.graph import DependencyGraph
from prunefx.analysis.roles import OUT, Kind
from prunefx.plan.config import PlanConfig


def allowed_width(dg: DependencyGraph, gid: int, cfg: PlanConfig, n: int) -> int:
    """``n`` raised to the smallest count ``cfg.allowed_widths`` accepts for the group (its full width if none).

    A pattern applies to a group holding the output channels of a module it matches, or a dim of a parameter it
    matches (a stacked expert weight read by the graph, with no module of its own).
    """
    group = dg.groups[gid]
    outs = [*group.modules(OUT), *(m.name for m in group.members if m.kind is Kind.PARAM)]
    c = dg.groups[gid].channels
    for pat, counts in cfg.allowed_widths:
        if any(fnmatch.fnmatchcase(m, pat) for m in outs):
            return min((k for k in counts if n <= k <= c), default=c)
    return n


__all__ = ["allowed_width"]
