"""The one stage loop behind every pipeline: baseline -> sparsity -> prune -> fine-tune -> report.

A backend (``pipeline/backends/``) does what differs between the model families: train, evaluate, load and save
a model of a role (baseline, sparse, pruned, fine-tuned), example inputs, extra costs. The runner owns the rest:
the stage order, resume (a finished stage is skipped, its files proven unchanged), logging with the resume hint and
the checks before any work; the stages that are the same for everyone are ``stages.py`` and ``controls.py``.

    backend = YoloBackend(job)                     # or ClassifyBackend(job, dist), SpecBackend(loaded)
    preflight(job.prune, backend)                  # nothing prunable / a target that prunes nothing: an error now
    run = open_run(job)
    execute(job, backend, run)                     # -> the RunDir, status complete

Distributed runs (classification under DDP) run the same loop in every rank: training stages everywhere, pruning
and the report in rank 0 while the others wait; only rank 0 writes files.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import replace
from pathlib import Path

import numpy as np

from prunefx._config import ConfigError
from prunefx.pipeline import digests
from prunefx.pipeline.controls import control_runs, controls_stage
from prunefx.pipeline.job import Backend, Job, StageContext, check_target, nothing_to_prune
from prunefx.pipeline.progress import JobProgress
from prunefx.pipeline.records import (
    read,
    to_state,
    warnings_of,
)
from prunefx.pipeline.run_config import PruneSpec
from prunefx.pipeline.rundir import RunDir, RunError, read_state, run_root
from prunefx.pipeline.stages import baseline_stage, finetune_stage, prune_stage, report_stage, sparsity_stage
from prunefx.plan.config import TARGETS
from prunefx.train.loop import listening_to_epochs

# training runs in every rank, the rest in rank 0
_EVERY_RANK = frozenset({"baseline", "sparsity", "finetune", "controls"})


def preflight(spec: PruneSpec, backend: Backend) -> None:
    """Check on the untrained architecture that the plan can prune something, before any training.

    Catches a model with no prunable group and ``ignore`` / ``min_channels`` settings that leave none eligible
    (e.g. ``prune.ignore=['*']``), which would otherwise surface after the baseline and sparsity stages.
    """
    from prunefx import analyze
    from prunefx.plan import make_plan

    check_target(spec)
    if spec.depth.remove and backend.cuts.depth is None:
        raise ConfigError(f"prune.depth: the pipeline of {backend.name} cannot save a depth-pruned model yet (the "
                          "custom and llm tasks can); remove prune.depth")
    if spec.experts.keep < 1 and backend.cuts.experts is None:
        raise ConfigError(f"prune.experts: the pipeline of {backend.name} does not remove MoE experts (the llm task "
                          "does); remove prune.experts")
    dg = analyze(backend.architecture(), backend.example_inputs())
    ones = {g.id: np.ones(g.channels) for g in dg.groups if g.prunable}
    # Which groups may be pruned does not depend on the target or the rounding: a plain ratio plan tells.
    # (scope "sensitivity" plans on measured curves; which groups it may cut is the same as a global plan's)
    scope = "global" if spec.plan.scope == "sensitivity" else spec.plan.scope
    plan = make_plan(dg, ones, replace(spec.plan, **{**dict.fromkeys(TARGETS), "ratio": 0.5}, round_to=1, scope=scope))
    reason = nothing_to_prune(dg, plan, backend.name)
    if reason:
        raise ConfigError(reason)
    if spec.refit or spec.plan.scope == "sensitivity" or spec.depth.remove or spec.experts.keep < 1:
        backend.calibration(1)  # a backend without data refuses prune.refit / scope sensitivity now, before training


def open_run(job: Job) -> RunDir:
    """Create, replace or resume the job's run directory (see :class:`RunDir`); a resumed run's finished stages
    must have left their files and records as they wrote them (:mod:`prunefx.pipeline.digests`)."""
    opts = job.run
    if opts.resume:
        check_unchanged(run_root(Path(opts.project), str(opts.name)))
    return RunDir.open(Path(opts.project), str(opts.name), job.config, resume=opts.resume, exist_ok=opts.exist_ok,
                       read_record=lambda stage, entry: read(stage, entry) if stage in job.stages else None)


def check_unchanged(root: Path) -> None:
    """Refuse, before anything is written, to resume ``root`` when a finished stage's plan, weights or record no
    longer match what the stage recorded (one RunError naming the file)."""
    try:
        state = read_state(root)
    except RunError:
        return  # no run, or a damaged state.json: RunDir.open says which, in its own words
    digests.verify(root, state)


def run_job(job: Job, backend: Backend, *, log: Callable[[str], None] = print) -> RunDir:
    """Check, open and run (or resume) every stage of a one-process ``job``; returns the finished run directory."""
    preflight(job.prune, backend)  # nothing prunable: an error before the directory exists
    run = open_run(job)
    log(f"run directory: {run.root}")
    result = execute(job, backend, run, log=log)
    assert result is not None  # one process: rank 0
    return result


def resume_hint(root: Path) -> str:
    """What to type to continue the run in ``root`` after fixing what stopped it."""
    return (f"finished stages are kept in {root}; fix the cause and continue with the same config plus: "
            f"resume=true name={root.name} project={root.parent}")


def execute(job: Job, backend: Backend, run: RunDir | None, *, log: Callable[[str], None] = print) -> RunDir | None:
    """Run (or resume) the job's stages; rank 0 holds ``run`` and returns it complete, other ranks get None."""
    dist = backend.dist
    root = Path(dist.broadcast(str(run.root) if dist.is_main else None))
    done = set(dist.broadcast(list(run.state["stages"]) if dist.is_main else None))
    log = log if dist.is_main else (lambda _msg: None)
    backend.root = root
    n = len(job.stages)
    progress = None
    if dist.is_main:
        plan = [(i, s, stage_epochs(job, backend, s)) for i, s in enumerate(job.stages, 1) if s not in done]
        progress = JobProgress.start(plan, n, log, latency_s=job.prune.latency_max_s if job.prune.latency else 0.0)
    ctx = StageContext(job, backend, run, root, log, progress)
    stages = {"baseline": baseline_stage, "sparsity": sparsity_stage, "prune": prune_stage, "finetune": finetune_stage,
              "controls": controls_stage, "report": report_stage}
    name: str | None = None
    try:
        for i, name in enumerate(job.stages, 1):
            if name in done:
                log(f"[{i}/{n}] {name}: done earlier, skipped")
                continue
            log(f"[{i}/{n}] {name}")
            if dist.is_main:
                assert progress is not None
                progress.stage_started(name)
                with run.stage(name) as info, listening_to_epochs(progress.epoch_ended):
                    before = digests.snapshot(root)
                    record = stages[name](ctx)
                    info.update(to_state(record))
                    info.update(digests.stamp(root, before, info))  # what a resume proves unchanged
                for warning in warnings_of(record):
                    log(f"  warning: {warning}")
                log(f"[{i}/{n}] {name} finished in {info['seconds']:.0f} s")
                progress.stage_finished(name, info["seconds"])
            elif name in _EVERY_RANK:
                stages[name](ctx)
            dist.barrier()  # rank 0's files of this stage exist before any rank starts the next
        if dist.is_main:
            run.complete()
    except BaseException as exc:
        # Also between stages (a log line, the barrier, the final save): Ctrl-C there must not leave "running".
        if dist.is_main:
            run.stopped(exc, stage=name)
            log(f"stopped in stage {name!r}; {resume_hint(root)}")
        raise
    return run


def stage_epochs(job: Job, backend: Backend, stage: str) -> int:
    """The epochs ``stage`` trains in ``job`` (the job progress's plan; 0 for a stage that trains nothing)."""
    spec = job.prune
    if stage == "baseline":
        return 0 if backend.checkpoint is not None else backend.baseline_epochs
    if stage == "sparsity":
        return spec.sparsity.epochs
    if stage == "finetune":
        return spec.finetune.epochs
    if stage == "controls":
        return sum(epochs for _, _, epochs in control_runs(spec, backend.baseline_epochs))
    return 0


__all__ = ["check_unchanged", "execute", "open_run", "preflight", "resume_hint", "run_job", "stage_epochs"]
