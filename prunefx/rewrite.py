"""Apply a ``PruningPlan`` to the model in place: slice parameters and buffers, fix module attributes.

The model keeps its own classes and forward. Every tensor is sliced along the dims the analysis
recorded (the parameter records are the single truth), then each pruned module's attributes are
re-derived from its new tensors (``in_channels``, ``num_features``, ``groups``...). Everything is
validated before the first tensor is touched, so a plan that fails leaves the model as it was.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np
import torch
from torch import nn

from .analysis.graph import DependencyGraph
from .plan import PlanError, PruningPlan

# ---- module attribute fixers ------------------------------------------------------------------------------
Fixer = Callable[[nn.Module, dict[str, int]], None]
_FIXERS: dict[type, Fixer] = {}


def register_fixer(*types: type) -> Callable[[Fixer], Fixer]:
    """Register how a module type's attributes follow its new widths: ``fix(module, widths)``, where
    widths maps the module's analysed roles ("out", "in", "channel", "normalized0") to new sizes."""

    def deco(fn: Fixer) -> Fixer:
        for t in types:
            _FIXERS[t] = fn
        return fn

    return deco


def fixer_for(module: nn.Module) -> Fixer | None:
    for cls in type(module).__mro__:
        if cls in _FIXERS:
            return _FIXERS[cls]
    return None


@register_fixer(nn.modules.conv._ConvNd)
def _fix_conv(m: nn.modules.conv._ConvNd, w: dict[str, int]) -> None:
    depthwise = m.groups > 1 and m.groups == m.in_channels
    if "in" in w:
        m.in_channels = w["in"]
    if "out" in w:
        m.out_channels = w["out"]
    if depthwise:
        m.groups = m.in_channels


@register_fixer(nn.Linear)
def _fix_linear(m: nn.Linear, w: dict[str, int]) -> None:
    m.in_features = w.get("in", m.in_features)
    m.out_features = w.get("out", m.out_features)


@register_fixer(nn.modules.batchnorm._NormBase)
def _fix_bn(m: nn.modules.batchnorm._NormBase, w: dict[str, int]) -> None:
    m.num_features = w.get("channel", m.num_features)


@register_fixer(nn.GroupNorm)
def _fix_gn(m: nn.GroupNorm, w: dict[str, int]) -> None:
    m.num_channels = w.get("channel", m.num_channels)


@register_fixer(nn.LayerNorm, nn.RMSNorm)
def _fix_ln(m: nn.Module, w: dict[str, int]) -> None:
    shape = list(m.normalized_shape)
    for j in range(len(shape)):
        shape[j] = w.get(f"normalized{j}", shape[j])
    m.normalized_shape = tuple(shape)


@register_fixer(nn.Embedding)
def _fix_embedding(m: nn.Embedding, w: dict[str, int]) -> None:
    m.embedding_dim = w.get("out", m.embedding_dim)


@register_fixer(nn.PReLU)
def _fix_prelu(m: nn.PReLU, w: dict[str, int]) -> None:
    m.num_parameters = w.get("channel", m.num_parameters)


# ---- applying -----------------------------------------------------------------------------------------------
def keep_by_root(dg: DependencyGraph, plan: PruningPlan) -> tuple[np.ndarray, np.ndarray]:
    """Sorted class ids of every pruned group's channels and whether each is kept."""
    roots, keep = [], []
    for gp in plan.groups:
        g = dg.groups[gp.group]
        mask = np.zeros(g.channels, dtype=bool)
        mask[list(gp.keep)] = True
        roots.append(g.roots)
        keep.append(mask)
    if not roots:
        return np.empty(0, np.int64), np.empty(0, bool)
    r, k = np.concatenate(roots), np.concatenate(keep)
    order = np.argsort(r)
    return r[order], k[order]


def kept_positions(roots: np.ndarray, sorted_roots: np.ndarray, keep: np.ndarray) -> np.ndarray:
    """Positions of a record that survive: never-pruned (-1 or untouched classes) or kept."""
    mask = np.ones(len(roots), dtype=bool)
    if len(sorted_roots):
        idx = np.clip(np.searchsorted(sorted_roots, roots), 0, len(sorted_roots) - 1)
        hit = (sorted_roots[idx] == roots) & (roots >= 0)
        mask[hit] = keep[idx[hit]]
    return np.flatnonzero(mask)


