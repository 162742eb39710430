"""Channel-dependency analysis, one coupling pattern per test.

Each test builds a few-line module and asserts the exact groups the analysis must find: which layer roles
share channels, where each channel sits in each of them, whether the group is prunable (or frozen, and why),
exact or not, and which groups must keep equal counts. Layouts are written the way ``dg.table()`` prints
members: ``<module>.<role>[slices]``; graph literals are prefixed with ``const:``.
"""

from __future__ import annotations

import copy
import inspect
import itertools
import operator

import pytest
import torch
import torch.fx
import torch.nn.functional as F
from _graph_checks import expect, head_consistent, layout, member_text, positions, the_group
from torch import nn

import prunefx
from prunefx.analysis.roles import Kind
from prunefx.capture import capture_info
from prunefx.errors import TraceFailure


# ---- helpers ----------------------------------------------------------------------------------------------
def analyze(model: nn.Module, *inputs: torch.Tensor) -> prunefx.DependencyGraph:
    return prunefx.analyze(model, inputs)


def tied(dg, a, b) -> bool:
    return any(a.id in ids and b.id in ids for ids, _ in dg.ties)


def frozen_because(group, fragment: str) -> bool:
    return not group.prunable and any(fragment in r for r in group.reasons)


X4 = (1, 3, 8, 8)  # NCHW example input used by most tests


# ---- chains, residuals, broadcasts ------------------------------------------------------------------------
def test_conv_bn_relu_conv_chain():
    model = nn.Sequential(nn.Conv2d(3, 8, 3, padding=1), nn.BatchNorm2d(8), nn.ReLU(), nn.Conv2d(8, 4, 1))
    dg = analyze(model, torch.randn(X4))
    expect(
        dg,
        (8, True, ["0.out[0:8]", "0.weight.dim0[0:8]", "0.bias.dim0[0:8]", "1.channel[0:8]", "1.weight.dim0[0:8]",
                   "1.bias.dim0[0:8]", "1.running_mean.dim0[0:8]", "1.running_var.dim0[0:8]", "3.in[0:8]",
                   "3.weight.dim1[0:8]"]),
        (4, False, ["3.out[0:4]", "3.weight.dim0[0:4]", "3.bias.dim0[0:4]"]),
        params=True,
    )
    g = the_group(dg, "0")
    assert g.exact and g.constraints == () and dg.ties == []
    assert frozen_because(the_group(dg, "3"), "model output")


@pytest.mark.parametrize(
    "op", [operator.add, operator.sub, operator.mul, torch.add, torch.maximum], ids=lambda f: f.__name__
)
def test_residual_elementwise_merges_both_producers(op):
    class Residual(nn.Module):
        def __init__(self):
            super().__init__()
            self.a, self.b, self.c = nn.Conv2d(3, 8, 1), nn.Conv2d(8, 8, 3, padding=1), nn.Conv2d(8, 4, 1)

        def forward(self, x):
            y = self.a(x)
            return self.c(op(y, self.b(y)))

    dg = analyze(Residual(), torch.randn(X4))
    expect(dg, (8, True, ["a.out[0:8]", "b.in[0:8]", "b.out[0:8]", "c.in[0:8]"]), (4, False, ["c.out[0:4]"]))
    assert the_group(dg, "a").exact


def test_inplace_add_merges_like_add():
    class Residual(nn.Module):
        def __init__(self):
            super().__init__()
            self.a, self.b, self.c = nn.Conv2d(3, 8, 1), nn.Conv2d(3, 8, 1), nn.Conv2d(8, 4, 1)

        def forward(self, x):
            y = self.a(x)
            y += self.b(x)
            return self.c(y)

    dg = analyze(Residual(), torch.randn(X4))
    expect(dg, (8, True, ["a.out[0:8]", "b.out[0:8]", "c.in[0:8]"]), (4, False, ["c.out[0:4]"]))


class SqueezeExcite(nn.Module):
    """x * sigmoid(fc2(relu(fc1(pool(x))))): the gate broadcasts over H, W, never over channels."""

    def __init__(self):
        super().__init__()
        self.a, self.pool = nn.Conv2d(3, 8, 1), nn.AdaptiveAvgPool2d(1)
        self.fc1, self.fc2, self.c = nn.Conv2d(8, 2, 1), nn.Conv2d(2, 8, 1), nn.Conv2d(8, 4, 1)

    def forward(self, x):
        y = self.a(x)
        return self.c(y * torch.sigmoid(self.fc2(F.relu(self.fc1(self.pool(y))))))


class SqueezeExciteLinear(nn.Module):
    """The timm/senet spelling: view(b, c) -> Linear -> view(b, c, 1, 1) -> expand_as."""

    def __init__(self):
        super().__init__()
        self.a, self.pool, self.c = nn.Conv2d(3, 8, 1), nn.AdaptiveAvgPool2d(1), nn.Conv2d(8, 4, 1)
        self.fc1, self.fc2 = nn.Linear(8, 2), nn.Linear(2, 8)

    def forward(self, x):
        y = self.a(x)
        b, c, _, _ = y.size()
        w = torch.sigmoid(self.fc2(F.relu(self.fc1(self.pool(y).view(b, c))))).view(b, c, 1, 1)
        return self.c(y * w.expand_as(y))


@pytest.mark.parametrize("cls", [SqueezeExcite, SqueezeExciteLinear])
def test_squeeze_excitation_broadcast_mul(cls):
    dg = analyze(cls(), torch.randn(X4))
    expect(
        dg,
        (8, True, ["a.out[0:8]", "fc1.in[0:8]", "fc2.out[0:8]", "c.in[0:8]"]),
        (2, True, ["fc1.out[0:2]", "fc2.in[0:2]"]),
        (4, False, ["c.out[0:4]"]),
    )
    assert all(g.exact for g in dg.groups)


def test_single_channel_broadcast_across_channels_is_frozen():
    class Gate(nn.Module):
        def __init__(self):
            super().__init__()
            self.a, self.g, self.c = nn.Conv2d(3, 8, 1), nn.Conv2d(3, 1, 1), nn.Conv2d(8, 4, 1)

        def forward(self, x):
            return self.c(self.a(x) * torch.sigmoid(self.g(x)))  # (1, 1, H, W) spatial gate

    dg = analyze(Gate(), torch.randn(X4))
    assert the_group(dg, "a").prunable
    assert frozen_because(the_group(dg, "g"), "a single channel broadcast across many")


