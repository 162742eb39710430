"""Apply a ``PruningPlan`` to the model in place: slice parameters and buffers, fix module attributes.

The model keeps its own classes and forward. Every tensor is sliced along the dims the analysis
recorded (the parameter records are the single truth), then each pruned module's attributes are
re-derived from its new tensors (``in_channels``, ``num_features``, ``groups``...). Everything is
validated before the first tensor is touched, so a plan that fails leaves the model as it was.
"""

from __future__ import annotations

import torch
from torch import nn

from prunefx import _plugins
from prunefx.analysis.graph import DependencyGraph
from prunefx.analysis.roles import Kind, Literal, ModuleRole
from prunefx.plan import PlanError, PruningPlan, validate_plan
from prunefx.transform.fixers import LiteralCount, fix_attributes, owned_modules
from prunefx.transform.keep import keep_by_root, kept_positions
from prunefx.transform.reparametrize import parametrized_names, slice_parametrized


def apply_plan(model: nn.Module, dg: DependencyGraph, plan: PruningPlan, *, graph_rewrite: bool = False) -> nn.Module:
    """Prune ``model`` in place according to ``plan`` (made from ``dg``, the analysis of this model).

    Returns the module to use from now on: ``model`` itself, or, when the plan needed literal channel counts in
    forward rewritten (``graph_rewrite``), the recompiled GraphModule ``dg.gm``, which shares the pruned modules
    (its graph is the training-mode trace: module calls follow ``.eval()``, Python branches on ``self.training`` were
    fixed when it was traced).
    """
    _plugins.activate()  # fixers of the model's library
    owned = owned_modules(model)
    validate_plan(dg, plan, graph_rewrite=graph_rewrite, owned=owned)
    if dg.capture == "export" and graph_rewrite:
        raise PlanError("graph_rewrite needs an fx capture: a torch.export graph is not the module that is returned")
    sorted_roots, keep = keep_by_root(dg, plan)
    # A literal inside a module whose fixer rewrites its attributes follows by itself; only the others are rewritten.
    owner_of = {(m.name, m.role): m.module_type for g in dg.groups for m in g.members if m.kind is Kind.CONST}
    slices: dict[str, list[tuple[int, torch.Tensor]]] = {}
    widths: dict[str, dict[ModuleRole | LiteralCount, int]] = {}
    consts: list[tuple[str, Literal, int]] = []
    for (kind, name, role), roots in dg.record_roots.items():
        pos = kept_positions(roots, sorted_roots, keep)
        if kind is Kind.PARAM and len(pos) < len(roots):
            slices.setdefault(name, []).append((role.dim, torch.as_tensor(pos)))
        elif kind is Kind.MODULE:
            widths.setdefault(name, {})[role] = len(pos)
        elif kind is Kind.CONST and len(pos) < len(roots):
            owner = owner_of.get((name, role))
            if owner in owned:  # its fixer rewrites the attribute the literal came from: tell it the new count
                widths.setdefault(owner, {})[LiteralCount(len(roots))] = len(pos)
            else:
                consts.append((name, role, len(pos)))
    tensors = dict(model.named_parameters(remove_duplicate=False))
    tensors.update(model.named_buffers(remove_duplicate=False))
    parametrized = parametrized_names(model, [n for n in slices if n not in tensors])  # checked before any change
    missing = [n for n in slices if n not in tensors and n not in parametrized]
    if missing:
        raise PlanError(f"the model has no tensor named {missing[0]!r}: was the plan made on another model?")
    slice_parametrized(model, {n: d for n, d in slices.items() if n in parametrized})  # weight_norm's weight
    _slice_tensors(model, tensors, {n: d for n, d in slices.items() if n not in parametrized})
    fix_attributes(model, widths)
    if consts:  # the literals live in the traced graph: hand back the GraphModule that holds them
        _rewrite_constants(dg, consts)
        _share_sliced(model, dg.gm, slices)
        return dg.gm
    return model


def _share_sliced(model: nn.Module, gm: nn.Module, slices) -> None:
    """The GraphModule holds the model's submodules, but its own reference to a tensor of the root (a parameter
    ``w`` read by ``F.conv2d(x, self.w)``): point it at the sliced tensor too."""
    for name in slices:
        owner_name, _, attr = name.rpartition(".")
        mine, theirs = model.get_submodule(owner_name), gm.get_submodule(owner_name)
        if mine is not theirs and hasattr(theirs, attr):
            setattr(theirs, attr, getattr(mine, attr))


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


def _rewrite_constants(dg: DependencyGraph, consts: list[tuple[str, Literal, int]]) -> None:
    """Replace literal channel counts in the traced graph (``view(b, 512, -1)``) with the new widths."""
    nodes = {n.name: n for n in dg.gm.graph.nodes}
    for node_name, role, value in consts:
        node = nodes[node_name]
        node.args = _replaced(node.args, role.path, value)
    dg.gm.graph.lint()
    dg.gm.recompile()


def _replaced(container: tuple | list | slice, path: tuple[int, ...], value: int) -> tuple | list | slice:
    """A copy of nested ``container`` with the item at ``path`` replaced (same container types; a slice's items
    are its start, stop and step)."""
    if isinstance(container, slice):
        return slice(*_replaced([container.start, container.stop, container.step], path, value))
    items = list(container)
    head, *rest = path
    items[head] = _replaced(items[head], tuple(rest), value) if rest else value
    return type(container)(items)
