"""Latency tables (cache key, hit / miss, reuse across runs and models), timing in alternating rounds, the noise
flag under a simulated load, and deployments that cannot run here (one clear error)."""

import json
import os
import sys

import pytest
import torch
from torch import nn

from prunefx.metrics import Deployment, MetricsError, compare_latency, latency
from prunefx.metrics.latency import noise_reason, time_runs
from prunefx.metrics.latency_table import SCHEMA, LatencyTable, LayerCase, table_key
from prunefx.metrics.layer_cases import per_channel, resized

DEP = Deployment(threads=1, batch=2)


class Counter:
    """A synthetic timer: 1 ms per 1000 weights; remembers what it was asked to time."""

    def __init__(self) -> None:
        self.asked: list[str] = []

    def __call__(self, cases):
        self.asked += list(cases)
        return {s: sum(p.numel() for p in c.layer.parameters()) / 1000 for s, c in cases.items()}


def conv(cin: int, cout: int) -> LayerCase:
    return LayerCase(nn.Conv2d(cin, cout, 3, padding=1), (2, cin, 8, 8))


def test_table_key_names_everything_a_layer_time_depends_on(tmp_path) -> None:
    key = table_key(DEP)
    assert set(key) == {"backend", "backend_version", "device", "processor", "machine", "dtype", "threads", "batch"}
    assert key["threads"] == 1 and key["batch"] == 2 and key["backend_version"] == f"torch {torch.__version__}"
    table = LatencyTable(DEP, tmp_path, timer=Counter())
    assert table.path.parent == tmp_path and table.name.startswith("torch-cpu-b2-float32-t1-")
    with pytest.raises(MetricsError, match="resolved deployment"):
        table_key(Deployment())


def test_miss_then_hit_across_runs(tmp_path) -> None:
    timer = Counter()
    table = LatencyTable(DEP, tmp_path, timer=timer)
    ms = table.lookup({"a": conv(8, 16), "b": conv(8, 16), "c": conv(16, 16)})
    assert (table.misses, table.hits) == (3, 0) and len(timer.asked) == 2  # same shape measured once
    assert ms["a"] == ms["b"] == pytest.approx((8 * 16 * 9 + 16) / 1000)
    data = json.loads(table.path.read_text())
    assert data["schema"] == SCHEMA and data["key"] == table_key(DEP) and set(data["entries"]) == set(timer.asked)

    again_timer = Counter()  # a new run (a new table object) reads the file: nothing is measured again
    again = LatencyTable(DEP, tmp_path, timer=again_timer)
    assert again.lookup({"x": conv(16, 16)}) == {"x": ms["c"]}
    assert (again.hits, again.misses, again_timer.asked) == (1, 0, [])


def test_another_key_is_another_table(tmp_path) -> None:
    LatencyTable(DEP, tmp_path, timer=Counter()).lookup({"a": conv(8, 8)})
    timer = Counter()
    other = LatencyTable(Deployment(threads=2, batch=2), tmp_path, timer=timer)
    other.lookup({"a": conv(8, 8)})
    assert other.misses == 1 and len(timer.asked) == 1 and len(list(tmp_path.glob("*.json"))) == 2


def test_corrupt_or_foreign_cache_is_remeasured(tmp_path) -> None:
    table = LatencyTable(DEP, tmp_path, timer=Counter())
    tmp_path.joinpath(table.name).write_text("{not json")
    timer = Counter()
    LatencyTable(DEP, tmp_path, timer=timer).lookup({"a": conv(8, 8)})
    assert len(timer.asked) == 1
    data = json.loads(tmp_path.joinpath(table.name).read_text())
    data["key"]["threads"] = 99  # a file whose key does not match is not trusted
    tmp_path.joinpath(table.name).write_text(json.dumps(data))
    timer = Counter()
    LatencyTable(DEP, tmp_path, timer=timer).lookup({"a": conv(8, 8)})
    assert len(timer.asked) == 1


def test_real_measurement_path_fills_the_table(tmp_path) -> None:
    """The default timer (no thresholds on the numbers: only that every case got a positive time)."""
    table = LatencyTable(DEP, None, warmup=1, repeats=2, rounds=2)
    ms = table.lookup({"a": conv(4, 8), "b": LayerCase(nn.BatchNorm2d(4), (2, 4, 8, 8))})
    assert set(ms) == {"a", "b"} and all(v > 0 for v in ms.values()) and table.path is None


