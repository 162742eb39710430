"""graph.json, schema ``prunefx.graph/1``: the one statement of what the HTML view draws.

:func:`prunefx.view.graph_data` builds these records from an analysed graph (and its plan); a run's graph.json is
read back through :func:`validate_graph`. A run directory may be shared and graph.json's values end up in
report.html, so reading checks every field against its annotation (ids, counts and indices are integers, flags
booleans, an fx op and a member kind one of their names, texts strings; unknown and missing keys are errors naming
the key), then ``Graph.__post_init__`` checks that every index points inside the graph and every count adds up.

The records mirror :class:`prunefx.analysis.Group` and :class:`prunefx.plan.GroupPlan` on purpose, under names of
their own: the report reads graph.json without torch or the analysis.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Literal

from prunefx._config import from_dict
from prunefx.errors import PrunefxError

GRAPH_SCHEMA = "prunefx.graph/1"  # the data a page draws: prunefx.view.graph_data, a run's graph.json


class GraphError(PrunefxError, ValueError):
    """A graph.json is malformed; the message names the first field that is wrong."""


@dataclass(frozen=True)
class GraphSummary:
    """The counts of the summary bar."""

    nodes: int
    edges: int
    groups: int
    prunable_groups: int
    frozen_groups: int
    channels: int
    prunable_channels: int
    auto_leaves: int
    unknown_ops: int
    frozen_reasons: dict[str, int]  # frozen reason (without its node) -> groups frozen by it


@dataclass(frozen=True)
class NodeRecord:
    """One fx node as the page draws it."""

    name: str
    op: Literal["placeholder", "get_attr", "call_function", "call_method", "call_module", "output"]
    target: str
    type: str
    label: str
    shape: str | None
    src: str | None  # file:line of the model code that made the node
    code: str | None
    chan: tuple[tuple[int, int], ...]  # (group id or -1 for fixed, positions) runs along its channels
    kept: int | None = None  # with a plan: positions that stay
    module: str = ""  # path of the block (module call) it runs in; "": the top level


@dataclass(frozen=True)
class BlockRecord:
    """A block of the collapsed view: one module call, inside its parent's block."""

    path: str
    type: str
    parent: int  # index of the enclosing block (an earlier one), -1 at the top


@dataclass(frozen=True)
class MemberRecord:
    """A group member: what it slices and the nodes that draw it."""

    kind: Literal["module", "param", "const"]
    name: str
    role: str
    type: str
    slices: str
    node: tuple[int, ...]


@dataclass(frozen=True)
class DecisionRecord:
    """The plan's decision for a group."""

    before: int
    after: int
    why: str


@dataclass(frozen=True)
class GroupRecord:
    """A channel group (``analyze --json``'s, without positions) with its label, nodes and decision."""

    id: int
    channels: int
    prunable: bool
    reasons: tuple[str, ...]
    constraints: tuple[str, ...]
    exact: bool
    inexact_reasons: tuple[str, ...]
    members: tuple[MemberRecord, ...]
    label: str
    nodes: tuple[int, ...]
    plan: DecisionRecord | None = None
    skipped: str | None = None  # why the plan left a prunable group alone


@dataclass(frozen=True)
class TieRecord:
    """Groups that keep equal channel counts, and why."""

    groups: tuple[int, ...]
    why: str


@dataclass(frozen=True)
class PlanRecord:
    """The plan a report's graph was pruned by."""

    summary: str
    criterion: str
    target: dict[str, Any]  # the plan's target as given (never drawn by the page)
    estimate: dict[str, float]