# ---- concatenation ------------------------------------------------------------------------------------------
@pytest.mark.parametrize("dim", [1, -3])
def test_cat_maps_each_producer_to_its_offset(dim):
    class Cat(nn.Module):
        def __init__(self):
            super().__init__()
            self.a, self.b, self.c = nn.Conv2d(3, 4, 1), nn.Conv2d(3, 6, 1), nn.Conv2d(10, 2, 1)

        def forward(self, x):
            return self.c(torch.cat([self.a(x), self.b(x)], dim))

    dg = analyze(Cat(), torch.randn(X4))
    expect(
        dg, (4, True, ["a.out[0:4]", "c.in[0:4]"]), (6, True, ["b.out[0:6]", "c.in[4:10]"]), (2, False, ["c.out[0:2]"])
    )


def test_cat_with_model_input_keeps_input_columns_out_of_every_group():
    class Dense(nn.Module):
        def __init__(self):
            super().__init__()
            self.a, self.c = nn.Conv2d(3, 4, 1), nn.Conv2d(7, 2, 1)

        def forward(self, x):
            return self.c(torch.cat([x, self.a(x)], 1))

    dg = analyze(Dense(), torch.randn(X4))
    expect(dg, (4, True, ["a.out[0:4]", "c.in[3:7]"]), (2, False, ["c.out[0:2]"]))


class SPPF(nn.Module):
    """ultralytics SPPF: cat of y, pool(y), pool(pool(y)), pool(pool(pool(y))) with one shared pool module."""

    def __init__(self):
        super().__init__()
        self.cv1, self.m, self.cv2 = nn.Conv2d(3, 4, 1), nn.MaxPool2d(5, 1, 2), nn.Conv2d(16, 2, 1)

    def forward(self, x):
        y = [self.cv1(x)]
        y.extend(self.m(y[-1]) for _ in range(3))
        return self.cv2(torch.cat(y, 1))


class SameTensorFourTimes(nn.Module):
    def __init__(self):
        super().__init__()
        self.cv1, self.cv2 = nn.Conv2d(3, 4, 1), nn.Conv2d(16, 2, 1)

    def forward(self, x):
        y = self.cv1(x)
        return self.cv2(torch.cat([y, y, y, y], 1))


class RepeatFourTimes(SameTensorFourTimes):
    def forward(self, x):
        return self.cv2(self.cv1(x).repeat(1, 4, 1, 1))


@pytest.mark.parametrize("cls", [SPPF, SameTensorFourTimes, RepeatFourTimes])
def test_same_channels_concatenated_four_times(cls):
    dg = analyze(cls(), torch.randn(X4))
    expect(dg, (4, True, ["cv1.out[0:4]", "cv2.in[0:4]+[4:8]+[8:12]+[12:16]"]), (2, False, ["cv2.out[0:2]"]))
    g = the_group(dg, "cv1")
    assert positions(g, "cv2", "in") == tuple((j, 4 + j, 8 + j, 12 + j) for j in range(4))
    assert positions(g, "cv2.weight", "dim1", kind="param") == tuple((j, 4 + j, 8 + j, 12 + j) for j in range(4))


# ---- split and chunk ----------------------------------------------------------------------------------------
class Halves(nn.Module):
    """cv1's output split in two halves, each with its own consumer (C2f / C2PSA / ShuffleNet)."""

    def __init__(self, spelling: str):
        super().__init__()
        self.spelling = spelling
        self.cv1, self.b, self.c = nn.Conv2d(3, 8, 1), nn.Conv2d(4, 5, 1), nn.Conv2d(4, 6, 1)

    def forward(self, x):
        y = self.cv1(x)
        if self.spelling == "getitem":
            pieces = y.chunk(2, 1)
            u, v = pieces[0], pieces[1]
        elif self.spelling == "unpack":
            u, v = y.chunk(2, dim=1)
        elif self.spelling == "list":
            pieces = list(y.chunk(2, 1))
            u, v = pieces[0], pieces[-1]
        elif self.spelling == "torch.chunk":
            u, v = torch.chunk(y, 2, 1)
        elif self.spelling == "split_int":
            u, v = y.split(4, 1)
        return self.b(u), self.c(v)


@pytest.mark.parametrize("spelling", ["getitem", "unpack", "list", "torch.chunk", "split_int"])
def test_equal_halves_are_two_groups_tied_by_count(spelling):
    dg = analyze(Halves(spelling), torch.randn(X4))
    first, second = the_group(dg, "b", "in"), the_group(dg, "c", "in")
    assert first is not second and first.prunable and second.prunable
    assert positions(first, "cv1", "out") == tuple((j,) for j in range(4))
    assert positions(second, "cv1", "out") == tuple((4 + j,) for j in range(4))
    assert positions(first, "b", "in") == positions(second, "c", "in") == tuple((j,) for j in range(4))
    assert tied(dg, first, second)
    assert any("needs equal pieces" in c for c in first.constraints)
    assert dg.groups_of("cv1", "out") == [first, second]


def test_split_with_sizes_records_each_size_literal():
    class Split(nn.Module):
        def __init__(self):
            super().__init__()
            self.cv1, self.b, self.c = nn.Conv2d(3, 8, 1), nn.Conv2d(3, 5, 1), nn.Conv2d(5, 6, 1)

        def forward(self, x):
            u, v = self.cv1(x).split([3, 5], 1)
            return self.b(u), self.c(v)

    dg = analyze(Split(), torch.randn(X4))
    expect(
        dg,
        (3, True, ["cv1.out[0:3]", "const:split.args[1][0][0:3]", "b.in[0:3]"]),
        (5, True, ["cv1.out[3:8]", "const:split.args[1][1][0:5]", "c.in[0:5]"]),
        (5, False, ["b.out[0:5]"]),
        (6, False, ["c.out[0:6]"]),
    )
    assert dg.ties == []  # unequal pieces with their own literals need no equal-count tie


class UnevenPieces(nn.Module):
    """chunk / split(int) whose last piece is shorter than the others."""

    def __init__(self, how: str, width: int):
        super().__init__()
        self.how = how
        self.cv1 = nn.Conv2d(3, width, 1)

    def forward(self, x):
        p = self.cv1(x).chunk(3, 1) if self.how == "chunk" else self.cv1(x).split(4, 1)
        return p[0], p[1], p[2]


