"""Turn the engine's coupled atoms into groups: sets of channels that are pruned together.

A class is one channel as every layer sees it (a conv output channel, the BN entry it feeds, the
consumer input columns it reaches). Classes that touch exactly the same layers form a *group*: any
subset of a group's channels can be removed with one consistent rewrite of those layers.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from .engine import EngineState, Record

_RNG = np.random.default_rng(0x5EED)


@dataclass(frozen=True)
class Member:
    """One layer role (or parameter dim, or graph literal) in a group and where each channel sits in it."""

    kind: str  # "module" | "param" | "const"
    name: str
    role: str
    module_type: str
    positions: tuple[tuple[int, ...], ...]  # per group channel; several when a channel is repeated (concat, flatten)

    def describe(self) -> str:
        """Compact slice notation: ``out[0:64]``, ``in[0:64]+[64:128]`` (SPPF), ``in[0:3136]/64`` (flatten)."""
        reps = len(self.positions[0]) if self.positions else 0
        uniform = all(len(p) == reps for p in self.positions)
        if not uniform:
            return f"{self.role}{{{sum(len(p) for p in self.positions)} positions}}"
        spans = []
        for r in range(reps):
            col = [p[r] for p in self.positions]
            spans.append(_span(col))
        return self.role + "+".join(spans) if reps <= 4 else f"{self.role}{spans[0]}x{reps}"


def _span(col: list[int]) -> str:
    if col == list(range(col[0], col[0] + len(col))):
        return f"[{col[0]}:{col[0] + len(col)}]"
    if len(col) > 1 and len({b - a for a, b in zip(col, col[1:])}) == 1:
        step = col[1] - col[0]
        return f"[{col[0]}:{col[-1] + 1}:{step}]"
    return "[" + ",".join(map(str, col[:6])) + (",...]" if len(col) > 6 else "]")


@dataclass(frozen=True)
class Group:
    """Channels that must be pruned together, with every member they touch."""

    id: int
    channels: int
    prunable: bool
    reasons: tuple[str, ...]
    constraints: tuple[str, ...]
    exact: bool
    inexact_reasons: tuple[str, ...]
    members: tuple[Member, ...]
    roots: np.ndarray = field(repr=False, compare=False)  # class id of each channel, in channel order

    def modules(self, role: str | None = None) -> list[str]:
        return [m.name for m in self.members if m.kind == "module" and (role is None or m.role == role)]

    def to_dict(self) -> dict:
        return {
            "id": self.id,
            "channels": self.channels,
            "prunable": self.prunable,
            "reasons": list(self.reasons),
            "constraints": list(self.constraints),
            "exact": self.exact,
            "inexact_reasons": list(self.inexact_reasons),
            "members": [
                {"kind": m.kind, "name": m.name, "role": m.role, "type": m.module_type,
                 "slices": m.describe(), "positions": [list(p) for p in m.positions]}
                for m in self.members
            ],
        }


@dataclass
class Grouping:
    groups: list[Group]
    record_roots: dict[tuple[str, str, str], np.ndarray]
    ties: list[tuple[tuple[int, ...], str]]


def build_groups(state: EngineState) -> Grouping:
    """Group classes by the exact set of members they touch (and their freeze / exactness state)."""
    for _ in range(8):  # equal-count ties that do not map to whole groups are coupled, then regrouped
        grouping = _group_once(state)
        if grouping is not None:
            return grouping
    raise RuntimeError("equal-count constraints did not settle")  # each retry merges classes, so it converges


def _group_once(state: EngineState) -> Grouping | None:
    atoms = state.atoms
    records = list(state.records.values())
    keys = list(state.records.keys())
    roots = [atoms.find(r.atoms) for r in records]
    rec_ids = np.concatenate([np.full(len(r), i, dtype=np.int64) for i, r in enumerate(roots)]) if roots else np.empty(0, np.int64)
    all_roots = np.concatenate(roots) if roots else np.empty(0, np.int64)
    valid = all_roots >= 0
    pairs = np.unique(np.stack([all_roots[valid], rec_ids[valid]], axis=1), axis=0) if valid.any() else np.empty((0, 2), np.int64)
    weights = _RNG.integers(1, 2**62, size=len(records) + 1, dtype=np.int64).astype(np.uint64)
    classes, inv = np.unique(pairs[:, 0], return_inverse=True)
    sig = np.zeros(len(classes), dtype=np.uint64)
    np.add.at(sig, inv, weights[pairs[:, 1]])
    frozen = atoms.frozen_reason(classes)
    inexact = atoms.inexact_reason(classes)
    sig = sig ^ (np.uint64(0x9E3779B97F4A7C15) * (frozen >= 0).astype(np.uint64))
    sig = sig ^ (np.uint64(0xC2B2AE3D27D4EB4F) * (inexact >= 0).astype(np.uint64))
    sigs, group_of_class = np.unique(sig, return_inverse=True)

    # Which records each group touches, and positions of each class inside each record.
    first_rec = np.full(len(classes), len(records), dtype=np.int64)
    np.minimum.at(first_rec, inv, pairs[:, 1])
    class_index = {int(c): i for i, c in enumerate(classes)}
    group_classes: list[list[int]] = [[] for _ in sigs]
    for ci, g in enumerate(group_of_class):
        group_classes[g].append(ci)
    pos_by_record: list[dict[int, list[int]]] = []
    for r in roots:
        d: dict[int, list[int]] = {}
        for p, c in enumerate(r.tolist()):
            if c >= 0:
                d.setdefault(c, []).append(p)
        pos_by_record.append(d)
    recs_of_group: list[list[int]] = [[] for _ in sigs]
    seen = set()
    for c, rid in pairs.tolist():
        g = int(group_of_class[class_index[c]])
        if (g, rid) not in seen:
            seen.add((g, rid))
            recs_of_group[g].append(rid)

    # Equal-count ties: fine when each segment is exactly one group; else couple positions and retry.
    ties: list[tuple[tuple[int, ...], str]] = []
    retry = False
    for tie in state.ties:
        seg_roots = [atoms.find(s) for s in tie.segments]
        gids = []
        for s in seg_roots:
            gs = {int(group_of_class[class_index[int(c)]]) for c in s if c >= 0 and int(c) in class_index}
            whole = len(gs) == 1 and len(set(s.tolist())) == len(s) == len(group_classes[next(iter(gs))])
            gids.append(next(iter(gs)) if whole else None)
        if all(g is not None for g in gids) and len(set(gids)) == len(gids):
            ties.append((tuple(gids), tie.why))
        elif all(g is not None for g in gids):
            continue  # all segments already one group: equal by construction
        else:
            lens = {len(s) for s in tie.segments}
            if len(lens) != 1:
                atoms.freeze(np.concatenate(tie.segments), f"{tie.why}: unequal pieces")
            else:
                for s in tie.segments[1:]:
                    atoms.union(tie.segments[0], s)
            retry = True
    if retry:
        state.ties = [t for t in state.ties if len({len(s) for s in t.segments}) == 1]
        return None

    notes_by_group: dict[int, list[str]] = {}
    for a, text in state.notes:
        for c in set(atoms.find(a).tolist()):
            if c in class_index:
                notes_by_group.setdefault(int(group_of_class[class_index[c]]), []).append(text)

    order = sorted(range(len(sigs)), key=lambda g: (min(recs_of_group[g]), _first_pos(g, group_classes, classes, pos_by_record, recs_of_group)))
    renumber = {g: i for i, g in enumerate(order)}
    groups: list[Group] = []
    for g in order:
        cls = [int(classes[ci]) for ci in group_classes[g]]
        rids = sorted(recs_of_group[g])
        lead = pos_by_record[rids[0]]
        cls.sort(key=lambda c: lead.get(c, [1 << 60])[0])
        members = []
        for rid in rids:
            rec: Record = records[rid]
            pos = pos_by_record[rid]
            members.append(Member(rec.kind, rec.name, rec.role, rec.module_type or rec.owner, tuple(tuple(pos[c]) for c in cls)))
        froots = np.asarray(cls, dtype=np.int64)
        fr = sorted({atoms.reasons[i] for i in atoms.frozen_reason(froots).tolist() if i >= 0})
        ir = sorted({atoms.reasons[i] for i in atoms.inexact_reason(froots).tolist() if i >= 0})
        constraints = list(dict.fromkeys(notes_by_group.get(g, [])))
        for gids, why in ties:
            if g in gids:
                others = [renumber[x] for x in gids if x != g]
                constraints.append(f"keeps as many channels as group(s) {others}: {why}")
        groups.append(Group(renumber[g], len(cls), not fr, tuple(fr), tuple(constraints), not ir, tuple(ir), tuple(members), froots))
    record_roots = {k: r for k, r in zip(keys, roots)}
    return Grouping(groups, record_roots, [(tuple(renumber[g] for g in gids), why) for gids, why in ties])


def _first_pos(g, group_classes, classes, pos_by_record, recs_of_group) -> int:
    rid = min(recs_of_group[g])
    return min(pos_by_record[rid].get(int(classes[ci]), [1 << 60])[0] for ci in group_classes[g])
