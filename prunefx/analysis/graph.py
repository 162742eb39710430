"""The analysis result: groups of coupled channels, printable and serialisable."""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import numpy as np
import torch.fx as fx

from prunefx.analysis.atoms import AtomTable
from prunefx.analysis.groups import Group
from prunefx.analysis.parts import PartialCapture
from prunefx.analysis.roles import OUT, Kind, RecordKey, Role, parse_role
from prunefx.capture.record import CapturedBy, capture_info
from prunefx.capture.trace import SOURCE_KEY

SCHEMA_VERSION = 1


@dataclass
class DependencyGraph:
    """Channel groups of a traced model plus what a rewrite needs (per-record class ids)."""

    gm: fx.GraphModule
    groups: list[Group]
    record_roots: dict[RecordKey, np.ndarray] = field(repr=False)
    ties: list[tuple[tuple[int, ...], str]]
    unknown_ops: dict[str, str]
    auto_leaves: dict[str, str]
    model_name: str
    seconds: float
    shape_pass: str
    atoms: AtomTable = field(repr=False)
    node_labels: dict[str, Any] = field(repr=False)  # fx node name -> Lab / SizeRef / structure of them
    input_shapes: tuple[tuple[int, ...], ...] = ()
    # each positional input's kind (its dtype, "none" or "other"): what prunefx.load rebuilds inputs from
    input_kinds: tuple[str, ...] = ()
    capture: CapturedBy = "fx"  # how the graph was captured: "fx" (training-mode trace) or "export" (ATen, eval mode)
    # (group id, reason) of groups that prune() froze because pruning them failed the exactness check
    frozen_by_check: tuple[tuple[int, str], ...] = ()
    # parameter dims whose channels live only inside a leaf module (nn.MultiheadAttention's heads): the oracle
    # zeroes the removed positions of these weights, since no graph edge carries those channels
    inside: frozenset[RecordKey] = frozenset()
    notes: tuple[str, ...] = ()  # how the capture deviated from the default (e.g. traced in evaluation mode)
    # set when the model's own forward could not be captured: the submodules analysed instead (gm is their graph)
    parts: PartialCapture | None = None
    # ops with no rule whose channel map was inferred by probing them (prunefx.analysis.inferred): node -> op: map
    inferred_ops: dict[str, str] = field(default_factory=dict)

    @property
    def training(self) -> bool | None:
        """The ``training`` flag the graph was traced with (True, False; None: the modules' own flags)."""
        return capture_info(self.gm).training

    def with_frozen(self, items: tuple[tuple[int, str], ...]) -> DependencyGraph:
        """A copy in which groups ``(id, reason)`` are frozen with that reason (the rest shared, not copied)."""
        new = [g for g in items if g not in self.frozen_by_check]
        if not new:
            return self
        groups = list(self.groups)
        for gid, reason in new:
            groups[gid] = replace(groups[gid], prunable=False, reasons=(reason, *groups[gid].reasons))
        return replace(self, groups=groups, frozen_by_check=(*self.frozen_by_check, *new))

    def path(self, gid: int) -> list[str]:
        """The traced ops that carry group ``gid``'s channels, in graph order: ``"add_3 (add at timm/x.py:12)"``."""
        roots = np.unique(self.groups[gid].roots)
        nodes = {n.name: n for n in self.gm.graph.nodes}
        out = []
        for name, lab in self.node_labels.items():
            arrays = [a for a in getattr(lab, "dims", ()) if a is not None]
            if not arrays or not np.isin(self.atoms.find(np.concatenate(arrays)), roots).any():
                continue
            node = nodes.get(name)
            target = getattr(node, "target", name)
            what = target if isinstance(target, str) else getattr(target, "__name__", str(target))
            src = node.meta.get(SOURCE_KEY) if node is not None else None
            where = f" at {'/'.join(Path(src[0]).parts[-2:])}:{src[1]}" if src else ""
            out.append(f"{name} ({what}{where})")
        return out

    def fingerprint(self) -> str:
        """Identifies the group structure, so a plan is never applied to a different model."""
        h = hashlib.sha256()
        for g in self.groups:
            h.update(f"{g.id}:{g.channels}:{g.prunable}:".encode())
            for m in g.members:
                h.update(f"{m.kind}/{m.name}/{m.role}/{len(m.index)};".encode())
        return h.hexdigest()[:16]

    @property
    def prunable(self) -> list[Group]:
        return [g for g in self.groups if g.prunable]

    def group_of(self, module: str, role: Role | str = OUT) -> Group | None:
        """The group holding ``module``'s ``role`` channels (the first, when they span several groups)."""
        found = self.groups_of(module, role)
        return found[0] if found else None

    def groups_of(self, module: str, role: Role | str = OUT) -> list[Group]:
        """Every group holding some of ``module``'s ``role`` channels (``"out"``, ``IN``, ``"normalized0"``...)."""
        role = parse_role(role)
        return [
            g
            for g in self.groups
            if any(m.kind is Kind.MODULE and m.name == module and m.role == role for m in g.members)
        ]

    def summary(self) -> str:
        frozen = [g for g in self.groups if not g.prunable]
        reasons: dict[str, int] = {}
        for g in frozen:
            for r in g.reasons[:1]:
                key = r.split(" (node")[0]
                reasons[key] = reasons.get(key, 0) + 1
        top = ", ".join(f"{k}: {v}" for k, v in sorted(reasons.items(), key=lambda kv: -kv[1])[:4])
        return (
            f"{self.model_name}: {len(self.gm.graph.nodes)} nodes, {len(self.groups)} groups, "
            f"{len(self.prunable)} prunable, {sum(g.channels for g in self.prunable)} prunable channels"
            f" of {sum(g.channels for g in self.groups)}; frozen groups by reason: {top or 'none'}; "
            f"{self.seconds:.3f} s" + "".join(f"\nnote: {n}" for n in self.notes)
            + "".join(f"\ninferred rule (probed, checked by the oracle): {op}" for op in self.inferred_ops.values())
        )

    def to_dict(self) -> dict[str, Any]:
        return {
            "schema": SCHEMA_VERSION,
            "model": self.model_name,
            "nodes": len(self.gm.graph.nodes),
            "seconds": round(self.seconds, 4),
            "shape_pass": self.shape_pass,
            "capture": self.capture,
            "auto_leaves": self.auto_leaves,
            "notes": list(self.notes),
            "parts": self.parts.to_dict() if self.parts is not None else None,
            "unknown_ops": self.unknown_ops,
            "inferred_ops": self.inferred_ops,
            "groups": [g.to_dict() for g in self.groups],
            "ties": [{"groups": list(g), "why": why} for g, why in self.ties],
        }

    def to_json(self, path: str | Path | None = None) -> str:
        text = json.dumps(self.to_dict(), indent=1)
        if path is not None:
            Path(path).write_text(text)
        return text

    def table(self, max_members: int = 6):
        """A rich Table of the groups (id, channels, prunable/why, constraints, members)."""
        from rich.table import Table

        t = Table(title=f"{self.model_name}: channel groups", show_lines=False)
        for col in ("id", "ch", "prunable", "constraint / reason", "members"):
            t.add_column(col, overflow="fold")
        for g in self.groups:
            owners = {m.name for m in g.members if m.kind is Kind.MODULE}
            mem = [
                f"{m.name}.{m.describe()}"
                for m in g.members
                if m.kind is not Kind.PARAM or m.name.rsplit(".", 1)[0] not in owners
            ]
            more = len(mem) - max_members
            text = "\n".join(mem[:max_members]) + (f"\n(+{more} more)" if more > 0 else "")
            why = (
                "; ".join(g.constraints)
                if g.prunable
                else g.reasons[0] + (f" (+{len(g.reasons) - 1})" if len(g.reasons) > 1 else "")
            )
            if g.prunable and not g.exact:
                why = ("inexact: " + g.inexact_reasons[0] + "; " + why).rstrip("; ")
            t.add_row(str(g.id), str(g.channels), "yes" if g.prunable else "no", why, text)
        return t