@pytest.mark.parametrize(("how", "width"), [("chunk", 8), ("split", 10)])
def test_uneven_pieces_every_allowed_count_reproduces_the_pieces(how, width):
    """Oracle: for every count assignment the groups and ties allow, chunk/split must cut the pruned
    tensor into exactly those pieces (otherwise consumers see wrong widths)."""

    class Consumers(nn.Module):
        def __init__(self):
            super().__init__()
            self.inner = UnevenPieces(how, width)
            sizes = [o.shape[1] for o in self.inner(torch.randn(1, 3, 2, 2))]
            self.heads = nn.ModuleList(nn.Conv2d(n, 1, 1) for n in sizes)

        def forward(self, x):
            pieces = self.inner(x)
            return [h(pieces[k]) for k, h in enumerate(self.heads)]

    model = Consumers()
    dg = analyze(model, torch.randn(X4))
    heads = [f"heads.{k}" for k in range(len(model.heads))]
    groups = sorted({g.id for h in heads for g in dg.groups_of(h, "in")})
    if not any(dg.groups[g].prunable for g in groups):  # frozen is safe, but only with the reason said
        assert all(any("uneven pieces" in r for r in dg.groups[g].reasons) for g in groups)
        return
    choices = [range(1, dg.groups[g].channels + 1) if dg.groups[g].prunable else [dg.groups[g].channels]
               for g in groups]
    bad = []
    for counts in itertools.product(*choices):
        kept = dict(zip(groups, counts, strict=True))
        if any(len({kept[g] for g in ids if g in kept}) > 1 for ids, _ in dg.ties):
            continue  # violates an equal-count tie
        widths = [sum(kept[g.id] * len(m.index) // g.channels for g in dg.groups_of(h, "in")
                      for m in g.members if m.kind == "module" and m.name == h and m.role == "in") for h in heads]
        t = torch.empty(1, sum(widths))
        got = [p.shape[1] for p in (t.chunk(3, 1) if how == "chunk" else t.split(widths[0], 1))]
        if got != widths:
            bad.append((widths, got))
    assert bad == []
    if how == "chunk":  # 8 -> (3, 3, 2): the first 2 positions of every piece prune together, 2 stay
        shared = [g for g in groups if dg.groups[g].prunable]
        assert [dg.groups[g].channels for g in shared] == [2]
        assert sum(dg.groups[g].channels for g in groups if not dg.groups[g].prunable) == 2


# ---- grouped and depthwise convolutions ------------------------------------------------------------------
def test_depthwise_conv_couples_input_and_output():
    model = nn.Sequential(
        nn.Conv2d(3, 8, 1), nn.BatchNorm2d(8), nn.Conv2d(8, 8, 3, padding=1, groups=8), nn.Conv2d(8, 4, 1)
    )
    dg = analyze(model, torch.randn(X4))
    expect(
        dg,
        (8, True, ["0.out[0:8]", "1.channel[0:8]", "2.in[0:8]", "2.out[0:8]", "3.in[0:8]"]),
        (4, False, ["3.out[0:4]"]),
    )
    g = the_group(dg, "2")
    assert positions(g, "2.weight", "dim0", kind="param") == tuple((j,) for j in range(8))
    assert not [m for m in g.members if m.name == "2.weight" and str(m.role) == "dim1"]  # one input per group
    assert any("groups follow the channel count" in c for c in g.constraints)


def test_depthwise_with_channel_multiplier_moves_both_outputs_of_an_input():
    model = nn.Sequential(nn.Conv2d(3, 4, 1), nn.Conv2d(4, 8, 3, padding=1, groups=4), nn.Conv2d(8, 2, 1))
    dg = analyze(model, torch.randn(X4))
    g = the_group(dg, "0")
    assert g.channels == 4 and g.prunable
    assert positions(g, "1", "in") == tuple((j,) for j in range(4))
    assert positions(g, "1", "out") == tuple((2 * j, 2 * j + 1) for j in range(4))
    assert positions(g, "2", "in") == tuple((2 * j, 2 * j + 1) for j in range(4))


def test_depthwise_on_model_input_is_frozen():
    model = nn.Sequential(nn.Conv2d(3, 3, 3, padding=1, groups=3), nn.Conv2d(3, 2, 1))
    dg = analyze(model, torch.randn(X4))
    assert frozen_because(the_group(dg, "0"), "depthwise conv over channels that cannot be pruned")


def test_grouped_conv_keeps_the_same_positions_in_every_block():
    model = nn.Sequential(nn.Conv2d(3, 8, 1), nn.Conv2d(8, 16, 3, padding=1, groups=4), nn.Conv2d(16, 4, 1))
    dg = analyze(model, torch.randn(X4))
    expect(
        dg,
        (2, True, ["0.out[0:2]+[2:4]+[4:6]+[6:8]", "1.in[0:2]+[2:4]+[4:6]+[6:8]"]),
        (4, True, ["1.out[0:4]+[4:8]+[8:12]+[12:16]", "2.in[0:4]+[4:8]+[8:12]+[12:16]"]),
        (4, False, ["2.out[0:4]"]),
    )
    g_in, g_out = the_group(dg, "1", "in"), the_group(dg, "1", "out")
    assert positions(g_in, "1", "in") == ((0, 2, 4, 6), (1, 3, 5, 7))  # channel k -> position k of each block
    assert positions(g_in, "1.weight", "dim1", kind="param") == ((0,), (1,))  # weight holds one block's inputs
    assert positions(g_out, "1", "out") == tuple((k, 4 + k, 8 + k, 12 + k) for k in range(4))
    assert all(any("4 conv groups" in c for c in g.constraints) for g in (g_in, g_out))


def test_grouped_transposed_conv_slices_weight_dims_the_other_way_round():
    model = nn.Sequential(nn.Conv2d(3, 8, 1), nn.ConvTranspose2d(8, 4, 2, stride=2, groups=2), nn.Conv2d(4, 2, 1))
    dg = analyze(model, torch.randn(X4))
    expect(
        dg,
        (4, True, ["0.out[0:4]+[4:8]", "1.in[0:4]+[4:8]"]),
        (2, True, ["1.out[0:2]+[2:4]", "2.in[0:2]+[2:4]"]),
        (2, False, ["2.out[0:2]"]),
    )
    g_in, g_out = the_group(dg, "1", "in"), the_group(dg, "1", "out")
    # ConvTranspose2d.weight is (in, out / groups, kh, kw)
    assert positions(g_in, "1.weight", "dim0", kind="param") == tuple((k, 4 + k) for k in range(4))
    assert positions(g_out, "1.weight", "dim1", kind="param") == ((0,), (1,))
    assert positions(g_out, "1.bias", "dim0", kind="param") == ((0, 2), (1, 3))


