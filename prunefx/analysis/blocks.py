"""Residual blocks of a captured graph: the units depth pruning removes.

A block is a module called once whose output is its input stream ``x`` plus what it adds (``x + f(x)``, and chains
of those: a pre-norm transformer layer is ``h = x + attn(x); h + mlp(h)``). Walking back from the block's one output,
each add continues along the argument that leads to ``x`` (the *spine*) and the other argument is a *branch*; ops
with the stream as their only tensor input (a ReLU after the add, a dtype cast, a post-norm) are the *tail*. With
every branch zeroed the block computes its tail on ``x``: that is what a removed block is replaced by, and what the
oracle compares the pruned model against. A block whose stream cannot be followed (two arguments lead to ``x``,
the output holds no add, an op on the stream reads other tensors) is refused with the reason.
"""

from __future__ import annotations

import operator
from collections.abc import Iterable
from dataclasses import dataclass

import torch
import torch.fx as fx
from torch import nn

from prunefx.capture.values import VALUE_KEY

_ADDS = {operator.add, operator.iadd, torch.add, "add", "add_", "aten.add.Tensor", "aten.add_.Tensor"}
# Ops on the stream that give it back unchanged when its dtype does not change: a removed block with only these
# on its spine is the identity, and a container may drop it (an HF decoder's layer list).
_IDENTITY = {"to", "_to_copy", "clone", "contiguous", "alias", "detach", "float", "type_as", "dropout", "Dropout",
             "Identity", "_assert_tensor_metadata"}


@dataclass(frozen=True)
class TailOp:
    """One op on a block's stream after (or between) its adds: how a removed block still runs it on ``x``."""

    op: str  # fx op: call_module, call_function or call_method
    target: object  # the module path (relative to the block), the function, or the method name
    args: tuple  # the node's arguments, the stream's place holding None
    kwargs: tuple[tuple[str, object], ...]
    stream_at: int  # the position of the stream among args
    identity: bool  # gives the stream back unchanged (a same-dtype cast, a clone, an eval dropout)


@dataclass(frozen=True)
class ResidualBlock:
    """A residual block of the graph (see the module docstring): what removing it means, and what it owns."""

    path: str
    stream: str  # the node feeding x into the block
    output: str  # the block's output node
    branches: tuple[str, ...]  # the nodes added onto the stream: zeroed, the block is its tail on x
    tail: tuple[TailOp, ...]  # ops the stream takes inside the block, in order
    params: int  # parameters owned by the block (shared ones excluded)

    @property
    def identity(self) -> bool:
        """Whether the block with its branches zeroed gives its input back unchanged."""
        return all(t.identity for t in self.tail)


@dataclass(frozen=True)
class BlockSearch:
    """The residual blocks found among the candidates, and each refused candidate with its reason."""

    blocks: tuple[ResidualBlock, ...]
    refused: tuple[tuple[str, str], ...]

    def block(self, path: str) -> ResidualBlock:
        """The block at ``path`` (a KeyError naming the refusal when it was refused)."""
        for b in self.blocks:
            if b.path == path:
                return b
        why = dict(self.refused).get(path, "it is not a candidate (no child of a ModuleList or Sequential)")
        raise KeyError(f"{path} is no removable residual block: {why}")


def candidate_paths(model: nn.Module) -> list[str]:
    """Children of every ``nn.ModuleList`` / ``nn.Sequential``: the repeated blocks a network stacks."""
    out = []
    for name, m in model.named_modules():
        if isinstance(m, (nn.ModuleList, nn.Sequential)):
            out += [f"{name}.{k}" if name else k for k, _ in m.named_children()]
    return out


def _paths(n: fx.Node) -> list[str]:
    stack = n.meta.get("nn_module_stack") or {}
    return [str(v[0]) for v in stack.values() if isinstance(v, tuple) and v]


