"""Measure forward latency: wall-clock time of real forwards, summarised by median and spread, flagged when noisy.

    lat = latency(model, x, threads=2)                                    # one model
    cmp = compare_latency({"baseline": m0, "pruned": m1}, x, Deployment(threads=2))   # alternating rounds
    cmp["pruned"].median_ms / cmp["baseline"].median_ms, cmp["pruned"].noise

Models compared are timed in alternating rounds (base, pruned, pruned, base, ...), so a slow spell of a shared
machine hits all of them rather than the one that happened to be running. The machine's load average is read
before and after; a timing whose spread or load makes it unreliable carries a ``noise`` reason
("noisy: load 5.1 on 2 cores") that reports print instead of a change they cannot vouch for.

``max_seconds`` bounds the wall time: timing stops after the round that reaches it (never before the first),
whichever comes first of it and ``rounds``; the result then says so (``cut_short``, fewer ``rounds`` and
``repeats``). ``progress(done, total)`` is called after every round.
"""

from __future__ import annotations

import contextlib
import math
import os
import time
from collections.abc import Callable, Mapping
from dataclasses import asdict, dataclass, replace
from typing import Any

import numpy as np
import torch
from torch import nn

from prunefx._gc import gc_paused
from prunefx.metrics.backends import Deployment, prepared
from prunefx.metrics.common import MetricsError, as_args, check_model

CONVENTION = (
    "wall-clock per forward after warm-up (eval, no_grad, garbage collection paused), as deployed: torch eager "
    "with eval BatchNorm folded into convolutions (fold_bn; as is when the model cannot be traced), or ONNX Runtime "
    "on an ONNX export; models compared are timed in alternating rounds; median with p10/p90 over all repeats; "
    "CUDA timings synchronise after each forward; 'noise' says why a timing is unreliable (1-min load average above "
    "the core count + 0.5, or p90 above 1.25x the median)"
)
SPREAD_LIMIT = 1.25  # p90 / median above this: the repeats disagree too much for a median to mean much
LOAD_MARGIN = 0.5  # load average above cores + this: more runnable work than cores while timing


