"""Report: schema validation, deltas, atomic files (json, md, png) and the terminal table."""

from __future__ import annotations

import copy
import json
from pathlib import Path

import pytest
import torch
from rich.console import Console
from torch import nn

from prunefx.metrics import latency, measure
from prunefx.report import (
    ReportError,
    Stage,
    SweepPoint,
    build_report,
    load_report,
    render_table,
    validate_report,
    write_report,
)

PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"


def net(width: int) -> nn.Sequential:
    return nn.Sequential(
        nn.Conv2d(3, width, 3, padding=1), nn.BatchNorm2d(width), nn.ReLU(),
        nn.Conv2d(width, width, 3), nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(width, 10),
    )  # fmt: skip


X = torch.randn(2, 3, 16, 16)


def stage(width: int, metrics: dict[str, float], timed: bool = True) -> Stage:
    model = net(width)
    return Stage(measure(model, X), latency(model, X, warmup=1, repeats=3) if timed else None, metrics)


@pytest.fixture(scope="module")
def report() -> dict:
    return build_report(
        model="toy-cnn",
        baseline=stage(16, {"top1": 0.75, "top5": 0.92}),
        pruned=stage(8, {"top1": 0.60}),
        finetuned=stage(8, {"top1": 0.72, "top5": 0.90}),
        widths=[("0", 16, 8), ("3", 16, 8)],
        sweep=[SweepPoint(r, measure(net(w), X), {"top1": t}) for r, w, t in [(0.25, 12, 0.74), (0.5, 8, 0.72)]],
        settings={"ratio": 0.5, "method": "l1"},
    )


def test_deltas_are_against_baseline(report: dict) -> None:
    base, pruned, tuned = (report["stages"][s] for s in ("baseline", "pruned", "finetuned"))
    assert base["delta"] == {} and base["metrics_delta"] == {}
    for key in ("macs", "flops", "params", "size_bytes"):
        assert pruned["delta"][key]["abs"] == pruned[key] - base[key]
        assert pruned["delta"][key]["rel"] == pytest.approx((pruned[key] - base[key]) / base[key])
    assert pruned["flops"] == 2 * pruned["macs"] and pruned["delta"]["macs"]["rel"] < -0.5
    lat = pruned["delta"]["latency_median_ms"]
    assert lat["abs"] == pytest.approx(pruned["latency"]["median_ms"] - base["latency"]["median_ms"])
    assert pruned["metrics_delta"] == {"top1": {"abs": pytest.approx(-0.15), "rel": pytest.approx(-0.2)}}
    assert set(tuned["metrics_delta"]) == {"top1", "top5"}  # only metrics both stages have
    assert report["widths"] == [{"name": "0", "before": 16, "after": 8}, {"name": "3", "before": 16, "after": 8}]
    assert "FLOPs = 2 x MACs" in report["conventions"]["flops"]
    assert report["machine"]["cpu_count"] >= 1 and report["machine"]["torch"] == torch.__version__


def test_write_and_load_round_trip(report: dict, tmp_path: Path) -> None:
    written = write_report(tmp_path / "run", report)
    names = {p.name for p in written}
    assert names == {"report.json", "report.md", "report.html", "widths.png", "accuracy_vs_flops.png"}
    assert sorted(p.name for p in (tmp_path / "run").iterdir()) == sorted(names)  # no temp files left
    loaded = load_report(tmp_path / "run")
    assert loaded == json.loads(json.dumps(report))
    for name in ("widths.png", "accuracy_vs_flops.png"):
        data = (tmp_path / "run" / name).read_bytes()
        assert data.startswith(PNG_SIGNATURE) and len(data) > 1000
    md = (tmp_path / "run" / "report.md").read_text()
    assert "| stage | GMACs | GFLOPs | params (M) | size (MB) |" in md
    assert "| pruned |" in md and "| finetuned |" in md and "FLOPs = 2 x MACs" in md
    assert "![widths](widths.png)" in md and "## Widths per group" in md and "## Sweep" in md


def test_rewrite_replaces_previous_files(report: dict, tmp_path: Path) -> None:
    write_report(tmp_path, report)
    changed = copy.deepcopy(report)
    changed["model"] = "toy-cnn-v2"
    write_report(tmp_path, changed)
    assert load_report(tmp_path)["model"] == "toy-cnn-v2"
    assert not [p for p in tmp_path.iterdir() if p.name.startswith(".")]