class FunctionalConv(nn.Module):
    """A conv written as F.conv2d with its weight read as a parameter (StdConv / weight-standardised style)."""

    def __init__(self):
        super().__init__()
        self.a, self.c = nn.Conv2d(3, 4, 1), nn.Conv2d(6, 2, 1)
        self.w = nn.Parameter(torch.randn(6, 4, 3, 3))

    def forward(self, x):
        return self.c(F.conv2d(self.a(x), self.w, padding=1))


def test_functional_conv_contracts_its_weight_with_the_input():
    dg = analyze(FunctionalConv(), torch.randn(X4))
    g_in, g_out = the_group(dg, "a"), the_group(dg, "c", "in")
    assert g_in.prunable and g_out.prunable
    assert positions(g_in, "w", "dim1", kind="param") == tuple((k,) for k in range(4))
    assert positions(g_out, "w", "dim0", kind="param") == tuple((k,) for k in range(6))


def test_functional_conv_kernel_dims_are_not_prunable():
    dg = analyze(FunctionalConv(), torch.randn(X4))
    for dim in ("dim2", "dim3"):
        (g,) = [g for g in dg.groups if any(m.name == "w" and str(m.role) == dim for m in g.members)]
        assert not g.prunable, dim


class UnbatchedConvSum(nn.Module):
    def __init__(self):
        super().__init__()
        self.a = nn.Conv2d(3, 4, 1)

    def forward(self, x):
        return self.a(x).sum(1)  # unbatched (C, H, W): sums over H, the 4 channels reach the output


def test_unbatched_conv_channels_reaching_the_output_are_frozen():
    dg = analyze(UnbatchedConvSum(), torch.randn(3, 8, 8))
    assert frozen_because(the_group(dg, "a"), "model output")


def test_unbatched_conv_flatten_linear_is_grouped_or_frozen():
    model = nn.Sequential(nn.Conv2d(3, 4, 1), nn.Flatten(0), nn.Linear(4 * 8 * 8, 2))
    dg = analyze(model, torch.randn(3, 8, 8))
    g = the_group(dg, "0")
    if g.prunable:
        assert positions(g, "2", "in") == tuple(tuple(range(64 * k, 64 * (k + 1))) for k in range(4))


# ---- reshapes ------------------------------------------------------------------------------------------------
class ConvFlattenLinear(nn.Module):
    def __init__(self, spelling: str):
        super().__init__()
        self.spelling = spelling
        self.a, self.fl, self.fc = nn.Conv2d(3, 4, 1), nn.Flatten(), nn.Linear(4 * 3 * 2, 5)

    def forward(self, x):
        y = self.a(x)
        if self.spelling == "nn.Flatten":
            return self.fc(self.fl(y))
        if self.spelling == "torch.flatten":
            return self.fc(torch.flatten(y, 1))
        if self.spelling == "view(b, -1)":
            return self.fc(y.view(y.size(0), -1))
        return self.fc(y.reshape(y.shape[0], 24))  # literal width: a graph constant follows the channels


@pytest.mark.parametrize("spelling", ["nn.Flatten", "torch.flatten", "view(b, -1)", "reshape(b, 24)"])
def test_flatten_into_linear_expands_each_channel_to_hw_inputs(spelling):
    dg = analyze(ConvFlattenLinear(spelling), torch.randn(1, 3, 3, 2))
    g = the_group(dg, "a")
    assert g.channels == 4 and g.prunable and g.exact
    hw = 6
    assert positions(g, "fc", "in") == tuple(tuple(range(hw * c, hw * (c + 1))) for c in range(4))
    assert positions(g, "fc.weight", "dim1", kind="param") == positions(g, "fc", "in")
    consts = [m for m in g.members if m.kind is Kind.CONST]
    if spelling == "reshape(b, 24)":
        assert [(m.name, str(m.role)) for m in consts] == [("reshape", "args[2]")]
        assert consts[0].positions == positions(g, "fc", "in")  # the literal counts 6 per channel
    else:
        assert consts == []