@dataclass(frozen=True)
class Graph:
    """A whole graph.json; ``validate_graph(d)`` builds it from ``d`` or raises :class:`GraphError`."""

    schema: str
    model: str
    summary: GraphSummary
    nodes: tuple[NodeRecord, ...]
    edges: tuple[tuple[int, int], ...]  # (source, target) node indices, one per input
    groups: tuple[GroupRecord, ...]
    ties: tuple[TieRecord, ...]
    auto_leaves: dict[str, str]  # module -> why it was traced as a leaf
    unknown_ops: dict[str, str]  # node -> op without a rule
    plan: PlanRecord | None
    modules: tuple[BlockRecord, ...] = ()  # the module hierarchy; absent in graphs written before it
    inferred_ops: dict[str, str] = field(default_factory=dict)  # node -> op: its probed channel map

    def __post_init__(self) -> None:
        if self.schema != GRAPH_SCHEMA:
            raise GraphError(f"schema: expected {GRAPH_SCHEMA!r}, got {self.schema!r}")
        n = len(self.nodes)
        for k, (s, t) in enumerate(self.edges):
            if not 0 <= s < t < n:  # fx numbers nodes in execution order: an edge points forward
                raise GraphError(f"edges[{k}]: ({s}, {t}) is not a forward edge between nodes 0..{n - 1}")
        ids = [g.id for g in self.groups]
        if len(set(ids)) != len(ids) or min(ids, default=0) < 0:
            raise GraphError("groups: every group id must be a distinct integer >= 0")
        known = set(ids)
        for i, node in enumerate(self.nodes):
            for gid, count in node.chan:
                if (gid != -1 and gid not in known) or count <= 0:
                    raise GraphError(f"nodes[{i}].chan: ({gid}, {count}) needs a known group id (or -1), count > 0")
            if (node.kept is None) != (self.plan is None):
                raise GraphError(f"nodes[{i}].kept: {'missing' if node.kept is None else 'given'} "
                                 f"in a graph {'with' if self.plan is not None else 'without'} a plan")
            if node.kept is not None and not 0 <= node.kept <= sum(c for _, c in node.chan):
                raise GraphError(f"nodes[{i}].kept: {node.kept} is not between 0 and the node's channels")
        paths = [m.path for m in self.modules]
        if len(set(paths)) != len(paths) or "" in paths:
            raise GraphError("modules: every block needs a distinct, non-empty path")
        for k, m in enumerate(self.modules):
            if not -1 <= m.parent < k:
                raise GraphError(f"modules[{k}].parent: {m.parent} is not -1 or an earlier block")
        known_paths = set(paths)
        for i, node in enumerate(self.nodes):
            if node.module and node.module not in known_paths:
                raise GraphError(f"nodes[{i}].module: {node.module!r} is not the path of a block in modules")
        for k, g in enumerate(self.groups):
            indices = [*g.nodes, *(i for m in g.members for i in m.node)]
            if any(not 0 <= i < n for i in indices):
                raise GraphError(f"groups[{k}]: a node index outside 0..{n - 1}")
            if g.channels < 0 or (g.plan is not None and not 0 <= g.plan.after <= g.plan.before):
                raise GraphError(f"groups[{k}]: negative channels or a plan keeping more than it had")
        for k, tie in enumerate(self.ties):
            if not set(tie.groups) <= known:
                raise GraphError(f"ties[{k}]: groups {list(tie.groups)} are not all known group ids")
        s = self.summary
        for name, got, want in (("nodes", s.nodes, n), ("edges", s.edges, len(self.edges)),
                                ("groups", s.groups, len(self.groups))):
            if got != want:
                raise GraphError(f"summary.{name}: {got}, but the graph has {want}")
        counts = (s.prunable_groups, s.frozen_groups, s.channels, s.prunable_channels, s.auto_leaves, s.unknown_ops,
                  *s.frozen_reasons.values())
        if min(counts) < 0:
            raise GraphError("summary: a negative count")


def validate_graph(data: Any) -> Graph:
    """``data`` as :class:`Graph`, or :class:`GraphError` naming the first way it departs from the schema."""
    if not isinstance(data, dict):
        raise GraphError(f"a graph is a JSON object, got {type(data).__name__}")
    return from_dict(Graph, data, error=GraphError)


__all__ = ["GRAPH_SCHEMA", "BlockRecord", "DecisionRecord", "Graph", "GraphError", "GraphSummary", "GroupRecord",
           "MemberRecord", "NodeRecord", "PlanRecord", "TieRecord", "validate_graph"]
