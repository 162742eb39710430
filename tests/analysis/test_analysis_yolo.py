"""Channel groups of ultralytics YOLO models (8.4.190), built from their yaml with random weights.

What must hold (see /work/shared/notes/ultralytics.md): C2f/C3k2 split cv1 into two halves of equal count;
Bottleneck residuals merge a half with every bottleneck output when ``add`` is true; SPPF concatenates one
tensor four times; the neck Concat layers place each source at its offset; Detect's last 1x1 convs feed fixed
views and are model outputs while its hidden convs are free; DFL never moves; the YOLO11 attention (fused
qkv conv laid out per head as [q(key_dim) k(key_dim) v(head_dim)]) is only pruned head-consistently.
The facts are read from the built modules (``m.add``, ``m.c``, ``Concat.f``), not hard-coded.
"""

from __future__ import annotations

import functools

import pytest
import torch
import torch.fx as fx
from _graph_checks import head_consistent, positions, producers, the_group
from torch import nn

import prunefx

ultralytics = pytest.importorskip("ultralytics")
from ultralytics.nn.modules.block import C2PSA, SPPF, Attention, Bottleneck, C2f, C3k, PSABlock
from ultralytics.nn.modules.conv import Concat
from ultralytics.nn.modules.head import Detect
from ultralytics.nn.tasks import ClassificationModel, DetectionModel, PoseModel, SegmentationModel

from prunefx.analysis.roles import Kind

IMGSZ = 64


@functools.cache
def build(cls, cfg: str):
    model = cls(cfg, verbose=False)
    return model, prunefx.analyze(model, torch.randn(1, 3, IMGSZ, IMGSZ))


@pytest.fixture(scope="module", params=["yolov8n.yaml", "yolo11n.yaml"])
def det(request):
    return build(DetectionModel, request.param)


@pytest.fixture(scope="module")
def yolo11n():
    return build(DetectionModel, "yolo11n.yaml")


# ---- helpers ------------------------------------------------------------------------------------------------
def maps_at_offset(group, src: str, dst: str, offset: int) -> bool:
    """Every channel of ``group`` at position p of ``src``'s output reaches position offset + p of ``dst``'s input."""
    pairs = zip(positions(group, src, "out"), positions(group, dst, "in"), strict=True)
    return all(offset + s[0] in d for s, d in pairs)


def blocks(model, cls) -> list[tuple[str, nn.Module]]:
    return [(n, m) for n, m in model.named_modules() if isinstance(m, cls)]


def output_conv(model, i: int) -> str:
    """Qualified name of the conv producing layer ``i``'s output (through Upsample)."""
    layer = model.model[i]
    if isinstance(layer, nn.Upsample):
        return output_conv(model, i - 1 if layer.f == -1 else layer.f)
    if isinstance(layer, (C2f, SPPF, C2PSA)):
        return f"model.{i}.cv2.conv"
    return f"model.{i}.conv"


def _nodes(x) -> list[fx.Node]:
    if isinstance(x, fx.Node):
        return [x]
    if isinstance(x, dict):
        x = list(x.values())
    return [n for item in x for n in _nodes(item)] if isinstance(x, (list, tuple)) else []


def returned_producers(dg, skip_keys: tuple[str, ...] = ("feats",)) -> set[str]:
    """Producers of every returned tensor; dict entries named in ``skip_keys`` are left out ("feats" are the
    head's inputs, returned for their spatial shapes only)."""
    (out,) = [n for n in dg.gm.graph.nodes if n.op == "output"]
    arg = out.args[0]
    items = [v for k, v in arg.items() if k not in skip_keys] if isinstance(arg, dict) else arg
    return producers(dg.gm, list(_nodes(items)))


# ---- C2f / C3k2 ---------------------------------------------------------------------------------------------
def test_c2f_halves_are_two_groups_tied_by_count(det):
    model, dg = det
    c2fs = blocks(model, C2f)  # C3k2 is a C2f
    assert len(c2fs) >= 8
    for p, m in c2fs:
        first, second = dg.groups_of(f"{p}.cv1.conv", "out")
        assert first.prunable and second.prunable, p
        assert positions(first, f"{p}.cv1.conv", "out") == tuple((k,) for k in range(m.c))
        assert positions(second, f"{p}.cv1.conv", "out") == tuple((m.c + k,) for k in range(m.c))
        assert any(first.id in ids and second.id in ids for ids, _ in dg.ties), p
        assert maps_at_offset(first, f"{p}.cv1.conv", f"{p}.cv2.conv", 0)
        assert maps_at_offset(second, f"{p}.cv1.conv", f"{p}.cv2.conv", 0)  # cv1 position c+k -> cv2 input c+k


