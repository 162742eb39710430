"""The analysed graph as plain JSON-able data for the HTML view: nodes, edges, groups and (optionally) the plan.

    data = graph_data(prunefx.analyze(model, x))          # what ``prunefx.view.to_html`` draws
    data = graph_data(result.graph, result.plan)         # plus kept / total per node and each group's decision

It reads what only the analysis knows (channel atoms per fx node, the source line the tracer recorded) and
hands ``prunefx.view.page`` and ``prunefx.report`` plain data, so the page builder never touches a model.

The schema (``prunefx.graph/1``) is :mod:`prunefx.view.schema`: ``graph_data`` builds its records, validated as
they are made, and returns them as JSON data.

A node's block is the innermost module call it ran in (``nn_module_stack``, which fx's tracer and torch.export
both record; a call_module node sits in its caller's block). A module called from several places (ultralytics'
one shared SiLU) is one block per call: its path gets the call index, ``model.0.act@3``, as torch numbers calls,
and a call_module node of it is labelled with its caller (``model.0.act@3 in model.2.cv1``). A parameter read by
a get_attr node (torch.export's weights) sits in its module's block, so ``q_proj`` finds its weight and its ops.

A frozen reason is counted under its text up to `` (node ...``, the node that caused it, so that
"model output" or "no rule for torch.einsum" groups all its occurrences.
"""

from __future__ import annotations

import linecache
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

import numpy as np
import torch

from prunefx._config import to_dict
from prunefx.analysis.graph import DependencyGraph
from prunefx.analysis.labels import Lab, instances
from prunefx.analysis.roles import Kind
from prunefx.capture.trace import SOURCE_KEY  # the tracer's (file, line, function) of the code that made a node
from prunefx.capture.values import VALUE_KEY  # the shape pass's node value (meta tensors)
from prunefx.view.schema import (
    GRAPH_SCHEMA,
    BlockRecord,
    DecisionRecord,
    Graph,
    GraphSummary,
    GroupRecord,
    MemberRecord,
    NodeRecord,
    PlanRecord,
    TieRecord,
)

if TYPE_CHECKING:  # the view reads a plan by attribute; drawing a graph without one needs no planner
    from prunefx.plan.plan import PruningPlan


def reason_key(reason: str) -> str:
    """A frozen reason without the node that caused it: the key the summary and the filter count by."""
    return reason.split(" (node")[0]


def _shape(value: Any) -> str | None:
    if isinstance(value, torch.Tensor):
        return "x".join(map(str, value.shape)) or "scalar"
    if isinstance(value, (list, tuple)) and value and all(isinstance(v, torch.Tensor) for v in value):
        return ", ".join("x".join(map(str, v.shape)) for v in value[:4]) + (", ..." if len(value) > 4 else "")
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        return repr(value)
    return None


def _describe(node, modules: Mapping[str, Any]) -> tuple[str, str, str]:
    """(target, type, label) of an fx node as the view shows them."""
    if node.op == "call_module":
        module = modules.get(node.target)
        return str(node.target), type(module).__name__, str(node.target)
    if node.op == "call_function":
        name = getattr(node.target, "__name__", repr(node.target))
        qual = f"{getattr(node.target, '__module__', '') or ''}.{name}".lstrip(".")
        return qual, qual, name
    if node.op == "call_method":
        return str(node.target), f"Tensor.{node.target}", f".{node.target}()"
    if node.op == "placeholder":
        return str(node.target), "input", f"input {node.target}"
    if node.op == "get_attr":
        return str(node.target), "attribute", str(node.target)
    return "output", "output", "output"