@dataclass(frozen=True)
class Latency:
    """Summary of ``repeats`` timed forwards, in milliseconds, and the conditions they were timed under."""

    median_ms: float
    p10_ms: float
    p90_ms: float
    min_ms: float
    mean_ms: float
    repeats: int
    warmup: int
    batch_size: int
    threads: int  # intra-op threads while timing
    device: str
    channels_last: bool
    torch_version: str
    backend: str = "torch"
    deployed: str = ""  # what ran: "BatchNorm folded (52 of 52)", "as is", "ONNX Runtime's own"
    rounds: int = 1  # alternating rounds the repeats were spread over (taken: fewer when max_seconds cut it short)
    load_avg: float | None = None  # highest 1-min load average seen before / after timing (None: unknown)
    cpu_count: int | None = None
    noise: str | None = None  # why this timing is unreliable, or None
    cut_short: str | None = None  # the wall-time bound stopped timing early: how many rounds of how many, or None

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready dict of every field."""
        return asdict(self)


def noise_reason(median_ms: float, p90_ms: float, load_avg: float | None, cpu_count: int | None) -> str | None:
    """Why a timing with this spread under this load is unreliable ("noisy: load 5.1 on 2 cores"), or None."""
    reasons = []
    if load_avg is not None and cpu_count and load_avg > cpu_count + LOAD_MARGIN:
        reasons.append(f"load {load_avg:.1f} on {cpu_count} cores")
    if median_ms > 0 and p90_ms / median_ms > SPREAD_LIMIT:
        reasons.append(f"p90 {p90_ms / median_ms:.2f}x the median")
    return "noisy: " + ", ".join(reasons) if reasons else None


def _load() -> float | None:
    try:
        return os.getloadavg()[0]
    except (OSError, AttributeError):  # not every platform has a load average
        return None


def time_runs(
    runs: Mapping[str, Callable[[], Any]], *, warmup: int, repeats: int, rounds: int, budget_s: float | None = None,
    max_seconds: float | None = None, on_round: Callable[[int, int], None] | None = None,
    clock: Callable[[], float] = time.perf_counter,
) -> dict[str, list[float]]:
    """Milliseconds of ``repeats`` calls of each run, spread over ``rounds`` alternating rounds (after ``warmup``).

    Round r visits the runs in order when r is even and in reverse when odd, so none is always first.
    ``budget_s``: fewer repeats (never fewer than ``rounds``) when the slowest warm-up call says ``repeats``
    calls of it would take longer than this. ``max_seconds``: no round starts once ``clock`` says this much
    time has passed since the call (warm-up included); the first round always runs. ``on_round(done, rounds)``
    runs after every round.
    """
    began = clock()
    names = list(runs)
    samples: dict[str, list[float]] = {n: [] for n in names}
    slowest = 0.0
    for name in names:
        for _ in range(warmup):
            start = time.perf_counter()
            runs[name]()
            slowest = max(slowest, time.perf_counter() - start)
    if budget_s is not None and warmup and slowest * repeats > budget_s:
        repeats = max(rounds, int(budget_s / slowest))
    per_round = max(1, math.ceil(repeats / rounds))
    with gc_paused():  # a collection inside one timed forward would be noise, as timeit reasons
        for r in range(rounds):
            for name in names if r % 2 == 0 else names[::-1]:
                run, out = runs[name], samples[name]
                for _ in range(min(per_round, repeats - len(out))):
                    start = time.perf_counter()
                    run()
                    out.append((time.perf_counter() - start) * 1e3)
            if on_round is not None:
                on_round(r + 1, rounds)
            if max_seconds is not None and clock() - began >= max_seconds:
                break
    return samples


def cut_short_note(taken: int, rounds: int, max_seconds: float | None) -> str | None:
    """Why a timing has fewer rounds than asked ("stopped at the 60 s bound after 2 of 6 rounds"), or None."""
    if taken >= rounds or max_seconds is None:
        return None
    return f"stopped at the {max_seconds:g} s bound after {taken} of {rounds} rounds"


def _summary(samples: list[float], warmup: int, rounds: int, dep: Deployment, deployed: str, load, cores) -> Latency:
    p10, median, p90 = np.percentile(samples, [10, 50, 90])
    return Latency(
        median_ms=float(median), p10_ms=float(p10), p90_ms=float(p90), min_ms=min(samples),
        mean_ms=float(np.mean(samples)), repeats=len(samples), warmup=warmup, batch_size=int(dep.batch or 1),
        threads=int(dep.threads or torch.get_num_threads()), device=dep.device, channels_last=False,
        torch_version=torch.__version__, backend=dep.backend, deployed=deployed, rounds=rounds, load_avg=load,
        cpu_count=cores, noise=noise_reason(float(median), float(p90), load, cores),
    )


def compare_latency(
    models: Mapping[str, nn.Module],
    example_inputs: Any,
    deployment: Deployment | None = None,
    *,
    warmup: int = 5,
    repeats: int = 30,
    rounds: int = 6,
    channels_last: bool = False,
    budget_s: float | None = None,
    max_seconds: float | None = None,
    progress: Callable[[int, int], None] | None = None,
) -> dict[str, Latency]:
    """Time every model in ``models`` on ``deployment`` in ``rounds`` alternating rounds; one Latency per name.

    Each model runs ``repeats`` timed forwards in all (``repeats / rounds`` per round) after ``warmup`` untimed
    ones (fewer, never under ``rounds``, when that would take a model more than ``budget_s`` seconds). Each
    result records the threads, rounds, load average and core count once, and a ``noise`` reason when the
    timing is unreliable. ``max_seconds`` stops timing after the round that reaches it (the result's
    ``cut_short`` says so); ``progress(rounds done, rounds)`` is called after every round.
    """
    if not models:
        raise MetricsError("compare_latency() needs at least one model")
    for model in models.values():
        check_model(model, "compare_latency")
    if warmup < 0 or repeats < 1 or rounds < 1:
        raise MetricsError(f"need warmup >= 0, repeats >= 1 and rounds >= 1, got {warmup}, {repeats}, {rounds}.")
    if max_seconds is not None and not max_seconds > 0:
        raise MetricsError(f"max_seconds must be positive (or None: no bound), got {max_seconds}.")
    rounds = min(rounds, repeats)
    taken = [0]

    def on_round(done: int, total: int) -> None:
        taken[0] = done
        if progress is not None:
            progress(done, total)

    args = as_args(example_inputs, next(iter(models.values())))  # every model takes the same inputs
    dep = (deployment or Deployment()).resolve(args)
    cores = os.cpu_count()
    loads = [_load()]
    with contextlib.ExitStack() as stack:
        runs = {n: stack.enter_context(prepared(m, args, dep, channels_last=channels_last)) for n, m in models.items()}
        previous = torch.get_num_threads()
        torch.set_num_threads(dep.threads)
        try:
            samples = time_runs(runs, warmup=warmup, repeats=repeats, rounds=rounds, budget_s=budget_s,
                                max_seconds=max_seconds, on_round=on_round)
        finally:
            torch.set_num_threads(previous)
        deployed = {n: r.deployed for n, r in runs.items()}
    loads.append(_load())
    load = None if None in loads else max(loads)
    out = {}
    cut = cut_short_note(taken[0], rounds, max_seconds)
    for name in models:
        lat = _summary(samples[name], warmup, taken[0], dep, deployed[name], load, cores)
        out[name] = replace(lat, channels_last=channels_last, cut_short=cut)
    return out


def latency(
    model: nn.Module,
    example_inputs: Any,
    *,
    warmup: int = 10,
    repeats: int = 50,
    threads: int | None = None,
    device: str = "cpu",
    channels_last: bool = False,
    backend: str = "torch",
    fold_bn: bool = True,
) -> Latency:
    """Time ``repeats`` forwards of ``model(*example_inputs)`` after ``warmup`` untimed ones.

    Runs as deployed on ``backend`` ("torch": eval, no_grad, eval BatchNorm folded unless ``fold_bn=False``;
    "onnxruntime": an in-memory ONNX export) on ``device``; ``threads`` sets the intra-op thread count for the
    measurement only. The model's flags, cached attributes and torch's thread count are restored.

    >>> latency(model, torch.randn(1, 3, 224, 224), repeats=30, threads=1).median_ms
    """
    check_model(model, "latency")
    if warmup < 0 or repeats < 1:
        raise MetricsError(f"need warmup >= 0 and repeats >= 1, got warmup={warmup}, repeats={repeats}.")
    if threads is not None and threads < 1:
        raise MetricsError(f"threads must be a positive integer or None (torch's default), got {threads}.")
    dep = Deployment(backend=backend, device=device, threads=threads, fold_bn=fold_bn)
    return compare_latency(
        {"model": model}, example_inputs, dep, warmup=warmup, repeats=repeats, rounds=1, channels_last=channels_last
    )["model"]
