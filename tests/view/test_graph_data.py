"""view.graph_data: the graph as data for the HTML view, checked against the analysis, the source and the pruned net."""

from __future__ import annotations

import inspect
import json

import pytest
import torch
import torchvision
from torch import nn

import prunefx
from prunefx.analysis.roles import Kind
from prunefx.capture.trace import SOURCE_KEY
from prunefx.view.graph_data import graph_data, reason_key

X = torch.randn(1, 3, 64, 64)


@pytest.fixture(scope="module")
def r18():
    model = torchvision.models.resnet18().eval()
    return model, prunefx.analyze(model, X)


def _by_target(data: dict) -> dict[str, dict]:
    return {n["target"]: n for n in data["nodes"] if n["op"] == "call_module"}


def test_summary_counts_what_analyze_json_holds(r18) -> None:
    _, dg = r18
    data, js = graph_data(dg), dg.to_dict()
    s = data["summary"]
    assert s["nodes"] == js["nodes"] == len(data["nodes"])
    assert s["groups"] == len(js["groups"]) and s["prunable_groups"] == sum(g["prunable"] for g in js["groups"])
    assert s["frozen_groups"] == s["groups"] - s["prunable_groups"]
    assert s["prunable_channels"] == sum(g["channels"] for g in js["groups"] if g["prunable"])
    assert s["channels"] == sum(g["channels"] for g in js["groups"])
    assert s["auto_leaves"] == len(js["auto_leaves"]) and s["unknown_ops"] == len(js["unknown_ops"])
    assert s["frozen_reasons"] == {"model output": 1}
    assert len(data["edges"]) == s["edges"] == sum(len(n.all_input_nodes) for n in dg.gm.graph.nodes)
    assert json.loads(json.dumps(data)) == data  # plain JSON


def test_each_node_carries_its_channels_groups(r18) -> None:
    model, dg = r18
    data = graph_data(dg)
    nodes = _by_target(data)
    for name, module in model.named_modules():
        width = getattr(module, "out_channels", None) or getattr(module, "num_features", None)
        if name in nodes and width:
            assert sum(c for _, c in nodes[name]["chan"]) == width, name
            role = "out" if isinstance(module, nn.Conv2d) else "channel"
            assert [g for g, _ in nodes[name]["chan"]] == [dg.group_of(name, role).id], name
    assert nodes["fc"]["chan"] == [[dg.group_of("fc").id, 1000]] and not dg.group_of("fc").prunable
    groups = {g["id"]: g for g in data["groups"]}
    for g in dg.groups:  # every member points at the node drawing it
        for m, md in zip(g.members, groups[g.id]["members"], strict=True):
            owner = m.name if m.kind is Kind.MODULE else m.name.rsplit(".", 1)[0]
            assert [data["nodes"][i]["target"] for i in md["node"]] == [owner], m
            assert md["slices"] == m.describe() and "positions" not in md


def test_the_source_line_is_the_model_line_that_made_the_node(r18) -> None:
    _, dg = r18
    nodes = _by_target(graph_data(dg))
    resnet = inspect.getsourcefile(torchvision.models.resnet)
    file, line = nodes["layer1.0.conv1"]["src"].rsplit(":", 1)
    assert file == resnet and nodes["layer1.0.conv1"]["code"] == "out = self.conv1(x)"
    assert nodes["fc"]["code"] == "x = self.fc(x)"
    assert "self.conv1(x)" in open(resnet).read().splitlines()[int(line) - 1]


class Gate(nn.Module):
    """Tensor-valued control flow: traced as an automatic leaf, its channels frozen."""

    def forward(self, x):
        if x.sum() > 0:
            return x
        return -x


def channel_spread(y):
    return torch.cumsum(y, 1)


torch.fx.wrap("channel_spread")


class Toy(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.a, self.gate, self.b, self.c = nn.Conv2d(3, 8, 3), Gate(), nn.Conv2d(8, 8, 3), nn.Conv2d(8, 4, 1)

    def forward(self, x):
        y = self.gate(self.a(x))
        y = channel_spread(self.b(y))  # no rule, and probed it mixes channels: frozen
        return self.c(y)


def test_auto_leaves_unknown_ops_and_frozen_reasons_are_counted() -> None:
    dg = prunefx.analyze(Toy(), torch.randn(1, 3, 16, 16))
    data = graph_data(dg)
    s = data["summary"]
    assert (s["auto_leaves"], s["unknown_ops"], s["prunable_groups"]) == (1, 2, 0)
    assert s["frozen_reasons"] == {reason_key(g.reasons[0]): 1 for g in dg.groups}
    assert set(data["auto_leaves"]) == {"gate"} and set(data["unknown_ops"]) == {"gate", "channel_spread"}
    unknown = next(n for n in data["nodes"] if n["name"] == "channel_spread")
    lines, start = inspect.getsourcelines(Toy.forward)
    (offset,) = [i for i, text in enumerate(lines) if "channel_spread(" in text]
    assert unknown["src"] == f"{__file__}:{start + offset}" and unknown["code"].startswith("y = channel_spread")
    (node,) = [n for n in dg.gm.graph.nodes if n.name == "channel_spread"]
    assert node.meta[SOURCE_KEY][2] == "forward"


def test_kept_per_node_equals_the_pruned_model() -> None:
    model = torchvision.models.resnet18().eval()
    result = prunefx.prune(model, X, prunefx.PlanConfig(ratio=0.5))
    data = graph_data(result.graph, result.plan)
    nodes = _by_target(data)
    checked = 0
    for name, module in model.named_modules():  # the model is pruned in place
        width = getattr(module, "out_channels", None) or getattr(module, "num_features", None)
        if name in nodes and width:
            assert nodes[name]["kept"] == width, name
            checked += 1
    assert checked == 40 and nodes["fc"]["kept"] == 1000
    decided = {g["id"]: g["plan"] for g in data["groups"] if g["plan"] is not None}
    assert decided == {gp.group: {"before": gp.before, "after": gp.after, "why": gp.why} for gp in result.plan.groups}
    assert data["plan"]["summary"] == result.plan.summary()
