"""The prunefx CLI: printed and JSON numbers equal the library's, bad input is one error line with exit code 2."""

from __future__ import annotations

import functools
import importlib.metadata
import json
import re
import sys
from pathlib import Path

import pytest
import torch
from typer.testing import CliRunner

import prunefx
from prunefx.integrations.ultralytics.env import setup_offline
from prunefx.integrations.ultralytics.gflops import ultralytics_gflops
from prunefx.metrics import latency, measure
from prunefx.report import Stage, build_report, write_report
from prunefx.spec import LoadedModel, load_spec

setup_offline()  # before ultralytics is imported: it reads YOLO_OFFLINE and YOLO_CONFIG_DIR at import

from prunefx.cli.main import app, main

TESTS = Path(__file__).resolve().parents[1]
RESNET = ["torchvision:resnet18", "--imgsz", "64"]
YOLO = ["ultralytics:yolov8n.yaml", "--imgsz", "64"]
TINY = ["_factories:tiny_cnn", "--imgsz", "32"]
SUMMARY = re.compile(
    r"^(?P<model>\w+): (?P<nodes>\d+) nodes, (?P<groups>\d+) groups, (?P<prunable>\d+) prunable, "
    r"(?P<channels>\d+) prunable channels of (?P<total>\d+); frozen groups by reason: .*; [\d.]+ s$",
    re.MULTILINE,
)

runner = CliRunner()


