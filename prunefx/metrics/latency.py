"""Measure forward latency: wall-clock time of real forwards, summarised by median and spread."""

from __future__ import annotations

import copy
import gc
import itertools
import time
from dataclasses import asdict, dataclass
from typing import Any

import numpy as np
import torch
from torch import nn
from torch.utils._pytree import tree_map_only

from prunefx.metrics.common import MetricsError, as_args, batch_size, check_model, rejected, untouched

CONVENTION = (
    "wall-clock per forward (eval, no_grad, garbage collection paused) after warmup; median with "
    "p10/p90 over repeats; CUDA timings synchronize before and after each forward"
)


@dataclass(frozen=True)
class Latency:
    """Summary of ``repeats`` timed forwards, in milliseconds."""

    median_ms: float
    p10_ms: float
    p90_ms: float
    min_ms: float
    mean_ms: float
    repeats: int
    warmup: int
    batch_size: int
    threads: int  # torch.get_num_threads() while timing
    device: str
    channels_last: bool
    torch_version: str

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready dict of every field."""
        return asdict(self)


def _placed(model: nn.Module, device: torch.device, channels_last: bool) -> nn.Module:
    # Moving or re-laying-out a module happens in place, so that work is done on a copy.
    current = next(itertools.chain(model.parameters(), model.buffers()), None)
    if (current is None or current.device == device) and not channels_last:
        return model
    clone = copy.deepcopy(model).to(device)
    return clone.to(memory_format=torch.channels_last) if channels_last else clone


def _placed_inputs(args: tuple[Any, ...], device: torch.device, channels_last: bool) -> tuple[Any, ...]:
    def place(t: torch.Tensor) -> torch.Tensor:
        t = t.to(device)
        return t.contiguous(memory_format=torch.channels_last) if channels_last and t.dim() == 4 else t

    return tree_map_only(torch.Tensor, place, args)


def latency(
    model: nn.Module,
    example_inputs: Any,
    *,
    warmup: int = 10,
    repeats: int = 50,
    threads: int | None = None,
    device: str = "cpu",
    channels_last: bool = False,
) -> Latency:
    """Time ``repeats`` forwards of ``model(*example_inputs)`` after ``warmup`` untimed ones.

    Runs in eval mode under ``torch.no_grad`` on ``device`` (the model is copied if it lives elsewhere
    or ``channels_last`` is asked for); ``threads`` sets torch's intra-op thread count for the
    measurement only. The model's flags, cached attributes and torch's thread count are restored.

    >>> latency(model, torch.randn(1, 3, 224, 224), repeats=30, threads=1).median_ms
    """
    check_model(model, "latency")
    if warmup < 0 or repeats < 1:
        raise MetricsError(f"need warmup >= 0 and repeats >= 1, got warmup={warmup}, repeats={repeats}.")
    if threads is not None and threads < 1:
        raise MetricsError(f"threads must be a positive integer or None (torch's default), got {threads}.")
    target = torch.device(device)
    cuda = target.type == "cuda"
    if cuda and not torch.cuda.is_available():
        raise MetricsError(f"device={device!r} but CUDA is not available here; use device='cpu'.")
    if cuda and target.index is None:  # "cuda" means the current device; name it so placement compares equal
        target = torch.device("cuda", torch.cuda.current_device())
    args = _placed_inputs(as_args(example_inputs), target, channels_last)
    runner = _placed(model, target, channels_last)

    def sync() -> None:
        if cuda:
            torch.cuda.synchronize(target)

    previous_threads = torch.get_num_threads()
    gc_was_enabled = gc.isenabled()
    samples = []
    try:
        if threads is not None:
            torch.set_num_threads(threads)
        used_threads = torch.get_num_threads()
        with untouched(runner), torch.no_grad():
            for _ in range(warmup):
                runner(*args)
            gc.disable()  # a collection inside one timed forward would be noise, as timeit reasons
            for _ in range(repeats):
                sync()
                start = time.perf_counter()
                runner(*args)
                sync()
                samples.append((time.perf_counter() - start) * 1e3)
    except Exception as exc:  # any failure of the forward is a bad-input error
        raise rejected(exc, args) from exc
    finally:
        if gc_was_enabled:
            gc.enable()
        torch.set_num_threads(previous_threads)
    p10, median, p90 = np.percentile(samples, [10, 50, 90])
    return Latency(
        median_ms=float(median),
        p10_ms=float(p10),
        p90_ms=float(p90),
        min_ms=min(samples),
        mean_ms=float(np.mean(samples)),
        repeats=repeats,
        warmup=warmup,
        batch_size=batch_size(args),
        threads=used_threads,
        device=str(target),
        channels_last=channels_last,
        torch_version=torch.__version__,
    )
