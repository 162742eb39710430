"""Every JSON file prunefx reads (state, plan, report, graph) goes through one reader: a damaged, deep, huge or
non-text file is one line naming it and what is wrong, never a RecursionError, ValueError or UnicodeDecodeError
traceback; and every record is type-checked on read, before a stage runs on it."""

from __future__ import annotations

import json
import os
import re
from pathlib import Path

import pytest
from _hostile import Sandbox, assert_refused, invoke

from prunefx import _io
from prunefx.errors import PrunefxError
from prunefx.pipeline.rundir import LOCK, RunDir, RunError, RunLock, read_state

DIGITS = ["prune", "digits_cnn.yaml", "project=runs", "name=r", "epochs=1"]

DAMAGE = {
    "truncated": (b"{", r"Expecting property name"),
    "200000 deep": (b"[" * 200_000 + b"]" * 200_000, r"nested deeper than the 512 levels prunefx reads"),
    "600 deep": (b'{"a": ' + b"[" * 600 + b"]" * 600 + b"}", r"nested deeper than the 512 levels prunefx reads"),
    "a 5000-digit integer": (b'{"n": ' + b"7" * 5000 + b"}", r"an integer of 5000 digits, more than the 100"),
    "not UTF-8": (b'{"model": "\xff\xfe"}', r"not UTF-8 text: byte 0xff at offset 11"),
}


def _plan_reader(run: Path) -> object:
    from prunefx.checkpoint import read_plan

    return read_plan(run / "plan.json", fix="start a new run", error=RunError)


def _graph_reader(run: Path) -> object:
    from prunefx.report.report_html import load_graph

    return load_graph(run)


def _report_reader(run: Path) -> object:
    from prunefx.report import load_report

    return load_report(run)


READERS = {"state.json": read_state, "plan.json": _plan_reader, "graph.json": _graph_reader,
           "report.json": _report_reader}


@pytest.mark.parametrize("damage", list(DAMAGE))
@pytest.mark.parametrize("name", list(READERS))
def test_a_damaged_json_file_is_one_line_naming_it(tmp_path: Path, name: str, damage: str) -> None:
    data, why = DAMAGE[damage]
    (tmp_path / name).write_bytes(data)
    with pytest.raises(PrunefxError) as info:
        READERS[name](tmp_path)
    message = str(info.value)
    assert "\n" not in message and len(message) < 400, message
    assert str(tmp_path / name) in message, message
    assert re.search(why, message), message


def test_a_file_that_is_not_a_regular_file_is_refused_without_blocking(tmp_path: Path) -> None:
    os.mkfifo(tmp_path / "state.json")  # reading a FIFO with no writer would wait for ever
    with pytest.raises(RunError, match=r"state\.json is corrupt \(it is not a regular file\)"):
        read_state(tmp_path)
    (tmp_path / "report.json").mkdir()
    with pytest.raises(PrunefxError, match=r"report\.json is not valid JSON \(it is a directory, not a file\)"):
        _report_reader(tmp_path)
    (tmp_path / "plan.json").write_text("[]")
    with pytest.raises(RunError, match=r"plan\.json is not valid JSON \(expected an object, got a list\)"):
        _plan_reader(tmp_path)


def test_a_file_over_the_size_limit_is_refused_before_it_is_parsed(tmp_path: Path,
                                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(_io, "MAX_JSON_BYTES", 2**20)
    (tmp_path / "graph.json").write_text(json.dumps({"schema": "x", "pad": "a" * 2**20}))
    with pytest.raises(PrunefxError, match=r"graph\.json is not valid JSON \(larger than the 1 MiB prunefx reads\)"):
        _graph_reader(tmp_path)


def test_the_cli_says_the_same_for_a_damaged_report(sandbox: Sandbox) -> None:
    run = sandbox.project / "done"
    run.mkdir(parents=True)
    (run / "report.json").write_bytes(DAMAGE["200000 deep"][0])
    assert_refused(invoke("report", str(run)), r"runs/done/report\.json is not valid JSON \(nested deeper than")


# ---- state.json: every field and stage record type-checked ---------------------------------------------------------


def _stopped_run(box: Sandbox, stages: dict) -> Path:
    from prunefx.pipeline.run_config import load_config

    run = RunDir.open(box.project, "r", load_config(DIGITS[1], DIGITS[2:]))
    run.state["stages"] = stages
    run.fail(KeyboardInterrupt(), stage=None)
    RunLock.release_root(run.root)
    return run.root


@pytest.mark.parametrize(("stages", "message"), [
    ({"baseline": ["not", "a", "record"]}, r"state\.json is damaged: stages\.baseline is list, not an object"),
    ({"baseline": "done"}, r"state\.json is damaged: stages\.baseline is str, not an object"),
    ({"baseline": {"source": "trained", "metrics": {"top1": 0.5}, "seconds": 1, "finished": "x"},
      "prune": {"source": "baseline", "verify": "ok", "widths": "all", "seconds": 1, "finished": "x"}},
     r"state\.json stages\.prune"),
])
def test_a_stage_record_of_the_wrong_type_is_refused_before_any_stage_runs(sandbox: Sandbox, stages: dict,
                                                                          message: str) -> None:
    root = _stopped_run(sandbox, stages)
    files = {p.name: p.read_bytes() for p in root.iterdir() if p.name != LOCK}
    before = sandbox.snapshot()
    result = invoke(*DIGITS, "resume=true")
    assert_refused(result, message)
    assert {p.name: p.read_bytes() for p in root.iterdir() if p.name != LOCK} == files  # nothing ran, nothing saved
    assert sandbox.snapshot() == before


@pytest.mark.parametrize(("field", "value", "message"), [
    ("status", ["complete"], r"status is .* not one of running, interrupted, failed, complete"),
    ("error", "boom", r"error is str, not an object or null"),
    ("current", 3, r"current is int, not a stage name"),
])
def test_a_state_field_of_the_wrong_type_is_refused(tmp_path: Path, field: str, value: object, message: str) -> None:
    state = {"schema": "prunefx.run/1", "status": "failed", "stages": {}, "error": None, field: value}
    (tmp_path / "state.json").write_text(json.dumps(state))
    with pytest.raises(RunError, match=rf"state\.json is damaged: {message}"):
        read_state(tmp_path)
