"""A decided plan: frozen, printable, JSON-serialisable, tied to the analysed model by a fingerprint.

Deciding (``prunefx.plan.solve.make_plan``) is kept apart from doing (``prunefx.apply_plan``): a plan can be
printed, reviewed, saved and re-applied to a fresh copy of the model.
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field
from typing import Any

from prunefx.analysis.graph import DependencyGraph
from prunefx.analysis.roles import Kind
from prunefx.plan.config import PlanError


@dataclass(frozen=True)
class GroupPlan:
    """One group's decision: which channels stay (indices in group channel order) and why."""

    group: int
    before: int
    after: int
    keep: tuple[int, ...]
    why: str
    label: str = ""  # the group's name in tables (first producing layer and channels): "layer1.0.conv1 out[0:64]"
    # the mean |raw score| of the group's channels, whatever PlanConfig.normalize was: one measure, so plans made
    # with different modes compare; None in plans saved before it was recorded
    score_scale: float | None = None


SCALE_SPREAD = 10.0  # a global plan over raw scores whose groups' scales differ more than this says so


@dataclass(frozen=True)
class PruningPlan:
    """What to keep in every pruned group, tied to the analysed model by a fingerprint."""

    model: str
    fingerprint: str
    input_shapes: tuple[tuple[int, ...], ...]
    criterion: str
    target: dict[str, Any]
    groups: tuple[GroupPlan, ...]
    skipped: tuple[tuple[int, str], ...] = ()  # (group id, reason) for prunable groups left alone
    estimate: dict[str, float] = field(default_factory=dict)  # cost model's MACs / params before and after
    frozen: tuple[tuple[int, str], ...] = ()  # (group id, reason): frozen because pruning them failed the oracle
    input_kinds: tuple[str, ...] = ()  # each positional input's dtype, "none" or "other" (() in older plans)

    def to_dict(self) -> dict[str, Any]:
        d = asdict(self)
        d["schema"] = "prunefx.plan/1"
        return d

    def to_json(self) -> str:
        return json.dumps(self.to_dict(), indent=1)

    @staticmethod
    def from_dict(d: dict[str, Any]) -> PruningPlan:
        if d.get("schema") != "prunefx.plan/1":
            raise PlanError(f"not a prunefx plan (schema {d.get('schema')!r}); expected 'prunefx.plan/1'")
        return PruningPlan(
            model=d["model"],
            fingerprint=d["fingerprint"],
            input_shapes=tuple(tuple(s) for s in d["input_shapes"]),
            criterion=d["criterion"],
            target=dict(d["target"]),
            groups=tuple(
                GroupPlan(group=g["group"], before=g["before"], after=g["after"], keep=tuple(g["keep"]), why=g["why"],
                          label=g.get("label", ""), score_scale=g.get("score_scale"))
                for g in d["groups"]
            ),
            skipped=tuple((int(a), str(b)) for a, b in d.get("skipped", ())),
            estimate=dict(d.get("estimate", {})),
            frozen=tuple((int(a), str(b)) for a, b in d.get("frozen", ())),
            input_kinds=tuple(str(k) for k in d.get("input_kinds", ())),
        )

    @staticmethod
    def from_json(text: str) -> PruningPlan:
        return PruningPlan.from_dict(json.loads(text))

    @property
    def pruned(self) -> tuple[GroupPlan, ...]:
        return tuple(g for g in self.groups if g.after < g.before)

    def score_spread(self) -> float | None:
        """Largest over smallest positive ``score_scale`` among the planned groups; None when none is known."""
        scales = [g.score_scale for g in self.groups if g.score_scale is not None and g.score_scale > 0]
        return max(scales) / min(scales) if scales else None

    def score_scale_note(self) -> str | None:
        """Says so when one global threshold over raw scores spans groups whose scales differ > ``SCALE_SPREAD``x."""
        spread = self.score_spread()
        # A normalised plan (target "normalize") or a local one ranks each group on its own scale already.
        if self.target.get("scope") != "global" or "normalize" in self.target or not spread or spread <= SCALE_SPREAD:
            return None
        return f"score scales differ {spread:.0f}x across groups; normalize='mean' ranks them comparably"

    def summary(self) -> str:
        """One line: groups pruned, channels before -> after, criterion, estimated MACs (``table()``: per group),
        and ``score_scale_note()`` when it has one."""
        before = sum(g.before for g in self.groups)
        after = sum(g.after for g in self.groups)
        est = ""
        if self.estimate:
            est = f"; estimated MACs {self.estimate['macs_after'] / max(self.estimate['macs_before'], 1):.3f}x"
        parts = self.target.get("partial_capture")
        if parts:  # the model's own forward was not captured: say what was pruned and what was not
            opaque = ", ".join(o["path"] or "<root>" for o in parts["opaque"])
            est += (f"; partial capture: only parts {', '.join(p['path'] for p in parts['parts'])} pruned, "
                    f"forwards of {opaque} opaque ({parts['opaque_params_share']:.1%} of the parameters)")
        note = self.score_scale_note()
        if note:
            est += f"; {note}"
        return (
            f"{self.model}: {len(self.pruned)}/{len(self.groups)} groups pruned, channels {before} -> {after} "
            f"({1 - after / before if before else 0.0:.1%} removed) by {self.criterion}{est}"
        )

    def table(self):
        """A rich Table with one row per planned group: its name, channels before -> after, and why."""
        from rich.table import Table

        t = Table(title=self.summary())
        for col in ("group", "layer", "before", "after", "why"):
            t.add_column(col, overflow="fold")
        for g in self.groups:
            t.add_row(str(g.group), g.label, str(g.before), str(g.after), g.why)
        return t


def validate_plan(
    dg: DependencyGraph, plan: PruningPlan, *, graph_rewrite: bool = False, owned: frozenset[str] = frozenset()
) -> None:
    """Raise PlanError unless ``plan`` fits ``dg`` exactly; nothing is modified. ``owned``: modules whose fixers
    rewrite the literals in their forward (``prunefx.transform.owned_modules``), which need no graph rewrite."""
    dg = dg.with_frozen(plan.frozen)  # a fresh analysis of the model, with the groups prune() froze re-frozen
    if plan.fingerprint != dg.fingerprint():
        raise PlanError(
            f"this plan was made for a different model or input shape (plan {plan.model} {plan.fingerprint}, "
            f"model {dg.model_name} {dg.fingerprint()}); re-plan on this model"
        )
    counts = {}
    for gp in plan.groups:
        if not 0 <= gp.group < len(dg.groups):
            raise PlanError(f"plan names group {gp.group}, the model has {len(dg.groups)}")
        g = dg.groups[gp.group]
        if not g.prunable:
            raise PlanError(f"group {g.id} is not prunable: {g.reasons[0]}")
        if len(set(gp.keep)) != len(gp.keep) or any(not 0 <= k < g.channels for k in gp.keep):
            raise PlanError(f"group {g.id}: kept indices must be distinct and in [0, {g.channels})")
        if not gp.keep:
            raise PlanError(f"group {g.id}: a group cannot be pruned to zero channels")
        hard = any(m.kind is Kind.CONST and m.module_type not in owned for m in g.members)
        if hard and not graph_rewrite and len(gp.keep) < g.channels:
            raise PlanError(f"group {g.id}: forward hard-codes its channel count; it needs graph_rewrite")
        counts[g.id] = len(gp.keep)
    for gids, why in dg.ties:
        ns = {counts.get(g, dg.groups[g].channels) for g in gids}
        if len(ns) > 1:
            raise PlanError(f"groups {list(gids)} must keep equally many channels ({why}); plan keeps {sorted(ns)}")