@pytest.fixture(autouse=True)
def factories_importable(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.syspath_prepend(str(TESTS))


@functools.cache
def loaded(spec: str, imgsz: int) -> LoadedModel:
    """The model a SPEC names, built once per test module (analyze, measure and latency leave it unchanged)."""
    return load_spec(spec, imgsz=imgsz)


def invoke(*args: str, columns: int = 160):
    """Run the app in a terminal this wide: wide enough by default that no table cell wraps a number."""
    return runner.invoke(app, list(args), env={"COLUMNS": str(columns)})


def test_console_script_is_main() -> None:
    (script,) = [e for e in importlib.metadata.entry_points(group="console_scripts") if e.name == "prunefx"]
    assert script.value == "prunefx.cli.main:main"


@pytest.mark.parametrize("command", ["analyze", "flops", "report"])
def test_help(command: str) -> None:
    result = invoke(command, "--help")
    assert result.exit_code == 0
    assert f"Usage: prunefx {command} [OPTIONS]" in result.stdout
    assert ("torchvision:NAME" in result.stdout) == (command != "report")


# ---- analyze -----------------------------------------------------------------------------------------


@pytest.mark.parametrize("spec", [RESNET, YOLO], ids=["resnet18", "yolov8n"])
def test_analyze_prints_and_writes_the_librarys_groups(spec: list[str], tmp_path: Path) -> None:
    out = tmp_path / "out" / "groups.json"  # a missing parent directory is created
    result = invoke("analyze", *spec, "--json", str(out))
    assert result.exit_code == 0, result.output
    model = loaded(spec[0], int(spec[2]))
    dg = prunefx.analyze(model.model, model.example_inputs)
    printed = SUMMARY.search(result.stdout)
    assert printed, result.stdout
    assert printed["model"] == dg.model_name
    assert int(printed["nodes"]) == len(dg.gm.graph.nodes)
    assert int(printed["groups"]) == len(dg.groups)
    assert int(printed["prunable"]) == len(dg.prunable)
    assert int(printed["channels"]) == sum(g.channels for g in dg.prunable)
    assert int(printed["total"]) == sum(g.channels for g in dg.groups)
    assert f"{dg.model_name}: channel groups" in result.stdout  # the table's title
    written = json.loads(out.read_text())
    expected = dg.to_dict()
    assert {k: v for k, v in written.items() if k != "seconds"} == {k: v for k, v in expected.items() if k != "seconds"}
    assert sorted(p.name for p in out.parent.iterdir()) == ["groups.json"]  # no temp file left behind


def test_analyze_max_members_truncates_the_table() -> None:
    few = invoke("analyze", *TINY, "--max-members", "1")
    many = invoke("analyze", *TINY, "--max-members", "10")
    assert few.exit_code == many.exit_code == 0
    assert "more)" in few.stdout and "more)" not in many.stdout


# ---- flops -------------------------------------------------------------------------------------------


def test_flops_numbers_and_json_match_measure(tmp_path: Path) -> None:
    out = tmp_path / "flops.json"
    result = invoke("flops", *RESNET, "--json", str(out))
    assert result.exit_code == 0, result.output
    model = loaded("torchvision:resnet18", 64)
    cost = measure(model.model, model.example_inputs, by="leaf")
    assert f"{cost.macs:,} ({cost.macs / 1e9:.3f} G)" in result.stdout
    assert f"{cost.flops:,}" in result.stdout and cost.flops == 2 * cost.macs
    assert f"{cost.params:,}" in result.stdout
    assert "FLOPs = 2 x MACs" in result.stdout
    assert "ultralytics" not in result.stdout  # no ultralytics GFLOPs row for a torchvision model
    top = max(cost.per_module, key=cost.per_module.get)
    assert top in result.stdout  # the breakdown is by leaf module by default
    written = json.loads(out.read_text())
    assert {k: written[k] for k in cost.to_dict()} == cost.to_dict()
    assert written["spec"] == "torchvision:resnet18" and written["kind"] == "torchvision" and written["batch"] == 1
    assert written["ultralytics_gflops"] is None and written["latency"] is None
    assert "FLOPs = 2 x MACs" in written["conventions"]["flops"]


def test_flops_ultralytics_gflops(tmp_path: Path) -> None:
    out = tmp_path / "flops.json"
    result = invoke("flops", *YOLO, "--json", str(out))
    assert result.exit_code == 0, result.output
    expected = ultralytics_gflops(loaded("ultralytics:yolov8n.yaml", 64).model, 64)
    assert json.loads(out.read_text())["ultralytics_gflops"] == expected
    assert re.search(rf"GFLOPs, ultralytics style \(batch 1\)\s*│\s*{expected:.3f}", result.stdout), result.stdout


def test_flops_batch_and_op_breakdown(tmp_path: Path) -> None:
    out = tmp_path / "flops.json"
    result = invoke("flops", *RESNET, "--batch", "2", "--by", "op", "--top", "1", "--json", str(out))
    assert result.exit_code == 0, result.output
    written = json.loads(out.read_text())
    model = loaded("torchvision:resnet18", 64)
    single = measure(model.model, model.example_inputs)
    assert written["input_shapes"] == [[2, 3, 64, 64]] and written["batch"] == 2
    assert written["macs"] == 2 * single.macs  # every layer of a CNN costs the same per image
    assert "top 1 of 3 by MACs (aten op)" in result.stdout
    assert "aten.convolution" in result.stdout and "aten.addmm" not in result.stdout


def test_flops_latency(tmp_path: Path) -> None:
    out = tmp_path / "flops.json"
    threads = torch.get_num_threads()
    result = invoke("flops", *TINY, "--batch", "3", "--latency", "--threads", "1", "--json", str(out))
    assert result.exit_code == 0, result.output
    timed = json.loads(out.read_text())["latency"]
    assert timed["threads"] == 1 and timed["batch_size"] == 3 and timed["device"] == "cpu"
    assert 0 < timed["p10_ms"] <= timed["median_ms"] <= timed["p90_ms"]
    assert f"{timed['median_ms']:.2f} ms [{timed['p10_ms']:.2f}, {timed['p90_ms']:.2f}], batch 3" in result.stdout
    assert torch.get_num_threads() == threads  # --threads held only while timing


def test_flops_threads_needs_latency() -> None:
    result = invoke("flops", *TINY, "--threads", "1")
    assert result.exit_code == 2
    assert "--latency" in result.stderr


# ---- report ------------------------------------------------------------------------------------------


@pytest.fixture
def run_dir(tmp_path: Path) -> Path:
    model = loaded("_factories:tiny_cnn", 32)
    timed = latency(model.model, model.example_inputs, warmup=0, repeats=2)
    stage = Stage(measure(model.model, model.example_inputs), timed)
    report = build_report(model="_factories:tiny_cnn", baseline=stage, pruned=stage, widths=[("0", 8, 4)])
    write_report(tmp_path / "run", report)
    return tmp_path / "run"


def test_report_prints_the_table_and_writes_nothing(run_dir: Path) -> None:
    before = {p.name: p.read_bytes() for p in run_dir.iterdir()}
    result = invoke("report", str(run_dir))
    assert result.exit_code == 0, result.output
    assert "prunefx: _factories:tiny_cnn" in result.stdout and "baseline" in result.stdout
    assert {p.name: p.read_bytes() for p in run_dir.iterdir()} == before


def test_report_write_regenerates_the_files(run_dir: Path) -> None:
    (run_dir / "report.md").unlink()
    (run_dir / "widths.png").unlink()
    result = invoke("report", str(run_dir), "--write")
    assert result.exit_code == 0, result.output
    assert sorted(p.name for p in run_dir.iterdir()) == ["report.html", "report.json", "report.md", "widths.png"]
    assert "# Pruning report: _factories:tiny_cnn" in (run_dir / "report.md").read_text()
    assert f"wrote {run_dir / 'report.md'}" in result.stdout


@pytest.mark.parametrize("damage", ["missing", "not json", "invalid"])
def test_report_bad_run_dir(run_dir: Path, damage: str) -> None:
    report_json = run_dir / "report.json"
    others = {p.name: p.read_bytes() for p in run_dir.iterdir() if p != report_json}
    if damage == "missing":
        report_json.unlink()
    elif damage == "not json":
        report_json.write_text("{")
    else:
        report_json.write_text(json.dumps({**json.loads(report_json.read_text()), "schema": "other/9"}))
    result = invoke("report", str(run_dir), "--write")
    assert result.exit_code == 2
    assert result.stderr.startswith("error: ")
    assert "Traceback" not in result.output
    assert {p.name: p.read_bytes() for p in run_dir.iterdir() if p != report_json} == others


# ---- bad input: exit code 2, one error line, nothing written ----------------------------------------


BAD = {
    "unknown model": (["torchvision:resnet1"], r"unknown torchvision model 'resnet1'.*Did you mean resnet18"),
    "unknown yaml": (["ultralytics:yolov8q.yaml"], r"unknown ultralytics model yaml"),
    "missing file": (["missing.pt"], r"checkpoint 'missing.pt' does not exist"),
    "corrupt file": (["corrupt.pt"], r"cannot load checkpoint corrupt.pt: it is not a torch.save archive"),
    "odd yolo imgsz": ([*YOLO[:2], "100"], r"multiple of 32 for YOLO models, got 100"),
    "zero imgsz": ([*RESNET[:2], "0"], r"imgsz must be a positive integer, got 0"),
    "not a spec": (["resnet18"], r"cannot read model SPEC 'resnet18'"),
}


@pytest.mark.parametrize("command", ["analyze", "flops"])
@pytest.mark.parametrize("case", [*BAD, "forward fails"])
def test_bad_input(command: str, case: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    (tmp_path / "corrupt.pt").write_bytes(b"\x00" * 64)
    if case == "forward fails":  # a 1-channel model given RGB images
        args, message = ["_factories:gray_cnn"], r"rejected example inputs|does not run on example inputs"
    else:
        args, message = BAD[case]
    out = tmp_path / "out" / "result.json"
    result = invoke(command, *args, "--json", str(out), columns=40)
    assert result.exit_code == 2, result.output
    lines = result.stderr.splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: "), result.stderr
    assert re.search(message, lines[0])
    assert "Traceback" not in result.output
    assert sorted(p.name for p in tmp_path.iterdir()) == ["corrupt.pt"]  # no JSON, no temp file, no directory


def test_multi_line_errors_become_one_line() -> None:
    result = invoke("analyze", "_factories:untraceable", columns=40)  # TraceFailure: reason, location, fixes
    assert result.exit_code == 2
    (line,) = result.stderr.splitlines()
    assert re.search(r"^error: cannot trace _Gated: .*; at .*_factories.py:\d+: .*; fixes: make the module", line)


def test_verbose_prints_the_traceback_then_the_error() -> None:
    result = invoke("analyze", "torchvision:resnet1", "--verbose")
    assert result.exit_code == 2
    assert result.stderr.startswith("Traceback (most recent call last):")
    assert "SpecError" in result.stderr
    assert result.stderr.rstrip().splitlines()[-1].startswith("error: unknown torchvision model")


def test_unwritable_json_path(tmp_path: Path) -> None:
    blocker = tmp_path / "file"
    blocker.write_text("")
    result = invoke("analyze", *TINY, "--json", str(blocker / "groups.json"))  # its parent is a file
    assert result.exit_code == 2
    assert result.stderr.startswith("error: ") and "Traceback" not in result.output
    assert invoke("analyze", *TINY, "--json", str(tmp_path)).exit_code == 2  # a directory: a usage error


@pytest.mark.parametrize("args", [["flops", *TINY, "--by", "layer"], ["flops", *TINY, "--batch", "0"], ["analyze"]])
def test_usage_errors(args: list[str]) -> None:
    assert invoke(*args).exit_code == 2


def test_main_maps_errors_to_exit_code_2(monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture) -> None:
    monkeypatch.setattr(sys, "argv", ["prunefx", "analyze", "torchvision:resnet1"])
    with pytest.raises(SystemExit) as exit_info:
        main()
    assert exit_info.value.code == 2
    assert capsys.readouterr().err.startswith("error: unknown torchvision model 'resnet1'")
