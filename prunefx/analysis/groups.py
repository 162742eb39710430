"""Turn the engine's coupled atoms into groups: sets of channels that are pruned together.

A class is one channel as every layer sees it (a conv output channel, the BN entry it feeds, the
consumer input columns it reaches). Classes that touch exactly the same layers form a *group*: any
subset of a group's channels can be removed with one consistent rewrite of those layers.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from itertools import pairwise

import numpy as np

from prunefx.analysis.atoms import NO_CHANNEL
from prunefx.analysis.engine import Decision, EngineState, Record
from prunefx.analysis.roles import OUT, Kind, RecordKey, Role, parse_role
from prunefx.capture.concrete import USES

_RNG = np.random.default_rng(0x5EED)


@dataclass(frozen=True)
class Member:
    """One layer role (or parameter dim, or graph literal) in a group and where each channel sits in it.

    Channel k of the group occupies positions ``index[offsets[k]:offsets[k + 1]]`` of this member: one
    position usually, several when a channel is repeated (SPPF's concat, a flatten into Linear).
    """

    kind: Kind
    name: str
    role: Role
    module_type: str
    index: np.ndarray = field(repr=False, compare=False)
    offsets: np.ndarray = field(repr=False, compare=False)

    @property
    def positions(self) -> tuple[tuple[int, ...], ...]:
        idx, off = self.index.tolist(), self.offsets.tolist()
        return tuple(tuple(idx[a:b]) for a, b in pairwise(off))

    def describe(self) -> str:
        """Compact slice notation: ``out[0:64]``, ``in[0:64]+[64:128]`` (SPPF), ``in[0:25088:49]x49`` (flatten)."""
        counts = np.diff(self.offsets)
        reps = int(counts[0]) if len(counts) else 0
        if len(counts) == 0 or not (counts == reps).all():
            return f"{self.role}{{{len(self.index)} positions}}"
        grid = self.index.reshape(-1, reps)
        spans = [_span(grid[:, r]) for r in range(min(reps, 4))]
        return f"{self.role}" + "+".join(spans) if reps <= 4 else f"{self.role}{spans[0]}x{reps}"


def _span(col: np.ndarray) -> str:
    if len(col) > 1:
        steps = np.diff(col)
        if (steps == steps[0]).all():
            step = int(steps[0])
            tail = f":{step}" if step != 1 else ""
            return f"[{col[0]}:{col[-1] + 1}{tail}]"
    elif len(col) == 1:
        return f"[{col[0]}:{col[0] + 1}]"
    head = ",".join(map(str, col[:6].tolist()))
    return f"[{head}{',...' if len(col) > 6 else ''}]"


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

    def modules(self, role: Role | str | None = None) -> list[str]:
        """Names of the modules with a member in this group (only those whose member has ``role``, if given)."""
        role = parse_role(role) if role is not None else None
        return [m.name for m in self.members if m.kind is Kind.MODULE and (role is None or m.role == role)]

    @property
    def label(self) -> str:
        """A short human name: the first producing layer and the channels of it the group holds.

        >>> g.label  # the second half of a C2f's chunked cv1 output
        'model.2.cv1.conv out[16:32]'
        """
        members = [m for m in self.members if m.kind is Kind.MODULE]
        first = next((m for m in members if m.role == OUT), members[0] if members else None)
        return f"{first.name} {first.describe()}" if first is not None else f"group {self.id}"

    def to_dict(self, positions: bool = True) -> dict:
        """The ``analyze --json`` group; ``positions=False`` leaves out the per-channel indices (large, slow)."""
        return {
            "id": self.id,
            "channels": self.channels,
            "prunable": self.prunable,
            "reasons": list(self.reasons),
            "constraints": list(self.constraints),
            "exact": self.exact,
            "inexact_reasons": list(self.inexact_reasons),
            "members": [
                {"kind": str(m.kind), "name": m.name, "role": str(m.role), "type": m.module_type,
                 "slices": m.describe(),
                 **({"positions": [list(p) for p in m.positions]} if positions else {})}
                for m in self.members
            ],
        }


@dataclass
class Grouping:
    groups: list[Group]
    record_roots: dict[RecordKey, np.ndarray]
    ties: list[tuple[tuple[int, ...], str]]


def build_groups(state: EngineState) -> Grouping:
    """Group classes by the exact set of members they touch (and their freeze / exactness state)."""
    for _ in range(8):  # equal-count ties that do not map to whole groups are coupled, then regrouped
        grouping = _group_once(state)
        if grouping is not None and not _freeze_decided(state, grouping):
            return grouping
    raise RuntimeError("equal-count constraints did not settle")  # each retry merges classes, so it converges


def _group_once(state: EngineState) -> Grouping | None:
    atoms = state.atoms
    keys = list(state.records.keys())
    records = list(state.records.values())
    # Records that hold the same atoms (a BN's weight, bias, running stats and channel role) touch the same classes:
    # the grouping runs once per distinct array (a ninth of ResNet-50's positions), then hands it to each record.
    sources, rec_src = _distinct_atoms(records)
    R = max(len(sources), 1)
    lengths = np.array([len(a) for a in sources], dtype=np.int64)
    # Every atom's class in one find, then one gather: a find per record costs more than its work on small ones.
    root_of = atoms.find(np.arange(atoms.size, dtype=np.int64))
    cat = np.concatenate(sources).astype(np.int64) if sources else np.empty(0, np.int64)
    occ_root = np.full(len(cat), NO_CHANNEL, dtype=np.int64)
    ok = cat >= 0
    occ_root[ok] = root_of[cat[ok]]
    del cat, ok
    occ_root.flags.writeable = False  # each source's roots serve every record that holds it: shared, never written
    roots = np.split(occ_root, np.cumsum(lengths)[:-1]) if sources else []
    # Per-position arrays hold record ids, positions and class/group indices: int32 halves their memory (a 7B LLM
    # has 5.4 M recorded positions), and each is dropped as soon as it is used.
    idx_t = np.int32 if max(int(lengths.max(initial=0)), len(sources)) < 2**31 else np.int64
    occ_rec = np.repeat(np.arange(len(sources), dtype=idx_t), lengths)
    starts_of = np.repeat(np.cumsum(lengths) - lengths, lengths)  # each occurrence's record start
    occ_pos = (np.arange(len(occ_root), dtype=np.int64) - starts_of).astype(idx_t)
    del starts_of
    valid = occ_root >= 0
    if not valid.all():
        occ_root, occ_rec, occ_pos = occ_root[valid], occ_rec[valid], occ_pos[valid]
    del valid
    classes, occ_cls = _unique_inverse(occ_root)
    del occ_root
    occ_cls = occ_cls.astype(idx_t)
    n_cls = len(classes)

    # Signature of a class: the set of records it appears in, plus its frozen / inexact state.
    # Record-major keys: occurrences come record by record, so the sort runs over nearly sorted data.
    pairs = _unique(occ_rec.astype(np.int64) * max(n_cls, 1) + occ_cls)
    pair_rec, pair_cls = pairs // max(n_cls, 1), pairs % max(n_cls, 1)
    del pairs
    weights = _RNG.integers(1, 2**62, size=R, dtype=np.int64).astype(np.uint64)
    sig = np.zeros(n_cls, dtype=np.uint64)
    np.add.at(sig, pair_cls, weights[pair_rec])
    del pair_cls, pair_rec
    frozen, inexact = atoms.frozen_reason(classes), atoms.inexact_reason(classes)
    sig ^= np.uint64(0x9E3779B97F4A7C15) * (frozen >= 0).astype(np.uint64)
    sig ^= np.uint64(0xC2B2AE3D27D4EB4F) * (inexact >= 0).astype(np.uint64)
    _, raw_gid = _unique_inverse(sig)
    del sig
    n_grp = int(raw_gid.max()) + 1 if n_cls else 0

    # Order groups and channels by first appearance (record order follows the graph, producers first).
    big = int(lengths.max()) + 1 if len(lengths) else 1
    first = np.full(n_cls, np.iinfo(np.int64).max, dtype=np.int64)
    np.minimum.at(first, occ_cls, occ_rec.astype(np.int64) * big + occ_pos)
    gfirst = np.full(n_grp, np.iinfo(np.int64).max, dtype=np.int64)
    np.minimum.at(gfirst, raw_gid, first)
    renum = np.empty(n_grp, dtype=np.int64)
    renum[np.argsort(gfirst, kind="stable")] = np.arange(n_grp)
    gid = renum[raw_gid].astype(idx_t)
    del raw_gid
    by_group = np.lexsort((first, gid))
    del first
    sizes = np.bincount(gid, minlength=n_grp)
    starts = np.concatenate([[0], np.cumsum(sizes)[:-1]])
    rank = np.empty(n_cls, dtype=idx_t)
    rank[by_group] = np.arange(n_cls) - starts[gid[by_group]]

    ties, retry = _resolve_ties(state, classes, gid, sizes)
    if retry:
        return None

    # Members: occurrences sorted by (group, record, channel rank, position).
    occ_gid, occ_rank = gid[occ_cls], rank[occ_cls]
    del occ_cls
    span = (int(n_grp), R, int(sizes.max(initial=1)), big)
    if math.prod(span) < 2**62:  # one int64 key (unique per occurrence) sorts faster than a 4-key lexsort
        key = ((occ_gid.astype(np.int64) * R + occ_rec) * span[2] + occ_rank) * big + occ_pos
        order = np.argsort(key)
        del key
    else:
        order = np.lexsort((occ_pos, occ_rank, occ_rec, occ_gid))
    o_gid, o_rec, o_rank = occ_gid[order], occ_rec[order], occ_rank[order]
    del occ_gid, occ_rec, occ_rank
    o_pos = occ_pos[order].astype(np.int64)
    o_pos.flags.writeable = False  # one member's positions may be another's (records sharing their atoms)
    del occ_pos, order
    block = np.flatnonzero((np.diff(o_gid, prepend=-1, append=-1) != 0) | (np.diff(o_rec, prepend=-1, append=-1) != 0))
    recs_of: list[list[int]] = [[] for _ in range(len(sources))]
    for i, u in enumerate(rec_src):
        recs_of[u].append(i)
    # Each block's channel offsets (positions before channel k), for all blocks in one pass: block j's are
    # offsets_all[seg[j] : seg[j] + width[j] + 1], width = its group's channel count.
    starts_b = block[:-1]
    width = sizes[o_gid[starts_b]].astype(np.int64)
    seg = np.cumsum(width + 1) - (width + 1)
    occ_block = np.repeat(np.arange(len(starts_b)), np.diff(block))
    per_slot = np.bincount(seg[occ_block] + 1 + o_rank, minlength=int((width + 1).sum()))
    running = np.cumsum(per_slot)
    offsets_all = running - np.repeat(running[seg], width + 1)
    offsets_all.flags.writeable = False
    placed: list[list[tuple[int, Member]]] = [[] for _ in range(n_grp)]
    for j, (a, b) in enumerate(pairwise(block)):
        g, u = int(o_gid[a]), int(o_rec[a])
        offsets = offsets_all[seg[j] : seg[j] + width[j] + 1]
        for rid in recs_of[u]:
            rec: Record = records[rid]
            member = Member(rec.kind, rec.name, rec.role, rec.module_type or rec.owner, o_pos[a:b], offsets)
            placed[g].append((rid, member))
    del o_gid, o_rec, o_rank
    members = [[m for _, m in sorted(p, key=lambda t: t[0])] for p in placed]  # in record (graph) order

    notes: dict[int, list[str]] = {}
    for a, text in state.notes:
        for g in np.unique(_gids_of(atoms.find(a), classes, gid)).tolist():
            if g >= 0:
                notes.setdefault(g, []).append(text)
    groups: list[Group] = []
    for g in range(n_grp):
        cls_idx = by_group[starts[g] : starts[g] + sizes[g]]
        froots = classes[cls_idx]
        fr = sorted({atoms.reasons[i] for i in set(frozen[cls_idx].tolist()) if i >= 0})
        ir = sorted({atoms.reasons[i] for i in set(inexact[cls_idx].tolist()) if i >= 0})
        constraints = list(dict.fromkeys(notes.get(g, [])))
        for gids, why in ties:
            if g in gids:
                constraints.append(f"keeps as many channels as group(s) {[x for x in gids if x != g]}: {why}")
        groups.append(
            Group(id=g, channels=int(sizes[g]), prunable=not fr, reasons=tuple(fr), constraints=tuple(constraints),
                  exact=not ir, inexact_reasons=tuple(ir), members=tuple(members[g]), roots=froots)
        )
    return Grouping(groups, {key: roots[u] for key, u in zip(keys, rec_src, strict=True)}, ties)


def _distinct_atoms(records: list[Record]) -> tuple[list[np.ndarray], list[int]]:
    """The distinct atom arrays, numbered by first appearance, and each record's index into them."""
    by_id: dict[int, int] = {}
    by_content: dict[tuple, int] = {}
    sources: list[np.ndarray] = []
    rec_src: list[int] = []
    for rec in records:
        a = rec.atoms
        u = by_id.get(id(a))  # records share array objects; the content check catches equal copies
        if u is None:
            u = by_content.setdefault((a.dtype.str, a.shape, a.tobytes()), len(sources))
            if u == len(sources):
                sources.append(a)
            by_id[id(a)] = u
        rec_src.append(u)
    return sources, rec_src


def _freeze_decided(state: EngineState, grouping: Grouping) -> bool:
    """Freeze each group whose pruning would change a Python decision the trace took on sizes; True if any was.

    The graph holds only the branch (loop count, constant) the example sizes chose, so pruning such a group would
    leave a model that takes another path than its graph. Each decision is re-evaluated with 1..n-1 of the group's
    n channels removed from the tensors it reads; a decision that no pruning changes (``x.numel() > 0``, a size
    compared with another of the same group) leaves the group prunable. Runs once: the decisions are consumed.
    """
    decisions, state.decisions = state.decisions, []
    groups, frozen = grouping.groups, set()
    if not decisions or not groups:
        return False
    roots = np.concatenate([g.roots for g in groups])
    owner = np.repeat(np.arange(len(groups)), [len(g.roots) for g in groups])
    order = np.argsort(roots, kind="stable")
    roots, owner = roots[order], owner[order]
    for dec in decisions:
        dims = [(n, d, state.atoms.find(lab.dims[d])) for n, lab in dec.labels.items() for d in lab.labeled()]
        hit = np.concatenate([r for _, _, r in dims])
        idx = np.minimum(np.searchsorted(roots, hit), len(roots) - 1)
        for g in np.unique(owner[idx[roots[idx] == hit]]).tolist():
            if groups[g].prunable and g not in frozen:
                why = _flip(dec, groups[g], dims)
                if why is not None:
                    state.atoms.freeze(groups[g].roots, why)
                    frozen.add(g)
    return bool(frozen)


def _flip(dec: Decision, group: Group, dims: list) -> str | None:
    """Why pruning ``group`` changes the decision (None when no number of channels removed does)."""
    rec, n = dec.record, group.channels
    head = f"{USES[rec['use']][0]} reads this channel count at {rec['at']}: `{rec['code']}`"
    try:
        if dec.size.outcome() != rec["value"]:
            raise ValueError("the traced sizes do not give the traced decision")
    except Exception as exc:  # noqa: BLE001 - a decision that cannot be re-evaluated may depend on anything
        return f"{head} (it cannot be re-evaluated at other sizes: {type(exc).__name__})"
    # Removing the group's first m channels takes, from each dim read, the positions of those channels.
    rank = {int(r): k for k, r in enumerate(group.roots.tolist())}
    cuts = []
    for node, d, r in dims:
        counts = np.bincount([rank[x] for x in r.tolist() if x in rank], minlength=n)
        if counts.any():
            cuts.append((node, d, np.cumsum(counts)))
    for m in range(1, n):
        shapes = {node: list(dec.size.value_of(node).shape) for node, _, _ in cuts}
        for node, d, removed in cuts:
            shapes[node][d] -= int(removed[m - 1])
        try:
            changed = dec.size.outcome({k: tuple(v) for k, v in shapes.items()}) != rec["value"]
        except Exception:  # noqa: BLE001 - the code would fail at that size: as much a change as another branch
            changed = True
        if changed:
            return f"{head} (the trace took {rec['value']!r} at {n} channels; {n - m} would change it)"
    return None


def _unique(a: np.ndarray) -> np.ndarray:
    """Sorted unique values (np.unique without its extra passes)."""
    s = np.sort(a)
    return s[np.concatenate([[True], s[1:] != s[:-1]])] if len(s) else s


def _unique_inverse(a: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Sorted unique values and the inverse index (a lookup table when the values are dense, else a sort)."""
    if len(a) and a.dtype.kind == "i" and 0 <= int(a.min()) and int(a.max()) < 4 * len(a) + 1024:
        present = np.zeros(int(a.max()) + 1, dtype=bool)  # atom ids: bounded by the positions, no sort needed
        present[a] = True
        return np.flatnonzero(present), (np.cumsum(present) - 1)[a]
    order = np.argsort(a)  # the inverse does not depend on how equal values are ordered
    sa = a[order]
    new = np.empty(len(sa), dtype=bool)
    new[:1] = True
    np.not_equal(sa[1:], sa[:-1], out=new[1:])
    inv = np.empty(len(a), dtype=np.int64)
    inv[order] = np.cumsum(new) - 1
    return sa[new], inv


def _gids_of(roots: np.ndarray, classes: np.ndarray, gid: np.ndarray) -> np.ndarray:
    """Group id of each class root (-1 for NO_CHANNEL or roots that are in no record)."""
    out = np.full(len(roots), -1, dtype=np.int64)
    ok = roots >= 0
    idx = np.searchsorted(classes, roots[ok])
    idx = np.minimum(idx, len(classes) - 1) if len(classes) else idx
    hit = classes[idx] == roots[ok] if len(classes) else np.zeros(0, bool)
    sub = np.full(ok.sum(), -1, dtype=np.int64)
    sub[hit] = gid[idx[hit]]
    out[ok] = sub
    return out


def _resolve_ties(state: EngineState, classes, gid, sizes) -> tuple[list[tuple[tuple[int, ...], str]], bool]:
    """Equal-count ties are kept when each piece is one whole group; else pieces are coupled by position."""
    atoms = state.atoms
    ties: list[tuple[tuple[int, ...], str]] = []
    retry = False
    for tie in state.ties:
        seg_roots = [atoms.find(s) for s in tie.segments]
        gids = []
        for s in seg_roots:
            gs = np.unique(_gids_of(s, classes, gid))
            whole = len(gs) == 1 and gs[0] >= 0 and len(np.unique(s)) == len(s) == sizes[gs[0]]
            gids.append(int(gs[0]) if whole else None)
        if all(g is not None for g in gids) and len(set(gids)) == len(gids):
            ties.append((tuple(gids), tie.why))
        elif all(len(s) == len(seg_roots[0]) and np.array_equal(s, seg_roots[0]) for s in seg_roots):
            continue  # pieces already coupled position by position: equal counts by construction
        elif len({len(s) for s in tie.segments}) != 1:
            atoms.freeze(np.concatenate(tie.segments), f"{tie.why}: unequal pieces")
            retry = True
        else:
            for s in tie.segments[1:]:
                atoms.union(tie.segments[0], s)
            retry = True
    return ties, retry
