"""The stages' records: state.json keeps them as plain data with the keys it always had, and reads them back."""

from __future__ import annotations

import json

import pytest

from prunefx.pipeline.records import (
    BaselineDone,
    ControlRun,
    ControlsDone,
    FrozenGroup,
    LatencyTarget,
    PruneDone,
    Skipped,
    SparsityDone,
    Width,
    read,
    to_state,
    warnings_of,
)
from prunefx.pipeline.rundir import RunError

PRUNED = PruneDone(source="sparse", verify="ok", widths=(Width(name="conv1", before=16, after=8),),
                   frozen_by_check=(FrozenGroup(name="fc", reason="oracle"),), macs_kept_estimate=None,
                   warnings=(), metrics={"top1": 0.5, "n": 100},
                   latency_target=LatencyTarget(met=True, note="met", rounds=({"ms": 1.0},)))


@pytest.mark.parametrize("record", [
    PRUNED,
    BaselineDone(source="checkpoint w.pt", metrics={"top1": 0.9}),
    SparsityDone(history=({"epoch": 1, "rank_loss": [0.1]},), metrics={}, warnings=("w",),
                 gammas={"bn_channels": 8.0, "below_0.01": 0.5, "q0.5": 0.02, "max": 1.0}),
    ControlsDone(runs={"scratch": ControlRun(start="scratch_init", epochs=2, metrics={"top1": 0.1}, history=())}),
    Skipped(skipped="prune.finetune.epochs is 0"),
])
def test_a_record_reads_back_from_its_json_as_the_same_record(record):
    stage = {PruneDone: "prune", BaselineDone: "baseline", SparsityDone: "sparsity", ControlsDone: "controls",
             Skipped: "finetune"}[type(record)]
    data = json.loads(json.dumps({**to_state(record), "seconds": 1.5, "finished": "2026-01-01T00:00:00+00:00"}))
    assert read(stage, data) == record


def test_optional_fields_at_their_default_are_not_written():
    assert to_state(BaselineDone(source="s", metrics={})) == {"source": "s", "metrics": {}}  # no history key
    assert set(to_state(ControlsDone(runs={}))) == {"runs"}  # warnings only when there are some
    state = to_state(PRUNED)
    assert state["macs_kept_estimate"] is None and state["warnings"] == []  # required: written even when empty
    assert "partial_capture" not in state and state["widths"] == [{"name": "conv1", "before": 16, "after": 8}]
    assert to_state(Skipped(skipped="x")) == {"skipped": "x"}


def test_warnings_of_and_a_damaged_record():
    assert warnings_of(SparsityDone(history=(), metrics={}, gammas={"bn_channels": 0.0}, warnings=("a",))) == ("a",)
    assert warnings_of(BaselineDone(source="s", metrics={})) == () and warnings_of(None) == ()
    with pytest.raises(RunError, match="stages.prune"):
        read("prune", {"source": "sparse"})


def test_a_stage_record_or_file_changed_since_its_stage_saved_it_is_refused_in_one_line(tmp_path) -> None:
    from prunefx.pipeline import digests

    before = digests.snapshot(tmp_path)
    (tmp_path / "plan.json").write_text("{}")
    entry = to_state(PRUNED)
    entry.update(digests.stamp(tmp_path, before, entry), seconds=1.0, finished="now")
    assert set(entry["files"]) == {"plan.json"}  # what the stage wrote, bookkeeping aside
    state = json.loads(json.dumps({"stages": {"prune": entry}}))  # as state.json holds it
    digests.verify(tmp_path, state)  # unchanged: resumes
    assert read("prune", state["stages"]["prune"]) == PRUNED  # the digests are not part of the record

    edited = json.loads(json.dumps(state))
    edited["stages"]["prune"]["verify"] = "skipped"
    with pytest.raises(RunError, match=r"the prune stage's record in state.json was changed since the stage saved"):
        digests.verify(tmp_path, edited)
    for stage in ("not a record", ["a", "list"]):
        with pytest.raises(RunError, match=r"records stage 'prune' as a (str|list), not the stage's results"):
            digests.verify(tmp_path, {"stages": {"prune": stage}})
    escaping = json.loads(json.dumps(state))
    escaping["stages"]["prune"]["files"] = {"../outside.pt": "0" * 64}
    with pytest.raises(RunError, match=r"records the file '../outside.pt', which is not inside the run"):
        digests.verify(tmp_path, escaping)
    (tmp_path / "plan.json").unlink()
    with pytest.raises(RunError, match=r"plan.json, written by the prune stage, is missing"):
        digests.verify(tmp_path, state)
    import os

    os.mkfifo(tmp_path / "plan.json")  # a FIFO in the file's place: refused, never read (a read would block)
    with pytest.raises(RunError, match=r"plan.json, written by the prune stage, is missing"):
        digests.verify(tmp_path, state)
