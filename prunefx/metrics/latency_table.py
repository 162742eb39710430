"""A lookup table of measured single-layer latencies for one deployment, cached on disk and reused across runs.

    table = LatencyTable(Deployment(threads=2, batch=1))
    ms = table.lookup({"a": LayerCase(nn.Conv2d(64, 48, 3, padding=1), (1, 64, 56, 56))})

**Key.** Everything that changes a layer's time names the file: backend and its version, device and the
processor's model name, dtype, threads and batch. The file is
``<cache_dir>/<backend>-<device>-b<batch>-<dtype>-t<threads>-<sha1 of the key>.json`` (``cache_dir``:
``$PRUNEFX_CACHE_DIR/latency``, default ``.cache/latency`` under the working directory) and holds
``{"schema", "key": {...}, "entries": {signature: {"ms", "p90_ms", "load_avg"}}}``. An entry's signature is the
layer's ``repr`` (every constructor argument that shapes its arithmetic) plus its input shape, so layers of the
same shape in any model share one entry. A missing entry is measured (the layers asked together are timed in
alternating rounds), written back atomically, and found the next time.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import platform
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch import nn

from prunefx._io import atomic_write
from prunefx.metrics.backends import Deployment, backend_version, machine_name, prepared
from prunefx.metrics.common import MetricsError
from prunefx.metrics.latency import _load, time_runs

SCHEMA = "prunefx.latency_table/1"
CHUNK = 8  # layers timed together in one set of alternating rounds (bounds the memory their inputs take)


def default_cache_dir() -> Path:
    """``$PRUNEFX_CACHE_DIR/latency``, else ``.cache/latency`` in the working directory."""
    root = os.environ.get("PRUNEFX_CACHE_DIR")
    return (Path(root) if root else Path(".cache")) / "latency"


@dataclass(frozen=True)
class LayerCase:
    """One standalone layer and the shape of the input it gets (batch included)."""

    layer: nn.Module
    input_shape: tuple[int, ...]

    @property
    def signature(self) -> str:
        return f"{self.layer!r}@{list(self.input_shape)}"


def table_key(dep: Deployment) -> dict[str, Any]:
    """What a layer's time depends on besides the layer: the documented key of a table file."""
    if dep.threads is None or dep.batch is None:
        raise MetricsError("a latency table needs a resolved deployment (Deployment.resolve(example_inputs))")
    return {
        "backend": dep.backend,
        "backend_version": backend_version(dep),
        "device": dep.device,
        "processor": machine_name(dep),
        "machine": platform.machine(),
        "dtype": dep.dtype,
        "threads": dep.threads,
        "batch": dep.batch,
    }


class LatencyTable:
    """Measured milliseconds of single layers on one deployment, read from and written to one cache file.

    ``hits`` and ``misses`` count lookups answered from the table and measured now. ``cache_dir=None`` keeps
    the table in memory only. ``timer`` replaces the measurement (tests inject synthetic timings with it):
    it gets the cases to time and returns their milliseconds.
    """

    def __init__(
        self,
        deployment: Deployment,
        cache_dir: str | os.PathLike[str] | None = "default",
        *,
        warmup: int = 3,
        repeats: int = 9,
        rounds: int = 3,
        timer: Callable[[Mapping[str, LayerCase]], Mapping[str, float]] | None = None,
    ) -> None:
        self.deployment = deployment
        self.key = table_key(deployment)
        digest = hashlib.sha1(json.dumps(self.key, sort_keys=True).encode()).hexdigest()[:10]
        d = deployment
        self.name = f"{d.backend}-{d.device.replace(':', '')}-b{d.batch}-{d.dtype}-t{d.threads}-{digest}.json"
        root = default_cache_dir() if cache_dir == "default" else cache_dir
        self.path = None if root is None else Path(root) / self.name
        self.warmup, self.repeats, self.rounds = warmup, repeats, rounds
        self.timer = timer or self._measure
        self.entries: dict[str, dict[str, float | None]] = {}
        self.hits = self.misses = 0
        if self.path is not None and self.path.is_file():
            self._read()

    def _read(self) -> None:
        try:
            data = json.loads(self.path.read_text())
        except (OSError, json.JSONDecodeError):
            return  # an unreadable cache is remeasured and overwritten, never trusted
        if data.get("schema") == SCHEMA and data.get("key") == self.key and isinstance(data.get("entries"), dict):
            self.entries = {k: v for k, v in data["entries"].items() if isinstance(v, dict) and "ms" in v}

    def save(self) -> None:
        """Write the table atomically (merging entries another process wrote meanwhile)."""
        if self.path is None:
            return
        self.path.parent.mkdir(parents=True, exist_ok=True)
        mine = dict(self.entries)
        self._read()
        self.entries.update(mine)
        data = {"schema": SCHEMA, "key": self.key, "entries": dict(sorted(self.entries.items()))}
        atomic_write(self.path, (json.dumps(data, indent=0) + "\n").encode())

    def __contains__(self, case: LayerCase) -> bool:
        return case.signature in self.entries

    def lookup(self, cases: Mapping[str, LayerCase]) -> dict[str, float]:
        """Milliseconds per case name: from the table, or measured now (then saved)."""
        sig = {name: c.signature for name, c in cases.items()}
        missing: dict[str, LayerCase] = {}
        for name, c in cases.items():
            if sig[name] not in self.entries:
                missing.setdefault(sig[name], c)
        self.hits += len(cases) - sum(1 for n in cases if sig[n] in missing)
        self.misses += sum(1 for n in cases if sig[n] in missing)
        items = list(missing.items())
        for start in range(0, len(items), CHUNK):
            chunk = dict(items[start : start + CHUNK])
            load = _load()
            for s, ms in self.timer(chunk).items():
                self.entries[s] = {"ms": float(ms), "load_avg": load}
            self.save()
        return {name: float(self.entries[sig[name]]["ms"]) for name in cases}

    def _measure(self, cases: Mapping[str, LayerCase]) -> dict[str, float]:
        dep = Deployment(**{**self.deployment.to_dict(), "fold_bn": False})  # layers are timed as they are
        with contextlib.ExitStack() as stack:
            runs = {}
            for s, c in cases.items():
                x = torch.randn(c.input_shape)
                runs[s] = stack.enter_context(prepared(c.layer.eval(), (x,), dep))
            previous = torch.get_num_threads()
            torch.set_num_threads(dep.threads)
            try:
                samples = time_runs(runs, warmup=self.warmup, repeats=self.repeats, rounds=self.rounds)
            finally:
                torch.set_num_threads(previous)
        return {s: float(np.median(v)) for s, v in samples.items()}