def test_bottleneck_residuals_follow_each_blocks_add_flag(det):
    model, dg = det
    seen_add = set()
    for p, m in blocks(model, C2f):
        chain = dg.groups_of(f"{p}.cv1.conv", "out")[1]  # the half that feeds m[0]
        for j, b in enumerate(m.m):
            q = f"{p}.m.{j}"
            if isinstance(b, Bottleneck):
                assert dg.group_of(f"{q}.cv1.conv", "in") is chain, q
                out = the_group(dg, f"{q}.cv2.conv")
                assert (out is chain) is b.add, q  # residual: the bottleneck adds onto the half it reads
                seen_add.add(b.add)
                chain, src = out, f"{q}.cv2.conv"
            else:
                assert isinstance(b, C3k)
                assert dg.group_of(f"{q}.cv1.conv", "in") is chain and dg.group_of(f"{q}.cv2.conv", "in") is chain
                chain, src = the_group(dg, f"{q}.cv3.conv"), f"{q}.cv3.conv"
            assert chain.prunable, q
            # the output of m[j] is the (j + 2)-th piece of the concat feeding cv2
            assert maps_at_offset(chain, src, f"{p}.cv2.conv", (j + 2) * m.c), q
    # YOLOv8: backbone C2f add, head C2f (shortcut=False) do not; YOLO11: C3k2 blocks default to shortcut=True.
    assert seen_add == ({True, False} if "yolov8" in model.yaml["yaml_file"] else {True})


def test_c3k_inner_bottlenecks_merge_with_cv1(yolo11n):
    model, dg = yolo11n
    c3ks = blocks(model, C3k)
    assert c3ks
    for p, m in c3ks:
        g = the_group(dg, f"{p}.cv1.conv")
        for j, b in enumerate(m.m):
            assert b.add and the_group(dg, f"{p}.m.{j}.cv2.conv") is g
        assert maps_at_offset(g, f"{p}.cv1.conv", f"{p}.cv3.conv", 0)
        assert maps_at_offset(the_group(dg, f"{p}.cv2.conv"), f"{p}.cv2.conv", f"{p}.cv3.conv", m.cv1.conv.out_channels)


# ---- SPPF, Concat ------------------------------------------------------------------------------------------------
def test_sppf_cv1_reaches_cv2_at_four_offsets(det):
    model, dg = det
    ((p, m),) = blocks(model, SPPF)
    c = m.cv1.conv.out_channels
    g = the_group(dg, f"{p}.cv1.conv")
    assert g.prunable and g.channels == c
    for src, dst in zip(positions(g, f"{p}.cv1.conv", "out"), positions(g, f"{p}.cv2.conv", "in"), strict=True):
        assert dst == tuple(k * c + src[0] for k in range(4))


def test_neck_concat_places_each_source_at_its_offset(det):
    model, dg = det
    concats = [(i, layer) for i, layer in enumerate(model.model) if isinstance(layer, Concat)]
    assert len(concats) == 4
    for i, layer in concats:
        consumer = f"model.{i + 1}.cv1.conv"
        offset = 0
        for f in layer.f:
            src = output_conv(model, i + f if f < 0 else f)
            g = the_group(dg, src)
            assert maps_at_offset(g, src, consumer, offset), (i, src)
            offset += model.get_submodule(src).out_channels
        assert offset == model.get_submodule(consumer).in_channels


# ---- Detect head -------------------------------------------------------------------------------------------------
def _head(model) -> tuple[str, Detect]:
    ((p, head),) = blocks(model, Detect)
    return p, head


def test_detect_last_convs_are_frozen_model_outputs(det):
    model, dg = det
    p, head = _head(model)
    for i in range(head.nl):
        for branch in ("cv2", "cv3"):
            g = the_group(dg, f"{p}.{branch}.{i}.2")
            assert not g.prunable and any("model output" in r for r in g.reasons), (branch, i)


def test_detect_feats_output_is_free(det):
    """Detect also returns its inputs as "feats", read only for their spatial sizes by the loss: the neck
    outputs stay prunable (registered as free outputs for ultralytics models)."""
    model, dg = det
    (out,) = [n for n in dg.gm.graph.nodes if n.op == "output"]
    feats = producers(dg.gm, list(_nodes(out.args[0]["feats"])))
    p, head = _head(model)
    assert feats == {output_conv(model, f) for f in head.f}
    for conv in feats:
        assert the_group(dg, conv).prunable, conv


def test_detect_hidden_convs_are_prunable(det):
    """Every dense conv inside cv2[i] / cv3[i] except the last; depthwise convs (YOLO11's DWConv) are left
    out: their output is the neck feature group, whose fate depends on how 'feats' are treated."""
    model, dg = det
    p, head = _head(model)
    hidden = [
        n for branch in ("cv2", "cv3") for i in range(head.nl)
        for n, mod in head.get_submodule(f"{branch}.{i}")[:-1].named_modules(prefix=f"{p}.{branch}.{i}")
        if isinstance(mod, nn.Conv2d) and mod.groups == 1
    ]  # fmt: skip
    assert len(hidden) >= 4 * head.nl
    for name in hidden:
        assert the_group(dg, name).prunable, name


def test_dfl_is_never_prunable(det):
    model, dg = det
    p, head = _head(model)
    assert not head.dfl.conv.weight.requires_grad
    dfl = [g for g in dg.groups if any(m.name.startswith(f"{p}.dfl") for m in g.members)]
    assert all(not g.prunable for g in dfl)


