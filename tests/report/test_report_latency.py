"""The report's latency: timing stated once (threads, rounds, load), and a noisy timing printed as its reason instead
of a percentage change it cannot vouch for (issue 12 item 4), with the noise simulated by an injected load."""

import dataclasses
import io
import os

import pytest
import torch
from rich.console import Console
from torch import nn

from prunefx.metrics import Deployment, compare_latency, measure
from prunefx.report import Stage, build_report, render_table, write_report

X = torch.randn(1, 3, 16, 16)


def nets() -> dict[str, nn.Module]:
    return {name: nn.Sequential(nn.Conv2d(3, w, 3), nn.BatchNorm2d(w), nn.ReLU()).eval()
            for name, w in (("baseline", 16), ("pruned", 8))}  # fmt: skip


def report_for(models: dict[str, nn.Module], timed: dict) -> dict:
    stages = {n: Stage(measure(m, X), timed[n]) for n, m in models.items()}
    return build_report(model="toy", baseline=stages["baseline"], pruned=stages["pruned"])


def test_noisy_latency_is_flagged_instead_of_a_change(monkeypatch, tmp_path) -> None:
    monkeypatch.setattr(os, "getloadavg", lambda: (5.1, 4.0, 3.0))
    monkeypatch.setattr(os, "cpu_count", lambda: 2)
    models = nets()
    timed = compare_latency(models, X, Deployment(threads=1), warmup=0, repeats=2)
    report = report_for(models, timed)
    delta = report["stages"]["pruned"]["delta"]["latency_median_ms"]
    assert delta["noise"].startswith("noisy: load 5.1 on 2 cores")
    rel = delta["rel"]
    assert rel is not None  # the number stays in report.json; the renderings refuse to present it as a change
    write_report(tmp_path, report)
    md = (tmp_path / "report.md").read_text()
    assert "(noisy: load 5.1 on 2 cores" in md and f"{rel * 100:+.1f}%" not in md
    assert "the latency changes above are not reliable" in md
    assert report["timing"]["load_avg"] == 5.1 and report["timing"]["alternating"] is True
    out = io.StringIO()
    Console(file=out, width=200).print(render_table(report))
    assert "noisy: load 5.1 on 2 cores" in out.getvalue() and f"{rel * 100:+.1f}%" not in out.getvalue()


def test_quiet_latency_shows_the_change_and_states_threads_once(monkeypatch) -> None:
    monkeypatch.setattr(os, "getloadavg", lambda: (0.5, 0.5, 0.5))
    models = nets()
    timed = compare_latency(models, X, Deployment(threads=1), warmup=0, repeats=2)
    timed = {n: dataclasses.replace(t, p90_ms=t.median_ms, noise=None) for n, t in timed.items()}  # no spread
    report = report_for(models, timed)
    delta = report["stages"]["pruned"]["delta"]["latency_median_ms"]
    assert "noise" not in delta
    assert report["machine"]["torch_threads"] == 1 == report["timing"]["threads"]
    assert report["timing"]["noise"] is None and report["timing"]["rounds"] == 2
    assert delta["rel"] == pytest.approx(timed["pruned"].median_ms / timed["baseline"].median_ms - 1)
