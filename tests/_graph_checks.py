"""Structural checks shared by the analysis tests."""

from collections import defaultdict

import torch
import torch.fx as fx
from torch import nn

from prunefx.analysis.roles import Kind, parse_role
from prunefx.capture.values import VALUE_KEY


def producers(gm: fx.GraphModule, nodes: list[fx.Node]) -> set[str]:
    """Convs / Linears whose output channels reach ``nodes`` (walking back through norms, activations, views
    and concatenations; never through size queries such as ``x.shape``)."""
    mods = dict(gm.named_modules())
    found, todo, seen = set(), list(nodes), set()
    while todo:
        n = todo.pop()
        if n in seen:
            continue
        seen.add(n)
        if n.op == "call_module" and isinstance(mods[n.target], (nn.Conv2d, nn.Linear)):
            found.add(n.target)
            continue
        todo.extend(a for a in n.all_input_nodes if isinstance(a.meta.get(VALUE_KEY), torch.Tensor))
    return found


def head_consistent(pos: tuple[int, ...], where) -> bool:
    """A channel may be removed from a fused qkv output only if it removes the same offsets from every head,
    and the same offsets from q and k (they are contracted); ``where(p) -> (part, head, offset)``."""
    by: dict[tuple[str, int], set[int]] = defaultdict(set)
    heads = set()
    for p in pos:
        part, h, off = where(p)
        by[(part, h)].add(off)
        heads.add(h)
    qk = [by[(part, h)] for part in "qk" for h in heads]
    v = [by[("v", h)] for h in heads]
    return all(s == qk[0] for s in qk) and all(s == v[0] for s in v)


def positions(group, name: str, role: str, kind: str = "module") -> tuple[tuple[int, ...], ...]:
    """Per group channel, its positions in the one member (kind, name, role)."""
    kind, role = Kind(kind), parse_role(role)
    (m,) = [m for m in group.members if m.kind is kind and m.name == name and m.role == role]
    return m.positions


def the_group(dg, name: str, role: str = "out"):
    """The single group holding ``name``'s ``role`` channels."""
    gs = dg.groups_of(name, role)
    assert len(gs) == 1, f"{name}.{role} spans {len(gs)} groups"
    return gs[0]


def member_text(m) -> str:
    return ("const:" if m.kind is Kind.CONST else "") + f"{m.name}.{m.describe()}"


def layout(dg, params: bool = False) -> list[tuple[int, bool, tuple[str, ...]]]:
    """Every group as (channels, prunable, sorted members); parameter members only when asked."""
    rows = [
        (g.channels, g.prunable, tuple(sorted(member_text(m) for m in g.members if params or m.kind is not Kind.PARAM)))
        for g in dg.groups
    ]
    return sorted(rows)


def expect(dg, *groups: tuple[int, bool, list[str]], params: bool = False) -> None:
    """The analysis found exactly these groups: (channels, prunable, members as ``dg.table()`` prints them)."""
    want = sorted((n, p, tuple(sorted(ms))) for n, p, ms in groups)
    assert layout(dg, params) == want