def validate_plan(dg: DependencyGraph, plan: PruningPlan, *, graph_rewrite: bool = False) -> None:
    """Raise PlanError unless ``plan`` fits ``dg`` exactly; nothing is modified."""
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
        if any(m.kind == "const" for m in g.members) and not graph_rewrite and len(gp.keep) < g.channels:
            raise PlanError(f"group {g.id}: forward hard-codes its channel count; it needs graph_rewrite")
        counts[g.id] = len(gp.keep)
    for gids, why in dg.ties:
        ns = {counts.get(g, dg.groups[g].channels) for g in gids}
        if len(ns) > 1:
            raise PlanError(f"groups {list(gids)} must keep equally many channels ({why}); plan keeps {sorted(ns)}")


def apply_plan(model: nn.Module, dg: DependencyGraph, plan: PruningPlan, *, graph_rewrite: bool = False) -> nn.Module:
    """Prune ``model`` in place according to ``plan`` (made from ``dg``, the analysis of this model).

    Returns ``model``; when the plan needed literal channel counts in forward rewritten (``graph_rewrite``),
    returns the recompiled GraphModule ``dg.gm`` instead, which shares the pruned modules.
    """
    validate_plan(dg, plan, graph_rewrite=graph_rewrite)
    sorted_roots, keep = keep_by_root(dg, plan)
    slices: dict[str, list[tuple[int, torch.Tensor]]] = {}
    widths: dict[str, dict[str, int]] = {}
    consts: list[tuple[str, str, int]] = []
    for (kind, name, role), roots in dg.record_roots.items():
        pos = kept_positions(roots, sorted_roots, keep)
        if kind == "param" and len(pos) < len(roots):
            slices.setdefault(name, []).append((int(role[3:]), torch.as_tensor(pos)))
        elif kind == "module":
            widths.setdefault(name, {})[role] = len(pos)
        elif kind == "const" and len(pos) < len(roots):
            consts.append((name, role, len(pos)))
    tensors = dict(model.named_parameters(remove_duplicate=False))
    tensors.update(model.named_buffers(remove_duplicate=False))
    missing = [n for n in slices if n not in tensors]
    if missing:
        raise PlanError(f"the model has no tensor named {missing[0]!r}: was the plan made on another model?")
    _slice_tensors(model, tensors, slices)
    for name, w in widths.items():
        module = model.get_submodule(name)
        fix = fixer_for(module)
        if fix is not None:
            fix(module, w)
    from .integrations.attributes import fix_container_attributes

    fix_container_attributes(model)
    if consts:  # the literals live in the traced graph: hand back the GraphModule that holds them
        _rewrite_constants(dg, consts)
        return dg.gm
    return model


def _slice_tensors(model: nn.Module, tensors: dict[str, torch.Tensor], slices) -> None:
    done: dict[int, torch.Tensor] = {}  # tied tensors are sliced once and stay tied
    for name, dims in slices.items():
        old = tensors[name]
        new = done.get(id(old))
        if new is None:
            data = old.detach()
            for dim, idx in dims:
                data = data.index_select(dim, idx.to(data.device))
            # index_select already returns fresh memory: no copy of the old tensor is kept alive
            new = nn.Parameter(data, requires_grad=old.requires_grad) if isinstance(old, nn.Parameter) else data
            done[id(old)] = new
        owner_name, _, attr = name.rpartition(".")
        owner = model.get_submodule(owner_name)
        setattr(owner, attr, new)
    # tied names that were not recorded themselves still point at the old tensor: repoint them
    for name, t in tensors.items():
        if id(t) in done and name not in slices:
            owner_name, _, attr = name.rpartition(".")
            setattr(model.get_submodule(owner_name), attr, done[id(t)])


def _rewrite_constants(dg: DependencyGraph, consts: list[tuple[str, str, int]]) -> None:
    """Replace literal channel counts in the traced graph (``view(b, 512, -1)``) with the new widths."""
    import ast

    nodes = {n.name: n for n in dg.gm.graph.nodes}
    for node_name, role, value in consts:
        node = nodes[node_name]
        path = ast.literal_eval("[" + role.replace("][", "],[").strip("args") + "]") if role.startswith("args") else None
        if path is None:
            raise PlanError(f"cannot rewrite constant {role} of node {node_name}")
        args = list(node.args)
        head = path[0][0]
        if len(path) == 1:
            args[head] = value
        else:
            inner = list(args[head])
            inner[path[1][0]] = value
            args[head] = type(node.args[head])(inner)
        node.args = tuple(args)
    dg.gm.graph.lint()
    dg.gm.recompile()