def test_minimal_report_without_optional_parts(tmp_path: Path) -> None:
    minimal = build_report(model="m", baseline=stage(8, {}, timed=False), pruned=stage(4, {}, timed=False))
    pruned = minimal["stages"]["pruned"]
    assert pruned["latency"] is None and "latency_median_ms" not in pruned["delta"]
    names = {p.name for p in write_report(tmp_path, minimal)}
    assert names == {"report.json", "report.md", "report.html"}  # no widths, no sweep: no plots


def test_unknown_size_is_null_not_zero() -> None:
    with torch.device("meta"):
        on_meta = net(8)
    meta_stage = Stage(measure(on_meta, X))
    r = build_report(model="m", baseline=stage(16, {}, timed=False), pruned=meta_stage)
    assert r["stages"]["pruned"]["size_bytes"] is None and "size_bytes" not in r["stages"]["pruned"]["delta"]
    console = Console(record=True, width=220)
    console.print(render_table(r))
    assert "pruned" in console.export_text()


@pytest.mark.parametrize(
    ("breakage", "message"),
    [
        (lambda r: r["stages"]["pruned"].pop("macs"), "stages.pruned: missing 'macs'"),
        (lambda r: r["stages"].pop("baseline"), "stages: missing 'baseline'"),
        (lambda r: r["stages"]["pruned"].update(flops=1), "must be 2 x macs"),
        (lambda r: r.update(schema="other/9"), "schema: expected 'prunefx.report/1'"),
        (lambda r: r["stages"]["baseline"]["latency"].pop("median_ms"), "latency: missing 'median_ms'"),
        (lambda r: r["stages"]["baseline"]["metrics"].update(top1="high"), "metrics.top1 must be a number"),
        (lambda r: r["widths"][0].update(after=None), r"widths\[0\].after must be an integer, got None"),
        (lambda r: r.update(sweep={}), "sweep must be a list"),
        (lambda r: r.update(extra=1), "unknown key in Report: 'extra'"),
        (lambda r: r["stages"]["pruned"]["delta"]["macs"].update(rel="x"), "delta.macs"),
    ],
)
def test_broken_reports_fail_validation(report: dict, breakage, message: str) -> None:
    broken = copy.deepcopy(report)
    breakage(broken)
    with pytest.raises(ReportError, match=message):
        validate_report(broken)


def test_load_report_errors(tmp_path: Path) -> None:
    with pytest.raises(ReportError, match="no report.json"):
        load_report(tmp_path)
    (tmp_path / "report.json").write_text("{not json")
    with pytest.raises(ReportError, match="not valid JSON"):
        load_report(tmp_path)
    (tmp_path / "report.json").write_text(json.dumps({"schema": "prunefx.report/1"}))
    with pytest.raises(ReportError, match="Report: missing 'model', .*'stages'"):
        load_report(tmp_path)


def test_settings_must_be_json(tmp_path: Path) -> None:
    with pytest.raises(ReportError, match="JSON-serializable"):
        build_report(model="m", baseline=stage(8, {}, False), pruned=stage(4, {}, False), settings={"f": object()})


def test_render_table(report: dict) -> None:
    table = render_table(report)
    assert [c.header for c in table.columns] == ["quantity", "baseline", "pruned", "finetuned"]
    quantities = list(table.columns[0].cells)
    assert quantities[:2] == ["GMACs", "GFLOPs"] and quantities[-2:] == ["top1", "top5"]
    console = Console(record=True, width=220)
    console.print(table)
    text = console.export_text()
    pruned_gmacs = report["stages"]["pruned"]["macs"] / 1e9
    assert "baseline" in text and f"{pruned_gmacs:.3f} (" in text and "%" in text


def test_widths_plot_groups_many_layers_into_stages():
    """widths.png stays readable for 100+ groups: per-stage bars (<= 30 stages, deepest module prefix that fits)."""
    from prunefx.report.plots import _stages, widths_png

    names = [f"layer{i}.{j}.conv{k} out[0:64]" for i in range(1, 5) for j in range(6) for k in range(1, 4)]
    assert _stages(names)[:3] == ["layer1.0"] * 3 and len(set(_stages(names))) == 24
    many = [f"blocks.{i}.mlp.fc1 out[0:64]" for i in range(40)]
    assert set(_stages(many)) == {"blocks"}  # 40 stages would not fit: one level up
    png = widths_png([{"name": n, "before": 64, "after": 32} for n in names], "resnet, target: flops 0.5")
    assert png[:8] == b"\x89PNG\r\n\x1a\n"