def _name(n: fx.Node) -> str:
    t = n.target
    if n.op == "call_module":
        return str(t).rsplit(".", 1)[-1]
    return getattr(t, "_opname", None) or getattr(t, "__name__", None) or str(t)  # aten.to.dtype -> "to"


def _is_add(n: fx.Node) -> bool:
    t = n.target
    return n.op in ("call_function", "call_method") and (t in _ADDS or str(t) in _ADDS) and not n.kwargs.get("alpha")


def _shape(n: object) -> tuple | None:
    v = n.meta.get(VALUE_KEY) if isinstance(n, fx.Node) else None
    return (tuple(v.shape), v.dtype) if isinstance(v, torch.Tensor) else None


def _tensor_args(n: fx.Node) -> list[fx.Node]:
    return [a for a in (*n.args, *n.kwargs.values()) if isinstance(a, fx.Node) and _shape(a) is not None]


class _Refused(Exception):
    pass


def _module_type(model: nn.Module, target: str) -> str:
    try:
        return type(model.get_submodule(target)).__name__
    except AttributeError:
        return target.rsplit(".", 1)[-1]


def _tail_op(model: nn.Module, path: str, n: fx.Node, stream: fx.Node) -> TailOp:
    others = [a for a in _tensor_args(n) if a is not stream]
    if others:
        raise _Refused(f"its stream passes through {n.name} ({_name(n)}), which also reads {others[0].name}")
    if n.op == "call_module":
        if not str(n.target).startswith(path + "."):
            raise _Refused(f"its stream passes through {n.target}, a module outside the block")
        target: object = str(n.target)[len(path) + 1:]
        name = _module_type(model, str(n.target))
    elif n.op in ("call_function", "call_method"):
        target, name = n.target, _name(n)
    else:
        raise _Refused(f"its stream passes through {n.name} ({n.op})")
    args = tuple(None if a is stream else a for a in n.args)
    if any(isinstance(a, fx.Node) for a in (*args, *n.kwargs.values())):
        raise _Refused(f"its stream passes through {n.name}, which reads other graph values")
    at = next((i for i, a in enumerate(n.args) if a is stream), -1)
    if at < 0:
        raise _Refused(f"its stream reaches {n.name} ({_name(n)}) as a keyword argument")
    same = _shape(n) is not None and _shape(n) == _shape(stream)  # a cast to another dtype is no identity
    plain = name.split(".")[-1].rstrip("_") in _IDENTITY or str(target).split(".")[-1].rstrip("_") in _IDENTITY
    return TailOp(n.op, target, args, tuple(sorted(n.kwargs.items())), at, bool(same and plain))


def _weighted(gm: fx.GraphModule, n: fx.Node) -> bool:
    """A module call with weights of its own that is no norm: a branch's layer, never part of the stream."""
    if n.op != "call_module":
        return False
    m = gm.get_submodule(str(n.target))
    return any(True for _ in m.parameters()) and "Norm" not in type(m).__name__


def _leads_to_x(gm: fx.GraphModule, n: fx.Node, inside: set[str], x_shape: tuple, seen: dict[str, bool]) -> bool:
    """Whether following adds and one-input ops back from ``n`` reaches a same-shaped value from outside."""
    if n.name in seen:
        return seen[n.name]
    seen[n.name] = False  # cycles cannot occur in a DAG; this only stops re-walking
    if n.name not in inside:
        ok = _shape(n) is not None and _shape(n)[0] == x_shape
    elif _is_add(n):
        ok = any(_leads_to_x(gm, a, inside, x_shape, seen) for a in _tensor_args(n))
    else:
        args = _tensor_args(n)
        ok = len(args) == 1 and _shape(n) is not None and _shape(n)[0] == x_shape and not _weighted(gm, n) and \
            _leads_to_x(gm, args[0], inside, x_shape, seen)
    seen[n.name] = ok
    return ok


