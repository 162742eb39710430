"""Which kept widths a group may take beyond the planner's own limits: ``PlanConfig.allowed_widths``."""

from __future__ import annotations

import fnmatch
from collections.abc import Callable, Iterable
from dataclasses import replace

from torch import nn

from prunefx import _plugins
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


WidthRule = Callable[[nn.Module], Iterable[tuple[str, tuple[int, ...]]]]
_WIDTH_RULES: list[WidthRule] = []


def register_widths(rule: WidthRule) -> None:
    """Widths a library's modules can run at, for every plan ``prunefx.prune`` makes: ``rule(model)`` gives
    ``(module pattern, kept counts)`` pairs that join ``PlanConfig.allowed_widths`` (a kernel that needs aligned
    rows, such as ``torch._grouped_mm`` under transformers' stacked experts, which refuses a row of 45 floats)."""
    _WIDTH_RULES.append(rule)


def with_registered_widths(model: nn.Module, cfg: PlanConfig) -> PlanConfig:
    """``cfg`` with the registered width rules' pairs for ``model`` after its own (which come first and win)."""
    _plugins.activate()  # the model's library is imported by now: its width rules register (before any analysis)
    pairs = tuple(pair for rule in _WIDTH_RULES for pair in rule(model))
    return replace(cfg, allowed_widths=(*cfg.allowed_widths, *pairs)) if pairs else cfg


__all__ = ["allowed_width", "register_widths", "with_registered_widths"]
