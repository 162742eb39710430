"""The job-wide progress line: the ETA arithmetic, its bookkeeping over stages, and its plain lines off a terminal."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from prunefx.pipeline import ConfigError, load_config, run_config
from prunefx.pipeline.progress import PRUNE_ALLOWANCE_S, REPORT_ALLOWANCE_S, JobProgress, clock_text, eta_seconds
from prunefx.report import load_report

CONFIG = Path(__file__).resolve().parents[2] / "configs" / "digits_cnn.yaml"
# test_pipeline_classify's tiny run (4 + 2 + 3 epochs), with latency timed under a bound that cuts it at one round
TINY = ["model=_classify_factories:tiny_bn_cnn", "dataset.image_size=8", "epochs=4", "lr=0.1",
        "prune.sparsity.epochs=2", "prune.sparsity.schedule=constant", "prune.sparsity.s=2.0e-2",
        "prune.finetune.epochs=3", "threads=1", "prune.latency_max_s=1.0e-9"]
JOB_LINE = re.compile(r"^job: stage (\d+)/(\d+) (\w+)(?:, epoch (\d+)/(\d+))?(?:, latency round (\d+)/(\d+))?, "
                      r"ETA (\d+:\d\d:\d\d|unknown), elapsed \d+:\d\d:\d\d$")


def test_eta_is_the_mean_epoch_times_the_epochs_left_plus_the_allowance():
    assert eta_seconds([2.0, 4.0], 5, 10.0) == 3.0 * 5 + 10.0
    assert eta_seconds([1.5], 2, 0.0) == 3.0
    assert eta_seconds([], 3, 10.0) is None  # epochs remain, none timed: no honest estimate yet
    assert eta_seconds([], 0, 7.5) == 7.5  # nothing left to train: the allowance alone


def test_clock_text():
    assert clock_text(3725.4) == "1:02:05" and clock_text(59.6) == "0:01:00" and clock_text(None) == "unknown"


class FakeClock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def test_the_job_estimate_follows_the_measured_epochs_and_the_stages_left():
    clock = FakeClock()
    lines: list[str] = []
    plan = [(1, "baseline", 2), (2, "prune", 0), (3, "finetune", 3), (4, "report", 0)]
    p = JobProgress.start(plan, 4, lines.append, latency_s=60.0, tty=False, clock=clock)
    p.stage_started("baseline")
    assert p.eta() is None  # 5 epochs ahead, none timed
    clock.now = 4.0
    p.epoch_ended(1, 2)  # 4 s an epoch; 1 + 3 epochs left
    assert p.eta() == 4.0 * 4 + PRUNE_ALLOWANCE_S + REPORT_ALLOWANCE_S + 60.0
    clock.now = 10.0
    p.epoch_ended(2, 2)  # mean 5 s
    clock.now = 13.0
    p.stage_finished("baseline", 13.0)  # 3 s beyond its epochs: each training stage left is allowed that
    p.stage_started("prune")
    clock.now = 20.0  # 7 s into the prune stage: its allowance is that much spent
    assert p.eta() == 5.0 * 3 + (PRUNE_ALLOWANCE_S - 7.0) + 3.0 + REPORT_ALLOWANCE_S + 60.0
    p.stage_finished("prune", 7.0)
    p.stage_started("finetune")
    clock.now = 26.0
    p.epoch_ended(1, 3)  # mean of 4, 6, 6
    assert p.eta() == pytest.approx(16 / 3 * 2 + 3.0 + REPORT_ALLOWANCE_S + 60.0)
    assert [JOB_LINE.match(line).group(3, 4, 5) for line in lines] == [
        ("baseline", None, None), ("baseline", "1", "2"), ("baseline", "2", "2"), ("prune", None, None),
        ("finetune", None, None), ("finetune", "1", "3")]


def test_several_fits_in_one_stage_add_up():
    clock = FakeClock()
    p = JobProgress.start([(5, "controls", 5)], 6, lambda _l: None, tty=False, clock=clock)
    p.stage_started("controls")
    for epoch, epochs in ((1, 3), (2, 3), (3, 3), (1, 2)):  # the narrow control (3 epochs), then narrow_ft (2)
        clock.now += 2.0
        p.epoch_ended(epoch, epochs)
    assert p.eta() == 2.0 * 1  # one epoch of the second fit left, 2 s each; no allowance in this plan


def test_a_bad_latency_bound_is_a_config_error(tmp_path):
    with pytest.raises(ConfigError, match="prune.latency_max_s must be a positive number of seconds"):
        from prunefx.pipeline.backends.classify import ClassifyJob

        ClassifyJob.from_config(load_config(CONFIG, [*TINY, "prune.latency_max_s=0", f"project={tmp_path}"]),
                                config_name="digits")


def test_a_run_off_a_terminal_prints_one_plain_job_line_per_epoch_and_a_bounded_latency(tmp_path, capsys):
    lines: list[str] = []
    run = run_config(CONFIG, [*TINY, f"project={tmp_path}", "name=progress"], log=lines.append)
    assert not capsys.readouterr().out.count("\r")  # stdout is not a terminal here: nothing is redrawn
    jobs = [m for m in map(JOB_LINE.match, lines) if m]
    assert len(jobs) == sum(line.startswith("job:") for line in lines)  # every job line has k/N and an ETA
    assert all(m.group(2) == "6" for m in jobs)
    epochs = [(m.group(3), int(m.group(4)), int(m.group(5))) for m in jobs if m.group(4)]
    assert epochs == ([("baseline", e, 4) for e in range(1, 5)] + [("sparsity", e, 2) for e in range(1, 3)]
                      + [("finetune", e, 3) for e in range(1, 4)])
    starts = [m.group(1, 3) for m in jobs if not m.group(4) and not m.group(6)]
    assert starts == [(str(k), s) for k, s in enumerate(
        ("baseline", "sparsity", "prune", "finetune", "controls", "report"), 1)]
    assert all(m.group(8) != "unknown" for m in jobs if m.group(4))  # an epoch timed: the ETA has a value
    # the `[k/6] stage` lines stay
    assert [line for line in lines if re.match(r"^\[\d/6\] \w+$", line)] == [
        f"[{k}/6] {s}" for k, s in enumerate(("baseline", "sparsity", "prune", "finetune", "controls", "report"), 1)]
    # latency: the bound stopped the timing after its first round, and the report says so
    assert [m.group(6, 7) for m in jobs if m.group(6)] == [("1", "6")]
    report = load_report(run.root)
    for stage in ("baseline", "pruned", "finetuned"):
        lat = report["stages"][stage]["latency"]
        assert lat["rounds"] == 1 and "1 of 6 rounds" in lat["cut_short"]
    assert report["settings"]["latency_timing"]["rounds"] == 1
    assert report["settings"]["latency_timing"]["max_seconds"] == 1e-9
