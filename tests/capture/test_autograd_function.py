"""A custom torch.autograd.Function in forward is one node with no rule: probed, an element-wise one is inferred
(forward and backward checked on fewer channels), a mixing one freezes saying so; nothing crashes.

Handed an fx Proxy, a Function's native ``apply`` used to kill the process (segmentation fault) inside analyze.
"""

from __future__ import annotations

import subprocess
import sys
import textwrap

import torch
from torch import nn

import prunefx


class Square(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x):
        ctx.save_for_backward(x)
        return x * x

    @staticmethod
    def backward(ctx, grad):
        (x,) = ctx.saved_tensors
        return 2 * x * grad


class TwoBranches(nn.Module):
    """a -> Square -> b beside c -> d: only the branch through the Function is opaque."""

    def __init__(self) -> None:
        super().__init__()
        self.a, self.b = nn.Conv2d(3, 8, 1), nn.Conv2d(8, 4, 1)
        self.c, self.d = nn.Conv2d(3, 6, 1), nn.Conv2d(6, 4, 1)

    def forward(self, x):
        return self.b(Square.apply(self.a(x))) + self.d(torch.relu(self.c(x)))


class Spread(torch.autograd.Function):
    """Mixes channels (a cumulative sum over dim 1)."""

    @staticmethod
    def forward(ctx, x):
        return x.cumsum(1)

    @staticmethod
    def backward(ctx, grad):
        return grad.flip(1).cumsum(1).flip(1)


class Spreading(TwoBranches):
    def forward(self, x):
        return self.b(Spread.apply(self.a(x))) + self.d(torch.relu(self.c(x)))


def test_a_custom_function_is_one_node_whose_channel_map_is_inferred() -> None:
    before = torch.autograd.Function.__dict__["apply"]
    dg = prunefx.analyze(TwoBranches(), (torch.randn(1, 3, 8, 8),))
    assert torch.autograd.Function.__dict__["apply"] is before  # tracing put torch's own apply back
    (through,) = dg.groups_of("a", "out")
    assert through.prunable
    assert list(dg.inferred_ops.values()) == [f"{__name__}.Square_apply: input 0 dim 1 identity -> dim 1"]
    (beside,) = dg.groups_of("c", "out")
    assert beside.prunable


def test_a_mixing_function_freezes_with_the_reason() -> None:
    dg = prunefx.analyze(Spreading(), (torch.randn(1, 3, 8, 8),))
    (through,) = dg.groups_of("a", "out")
    assert not through.prunable and any("no rule for" in r and "Spread_apply" in r and "mixes" in r
                                        for r in through.reasons)
    assert list(dg.unknown_ops.values()) == [f"{__name__}.Spread_apply"]


def test_pruning_through_it_is_verified_and_the_function_still_runs_and_differentiates() -> None:
    torch.manual_seed(0)
    model, x = TwoBranches().eval(), torch.randn(2, 3, 8, 8)
    result = prunefx.prune(model, x, prunefx.PlanConfig(ratio=0.5), criterion="l1")
    assert result.verified.ok and result.verified.errors
    assert result.model.c.out_channels == 3 and result.model.a.out_channels == 4
    x.requires_grad_(True)
    result.model(x).sum().backward()  # the Function's own backward, on the fewer channels
    assert x.grad is not None and torch.isfinite(x.grad).all()


def test_analyze_survives_in_a_fresh_interpreter() -> None:
    # the crash was a segfault: only a separate process can show it is gone
    code = textwrap.dedent(f"""
        import sys, torch
        sys.path.insert(0, {str(__file__.rsplit('/', 1)[0])!r})
        from test_autograd_function import TwoBranches
        import prunefx
        prunefx.analyze(TwoBranches(), (torch.randn(1, 3, 8, 8),))
        print("ok")
    """)
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0 and proc.stdout.strip().endswith("ok"), proc.stderr[-2000:]
