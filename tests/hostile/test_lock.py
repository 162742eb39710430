"""Two runs with one name: the second fails clearly while the first holds the directory; a dead holder never blocks."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest
from _hostile import PRUNEFX_ROOT, Sandbox, assert_refused, invoke

from prunefx.pipeline.rundir import LOCK, RunDir, RunError, RunLock

YOLO = ["prune", "yolo.yaml", "project=runs", "name=same", "imgsz=64", "prune.data.n_train=8", "prune.data.n_val=4",
        "prune.data.imgsz=64"]

# Another process opens the run the way a pipeline does, then holds it until its stdin closes.
HOLDER = """
import sys
from pathlib import Path
from prunefx.pipeline.rundir import RunDir
run = RunDir.open(Path(sys.argv[1]), "same", {"model": "first"}, exist_ok=True)
(run.root / "weights").mkdir()
(run.root / "weights" / "baseline.pt").write_bytes(b"the first run's weights")
print(run.root, flush=True)
sys.stdin.read()
"""


def _holder(project: Path) -> tuple[subprocess.Popen, Path]:
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(PRUNEFX_ROOT), os.environ.get("PYTHONPATH", "")])}
    proc = subprocess.Popen([sys.executable, "-c", HOLDER, str(project)], stdin=subprocess.PIPE,
                            stdout=subprocess.PIPE, text=True, env=env)
    line = proc.stdout.readline().strip()
    assert line, "the holder process did not open its run"
    return proc, Path(line)


def test_a_second_run_on_a_held_directory_fails_and_changes_nothing(sandbox: Sandbox) -> None:
    proc, root = _holder(sandbox.project.absolute())
    try:
        files = {p.relative_to(root): p.read_bytes() for p in root.rglob("*") if p.is_file() and p.name != LOCK}
        for extra in (["exist_ok=true"], ["resume=true"]):
            result = invoke(*YOLO, *extra)
            assert_refused(result, rf"runs/same is in use by another prunefx run \(pid {proc.pid} on .*\); wait")
        with pytest.raises(RunError, match=f"pid {proc.pid}"):
            RunDir.open(sandbox.project, "same", {}, exist_ok=True)
        assert {p.relative_to(root): p.read_bytes() for p in root.rglob("*") if p.is_file() and p.name != LOCK} == files
        assert json.loads((root / "state.json").read_text())["status"] == "running"
        # Without exist_ok a second run is not blocked: it takes the next free name.
        other = RunDir.open(sandbox.project, "same", {})
        assert other.root.name == "same2"
        RunLock.release_root(other.root)
    finally:
        proc.stdin.close()
        proc.wait(timeout=60)
    again = RunDir.open(sandbox.project, "same", {"model": "second"}, exist_ok=True)  # the holder finished
    assert not (again.root / "weights").exists()
    RunLock.release_root(again.root)


def test_a_killed_holder_leaves_a_stale_lock_that_never_blocks(sandbox: Sandbox) -> None:
    proc, root = _holder(sandbox.project.absolute())
    proc.send_signal(signal.SIGKILL)
    proc.wait(timeout=60)
    assert json.loads((root / LOCK).read_text())["pid"] == proc.pid  # the lock file is still there
    run = RunDir.open(sandbox.project, "same", {"model": "first"}, resume=True)  # ... and taken over
    assert json.loads((root / LOCK).read_text())["pid"] == os.getpid()
    RunLock.release_root(run.root)


# ---- a planted .lock: never written through ---------------------------------------------------------------------


def _stopped_run(box: Sandbox) -> Path:
    run = RunDir.open(box.project, "r", {})
    run.fail(KeyboardInterrupt(), stage=None)  # interrupted: a run to resume
    RunLock.release_root(run.root)
    (run.root / LOCK).unlink()
    return run.root


@pytest.mark.parametrize("plant", ["a link to a user's file", "a hard link to a user's file", "a directory"])
@pytest.mark.parametrize("how", ["resume", "exist_ok"])
def test_a_planted_lock_is_refused_before_anything_is_written(sandbox: Sandbox, plant: str, how: str) -> None:
    """``.lock -> ~/notes.txt``: taking the lock used to truncate the user's file and write a pid record into it."""
    root = _stopped_run(sandbox)
    victim = sandbox.outside / "keep.txt"
    if plant == "a link to a user's file":
        (root / LOCK).symlink_to(victim)
    elif plant == "a hard link to a user's file":
        os.link(victim, root / LOCK)
    else:
        (root / LOCK).mkdir()
    before, state = sandbox.snapshot(), (root / "state.json").read_bytes()
    why = {"a link to a user's file": r"is a symbolic link \(to .*keep\.txt\); prunefx does not write through links",
           "a hard link to a user's file": r"cannot be written in place: it has another hard link",
           "a directory": r"is a directory, where prunefx writes a file"}[plant]
    with pytest.raises(RunError, match=rf"^cannot lock .*runs/r: .*runs/r/\.lock {why}.*[;:] remove") as info:
        RunDir.open(sandbox.project, "r", {}, **{how: True})
    assert "\n" not in str(info.value)
    assert sandbox.snapshot() == before  # the user's file is byte-identical: no pid record, no truncation
    assert (root / "state.json").read_bytes() == state
    assert os.path.lexists(root / LOCK)  # the planted entry is the user's to look at, not removed behind their back


def test_a_planted_lock_link_through_the_cli(sandbox: Sandbox) -> None:
    root = _stopped_run(sandbox)
    (root / LOCK).symlink_to(sandbox.outside / "keep.txt")
    before = sandbox.snapshot()
    result = invoke("prune", "digits_cnn.yaml", "project=runs", "name=r", "epochs=1", "resume=true")
    assert_refused(result, r"cannot lock runs/r: runs/r/\.lock is a symbolic link .*remove the link")
    assert sandbox.snapshot() == before