def test_detect_analysis_has_no_unknown_ops_or_leaves(det):
    model, dg = det
    assert dg.unknown_ops == {} and dg.auto_leaves == {}
    assert len(dg.prunable) >= 40
    assert [g.id for g in dg.prunable if not any(m.kind is Kind.MODULE for m in g.members)] == []


# ---- YOLO11 C2PSA / Attention ----------------------------------------------------------------------------------------
def _attention_where(a: Attention):
    per_head = 2 * a.key_dim + a.head_dim

    def where(p: int) -> tuple[str, int, int]:
        h, r = divmod(p, per_head)
        if r < a.key_dim:
            return "q", h, r
        if r < 2 * a.key_dim:
            return "k", h, r - a.key_dim
        return "v", h, r - 2 * a.key_dim

    return where


def test_attention_qkv_is_pruned_in_whole_heads(yolo11n):
    """YOLO11's Attention (qkv.view(B, num_heads, 2 * key_dim + head_dim, N)): every prunable group in the fused qkv
    output removes whole heads -- each channel is one head's q, k and v rows together -- and carries the view's
    literal head count as a graph-constant member (the ultralytics plugin's fixer rewrites ``num_heads``)."""
    model, dg = yolo11n
    attns = blocks(model, Attention)
    assert attns
    view_nodes = {n.name for n in dg.gm.graph.nodes if n.op == "call_method" and n.target == "view"}
    for p, a in attns:
        where = _attention_where(a)
        per_head = 2 * a.key_dim + a.head_dim
        qkv = f"{p}.qkv.conv"
        groups = dg.groups_of(qkv, "out")
        covered = sorted(x for g in groups for pos in positions(g, qkv, "out") for x in pos)
        assert covered == list(range(a.qkv.conv.out_channels))
        prunable = [g for g in groups if g.prunable]
        assert prunable, "no head of the attention is prunable"
        for g in prunable:
            for pos in positions(g, qkv, "out"):
                assert head_consistent(pos, where), (g.id, pos)
                assert sorted(pos) == list(range(pos[0], pos[0] + per_head)) and pos[0] % per_head == 0, pos
            assert any(m.kind is Kind.CONST and m.name in view_nodes for m in g.members), g.id


def test_psa_block_residuals_merge_attention_and_ffn_outputs(yolo11n):
    model, dg = yolo11n
    for p, b in blocks(model, PSABlock):
        assert b.add
        stream = the_group(dg, f"{p}.attn.qkv.conv", "in")
        assert the_group(dg, f"{p}.attn.proj.conv") is stream
        assert the_group(dg, f"{p}.ffn.1.conv") is stream
        assert the_group(dg, f"{p}.ffn.0.conv").prunable  # the ffn hidden width is free
        assert the_group(dg, f"{p}.ffn.0.conv") is not stream


def test_c2psa_split_halves_record_their_size_literals(yolo11n):
    model, dg = yolo11n
    ((p, m),) = blocks(model, C2PSA)
    groups = dg.groups_of(f"{p}.cv1.conv", "out")
    for g in groups:
        assert any(m_.kind is Kind.CONST and str(m_.role).startswith("args[1]") for m_ in g.members)
    assert maps_at_offset(groups[0], f"{p}.cv1.conv", f"{p}.cv2.conv", 0)


def test_c2psa_halves_keep_equal_widths(yolo11n):
    """The native C2PSA needs both halves of cv1 equally wide (one attribute sizes both): tied, coupled, or frozen."""
    model, dg = yolo11n
    ((p, m),) = blocks(model, C2PSA)
    groups = dg.groups_of(f"{p}.cv1.conv", "out")
    if len(groups) == 2:
        first, second = groups
        tied = any(first.id in ids and second.id in ids for ids, _ in dg.ties)
        assert tied or not (first.prunable or second.prunable)
    else:  # the halves are coupled position by position: every channel takes as many from each half
        (g,) = groups
        c = m.c
        for pos in positions(g, f"{p}.cv1.conv", "out"):
            assert sum(q < c for q in pos) == sum(q >= c for q in pos) >= 1


# ---- other tasks ----------------------------------------------------------------------------------------------
TASKS = {
    "yolo11n-seg": (SegmentationModel, "yolo11n-seg.yaml"),
    "yolov8n-pose": (PoseModel, "yolov8n-pose.yaml"),
    "yolo11n-cls": (ClassificationModel, "yolo11n-cls.yaml"),
}


@pytest.fixture(scope="module", params=[pytest.param(t, marks=pytest.mark.slow) for t in TASKS])
def task(request):
    cls, cfg = TASKS[request.param]
    return (request.param, *build(cls, cfg))


def test_task_variants_analyse_with_prunable_groups(task):
    name, model, dg = task
    assert dg.unknown_ops == {} and dg.auto_leaves == {}
    assert len(dg.prunable) >= 20, name
    assert len(dg.ties) >= 2  # C2f / C3k2 halves


def test_task_variant_outputs_are_frozen(task):
    name, model, dg = task
    outs = returned_producers(dg)
    assert outs, name
    for conv in outs:
        g = the_group(dg, conv)
        assert not g.prunable and any("model output" in r for r in g.reasons), (name, conv)
