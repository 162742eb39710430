"""A small graph.json with every part of ``prunefx.graph/1`` filled in, and markup that runs script if a page ever
puts it into the DOM unescaped (for tests/view: the loader's refusals and the page in a browser).

The model has a plan with a pruned and a skipped group, a tie (chunk), an auto-leaf, an op without a rule and the
model's source lines, so every field the page draws holds a value.
"""

from __future__ import annotations

import copy
import json
import warnings
from collections.abc import Callable, Iterator
from typing import Any

import torch
from torch import nn

import prunefx
from prunefx.metrics import measure
from prunefx.report import Stage, build_report
from prunefx.view.graph_data import graph_data

# Runs when parsed as markup: the handler when the image fails, the script element when inserted by the parser.
PAYLOAD = '<img src=x onerror="window.__pwned=1"><script>window.__pwned=2</script>'

# The fields that may hold any text (list indices as [], map keys as *): the page escapes them. Every other value
# is typed (an id, a count, an index, a flag, an fx op, a member kind, the schema) and the loader refuses markup.
TEXT = {
    "model", "nodes[].name", "nodes[].target", "nodes[].type", "nodes[].label", "nodes[].shape", "nodes[].src",
    "nodes[].code", "modules[].path", "modules[].type", "groups[].reasons[]", "groups[].constraints[]",
    "groups[].inexact_reasons[]",
    "groups[].members[].name", "groups[].members[].role", "groups[].members[].type", "groups[].members[].slices",
    "groups[].label", "groups[].plan.why", "groups[].skipped", "ties[].why", "auto_leaves.*", "unknown_ops.*",
    "inferred_ops.*", "plan.summary", "plan.criterion", "plan.target.*",
}
NOT_TEXT = {"schema", "nodes[].op", "groups[].members[].kind"}  # strings, but one of a few names
# Maps keyed by free text (a module, a node, a frozen reason, a target or estimate name).
MAPS = {("auto_leaves",), ("unknown_ops",), ("inferred_ops",), ("summary", "frozen_reasons"), ("plan", "target"),
        ("plan", "estimate")}


class Gate(nn.Module):
    def forward(self, x):
        return x if x.sum() > 0 else -x  # tensor-valued control flow: an automatic leaf


class Toy(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.a, self.bn, self.b = nn.Conv2d(3, 8, 3), nn.BatchNorm2d(8), nn.Conv2d(8, 8, 3)
        # e sits in a Sequential: the graph has a module block (graph.modules) and a node inside it
        self.c, self.d, self.gate = nn.Conv2d(4, 8, 1), nn.Conv2d(16, 6, 1), Gate()
        self.e = nn.Sequential(nn.Conv2d(6, 4, 1))

    def forward(self, x):
        p, q = self.b(self.bn(self.a(x))).chunk(2, 1)  # the halves are tied
        z = torch.cat([p, self.c(q)], 1)
        return self.e(self.gate(torch.i0(self.d(torch.cat([z, q], 1)))))  # i0: an op without a rule, probed: inferred


def sample_run() -> tuple[dict[str, Any], dict[str, Any]]:
    """(graph.json, report.json) of the toy pruned to 60% of its MACs with ``c``'s group left alone."""
    model, x = Toy().eval(), torch.randn(1, 3, 16, 16)
    base = Stage(measure(model, x), None, {"top1": 0.5})
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # tied scores of an untrained model: irrelevant here
        result = prunefx.prune(model, x, prunefx.PlanConfig(flops=0.6, ignore=["c"]), check=False)
    after = Stage(measure(model, x), None, {"top1": 0.4})
    widths = [(result.graph.groups[g.group].label, g.before, g.after) for g in result.plan.groups]
    report = build_report(model="toy", baseline=base, pruned=after, widths=widths)
    return json.loads(json.dumps(graph_data(result.graph, result.plan))), report


def leaves(data: Any, path: tuple = ()) -> Iterator[tuple[tuple, Any]]:
    """(path, value) of every scalar in ``data``; a path holds list indices and dict keys."""
    if isinstance(data, dict):
        for k, v in data.items():
            yield from leaves(v, (*path, k))
    elif isinstance(data, list):
        for i, v in enumerate(data):
            yield from leaves(v, (*path, i))
    else:
        yield path, data


def field(path: tuple) -> str:
    """The schema field of a path: ``("groups", 3, "members", 0, "name")`` -> ``groups[].members[].name``."""
    out = ""
    for i, p in enumerate(path):
        if isinstance(p, int):
            out += "[]"
        elif tuple(q for q in path[:i] if not isinstance(q, int)) in MAPS:
            out += ".*"
        else:
            out += ("." if out else "") + p
    return out


def where(path: tuple) -> str:
    """A path as the loader's messages name it: ``groups[3].members[0].name``."""
    return "".join(f"[{p}]" if isinstance(p, int) else ("." if i else "") + p for i, p in enumerate(path))


def with_value(data: dict, path: tuple, value: Any) -> dict:
    """A deep copy of ``data`` with ``value`` at ``path``."""
    out = copy.deepcopy(data)
    node = out
    for p in path[:-1]:
        node = node[p]
    node[path[-1]] = value
    return out


def map_text(data: Any, fn: Callable[[str], str], path: tuple = ()) -> Any:
    """``data`` with ``fn`` applied to every free-text string and to the keys of the maps the page draws."""
    if isinstance(data, dict):
        rename = path in MAPS and path[0] != "plan"
        return {(fn(k) if rename else k): map_text(v, fn, (*path, k)) for k, v in data.items()}
    if isinstance(data, list):
        return [map_text(v, fn, (*path, i)) for i, v in enumerate(data)]
    if isinstance(data, str) and field(path) not in NOT_TEXT:
        # A node's module is a reference to a block's path, refused when it names none (so not in TEXT), and
        # mapped like the paths it names; "" (the top level) names no block.
        return data if field(path) == "nodes[].module" and not data else fn(data)
    return data


def planted(data: dict, path: tuple, value: Any) -> dict:
    """``with_value``, except that a block's path is renamed everywhere (its nodes name it): text, like a label."""
    if field(path) != "modules[].path":
        return with_value(data, path, value)
    out = with_value(data, path, value)
    old = data["modules"][path[1]]["path"]
    for node in out["nodes"]:
        if node["module"] == old:
            node["module"] = value
    return out
