"""Long-tail rules: GLU (its halves share channels), reductions returning (values, indices), roll by a count."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from _graph_checks import positions, the_group
from torch import nn

import prunefx


class Gated(nn.Module):
    """A conv whose 8 outputs feed glu over channels: output channel j is a[j] * sigmoid(a[4 + j])."""

    def __init__(self, how: str):
        super().__init__()
        self.how = how
        self.a, self.gate, self.b = nn.Conv1d(3, 8, 1), nn.GLU(dim=1), nn.Conv1d(4, 5, 1)

    def forward(self, x):
        y = self.a(x)
        return self.b(self.gate(y) if self.how == "module" else F.glu(y, dim=1))


@pytest.mark.parametrize("capture", ["fx", "export"])
@pytest.mark.parametrize("how", ["module", "function"])
def test_glu_halves_are_one_group_with_two_positions_per_channel(how: str, capture: str) -> None:
    dg = prunefx.analyze(Gated(how), (torch.randn(2, 3, 6),), capture=capture)
    g = the_group(dg, "a")
    assert g.prunable and g.exact and g is the_group(dg, "b", "in")
    assert positions(g, "a", "out") == tuple((j, 4 + j) for j in range(4))
    assert positions(g, "b", "in") == tuple((j,) for j in range(4))
    assert not dg.unknown_ops


@pytest.mark.parametrize("capture", ["fx", "export"])
def test_a_pruned_glu_model_equals_the_masked_original(capture: str) -> None:
    torch.manual_seed(0)
    result = prunefx.prune(Gated("function").eval(), torch.randn(2, 3, 6), prunefx.PlanConfig(ratio=0.5),
                           criterion="l1", capture=capture)
    assert result.model.a.out_channels == 4 and result.model.b.in_channels == 2
    assert result.verified is not None and result.verified.ok and result.verified.errors


class MaxOverLength(nn.Module):
    """Channels pass a max / min over the length dim (values and indices) into a Linear."""

    def __init__(self, op: str):
        super().__init__()
        self.op = op
        self.a, self.fc = nn.Conv1d(3, 8, 1), nn.Linear(8, 5)

    def forward(self, x):
        y = self.a(x)
        values = (y.max(dim=2) if self.op == "max" else torch.min(y, 2)).values
        return self.fc(values)


@pytest.mark.parametrize("capture", ["fx", "export"])
@pytest.mark.parametrize("op", ["max", "min"])
def test_max_and_min_over_a_non_channel_dim_keep_channels_prunable(op: str, capture: str) -> None:
    dg = prunefx.analyze(MaxOverLength(op), (torch.randn(2, 3, 6),), capture=capture)
    g = the_group(dg, "a")
    assert g.prunable and g is the_group(dg, "fc", "in")
    assert positions(g, "fc", "in") == tuple((j,) for j in range(8))
    assert not dg.unknown_ops


class Rolled(nn.Module):
    """roll along the length by a literal, or by an amount computed from the channel count."""

    def __init__(self, by_channels: bool):
        super().__init__()
        self.by_channels = by_channels
        self.a, self.b = nn.Conv1d(3, 8, 1), nn.Conv1d(8, 4, 1)

    def forward(self, x):
        y = self.a(x)
        return self.b(torch.roll(y, shifts=y.size(1) // 4 if self.by_channels else 2, dims=2))


def test_a_shift_computed_from_a_channel_count_freezes_those_channels() -> None:
    frozen = the_group(prunefx.analyze(Rolled(True), (torch.randn(2, 3, 6),)), "a")
    assert not frozen.prunable and any("used as a value by node 'roll'" in r for r in frozen.reasons)
    literal = the_group(prunefx.analyze(Rolled(False), (torch.randn(2, 3, 6),)), "a")
    assert literal.prunable


class SamePadding(nn.Module):
    """Convs with string padding (HF EfficientNet): torch.export records them as aten.conv2d.padding."""

    def __init__(self, groups: int):
        super().__init__()
        self.a = nn.Conv2d(3, 8, 3, padding="same")
        self.dw = nn.Conv2d(8, 8, 3, padding="same", groups=groups)
        self.b = nn.Conv2d(8, 4, 1, padding="valid")

    def forward(self, x):
        return self.b(torch.relu(self.dw(torch.relu(self.a(x)))))


@pytest.mark.parametrize("groups", [1, 8])
def test_string_padding_convs_are_pruned_under_export(groups: int) -> None:
    torch.manual_seed(0)
    model, x = SamePadding(groups).eval(), torch.randn(1, 3, 8, 8)
    dg = prunefx.analyze(model, (x,), capture="export")
    assert not dg.unknown_ops and the_group(dg, "a").prunable
    result = prunefx.prune(model, x, prunefx.PlanConfig(ratio=0.5), criterion="l1", capture="export")
    assert result.verified.ok and result.verified.errors and result.model.a.out_channels < 8


class SpectralCNN(nn.Module):
    """spectral_norm on the first conv and the Linear head; the conv between them is plain."""

    def __init__(self):
        super().__init__()
        sn = torch.nn.utils.parametrizations.spectral_norm
        self.a, self.b, self.c = sn(nn.Conv2d(3, 8, 3, padding=1)), nn.Conv2d(8, 8, 3, padding=1), nn.Conv2d(8, 8, 1)
        self.fc = sn(nn.Linear(8, 5))

    def forward(self, x):
        y = torch.relu(self.c(torch.relu(self.b(torch.relu(self.a(x))))))
        return self.fc(y.mean((2, 3)))


@pytest.mark.parametrize("capture", ["fx", "export"])
def test_spectral_norm_layers_freeze_in_the_analysis_naming_it_and_the_rest_prunes_exactly(capture: str) -> None:
    # sigma is the whole weight's largest singular value: a slice has another one, so nothing pruned through it equals
    # the masked original. Under export the graph reads the parametrization's tensors (original, _u, _v), which froze
    # only when the oracle failed, with a trace error as the reason
    torch.manual_seed(0)
    result = prunefx.prune(SpectralCNN().eval(), torch.randn(2, 3, 8, 8), prunefx.PlanConfig(ratio=0.5),
                           criterion="l1", capture=capture)
    dg = result.graph
    for name in ("a", "c"):
        g = the_group(dg, name)
        assert not g.prunable and "_SpectralNorm" in g.reasons[0] and "remove_parametrizations" in g.reasons[0]
    assert not result.frozen_by_check
    assert result.model.b.out_channels == result.model.c.in_channels == 4
    assert result.model.a.out_channels == 8 and result.model.fc.in_features == 8
    assert result.verified.ok and result.verified.exact, result.verified.message


class Diffs(nn.Module):
    """torch.diff of a conv's output, n=2, along the length (dim 2) or along the channels (dim 1)."""

    def __init__(self, dim: int):
        super().__init__()
        self.dim = dim
        self.a, self.b = nn.Conv1d(3, 8, 1), nn.Conv1d(8 - 2 * (dim == 1), 5, 1)

    def forward(self, x):
        return self.b(torch.diff(self.a(x), 2, self.dim))


@pytest.mark.parametrize("capture", ["fx", "export"])
def test_diff_keeps_the_channels_off_its_dim_and_freezes_them_along_it(capture: str) -> None:
    # the aten rule read diff's dim at position 1, which is n: diff(x, 2, 1) was taken as a diff along dim 2 and
    # left the mixed channels prunable; under fx, torch.diff had no rule at all (an unknown op)
    x = torch.randn(2, 3, 9)
    dg = prunefx.analyze(Diffs(2), (x,), capture=capture)
    g = the_group(dg, "a")
    assert not dg.unknown_ops and g.prunable and g.exact and g is the_group(dg, "b", "in")
    result = prunefx.prune(Diffs(2).eval(), x, prunefx.PlanConfig(ratio=0.5), criterion="l1", capture=capture)
    assert result.verified.ok and result.verified.exact, result.verified.message
    assert result.model.a.out_channels == result.model.b.in_channels == 4
    dg = prunefx.analyze(Diffs(1), (x,), capture=capture)
    g = the_group(dg, "a")
    assert not dg.unknown_ops and not g.prunable
    assert any("diff along a channel dim" in r for r in g.reasons), g.reasons
