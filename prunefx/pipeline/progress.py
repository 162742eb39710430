"""The job-wide progress line of a pipeline run: stage k/N, the stage's epoch e/E, and an ETA of the whole job.

    progress = JobProgress.start(plan, log)          # plan: (stage, epochs) of the stages still to run
    progress.stage_started("finetune")                # a line at every stage boundary
    with listening_to_epochs(progress.epoch_ended):   # a line after every epoch (fit, ultralytics' trainer)
        ...
    progress.stage_finished("finetune", seconds)

The ETA is :func:`eta_seconds`: the mean epoch measured so far in this run times the epochs left in all
remaining stages, plus an allowance for what is not epochs: the prune stage, the report (its latency timing
bounded by ``prune.latency_max_s``) and, per remaining training stage, the evaluation and setup time the
training stages of this run took beyond their epochs (none until one finished).

Lines are printed through ``log``, never redrawn, so they cannot garble the bars ultralytics' trainer and ``fit``
draw: once per stage boundary, epoch and latency round; styled by rich with a bar of the job's share done when
``log`` is a rich Console on a terminal (the CLI's), plain text otherwise (CI logs, files).
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

PRUNE_ALLOWANCE_S = 30.0  # the prune stage: analysis, scores, the cut, the oracle, the pruned model's evaluation
REPORT_ALLOWANCE_S = 20.0  # the report stage besides latency timing: costs counted, files written


def eta_seconds(epoch_seconds: Sequence[float], epochs_left: int, allowance_s: float) -> float | None:
    """Seconds the job still needs: mean measured epoch x epochs left + allowance; None while no epoch was timed."""
    if epochs_left <= 0:
        return allowance_s
    if not epoch_seconds:
        return None
    return sum(epoch_seconds) / len(epoch_seconds) * epochs_left + allowance_s


def clock_text(seconds: float | None) -> str:
    """``seconds`` as h:mm:ss ("unknown" for None)."""
    if seconds is None:
        return "unknown"
    s = max(0, round(seconds))
    return f"{s // 3600}:{s // 60 % 60:02d}:{s % 60:02d}"


@dataclass
class _Stage:
    name: str
    index: int  # 1-based position among all the job's stages
    epochs: int  # epochs the stage trains in all (several fits for the controls)
    done: int = 0  # epochs finished in this stage
    fit_base: int = 0  # epochs of the stage's earlier fits (the controls train several models)
    last: int = 0  # the epoch the current fit reported last
    epoch_seconds: list[float] = field(default_factory=list)


@dataclass
class JobProgress:
    """What has run of a job and how long it took; prints the job line (see the module docstring)."""

    stages: list[_Stage]
    total: int  # stages in the job, done earlier ones included
    log: Callable[[str], None]
    latency_s: float = 0.0  # the report stage's latency bound (0: latency is not timed)
    tty: bool = False
    clock: Callable[[], float] = time.monotonic
    began: float = 0.0
    current: _Stage | None = None
    since: float = 0.0  # when the current stage started, or its last epoch ended
    overheads: list[float] = field(default_factory=list)  # finished training stages: seconds beyond their epochs
    _measured: list[list[float]] = field(default_factory=list)  # every stage's epoch seconds, finished ones too

    @classmethod
    def start(cls, plan: Sequence[tuple[int, str, int]], total: int, log: Callable[[str], None], *,
              latency_s: float = 0.0, tty: bool | None = None,
              clock: Callable[[], float] = time.monotonic) -> JobProgress:
        """Progress of the stages in ``plan`` ((index, name, epochs) each), printed through ``log``.

        ``tty`` None: rich lines when ``log`` is a rich Console's print on a terminal (the CLI's), else plain text
        (a silenced ``log`` stays silent).
        """
        if tty is None:
            from rich.console import Console

            console = getattr(log, "__self__", None)
            tty = isinstance(console, Console) and console.is_terminal
        stages = [_Stage(name, i, epochs) for i, name, epochs in plan]
        return cls(stages, total, log, latency_s, tty, clock, clock(), _measured=[s.epoch_seconds for s in stages])

    def _find(self, name: str) -> _Stage:
        return next(s for s in self.stages if s.name == name)

    def eta(self) -> float | None:
        """Seconds the job still needs, by :func:`eta_seconds` over everything measured so far."""
        overhead = sum(self.overheads) / len(self.overheads) if self.overheads else 0.0
        allowance = 0.0
        for s in self.stages:  # the stages still to run, the current one included
            own = {"prune": PRUNE_ALLOWANCE_S, "report": REPORT_ALLOWANCE_S + self.latency_s}.get(
                s.name, overhead if s.epochs else 0.0)
            if s is self.current and not s.epochs:  # a stage without epochs: part of its allowance is spent
                own = max(0.0, own - (self.clock() - self.since))
            allowance += own
        epochs_left = sum(s.epochs - s.done for s in self.stages)
        measured = [t for s in self._measured for t in s]
        return eta_seconds(measured, epochs_left, allowance)

    def stage_started(self, name: str) -> None:
        """The job line for the start of stage ``name``."""
        self.current = self._find(name)
        self.since = self.clock()
        self._emit()

    def epoch_ended(self, epoch: int, epochs: int) -> None:
        """Epoch ``epoch`` of ``epochs`` of a fit in the current stage finished: the job line with e/E."""
        s = self.current
        if s is None:
            return
        if epoch <= s.last:  # a new fit in the same stage (the next control)
            s.fit_base += s.last
        s.last = epoch
        now = self.clock()
        s.epoch_seconds.append(now - self.since)
        self.since = now
        s.done = min(s.epochs, s.fit_base + epoch)
        self._emit(f"epoch {epoch}/{epochs}")

    def latency_round(self, done: int, rounds: int) -> None:
        """A latency timing round of the report finished: the job line with rounds done / total."""
        self._emit(f"latency round {done}/{rounds}")

    def stage_finished(self, name: str, seconds: float) -> None:
        """Stage ``name`` finished after ``seconds``; a training stage's time beyond its epochs feeds the ETA."""
        s = self._find(name)
        if s.epoch_seconds:
            self.overheads.append(max(0.0, seconds - sum(s.epoch_seconds)))
        s.done = s.epochs
        self.stages = [t for t in self.stages if t is not s]
        self.current = None

    def _emit(self, detail: str | None = None) -> None:
        s = self.current
        assert s is not None
        eta = self.eta()
        elapsed = self.clock() - self.began
        # the ETA before the elapsed time: a narrow terminal cuts the line's end
        parts = [f"stage {s.index}/{self.total} {s.name}", *([detail] if detail else []),
                 f"ETA {clock_text(eta)}", f"elapsed {clock_text(elapsed)}"]
        line = "job: " + ", ".join(parts)
        if not self.tty:
            self.log(line)
            return
        from rich.progress_bar import ProgressBar
        from rich.table import Table

        grid = Table.grid(padding=(0, 1))
        grid.add_column(width=20)
        grid.add_column(no_wrap=True, overflow="ellipsis")  # one line, however narrow the terminal
        share = 0.0 if eta is None else elapsed / (elapsed + eta) if elapsed + eta > 0 else 1.0
        grid.add_row(ProgressBar(total=1.0, completed=share, width=20),
                     f"[bold cyan]{line}[/]")
        self.log(grid)  # a rich Console's print (see start)


__all__ = ["PRUNE_ALLOWANCE_S", "REPORT_ALLOWANCE_S", "JobProgress", "clock_text", "eta_seconds"]
