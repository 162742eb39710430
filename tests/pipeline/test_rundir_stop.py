"""A run stopped from outside (SIGTERM, Ctrl-C) never stays ``running``, and its SIGTERM handler is only lent."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import textwrap
import threading
from pathlib import Path

import pytest

from prunefx.pipeline.rundir import RunDir, Terminated

# A process that opens a run and stops itself: in a stage, before the first one, or with Ctrl-C instead of SIGTERM.
SCRIPT = textwrap.dedent("""
    import os, signal, sys, time
    from pathlib import Path
    from prunefx.pipeline.rundir import RunDir

    project, where, sig = Path(sys.argv[1]), sys.argv[2], getattr(signal, sys.argv[3])
    run = RunDir.open(project, "run", {"model": "m"})
    if where == "stage":
        with run.stage("baseline") as info:
            os.kill(os.getpid(), sig)
            time.sleep(60)  # the signal's exception ends the stage long before this
    else:
        os.kill(os.getpid(), sig)
        time.sleep(60)
    sys.exit(0)  # not reached
""")


def _stop(tmp_path: Path, where: str, sig: str) -> tuple[subprocess.CompletedProcess[str], dict]:
    done = subprocess.run([sys.executable, "-c", SCRIPT, str(tmp_path), where, sig], capture_output=True, text=True,
                          timeout=120)
    return done, json.loads((tmp_path / "run" / "state.json").read_text())


@pytest.mark.parametrize("where", ["stage", "before_stage"])
def test_sigterm_records_interrupted_and_the_process_exits_non_zero(tmp_path: Path, where: str) -> None:
    done, state = _stop(tmp_path, where, "SIGTERM")
    assert done.returncode != 0, done.stderr
    assert state["status"] == "interrupted", state
    assert state["error"]["type"] == "Terminated" and state["error"]["signal"] == "SIGTERM"
    assert "SIGTERM" in state["error"]["message"]
    assert state["error"]["stage"] == ("baseline" if where == "stage" else None)
    assert state["stages"] == {}  # the interrupted stage is not recorded as done


def test_ctrl_c_before_the_first_stage_records_interrupted(tmp_path: Path) -> None:
    done, state = _stop(tmp_path, "before_stage", "SIGINT")
    assert done.returncode != 0, done.stderr
    assert state["status"] == "interrupted", state
    assert state["error"]["stage"] is None and "signal" not in state["error"]


def _handler_while(tmp_path: Path, end: str) -> tuple[object, object]:
    """The SIGTERM handler while a run is open and after it ends (``complete`` or ``fail``)."""
    run = RunDir.open(tmp_path, end, {"model": "m"})
    during = signal.getsignal(signal.SIGTERM)
    if end == "complete":
        run.complete()
    else:
        run.fail(RuntimeError("boom"), stage=None)
    return during, signal.getsignal(signal.SIGTERM)


@pytest.mark.parametrize("end", ["complete", "fail"])
def test_the_previous_sigterm_handler_is_back_when_the_run_ends(tmp_path: Path, end: str) -> None:
    def mine(signum, frame):  # the caller's own handler: lent to the run, then given back
        pass

    before = signal.signal(signal.SIGTERM, mine)
    try:
        during, after = _handler_while(tmp_path, end)
    finally:
        signal.signal(signal.SIGTERM, before)
    assert during is not mine and callable(during)
    assert after is mine


def test_the_handler_raises_terminated_naming_the_signal(tmp_path: Path) -> None:
    run = RunDir.open(tmp_path, "r", {"model": "m"})
    try:
        handler = signal.getsignal(signal.SIGTERM)
        with pytest.raises(Terminated) as caught:
            handler(signal.SIGTERM, None)
        assert caught.value.signal == "SIGTERM" and isinstance(caught.value, KeyboardInterrupt)
    finally:
        run.complete()


def test_a_run_opened_off_the_main_thread_leaves_the_handler_alone(tmp_path: Path) -> None:
    before = signal.getsignal(signal.SIGTERM)
    seen: list[object] = []

    def work() -> None:
        run = RunDir.open(tmp_path, "t", {"model": "m"})
        with run.stage("baseline"):
            seen.append(signal.getsignal(signal.SIGTERM))
        run.complete()

    thread = threading.Thread(target=work)
    thread.start()
    thread.join(timeout=60)
    assert seen == [before]  # set only in the main thread (signal.signal fails elsewhere)
    assert signal.getsignal(signal.SIGTERM) is before
    assert json.loads((tmp_path / "t" / "state.json").read_text())["status"] == "complete"


def test_a_run_left_open_does_not_keep_the_next_run_from_giving_the_handler_back(tmp_path: Path) -> None:
    # A run opened and never closed (a notebook cell that raised) holds the handler until the process ends; the
    # caller then sets their own, and the next run must lend and return that one, not keep the abandoned run's.
    from prunefx.pipeline import rundir

    abandoned = RunDir.open(tmp_path, "abandoned", {"model": "m"})
    try:
        def mine(signum, frame):
            pass

        before = signal.signal(signal.SIGTERM, mine)
        try:
            during, after = _handler_while(tmp_path, "complete")
        finally:
            signal.signal(signal.SIGTERM, before)
        assert during is not mine and callable(during)
        assert after is mine
    finally:
        rundir._OPEN.close(abandoned.root)


def test_holds_ended_out_of_order_give_back_the_first_handler() -> None:
    from prunefx.pipeline.rundir import _Sigterm

    def mine(signum, frame):
        pass

    before = signal.signal(signal.SIGTERM, mine)
    try:
        lender = _Sigterm()
        first, second = lender.hold(), lender.hold()
        ours = signal.getsignal(signal.SIGTERM)
        assert ours is not mine
        lender.release(first)  # the second run is still open: still ours
        assert signal.getsignal(signal.SIGTERM) == ours
        lender.release(first)  # ended twice: a no-op
        lender.release(second)
        assert signal.getsignal(signal.SIGTERM) is mine
    finally:
        signal.signal(signal.SIGTERM, before)