def test_resized_layers() -> None:
    dw = nn.Conv2d(32, 32, 3, padding=1, groups=32, bias=False)
    case = resized(dw, 24, None, (1, 32, 16, 16))
    assert per_channel(dw) and case.layer.groups == 24 and case.layer.out_channels == 24
    assert case.input_shape == (1, 24, 16, 16) and case.layer.bias is not None  # as deployed: BatchNorm folded
    grouped = nn.Conv2d(32, 64, 3, groups=4)
    assert resized(grouped, 16, 32, (1, 32, 8, 8)).layer.groups == 4 and resized(grouped, 18, 32, (1, 32, 8, 8)) is None
    lin = resized(nn.Linear(768, 3072), 512, None, (1, 197, 768))
    assert (lin.layer.in_features, lin.layer.out_features, lin.input_shape) == (512, 3072, (1, 197, 512))
    assert resized(nn.ReLU(), 4, 4, (1, 4)) is None  # no builder: not timed on its own


def test_time_runs_alternates_rounds() -> None:
    order: list[str] = []
    runs = {n: (lambda n=n: order.append(n)) for n in ("base", "pruned")}
    samples = time_runs(runs, warmup=1, repeats=4, rounds=4)
    assert order[:2] == ["base", "pruned"]  # warm-up
    assert order[2:] == ["base", "pruned", "pruned", "base", "base", "pruned", "pruned", "base"]
    assert [len(v) for v in samples.values()] == [4, 4]


def test_noise_reason() -> None:
    assert noise_reason(10.0, 11.0, 2.0, 2) is None
    assert noise_reason(10.0, 11.0, 5.1, 2) == "noisy: load 5.1 on 2 cores"
    assert noise_reason(10.0, 17.0, 1.0, 2) == "noisy: p90 1.70x the median"
    assert noise_reason(10.0, 17.0, None, None) == "noisy: p90 1.70x the median"


def test_simulated_load_flags_the_comparison(monkeypatch) -> None:
    monkeypatch.setattr(os, "getloadavg", lambda: (5.1, 4.0, 3.0))
    monkeypatch.setattr(os, "cpu_count", lambda: 2)
    net = nn.Sequential(nn.Conv2d(3, 4, 3), nn.BatchNorm2d(4)).eval()
    timed = compare_latency({"baseline": net, "pruned": net}, torch.randn(1, 3, 8, 8), DEP, warmup=0, repeats=2)
    for lat in timed.values():
        assert lat.noise.startswith("noisy: load 5.1 on 2 cores") and lat.load_avg == 5.1 and lat.cpu_count == 2
        assert lat.rounds == 2 and lat.repeats == 2 and lat.batch_size == 2 and lat.threads == 1
        assert lat.deployed == "BatchNorm folded (1 of 1)"


def test_deployments_that_cannot_run_here_are_one_clear_error(monkeypatch) -> None:
    with pytest.raises(MetricsError, match="unknown latency backend 'tensorrt'; choose one of torch, onnxruntime"):
        Deployment(backend="tensorrt")
    with pytest.raises(MetricsError, match="'cpu' or 'cuda'"):
        Deployment(device="mps")
    if torch.cuda.device_count() < 8:
        with pytest.raises(MetricsError, match="cuda:7"):
            latency(nn.Conv2d(3, 3, 1), torch.randn(1, 3, 4, 4), device="cuda:7")
    monkeypatch.setitem(sys.modules, "onnxruntime", None)  # import fails as if it were not installed
    with pytest.raises(MetricsError, match=r"not installed: pip install 'prunefx\[deploy\]'"):
        latency(nn.Conv2d(3, 3, 1), torch.randn(1, 3, 4, 4), backend="onnxruntime")


def test_onnxruntime_backend_times_an_export() -> None:
    net = nn.Sequential(nn.Conv2d(3, 4, 3), nn.BatchNorm2d(4), nn.ReLU()).eval()
    lat = latency(net, torch.randn(1, 3, 8, 8), warmup=1, repeats=2, threads=1, backend="onnxruntime")
    assert lat.backend == "onnxruntime" and lat.deployed.startswith("ONNX Runtime 1.31.1, opset 18")
    assert lat.median_ms > 0 and lat.threads == 1
