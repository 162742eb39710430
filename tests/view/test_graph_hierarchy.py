"""The module hierarchy in graph.json (``graph.modules``, ``nodes[].module``): the blocks of the collapsed view.

A nested model's blocks and the nodes in each; a shared module labelled per call site; a torch.export capture
of a tiny Llama with the module path on its ATen nodes and weights; every graph validates.
"""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from torch import nn

import prunefx
from prunefx.view.graph_data import graph_data
from prunefx.view.schema import validate_graph


class Block(nn.Module):
    def __init__(self, c: int, act: nn.Module) -> None:
        super().__init__()
        self.conv, self.bn, self.act = nn.Conv2d(c, c, 3, padding=1), nn.BatchNorm2d(c), act

    def forward(self, x):
        return F.relu(self.act(self.bn(self.conv(x))) + x)


class Net(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        shared = nn.SiLU()  # one module called by both blocks (as ultralytics' Conv.default_act)
        self.stem = nn.Conv2d(3, 8, 3)
        self.body = nn.Sequential(Block(8, shared), Block(8, shared))
        self.head = nn.Conv2d(8, 4, 1)

    def forward(self, x):
        return self.head(self.body(self.stem(x)).relu())


def _module_of(data: dict) -> dict[str, str]:
    return {n["name"]: n["module"] for n in data["nodes"]}


def test_a_nested_model_has_one_block_per_module_call_with_its_nodes() -> None:
    data = graph_data(prunefx.analyze(Net(), (torch.randn(1, 3, 16, 16),)))
    validate_graph(data)
    blocks = [(b["path"], b["type"], b["parent"]) for b in data["modules"]]
    assert blocks == [("body", "Sequential", -1), ("body.0", "Block", 0), ("body.1", "Block", 0)]
    where = {n["target"] if n["op"] == "call_module" else n["name"]: n["module"] for n in data["nodes"]}
    # Leaf calls sit in their caller's block; the top level is ""
    assert where["stem"] == where["head"] == where["relu_2"] == where["x"] == where["output"] == ""  # .relu()
    assert where["body.0.conv"] == where["body.0.bn"] == "body.0" and where["body.1.conv"] == "body.1"
    inside = {b: sorted(n["name"] for n in data["nodes"] if n["module"] == b) for b in ("body", "body.0", "body.1")}
    assert inside["body"] == []  # a Sequential only calls its children: it holds blocks, no node of its own
    assert len(inside["body.0"]) == len(inside["body.1"]) == 5  # conv, bn, act, add, relu
    assert {n["op"] for n in data["nodes"] if n["module"] == "body.0"} == {"call_module", "call_function"}


def test_a_shared_module_is_labelled_with_its_call_site() -> None:
    data = graph_data(prunefx.analyze(Net(), (torch.randn(1, 3, 16, 16),)))
    calls = [n for n in data["nodes"] if n["op"] == "call_module" and n["target"] == "body.0.act"]
    assert [(n["label"], n["module"]) for n in calls] == [("body.0.act@0 in body.0", "body.0"),
                                                         ("body.0.act@1 in body.1", "body.1")]
    alone = next(n for n in data["nodes"] if n["target"] == "body.1.conv")
    assert alone["label"] == "body.1.conv"  # a module called once keeps its own name


@pytest.fixture(scope="module")
def llama_export() -> tuple[prunefx.DependencyGraph, dict]:
    transformers = pytest.importorskip("transformers")
    cfg = transformers.LlamaConfig(hidden_size=32, intermediate_size=64, num_hidden_layers=1, num_attention_heads=4,
                                   num_key_value_heads=2, vocab_size=64)
    model = transformers.LlamaForCausalLM(cfg).eval()
    dg = prunefx.analyze(model, (torch.randint(0, 64, (1, 8)),), capture="export")
    return dg, graph_data(dg)


def test_an_export_capture_of_a_llama_has_module_paths_on_its_aten_nodes(llama_export) -> None:
    dg, data = llama_export
    validate_graph(data)
    paths = {b["path"]: b for b in data["modules"]}
    parent = lambda p: data["modules"][paths[p]["parent"]]["path"]  # noqa: E731
    assert parent("model.layers.0.self_attn.q_proj") == "model.layers.0.self_attn"
    assert parent("model.layers.0.self_attn") == "model.layers.0" and parent("model.layers.0") == "model"
    assert paths["model"]["parent"] == -1 and paths["lm_head"]["parent"] == -1
    assert paths["model.layers.0"]["type"] == "LlamaDecoderLayer"
    assert paths["model.layers.0.mlp.up_proj"]["type"] == "Linear"
    q = [n for n in data["nodes"] if n["module"] == "model.layers.0.self_attn.q_proj"]
    assert {n["op"] for n in q} == {"get_attr", "call_function"}  # its weight and its ATen op
    assert any(n["target"] == "model.layers.0.self_attn.q_proj.weight" for n in q)
    assert any("aten.linear" in n["target"] or "aten.mm" in n["target"] for n in q if n["op"] == "call_function")
    aten = [n for n in data["nodes"] if n["op"] == "call_function"]
    assert all(n["target"].startswith("torch._ops.aten.") for n in aten)
    # an op gets a block exactly when it ran inside a module call (the output's alias runs at the top level)
    stacks = {n.name: [v[0] for v in (n.meta.get("nn_module_stack") or {}).values() if v[0]]
              for n in dg.gm.graph.nodes}
    assert all(n["module"] == (stacks[n["name"]][-1] if stacks[n["name"]] else "") for n in aten)
    assert sum(1 for n in aten if n["module"]) >= len(aten) - 2
    # the blocks are what the export recorded, nothing else
    recorded = {v[0] for n in dg.gm.graph.nodes for v in (n.meta.get("nn_module_stack") or {}).values() if v[0]}
    assert set(paths) == recorded