class _ChannelMap:
    """Group id and channel rank of every class root, for looking up a tensor's atoms."""

    def __init__(self, dg: DependencyGraph) -> None:
        roots = [np.asarray(g.roots, dtype=np.int64) for g in dg.groups]
        all_roots = np.concatenate(roots) if roots else np.empty(0, np.int64)
        ids = [np.full(len(r), g.id) for g, r in zip(dg.groups, roots, strict=True)]
        gids = np.concatenate(ids) if roots else all_roots
        ranks = np.concatenate([np.arange(len(r)) for r in roots]) if roots else all_roots
        order = np.argsort(all_roots, kind="stable")
        self.roots, self.gids, self.ranks = all_roots[order], gids[order], ranks[order]
        self.atoms = dg.atoms

    def lookup(self, atoms: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """(group id, rank) per atom; (-1, -1) for a fixed position or a class in no group."""
        gid = np.full(len(atoms), -1, dtype=np.int64)
        rank = np.full(len(atoms), -1, dtype=np.int64)
        if len(atoms) == 0 or len(self.roots) == 0:
            return gid, rank
        roots = self.atoms.find(atoms)
        ok = roots >= 0
        idx = np.minimum(np.searchsorted(self.roots, roots[ok]), len(self.roots) - 1)
        hit = self.roots[idx] == roots[ok]
        sub_g, sub_r = np.full(int(ok.sum()), -1), np.full(int(ok.sum()), -1)
        sub_g[hit], sub_r[hit] = self.gids[idx[hit]], self.ranks[idx[hit]]
        gid[ok], rank[ok] = sub_g, sub_r
        return gid, rank


def _runs(gid: np.ndarray) -> list[list[int]]:
    """Run-length encoding [[group id, count], ...] of the group id along a node's positions."""
    if len(gid) == 0:
        return []
    cut = np.flatnonzero(np.diff(gid)) + 1
    starts = np.concatenate([[0], cut])
    counts = np.diff(np.concatenate([starts, [len(gid)]]))
    return [[int(gid[s]), int(c)] for s, c in zip(starts, counts, strict=True)]


def _source(node) -> tuple[str | None, str | None]:
    src = node.meta.get(SOURCE_KEY)
    if not src:
        return None, None
    file, line = src[0], src[1]
    code = linecache.getline(file, line).strip() or None
    return f"{file}:{line}", code


def _blocks(nodes: list) -> tuple[list[str], list[dict[str, Any]], dict[str, int]]:
    """Per node the path of its block, the blocks (parents first) and the number of calls of each module target."""
    blocks: dict[tuple[str, ...], dict[str, Any]] = {}  # chain of nn_module_stack keys -> block
    by_name: dict[str, str] = {}  # module path -> its first block's path (where a parameter's reader sits)
    where, calls, taken = [], {}, set()
    for node in nodes:
        # torch.export's stack starts with the root module (path ""): it is the top level, not a block
        stack = [(k, v) for k, v in (node.meta.get("nn_module_stack") or {}).items() if v[0]]
        if node.op == "call_module":
            calls[node.target] = calls.get(node.target, 0) + 1
            if stack and stack[-1][1][0] == node.target:  # its own entry: the node is the call, not inside it
                stack = stack[:-1]
        parent = ""
        for depth in range(len(stack)):
            chain = tuple(key for key, _ in stack[: depth + 1])
            if chain not in blocks:
                key, (name, kind) = stack[depth]
                # A key is the module's path, with "@k" from the second call on: the block of that call.
                path = f"{name}@{key.rsplit('@', 1)[1]}" if "@" in key else str(name)
                while path in taken:  # the same call path under another parent (a module reached twice)
                    path += "'"
                taken.add(path)
                type_name = kind if isinstance(kind, str) else getattr(kind, "__name__", str(kind))
                blocks[chain] = {"path": path, "type": type_name.rsplit(".", 1)[-1], "parent": parent}
                by_name.setdefault(str(name), path)
            parent = blocks[chain]["path"]
        where.append(parent)
    for i, node in enumerate(nodes):
        if node.op == "get_attr" and not where[i]:
            where[i] = by_name.get(str(node.target).rsplit(".", 1)[0], "")
    order = list(blocks.values())
    index = {b["path"]: k for k, b in enumerate(order)}
    out = [{"path": b["path"], "type": b["type"], "parent": index[b["parent"]] if b["parent"] else -1} for b in order]
    return where, out, calls


def graph_data(dg: DependencyGraph, plan: PruningPlan | None = None) -> dict[str, Any]:
    """Everything the HTML view draws (schema in this module's docstring), with ``plan``'s decisions when given."""
    nodes = list(dg.gm.graph.nodes)
    index = {n: i for i, n in enumerate(nodes)}
    modules = dict(dg.gm.named_modules())
    cmap = _ChannelMap(dg)
    keep: dict[int, np.ndarray] = {}
    if plan is not None:
        for gp in plan.groups:
            mask = np.zeros(gp.before, dtype=bool)
            mask[list(gp.keep)] = True
            keep[gp.group] = mask

    where, blocks, calls = _blocks(nodes)
    out_nodes = []
    by_module: dict[str, list[int]] = {}
    by_attr: dict[str, list[int]] = {}
    by_name: dict[str, list[int]] = {}
    for i, node in enumerate(nodes):
        target, kind, label = _describe(node, modules)
        if node.op == "call_module" and calls[target] > 1:  # a shared module: which call this is, from where
            own = (node.meta.get("nn_module_stack") or {}).keys()
            key = next(reversed(own), target) if own else target
            label = f"{key if '@' in key else target + '@0'} in {where[i] or 'the model'}"
        if node.op == "call_module":
            by_module.setdefault(target, []).append(i)
        elif node.op == "get_attr":
            by_attr.setdefault(target, []).append(i)
        by_name[node.name] = [i]
        labs = instances(dg.node_labels.get(node.name), Lab)
        atoms = np.concatenate([lab.atoms() for lab in labs]) if labs else np.empty(0, np.int64)
        gid, rank = cmap.lookup(atoms)
        src, code = _source(node)
        kept_count = None
        if plan is not None:
            kept = gid < 0
            for g in np.unique(gid[gid >= 0]).tolist():
                sel = gid == g
                kept[sel] = keep[g][rank[sel]] if g in keep else True
            kept_count = int(kept.sum())
        out_nodes.append(NodeRecord(
            name=node.name, op=node.op, target=target, type=kind, label=label,
            shape=_shape(node.meta.get(VALUE_KEY)), src=src, code=code,
            chan=tuple((int(g), int(c)) for g, c in _runs(gid)), kept=kept_count, module=where[i]))

    def member_nodes(m) -> list[int]:
        if m.kind is Kind.MODULE:
            return by_module.get(m.name, [])
        if m.kind is Kind.PARAM:
            return by_attr.get(m.name) or by_module.get(m.name.rsplit(".", 1)[0], [])
        return by_name.get(m.name, [])

    decisions = {gp.group: gp for gp in plan.groups} if plan is not None else {}
    skipped = dict(plan.skipped) if plan is not None else {}
    groups = []
    for g in dg.groups:
        d = g.to_dict(positions=False)
        members = tuple(MemberRecord(**md, node=tuple(member_nodes(m))) for m, md in zip(g.members, d.pop("members"),
                                                                                           strict=True))
        gp = decisions.get(g.id)
        groups.append(GroupRecord(
            **{k: tuple(v) if isinstance(v, list) else v for k, v in d.items()}, members=members, label=g.label,
            nodes=tuple(sorted({i for m in members for i in m.node})),
            plan=None if gp is None else DecisionRecord(before=gp.before, after=gp.after, why=gp.why),
            skipped=skipped.get(g.id)))

    frozen_reasons: dict[str, int] = {}
    for g in dg.groups:
        for key in dict.fromkeys(reason_key(r) for r in g.reasons):
            frozen_reasons[key] = frozen_reasons.get(key, 0) + 1
    edges = tuple((index[a], i) for i, node in enumerate(nodes) for a in node.all_input_nodes)
    prunable = [g for g in dg.groups if g.prunable]
    summary = GraphSummary(
        nodes=len(nodes), edges=len(edges), groups=len(dg.groups), prunable_groups=len(prunable),
        frozen_groups=len(dg.groups) - len(prunable), channels=sum(g.channels for g in dg.groups),
        prunable_channels=sum(g.channels for g in prunable), auto_leaves=len(dg.auto_leaves),
        unknown_ops=len(dg.unknown_ops),
        frozen_reasons=dict(sorted(frozen_reasons.items(), key=lambda kv: -kv[1])))
    graph = Graph(  # __post_init__ checks every index and count: a bug here fails now, not in the page
        schema=GRAPH_SCHEMA, model=dg.model_name, summary=summary, nodes=tuple(out_nodes), edges=edges,
        groups=tuple(groups), ties=tuple(TieRecord(groups=tuple(ids), why=why) for ids, why in dg.ties),
        auto_leaves=dict(dg.auto_leaves), unknown_ops=dict(dg.unknown_ops),
        plan=None if plan is None else PlanRecord(summary=plan.summary(), criterion=plan.criterion,
                                                  target=plan.target, estimate=plan.estimate),
        modules=tuple(BlockRecord(**b) for b in blocks), inferred_ops=dict(dg.inferred_ops))
    return to_dict(graph)