def _block(model: nn.Module, gm: fx.GraphModule, path: str, inside: set[str]) -> ResidualBlock:
    nodes = {n.name: n for n in gm.graph.nodes}
    outs = [nodes[k] for k in inside if any(u.name not in inside for u in nodes[k].users)]
    if len(outs) != 1:
        raise _Refused(f"{len(outs)} of its values are read outside it (one, the stream, is what a block gives)")
    out = outs[0]
    if _shape(out) is None:
        raise _Refused("its output is no tensor")
    shape = _shape(out)[0]
    seen: dict[str, bool] = {}
    cur, branches, tail, adds = out, [], [], 0
    while cur.name in inside:
        args = _tensor_args(cur)
        if _is_add(cur):
            leads = [a for a in args if _leads_to_x(gm, a, inside, shape, seen)]
            if len(leads) != 1 or len(args) != 2:
                raise _Refused(f"{cur.name} adds {len(leads)} values that lead back to the input (one is a residual)")
            branches.append(next(a for a in args if a is not leads[0]).name)
            cur, adds = leads[0], adds + 1
        elif len(args) == 1 and _leads_to_x(gm, args[0], inside, shape, seen) and _shape(cur)[0] == shape:
            tail.append(_tail_op(model, path, cur, args[0]))
            cur = args[0]
        elif any(_leads_to_x(gm, a, inside, shape, seen) for a in args):
            other = next(a for a in args if not _leads_to_x(gm, a, inside, shape, seen))
            raise _Refused(f"its stream passes through {cur.name} ({_name(cur)}), which also reads {other.name} (a "
                           "norm after the add, a gate): only ops on the stream alone can stay when it goes")
        else:
            raise _Refused(f"no add in it has its input on one side ({cur.name}: {_name(cur)} is no residual sum; a "
                           "projection on the shortcut, a norm after the add (post-norm) or a change of shape makes "
                           "a block that cannot be removed)")
    if not adds:
        raise _Refused("its output is no sum of its input and a branch")
    owned = {id(p) for p in model.get_submodule(path).parameters()}
    shared = {id(p) for n, m in model.named_modules() if not (n == path or n.startswith(path + "."))
              for p in m.parameters(recurse=False)}
    params = sum(p.numel() for p in model.get_submodule(path).parameters() if id(p) in owned - shared)
    return ResidualBlock(path, cur.name, out.name, tuple(reversed(branches)), tuple(reversed(tail)), params)


def residual_blocks(model: nn.Module, gm: fx.GraphModule, paths: Iterable[str] | None = None) -> BlockSearch:
    """The residual blocks among ``paths`` (default: :func:`candidate_paths`) in ``gm``, ``model``'s capture."""
    paths = list(candidate_paths(model) if paths is None else paths)
    members: dict[str, set[str]] = {p: set() for p in paths}
    calls: dict[str, set[str]] = {p: set() for p in paths}  # the stack keys of each call (a second call: "@1")
    for n in gm.graph.nodes:
        for key, value in (n.meta.get("nn_module_stack") or {}).items():
            if isinstance(value, tuple) and value and str(value[0]) in calls:
                calls[str(value[0])].add(str(key))
        for p in set(_paths(n)):
            if p in members and not (n.op == "call_module" and n.target == p):
                members[p].add(n.name)
        if n.op == "call_module" and n.target in members:
            members[n.target].add(n.name)
    found, refused = [], []
    for p in paths:
        try:
            if not members[p]:
                raise _Refused("the captured graph holds no op of it (it is not called)")
            if len(calls[p]) > 1:
                raise _Refused(f"it is called {len(calls[p])} times (shared weights): removing it would remove every "
                               "call")
            if members[p] <= {n.name for n in gm.graph.find_nodes(op="call_module", target=p)}:
                raise _Refused("it is one call in the captured graph (a layer or a leaf), not a residual block")
            found.append(_block(model, gm, p, members[p]))
        except _Refused as exc:
            refused.append((p, str(exc)))
    return BlockSearch(tuple(found), tuple(refused))