def channel_shuffle(x: torch.Tensor, groups: int) -> torch.Tensor:
    """torchvision.models.shufflenetv2.channel_shuffle."""
    b, c, h, w = x.size()
    x = x.view(b, groups, c // groups, h, w)
    x = torch.transpose(x, 1, 2).contiguous()
    return x.view(b, -1, h, w)


def test_channel_shuffle_of_one_tensor_couples_positions_across_groups():
    class Shuffle(nn.Module):
        def __init__(self):
            super().__init__()
            self.a, self.c = nn.Conv2d(3, 8, 1), nn.Conv2d(8, 2, 1)

        def forward(self, x):
            return self.c(channel_shuffle(self.a(x), 2))

    dg = analyze(Shuffle(), torch.randn(X4))
    expect(dg, (4, True, ["a.out[0:4]+[4:8]", "c.in[0:7:2]+[1:8:2]"]), (2, False, ["c.out[0:2]"]))
    g = the_group(dg, "a")
    # channel k = a's k and 4+k; after the shuffle they sit at 2k and 2k+1.
    assert positions(g, "a", "out") == tuple((k, 4 + k) for k in range(4))
    assert positions(g, "c", "in") == tuple((2 * k, 2 * k + 1) for k in range(4))


def test_shufflenet_v2_unit_chunk_cat_shuffle():
    class Unit(nn.Module):
        def __init__(self):
            super().__init__()
            self.a, self.branch, self.c = nn.Conv2d(3, 8, 1), nn.Conv2d(4, 4, 1), nn.Conv2d(8, 2, 1)

        def forward(self, x):
            x1, x2 = self.a(x).chunk(2, dim=1)
            return self.c(channel_shuffle(torch.cat((x1, self.branch(x2)), 1), 2))

    dg = analyze(Unit(), torch.randn(X4))
    expect(
        dg,
        (4, True, ["a.out[0:4]", "branch.out[0:4]", "c.in[0:7:2]+[1:8:2]"]),  # x1[k] and branch[k] end up side by side
        (4, True, ["a.out[4:8]", "branch.in[0:4]"]),
        (2, False, ["c.out[0:2]"]),
    )
    assert tied(dg, the_group(dg, "branch", "out"), the_group(dg, "branch", "in"))


def test_channel_shuffle_module():
    model = nn.Sequential(nn.Conv2d(3, 8, 1), nn.ChannelShuffle(2), nn.Conv2d(8, 2, 1))
    dg = analyze(model, torch.randn(X4))
    expect(dg, (4, True, ["0.out[0:4]+[4:8]", "2.in[0:7:2]+[1:8:2]"]), (2, False, ["2.out[0:2]"]))


# ---- shared modules ---------------------------------------------------------------------------------------
def test_module_called_at_two_places_is_sliced_once():
    class Shared(nn.Module):
        def __init__(self):
            super().__init__()
            self.a, self.b = nn.Conv2d(3, 4, 1), nn.Conv2d(3, 4, 1)
            self.shared, self.c = nn.Conv2d(4, 6, 1), nn.Conv2d(12, 2, 1)

        def forward(self, x):
            return self.c(torch.cat([self.shared(self.a(x)), self.shared(self.b(x))], 1))

    dg = analyze(Shared(), torch.randn(X4))
    expect(
        dg,
        (4, True, ["a.out[0:4]", "b.out[0:4]", "shared.in[0:4]"]),  # both inputs must lose the same channels
        (6, True, ["shared.out[0:6]", "c.in[0:6]+[6:12]"]),
        (2, False, ["c.out[0:2]"]),
    )


def test_module_called_with_two_widths_is_frozen():
    class TwoWidths(nn.Module):
        def __init__(self):
            super().__init__()
            self.a, self.b, self.c = nn.Conv2d(3, 4, 1), nn.Conv2d(3, 6, 1), nn.Conv2d(10, 2, 1)
            self.norm = nn.InstanceNorm2d(4)  # no affine, no stats: runs on any width

        def forward(self, x):
            return self.c(torch.cat([self.norm(self.a(x)), self.norm(self.b(x))], 1))

    dg = analyze(TwoWidths(), torch.randn(X4))
    for name in ("a", "b"):
        assert frozen_because(the_group(dg, name), "norm channel used with different widths")


# ---- attention -----------------------------------------------------------------------------------------------
class ViTAttention(nn.Module):
    """embed -> qkv Linear -> reshape into heads -> softmax(q k^T) v -> proj, residual around it.

    ``sizes='from_input'`` is timm's spelling (C read from x, C // heads); ``'inferred'`` uses -1 so the head
    dim follows whatever qkv produces.
    """

    def __init__(self, sizes: str, dim: int = 8, heads: int = 2):
        super().__init__()
        self.sizes, self.heads, self.scale = sizes, heads, (dim // heads) ** -0.5
        self.embed, self.qkv = nn.Linear(5, dim), nn.Linear(dim, 3 * dim)
        self.proj, self.head = nn.Linear(dim, dim), nn.Linear(dim, 3)

    def forward(self, inp):
        x = self.embed(inp)
        B, N, C = x.shape
        if self.sizes == "from_input":
            qkv = self.qkv(x).reshape(B, N, 3, self.heads, C // self.heads).permute(2, 0, 3, 1, 4)
        else:
            qkv = self.qkv(x).reshape(B, N, 3, self.heads, -1).permute(2, 0, 3, 1, 4)
        q, k, v = qkv.unbind(0)
        attn = ((q @ k.transpose(-2, -1)) * self.scale).softmax(dim=-1)
        y = (attn @ v).transpose(1, 2)
        y = y.reshape(B, N, C) if self.sizes == "from_input" else y.reshape(B, N, -1)
        return self.head(x + self.proj(y))


def assert_qkv_safe(dg, qkv: str, where) -> list:
    """Every channel of a prunable group in ``qkv``'s output is head-consistent; returns those groups."""
    prunable = []
    for g in dg.groups_of(qkv, "out"):
        if not g.prunable:
            continue
        prunable.append(g)
        for pos in positions(g, qkv, "out"):
            assert head_consistent(pos, where), (g.id, pos)
    return prunable


def _vit_where(dim: int, heads: int):
    hd = dim // heads
    return lambda p: ("qkv"[p // dim], (p % dim) // hd, p % hd)


def test_attention_head_dim_read_from_input_prunes_one_offset_in_every_block_of_the_stream():
    # C // heads sizes head_dim: offset d of head_dim goes with channels d and 4 + d of the residual stream, so the
    # pruned stream is still heads x the pruned head_dim
    dg = analyze(ViTAttention("from_input"), torch.randn(1, 4, 5))
    (g,) = assert_qkv_safe(dg, "qkv", _vit_where(8, 2))
    assert g is the_group(dg, "embed") is the_group(dg, "proj") and g.channels == 4
    assert positions(g, "embed", "out") == tuple((d, 4 + d) for d in range(4))
    assert the_group(dg, "head").prunable is False  # model output
    result = prunefx.prune(ViTAttention("from_input").eval(), torch.randn(1, 4, 5), prunefx.PlanConfig(ratio=0.5))
    assert result.verified.ok and result.model.embed.out_features == result.model.qkv.out_features // 3 < 8


def test_attention_with_inferred_sizes_prunes_head_dims_consistently():
    dg = analyze(ViTAttention("inferred"), torch.randn(1, 4, 5))
    (g,) = assert_qkv_safe(dg, "qkv", _vit_where(8, 2))
    # head-dim offset d of q, k and v in both heads go together: 6 positions per channel.
    assert g.channels == 4
    qkv_positions = tuple(tuple(t * 8 + h * 4 + d for t in range(3) for h in range(2)) for d in range(4))
    assert positions(g, "qkv", "out") == qkv_positions
    assert positions(g, "proj", "in") == tuple((d, 4 + d) for d in range(4))
    expect_stream = ["embed.out[0:8]", "qkv.in[0:8]", "proj.out[0:8]", "head.in[0:8]"]
    assert the_group(dg, "embed").prunable
    stream = the_group(dg, "embed").members
    assert sorted(member_text(m) for m in stream if m.kind is Kind.MODULE) == sorted(expect_stream)


def test_non_local_block_couples_contracted_projections():
    """theta^T phi contracts theta's and phi's channels; (f g) carries g's channels into W."""

    class NonLocal(nn.Module):
        def __init__(self):
            super().__init__()
            self.a, self.c, self.W = nn.Conv2d(3, 8, 1), nn.Conv2d(8, 2, 1), nn.Conv2d(4, 8, 1)
            self.theta, self.phi, self.g = nn.Conv2d(8, 4, 1), nn.Conv2d(8, 4, 1), nn.Conv2d(8, 4, 1)

        def forward(self, x):
            x = self.a(x)
            b, _, h, w = x.shape
            t = self.theta(x).view(b, 4, -1).permute(0, 2, 1)
            p = self.phi(x).view(b, 4, -1)
            g = self.g(x).view(b, 4, -1).permute(0, 2, 1)
            y = (torch.softmax(t @ p, -1) @ g).permute(0, 2, 1).contiguous().view(b, 4, h, w)
            return self.c(x + self.W(y))

    dg = analyze(NonLocal(), torch.randn(X4))
    expect(
        dg,
        (8, True, ["a.out[0:8]", "theta.in[0:8]", "phi.in[0:8]", "g.in[0:8]", "W.out[0:8]", "c.in[0:8]"]),
        (4, True, ["theta.out[0:4]", "phi.out[0:4]", "const:view.args[2][0:4]", "const:view_1.args[2][0:4]"]),
        (4, True, ["g.out[0:4]", "W.in[0:4]", "const:view_2.args[2][0:4]", "const:view_3.args[2][0:4]"]),
        (2, False, ["c.out[0:2]"]),
    )
    assert all(g.exact for g in dg.groups)  # softmax runs over positions, not channels


# ---- normalisation --------------------------------------------------------------------------------------------
def test_group_norm_couples_positions_across_groups_and_is_inexact():
    model = nn.Sequential(nn.Conv2d(3, 8, 1), nn.GroupNorm(2, 8), nn.Conv2d(8, 2, 1))
    dg = analyze(model, torch.randn(X4))
    expect(dg, (4, True, ["0.out[0:4]+[4:8]", "1.channel[0:4]+[4:8]", "2.in[0:4]+[4:8]"]), (2, False, ["2.out[0:2]"]))
    g = the_group(dg, "0")
    assert positions(g, "1.weight", "dim0", kind="param") == tuple((k, 4 + k) for k in range(4))
    assert not g.exact and any("GroupNorm" in r for r in g.inexact_reasons)


@pytest.mark.parametrize("layout_", ["NLC", "NCHW->NHWC"])
def test_layer_norm_over_channels_is_inexact(layout_):
    class LN(nn.Module):
        def __init__(self):
            super().__init__()
            self.ln = nn.LayerNorm(8)
            nlc = layout_ == "NLC"
            self.a, self.c = (nn.Linear(3, 8), nn.Linear(8, 2)) if nlc else (nn.Conv2d(3, 8, 1), nn.Conv2d(8, 2, 1))

        def forward(self, x):
            if layout_ == "NLC":
                return self.c(self.ln(self.a(x)))
            return self.c(self.ln(self.a(x).permute(0, 2, 3, 1)).permute(0, 3, 1, 2))

    x = torch.randn(1, 5, 3) if layout_ == "NLC" else torch.randn(X4)
    dg = analyze(LN(), x)
    expect(dg, (8, True, ["a.out[0:8]", "ln.normalized0[0:8]", "c.in[0:8]"]), (2, False, ["c.out[0:2]"]))
    g = the_group(dg, "a")
    assert not g.exact and any("LayerNorm" in r for r in g.inexact_reasons)
    ln_params = {(m.name, str(m.role)) for m in g.members if m.kind is Kind.PARAM and m.name.startswith("ln.")}
    assert ln_params == {("ln.weight", "dim0"), ("ln.bias", "dim0")}


def test_functional_layer_norm_records_its_literal_shape():
    class LN(nn.Module):
        def __init__(self):
            super().__init__()
            self.a, self.c = nn.Linear(3, 8), nn.Linear(8, 2)

        def forward(self, x):
            return self.c(F.layer_norm(self.a(x), (8,)))

    dg = analyze(LN(), torch.randn(1, 5, 3))
    g = the_group(dg, "a")
    assert g.prunable and not g.exact
    assert [(m.name, str(m.role)) for m in g.members if m.kind is Kind.CONST] == [("layer_norm", "args[1][0]")]


@pytest.mark.parametrize("affine", [True, False])
def test_instance_norm_is_exact_per_channel(affine):
    model = nn.Sequential(nn.Conv2d(3, 8, 1), nn.InstanceNorm2d(8, affine=affine), nn.Conv2d(8, 2, 1))
    dg = analyze(model, torch.randn(X4))
    expect(dg, (8, True, ["0.out[0:8]", "1.channel[0:8]", "2.in[0:8]"]), (2, False, ["2.out[0:2]"]))
    g = the_group(dg, "0")
    assert g.exact
    norm_params = {m.name for m in g.members if m.kind is Kind.PARAM and m.name.startswith("1.")}
    assert norm_params == ({"1.weight", "1.bias"} if affine else set())


@pytest.mark.parametrize(("reduce", "exact"), [("sum", True), ("mean", False)])
def test_reduction_over_channels(reduce, exact):
    class Reduce(nn.Module):
        def __init__(self):
            super().__init__()
            self.a, self.c = nn.Conv2d(3, 8, 1), nn.Conv2d(8, 2, 1)

        def forward(self, x):
            y = self.a(x)
            return self.c(y), getattr(y, reduce)(1)

    dg = analyze(Reduce(), torch.randn(X4))
    g = the_group(dg, "a")
    assert g.prunable and g.exact is exact


# ---- model outputs ------------------------------------------------------------------------------------------
class TwoHeads(nn.Module):
    def __init__(self, container: str):
        super().__init__()
        self.container = container
        self.a, self.b, self.hidden = nn.Conv2d(3, 4, 1), nn.Conv2d(8, 2, 1), nn.Conv2d(3, 8, 1)

    def forward(self, x):
        h = self.hidden(x)
        y, z = self.a(x), self.b(h)
        if self.container == "tuple":
            return y, z
        if self.container == "nested list":
            return [y, (z,)]
        return {"boxes": y, "scores": z}


@pytest.mark.parametrize("container", ["tuple", "nested list", "dict"])
def test_every_returned_tensor_is_frozen_as_model_output(container):
    dg = analyze(TwoHeads(container), torch.randn(X4))
    assert frozen_because(the_group(dg, "a"), "model output")
    assert frozen_because(the_group(dg, "b"), "model output")
    assert the_group(dg, "hidden").prunable


def test_free_dict_outputs_keep_their_channels_prunable():
    dg = prunefx.analyze(TwoHeads("dict"), torch.randn(X4), free_outputs=("scores",))
    assert frozen_because(the_group(dg, "a"), "model output")  # "boxes" stays frozen
    assert the_group(dg, "b").prunable


# ---- ops without rules, model inputs, parameters, literals --------------------------------------------------------
def mystery(x: torch.Tensor) -> torch.Tensor:
    return torch.cumsum(x, 1)  # mixes channels: position k reaches every later one


torch.fx.wrap("mystery")


def zeros_of_size(b: int, c: int, h: int, w: int) -> torch.Tensor:
    return torch.zeros(b, c, h, w)


torch.fx.wrap("zeros_of_size")


def test_wrapped_function_without_rule_freezes_what_it_touches():
    class Wrapped(nn.Module):
        def __init__(self):
            super().__init__()
            self.a, self.b = nn.Conv2d(3, 4, 1), nn.Conv2d(3, 6, 1)
            self.c, self.d = nn.Conv2d(4, 2, 1), nn.Conv2d(6, 2, 1)

        def forward(self, x):
            return self.c(mystery(self.a(x))) + self.d(self.b(x))

    dg = analyze(Wrapped(), torch.randn(X4))
    g = the_group(dg, "a")
    assert frozen_because(g, f"no rule for {__name__}.mystery (probed: input 0 dim 1: mixes positions")
    assert the_group(dg, "b").prunable  # untouched branch stays prunable
    assert dg.unknown_ops == {"mystery": f"{__name__}.mystery"} and not dg.inferred_ops


def test_op_without_rule_fed_with_a_channel_count_freezes_that_count():
    class PadWithZeros(nn.Module):
        def __init__(self):
            super().__init__()
            self.a, self.c = nn.Conv2d(3, 4, 1), nn.Conv2d(8, 2, 1)

        def forward(self, x):
            y = self.a(x)
            b, c, h, w = y.shape
            return self.c(torch.cat([y, zeros_of_size(b, c, h, w)], 1))  # width of the zeros = a's width

    dg = analyze(PadWithZeros(), torch.randn(X4))
    assert "zeros_of_size" in dg.unknown_ops
    assert frozen_because(the_group(dg, "a"), "no rule for")


def test_model_input_channels_are_never_prunable():
    class InputUses(nn.Module):
        def __init__(self):
            super().__init__()
            self.a, self.b, self.c = nn.Conv2d(3, 3, 1), nn.Conv2d(3, 5, 1), nn.Conv2d(3, 2, 1)

        def forward(self, x):
            return self.c(x + self.a(x)), self.b(x)

    dg = analyze(InputUses(), torch.randn(X4))
    for name in ("a", "b"):
        assert dg.groups_of(name, "in") == []  # the input channels belong to no group
        assert not any(m.name == f"{name}.weight" and str(m.role) == "dim1" for g in dg.groups for m in g.members)
    assert frozen_because(the_group(dg, "a"), "element-wise with an operand whose channels cannot be sliced")


def test_learned_parameter_added_in_forward_is_sliced_with_the_channels():
    class PosEmbed(nn.Module):
        def __init__(self):
            super().__init__()
            self.embed, self.head = nn.Linear(3, 8), nn.Linear(8, 2)
            self.pos = nn.Parameter(torch.zeros(1, 5, 8))
            self.gamma = nn.Parameter(torch.ones(8))

        def forward(self, x):
            return self.head((self.embed(x) + self.pos) * self.gamma)

    dg = analyze(PosEmbed(), torch.randn(2, 5, 3))
    g = the_group(dg, "embed")
    assert g.prunable and g.channels == 8
    assert positions(g, "pos", "dim2", kind="param") == tuple((j,) for j in range(8))
    assert positions(g, "gamma", "dim0", kind="param") == tuple((j,) for j in range(8))
    assert positions(g, "head", "in") == tuple((j,) for j in range(8))
    # the token dim of pos is not a channel set anyone may prune
    (tokens,) = [g for g in dg.groups if any(m.name == "pos" and str(m.role) == "dim1" for m in g.members)]
    assert not tokens.prunable


def test_hard_coded_view_size_is_a_graph_constant_member():
    class HardView(nn.Module):
        def __init__(self):
            super().__init__()
            self.a, self.fc = nn.Conv2d(3, 8, 1), nn.Linear(8, 2)

        def forward(self, x):
            b = x.shape[0]
            return self.fc(self.a(x).view(b, 8, -1).mean(-1))

    dg = analyze(HardView(), torch.randn(X4))
    expect(dg, (8, True, ["a.out[0:8]", "const:view.args[2][0:8]", "fc.in[0:8]"]), (2, False, ["fc.out[0:2]"]))
    (const,) = [m for m in the_group(dg, "a").members if m.kind is Kind.CONST]
    assert (str(const.kind), const.name, str(const.role), const.module_type) == ("const", "view", "args[2]", "")


# ---- tracing ---------------------------------------------------------------------------------------------------
class VarArgs(nn.Module):
    def __init__(self):
        super().__init__()
        self.a = nn.Conv2d(3, 4, 1)

    def forward(self, x, *args, **kwargs):
        return self.a(x)


class C2fLike(nn.Module):
    def __init__(self):
        super().__init__()
        self.cv1, self.cv2 = nn.Conv2d(3, 8, 1), nn.Conv2d(16, 2, 1)
        self.m = nn.ModuleList([nn.Conv2d(4, 4, 1), nn.Conv2d(4, 4, 1)])

    def forward(self, x):
        y = list(self.cv1(x).chunk(2, 1))
        y.extend(m(y[-1]) for m in self.m)
        return self.cv2(torch.cat(y, 1))


class Iterate(nn.Module):
    def __init__(self):
        super().__init__()
        self.cv1 = nn.Conv2d(3, 9, 1)

    def forward(self, x):
        out = 0
        for t in self.cv1(x).split([2, 3, 4], 1):
            out = out + t.sum(1)
        a, b = x.chunk(2, dim=-1)
        n, c, h, w = x.shape
        return out * (a.mean() + b.mean()) / c


@pytest.mark.parametrize("cls", [VarArgs, C2fLike, Iterate])
def test_trace_matches_eager(cls):
    model = cls().eval()
    x = torch.randn(1, 3, 4, 4)
    gm = prunefx.trace(model, (x,))
    assert [n.name for n in gm.graph.nodes if n.op == "placeholder"] == ["x"]
    assert capture_info(gm).auto_leaves == {}
    torch.testing.assert_close(gm(x), model(x))


def test_trace_chunk_iteration_has_no_len_or_iter_nodes():
    gm = prunefx.trace(C2fLike(), torch.randn(1, 3, 4, 4))
    targets = [n.target for n in gm.graph.nodes]
    assert "chunk" in targets and len not in targets and iter not in targets
    assert sum(1 for n in gm.graph.nodes if n.target is operator.getitem) == 2


class DataDependentGate(nn.Module):
    def forward(self, x):
        if x.sum() > 0:
            return x
        return -x


class WithGate(nn.Module):
    def __init__(self):
        super().__init__()
        self.a, self.gate, self.c = nn.Conv2d(3, 4, 1), DataDependentGate(), nn.Conv2d(4, 2, 1)

    def forward(self, x):
        return self.c(self.gate(self.a(x)))


def _line_of(fn, text: str) -> int:
    src, start = inspect.getsourcelines(fn)
    return start + next(i for i, line in enumerate(src) if text in line)


def test_untraceable_submodule_becomes_an_auto_leaf_with_its_reason():
    model = WithGate()
    gm = prunefx.trace(model, torch.randn(1, 3, 4, 4))
    leaves = capture_info(gm).auto_leaves
    assert list(leaves) == ["gate"]
    line = _line_of(DataDependentGate.forward, "if x.sum() > 0")
    assert f"{__file__}:{line}" in leaves["gate"] and "if x.sum() > 0" in leaves["gate"]
    assert [n.target for n in gm.graph.nodes if n.op == "call_module"] == ["a", "gate", "c"]
    for sign in (1, -1):
        x = sign * torch.rand(1, 3, 4, 4)
        torch.testing.assert_close(gm(x), model(x))
    dg = prunefx.analyze(model, torch.randn(1, 3, 4, 4))
    assert dg.auto_leaves == leaves
    assert frozen_because(the_group(dg, "a"), "no rule for")


def test_tensor_dependent_branch_in_root_raises_trace_failure_naming_the_line():
    class Root(nn.Module):
        def __init__(self):
            super().__init__()
            self.a = nn.Conv2d(3, 4, 1)

        def forward(self, x):
            if x.sum() > 0:
                return self.a(x)
            return self.a(-x)

    with pytest.raises(TraceFailure) as err:
        prunefx.trace(Root(), torch.randn(1, 3, 4, 4))
    line = _line_of(Root.forward, "if x.sum() > 0")
    assert f"{__file__}:{line}: if x.sum() > 0:" in str(err.value)
    assert "leaf" in str(err.value)  # names a fix


def test_auto_leaf_disabled_raises():
    with pytest.raises(TraceFailure, match="if x.sum"):
        prunefx.trace(WithGate(), torch.randn(1, 3, 4, 4), auto_leaf=False)


# ---- analysis leaves the model alone ----------------------------------------------------------------------------
def _state(model: nn.Module):
    return {k: v.clone() for k, v in model.state_dict().items()}, [(n, m.training) for n, m in model.named_modules()]


@pytest.mark.parametrize(
    "cls",
    [lambda: nn.Sequential(nn.Conv2d(3, 8, 1), nn.BatchNorm2d(8), nn.Conv2d(8, 2, 1)), WithGate],
    ids=["conv-bn (meta pass)", "data-dependent (eval pass)"],
)
@pytest.mark.parametrize("flags", ["train", "eval", "mixed"])
def test_analyze_keeps_training_flags_and_batchnorm_statistics(cls, flags):
    model = cls()
    bn = nn.BatchNorm2d(4)
    if isinstance(model, WithGate):  # meta shape pass fails on the data-dependent gate: the real eval pass runs
        model.a = nn.Sequential(model.a, bn)
    model.train(flags != "eval")
    if flags == "mixed":
        next(m for m in model.modules() if isinstance(m, nn.BatchNorm2d)).eval()
        model.training = False
    before, flags_before = _state(model)
    dg = prunefx.analyze(model, torch.randn(2, 3, 4, 4))
    assert dg.shape_pass == ("eval" if isinstance(model, WithGate) else "meta")
    after, flags_after = _state(model)
    assert flags_after == flags_before
    assert before.keys() == after.keys()
    for k in before:
        torch.testing.assert_close(after[k], before[k], rtol=0, atol=0, msg=k)


def test_analyze_model_built_on_meta_device():
    with torch.device("meta"):
        model = nn.Sequential(nn.Conv2d(3, 8, 1), nn.BatchNorm2d(8), nn.ReLU(), nn.Conv2d(8, 4, 1))
    ref = analyze(nn.Sequential(nn.Conv2d(3, 8, 1), nn.BatchNorm2d(8), nn.ReLU(), nn.Conv2d(8, 4, 1)), torch.randn(X4))
    for x in (torch.randn(X4), torch.randn(X4, device="meta")):
        dg = analyze(model, x)
        assert dg.shape_pass == "meta"
        assert layout(dg, params=True) == layout(ref, params=True)
    assert all(p.is_meta for p in model.parameters())


def test_analyze_does_not_mutate_a_deep_copy_equal_model():
    model = SqueezeExciteLinear()
    twin = copy.deepcopy(model)
    prunefx.analyze(model, torch.randn(X4))
    x = torch.randn(X4)
    torch.testing.assert_close(model(x), twin(x))


def test_lazy_modules_are_initialised_by_one_forward_before_tracing():
    model = nn.Sequential(nn.LazyConv2d(8, 3), nn.BatchNorm2d(8), nn.ReLU(), nn.Flatten(), nn.LazyLinear(4))
    x = torch.randn(2, 3, 8, 8)
    gm = prunefx.trace(model, (x,))
    assert model[0].weight.shape == (8, 3, 3, 3) and model[4].weight.shape == (4, 8 * 6 * 6)
    torch.testing.assert_close(gm.eval()(x), model.eval()(x))
    with pytest.raises(TraceFailure, match="lazy parameter"):
        prunefx.trace(nn.Sequential(nn.LazyLinear(2)))


class _TwiceLinear(nn.Module):
    """One Linear applied to the model input and again to its own output."""

    def __init__(self) -> None:
        super().__init__()
        self.l, self.fc = nn.Linear(8, 8), nn.Linear(8, 3)

    def forward(self, x):
        return self.fc(self.l(torch.relu(self.l(x))))


class _TwiceConv(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.c, self.h = nn.Conv2d(4, 4, 3, padding=1), nn.Conv2d(4, 2, 1)

    def forward(self, x):
        return self.h(self.c(torch.relu(self.c(x))))


@pytest.mark.parametrize(("cls", "shape"), [(_TwiceLinear, (2, 8)), (_TwiceConv, (1, 4, 6, 6))])
def test_layer_called_on_the_model_input_and_again_keeps_its_input_columns(cls, shape):
    # The second call feeds the layer its own output, whose channels alone would be prunable; but removing them
    # also removes weight columns the first call needs for the (unprunable) model input: frozen, and said why.
    model = cls()
    dg = analyze(model, torch.randn(*shape))
    (own,) = [g for g in dg.groups if g.label.startswith(("l out", "c out"))]
    assert not own.prunable
    assert any("kept" in r for r in own.reasons)
    assert not any(g.prunable for g in dg.groups)
