"""The latency timing's wall-time bound: rounds stop at it, progress counts rounds, the result says it was cut."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from prunefx.metrics import Deployment, MetricsError, compare_latency
from prunefx.metrics.latency import time_runs

DEP = Deployment(threads=1)
NET = nn.Sequential(nn.Conv2d(3, 4, 3), nn.BatchNorm2d(4)).eval()
X = torch.randn(1, 3, 8, 8)


class FakeClock:
    """A clock that moves only when a timed run advances it."""

    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now

    def advance(self, seconds: float) -> None:
        self.now += seconds


def test_no_round_starts_after_the_bound() -> None:
    clock = FakeClock()
    runs = {n: (lambda: clock.advance(1.0)) for n in ("base", "pruned")}
    seen: list[tuple[int, int]] = []
    # 12 repeats in 6 rounds: 2 calls of each run a round, 4 s a round; at 10 s the third round (ending at 12 s)
    # is the last one started
    samples = time_runs(runs, warmup=0, repeats=12, rounds=6, max_seconds=10.0, clock=clock,
                        on_round=lambda d, t: seen.append((d, t)))
    assert seen == [(1, 6), (2, 6), (3, 6)]
    assert {len(v) for v in samples.values()} == {6}


def test_without_a_bound_every_round_runs() -> None:
    clock = FakeClock()
    runs = {n: (lambda: clock.advance(1.0)) for n in ("base", "pruned")}
    seen: list[int] = []
    samples = time_runs(runs, warmup=0, repeats=12, rounds=6, clock=clock, on_round=lambda d, _t: seen.append(d))
    assert seen == [1, 2, 3, 4, 5, 6]
    assert {len(v) for v in samples.values()} == {12}


def test_warm_up_counts_against_the_bound_but_one_round_always_runs() -> None:
    clock = FakeClock()
    runs = {"base": lambda: clock.advance(100.0)}
    seen: list[int] = []
    samples = time_runs(runs, warmup=2, repeats=6, rounds=3, max_seconds=50.0, clock=clock,
                        on_round=lambda d, _t: seen.append(d))
    assert seen == [1] and len(samples["base"]) == 2


def test_compare_latency_records_the_rounds_a_bound_cut_short() -> None:
    rounds: list[tuple[int, int]] = []
    timed = compare_latency({"baseline": NET, "pruned": NET}, X, DEP, warmup=0, repeats=12, rounds=6,
                            max_seconds=1e-9, progress=lambda d, t: rounds.append((d, t)))
    assert rounds == [(1, 6)]
    for lat in timed.values():
        assert lat.rounds == 1 and lat.repeats == 2  # one round of 12 / 6 repeats: fewer repeats, said so
        assert lat.cut_short is not None and "1 of 6 rounds" in lat.cut_short


def test_compare_latency_within_the_bound_is_not_cut() -> None:
    rounds: list[int] = []
    timed = compare_latency({"baseline": NET, "pruned": NET}, X, DEP, warmup=0, repeats=6, rounds=3,
                            max_seconds=3600.0, progress=lambda d, _t: rounds.append(d))
    assert rounds == [1, 2, 3]
    assert all(lat.rounds == 3 and lat.repeats == 6 and lat.cut_short is None for lat in timed.values())


@pytest.mark.parametrize("bad", [0.0, -1.0])
def test_a_bound_that_allows_nothing_is_refused(bad: float) -> None:
    with pytest.raises(MetricsError, match="max_seconds must be positive"):
        compare_latency({"m": NET}, X, DEP, max_seconds=bad)
