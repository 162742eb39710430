"""Run directories: created only under project, name one path component, replaced only when they are prunefx runs,
and damaged runs reported in one line."""

from __future__ import annotations

import json
import re
import sys
from pathlib import Path

import pytest
from _hostile import Sandbox, assert_refused, assert_untouched, invoke

from prunefx.pipeline.rundir import LOCK, RunDir, RunError, RunLock, is_run, read_state

# Validates in about a second; every case below is refused before a stage runs.
YOLO = ["prune", "yolo.yaml", "project=runs", "imgsz=64", "prune.data.n_train=8", "prune.data.n_val=4",
        "prune.data.imgsz=64"]
DIGITS = ["prune", "digits_cnn.yaml", "project=runs", "epochs=1"]


@pytest.mark.parametrize("config", [YOLO, DIGITS], ids=["yolo", "classify"])
@pytest.mark.parametrize(
    "name", ["../../../outside/escape", "../outside", "..", ".", "a/b", "/tmp/prunefx-absolute-name"]
)
def test_name_is_one_path_component(sandbox: Sandbox, config: list[str], name: str) -> None:
    before = sandbox.snapshot()
    result = invoke(*config, f"name={name}", "exist_ok=true")
    assert_refused(result, r"name=.* must be one directory name")
    assert_untouched(sandbox, before)
    assert not Path("/tmp/prunefx-absolute-name").exists()
    assert not sandbox.project.exists() or not any(sandbox.project.iterdir())


def test_name_dotdot_with_exist_ok_deletes_nothing(sandbox: Sandbox) -> None:
    """The reported case: name=../.. with exist_ok=true deleted a user's directory."""
    (sandbox.project / "deep").mkdir(parents=True)
    before = sandbox.snapshot()
    result = invoke(*YOLO[:2], "project=runs/deep", "name=../..", "exist_ok=true")
    assert_refused(result, r"name='\.\./\.\.' must be one directory name")
    assert_untouched(sandbox, before)
    assert (sandbox.project / "deep").is_dir()


def test_project_that_is_a_file(sandbox: Sandbox) -> None:
    (sandbox.root / "notadir").write_text("x")
    before = sandbox.snapshot()
    for config in (YOLO, DIGITS):
        result = invoke(*config[:2], "project=notadir", "name=r")
        assert_refused(result, r"project=notadir is a file, not a directory")
    result = invoke(*YOLO[:2], "project=notadir/sub", "name=r")
    assert_refused(result, r"cannot create project directory notadir/sub")
    assert_untouched(sandbox, before)


@pytest.mark.parametrize("config", [YOLO, DIGITS], ids=["yolo", "classify"])
def test_exist_ok_refuses_a_directory_that_is_not_a_run(sandbox: Sandbox, config: list[str]) -> None:
    mine = sandbox.project / "mine"
    mine.mkdir(parents=True)
    (mine / "thesis.tex").write_text("years of work")
    result = invoke(*config, "name=mine", "exist_ok=true")
    assert_refused(result, r"runs/mine is not a prunefx run .* exist_ok will not delete it")
    assert sorted(p.name for p in mine.iterdir()) == ["thesis.tex"]  # not even a lock file was added
    assert (mine / "thesis.tex").read_text() == "years of work"


def test_exist_ok_replaces_a_run_and_only_a_run(tmp_path: Path) -> None:
    first = RunDir.open(tmp_path, "r", {"model": "a"})
    (first.root / "weights").mkdir()
    (first.root / "weights" / "old.pt").write_bytes(b"old")
    first.complete()
    again = RunDir.open(tmp_path, "r", {"model": "b"}, exist_ok=True)
    assert again.root == first.root
    assert sorted(p.name for p in again.root.iterdir()) == [LOCK, "config.yaml", "state.json"]
    assert "model: b" in (again.root / "config.yaml").read_text()
    taken = RunDir.open(tmp_path, "r", {"model": "c"})  # without exist_ok: the next free name
    assert taken.root == tmp_path / "r2" and is_run(taken.root)
    (tmp_path / "empty").mkdir()
    assert RunDir.open(tmp_path, "empty", {}, exist_ok=True).root == tmp_path / "empty"  # nothing to delete
    for other in (RunDir.open(tmp_path, "r", {}, exist_ok=True), taken):
        RunLock.release_root(other.root)


@pytest.mark.parametrize("target", ["not a run", "a file", "a symlink to a run"])
def test_prune_spec_exist_ok_replaces_only_runs(sandbox: Sandbox, target: str) -> None:
    out = sandbox.root / "out"
    if target == "not a run":
        out.mkdir()
        (out / "data.csv").write_text("1,2,3")
    elif target == "a file":
        out.write_text("a file")
    else:
        run = RunDir.open(sandbox.root, "real_run", {})
        run.complete()
        out.symlink_to(run.root, target_is_directory=True)
    before = sandbox.snapshot()
    result = invoke("prune", "hostile_models:tiny", "--imgsz", "16", "--out", "out", "--exist-ok", "--no-latency")
    assert_refused(result, r"out is not (a prunefx run|a directory)")
    assert_untouched(sandbox, before)


def test_prune_spec_replaces_its_own_run(sandbox: Sandbox) -> None:
    args = ["prune", "hostile_models:tiny", "--imgsz", "16", "--out", "runs/once", "--no-latency", "--ratio", "0.5"]
    assert invoke(*args).exit_code == 0
    run = sandbox.project / "once"
    state = json.loads((run / "state.json").read_text())
    assert state["status"] == "complete" and is_run(run)
    assert_refused(invoke(*args), r"runs/once already holds a run; pick another --out or pass --exist-ok")
    (run / "stale.txt").write_text("from the first run")
    result = invoke(*args, "--exist-ok")
    assert result.exit_code == 0, result.output
    assert not (run / "stale.txt").exists() and is_run(run)
    assert [p.name for p in sandbox.project.iterdir()] == ["once"]  # no temp or trash directory left


# ---- damaged runs ------------------------------------------------------------------------------------------------


def _started_run(box: Sandbox, config: list[str], name: str = "r") -> Path:
    """A run as the CLI would have left it after being interrupted: config.yaml, state.json, status failed."""
    from prunefx.pipeline.run_config import load_config

    raw = load_config(config[1], [*config[2:], f"name={name}"])
    run = RunDir.open(box.project, name, raw)
    run.state["status"] = "interrupted"
    run._save()
    RunLock.release_root(run.root)
    return run.root


@pytest.mark.parametrize(
    "damage, message",
    [
        ("state.json is a list", r"state\.json is not a prunefx run state"),
        ("state.json is not json", r"state\.json is corrupt"),
        ("config.yaml is not yaml", r"config\.yaml is corrupt"),
        ("config.yaml is a list", r"config\.yaml is not a mapping"),
        ("config.yaml is missing", r"config\.yaml is missing"),
        ("no state.json", r"holds no state\.json"),
    ],
)
@pytest.mark.parametrize("config", [YOLO, DIGITS], ids=["yolo", "classify"])
def test_resume_of_a_damaged_run(sandbox: Sandbox, config: list[str], damage: str, message: str) -> None:
    root = _started_run(sandbox, config)
    state, cfg = root / "state.json", root / "config.yaml"
    {
        "state.json is a list": lambda: state.write_text("[1, 2]"),
        "state.json is not json": lambda: state.write_text("{"),
        "config.yaml is not yaml": lambda: cfg.write_text("a: [unclosed"),
        "config.yaml is a list": lambda: cfg.write_text("- 1\n- 2\n"),
        "config.yaml is missing": cfg.unlink,
        "no state.json": state.unlink,
    }[damage]()
    before = {p.name: p.read_bytes() for p in root.iterdir() if p.name != LOCK}  # the lock records its holder
    outside = sandbox.snapshot()
    result = invoke(*config, "name=r", "resume=true")
    assert_refused(result, rf"cannot resume .*runs/r|{message}")
    assert re.search(message, result.stderr)
    assert {p.name: p.read_bytes() for p in root.iterdir() if p.name != LOCK} == before
    assert_untouched(sandbox, outside)


def test_report_on_a_file_or_a_damaged_run(sandbox: Sandbox) -> None:
    (sandbox.root / "report.json").write_text("{}")
    assert_refused(invoke("report", "report.json"), r"report\.json is a file, not a directory; give the directory")
    assert_refused(invoke("report", "nowhere"), r"nowhere does not exist")
    root = _started_run(sandbox, YOLO)
    (root / "state.json").write_text("[]")
    assert_refused(invoke("report", str(root)), r"state\.json is not a prunefx run state")


# ---- links out of a run ------------------------------------------------------------------------------------------


@pytest.mark.parametrize("link", ["weights", "weights/baseline.pt"])
def test_resume_refuses_a_link_that_leads_out_of_the_run(sandbox: Sandbox, link: str) -> None:
    """``weights -> ../outside``: resuming would write baseline.pt / pruned.pt into the user's directory."""
    root = _started_run(sandbox, DIGITS)
    if link == "weights":
        (root / "weights").symlink_to(sandbox.outside, target_is_directory=True)
    else:
        (root / "weights").mkdir()
        (root / link).symlink_to(sandbox.outside / "keep.txt")
    before = {p.name: p.read_bytes() for p in root.iterdir() if p.is_file() and p.name != LOCK}
    outside = sandbox.snapshot()
    result = invoke(*DIGITS, "name=r", "resume=true")
    assert_refused(result, rf"runs/r/{link} is a symbolic link to .*/outside(/keep\.txt)?, outside the run "
                           r"directory .*runs/r; .*remove the link")
    assert_untouched(sandbox, outside)
    assert {p.name: p.read_bytes() for p in root.iterdir() if p.is_file() and p.name != LOCK} == before


def test_a_link_planted_during_a_run_stops_the_next_stage(tmp_path: Path) -> None:
    (tmp_path / "outside").mkdir()
    run = RunDir.open(tmp_path / "runs", "r", {})
    (run.root / "inside").mkdir()
    (run.root / "alias").symlink_to(run.root / "inside", target_is_directory=True)  # inside the run: fine
    with run.stage("baseline"):
        pass
    (run.root / "weights").symlink_to(tmp_path / "outside", target_is_directory=True)
    with pytest.raises(RunError, match=r"weights is a symbolic link to .*outside, outside the run directory"):
        with run.stage("prune"):
            raise AssertionError("the stage ran with a link out of the run")
    state = read_state(run.root)
    assert state["status"] == "failed" and state["error"]["stage"] == "prune" and list(state["stages"]) == ["baseline"]
    assert list((tmp_path / "outside").iterdir()) == []
    RunLock.release_root(run.root)


# ---- Ctrl-C ------------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("when", ["its log line", "its state save"])
def test_ctrl_c_as_a_stage_starts_records_interrupted(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                      when: str) -> None:
    """KeyboardInterrupt outside the stage's own body (before it starts running) still leaves ``interrupted``."""
    from types import SimpleNamespace

    from prunefx.pipeline import runner
    from prunefx.pipeline.job import ONE_SHOT, Job
    from prunefx.pipeline.records import BaselineDone
    from prunefx.pipeline.run_config import PruneSpec, RunOptions
    from prunefx.train.distributed import LOCAL

    def baseline(ctx):
        return BaselineDone(source="stub", metrics={})

    def prune(ctx):
        raise AssertionError("the prune stage ran")

    monkeypatch.setattr(runner, "baseline_stage", baseline)
    monkeypatch.setattr(runner, "prune_stage", prune)
    run = RunDir.open(tmp_path, "r", {})
    log = print
    if when == "its log line":
        def log(message: str) -> None:
            if message == "[2/3] prune":
                raise KeyboardInterrupt
    else:
        save = RunDir._save

        def interrupted_save(self: RunDir) -> None:
            if self.state.get("current") == "prune" and self.state["status"] == "running":
                raise KeyboardInterrupt  # once: the state records "interrupted" on the next save
            save(self)

        monkeypatch.setattr(RunDir, "_save", interrupted_save)
    job = Job(prune=PruneSpec(), run=RunOptions(name="r"), stages=ONE_SHOT)
    with pytest.raises(KeyboardInterrupt):
        runner.execute(job, SimpleNamespace(dist=LOCAL, root=None, checkpoint=None, baseline_epochs=0), run, log=log)
    state = read_state(run.root)
    assert state["status"] == "interrupted", state
    assert state["error"]["stage"] == "prune" and state["error"]["type"] == "KeyboardInterrupt"
    assert list(state["stages"]) == ["baseline"]  # finished before the interrupt, kept for resume
    RunLock.release_root(run.root)


# ---- the config a run keeps --------------------------------------------------------------------------------------


def test_a_runs_config_is_written_without_aliases_and_resumes(tmp_path: Path) -> None:
    """A value shared by two keys is written out twice: config.yaml is read back by the alias-refusing loader."""
    shared = ["model.22.*", "model.0.*"]
    config = {"model": "m", "prune": {"ignore": shared}, "notes": {"ignore": shared}}
    run = RunDir.open(tmp_path, "r", config)
    text = (run.root / "config.yaml").read_text()
    assert "&" not in text and "*id" not in text, text
    run.state["status"] = "interrupted"
    run._save()
    RunLock.release_root(run.root)
    again = RunDir.open(tmp_path, "r", config, resume=True)
    assert again.root == run.root and again.state["status"] == "running"
    RunLock.release_root(again.root)


# A module that leaves the marker when imported: named by a run's files, it must never be imported by export.
EVIL_PY = "open({marker!r}, 'w').close()\n\ndef make():\n    raise SystemExit(0)\n"


@pytest.mark.parametrize(("config", "extra"), [
    ({"task": "custom", "model": "evil_factory:make", "data": "evil_factory:make", "metric": "evil_factory:make",
      "trust_code": True}, {}),
    ({"task": "classify", "model": "evil_factory:make"}, {}),
    ({"model": "evil_factory:make"}, {}),
    ({"spec": "evil_factory:make", "prune": {}}, {"report.json": {"settings": {"spec": "evil_factory:make"}}}),
    ({"task": "custom", "model": "signal:pause", "data": "signal:pause", "metric": "signal:pause"}, {}),
], ids=["custom", "classify", "no-task", "spec", "signal-pause"])
def test_export_never_imports_a_name_read_from_the_run(sandbox: Sandbox, config: dict, extra: dict) -> None:
    import yaml

    (sandbox.root / "evil_factory.py").write_text(EVIL_PY.format(marker=str(sandbox.marker)))
    run = sandbox.root / "shared" / "r"  # outside project: the snapshot proves export left it as it was
    (run / "weights").mkdir(parents=True)
    stages = {s: {"metrics": {}} for s in ("baseline", "prune", "finetune", "report")}
    (run / "state.json").write_text(json.dumps({"schema": "prunefx.run/1", "status": "complete", "stages": stages}))
    (run / "config.yaml").write_text(yaml.safe_dump(config))
    for name, data in extra.items():
        (run / name).write_text(json.dumps(data))
    before = sandbox.snapshot()
    assert_refused(invoke("export", run), r"never imports .*--model package\.module:function")
    assert_untouched(sandbox, before)
    assert not (run / "model.onnx").exists() and "evil_factory" not in sys.modules


@pytest.mark.parametrize(("config", "planted", "message"), [
    ({"task": "custom", "model": "prunefx.zoo:bn_cnn", "data": "x:y", "metric": "x:z"}, "weights/finetuned.pt",
     r"finetuned\.pt is not a prunefx checkpoint: it holds pickled objects"),
    ({"model": "yolov8n.yaml", "imgsz": 64}, "weights/best.pt", r"best\.pt was not loaded"),
    ({"spec": "torchvision:resnet18", "prune": {}}, "pruned.pt", r"pruned\.pt is not a prunefx checkpoint"),
], ids=["custom", "yolo", "spec"])
def test_export_never_unpickles_a_planted_checkpoint(sandbox: Sandbox, config: dict, planted: str,
                                                     message: str) -> None:
    import yaml

    run = sandbox.root / "shared" / "r"
    (run / "weights").mkdir(parents=True)
    stages = {s: {"metrics": {}} for s in ("baseline", "prune", "finetune", "report")}
    (run / "state.json").write_text(json.dumps({"schema": "prunefx.run/1", "status": "complete", "stages": stages}))
    (run / "config.yaml").write_text(yaml.safe_dump(config))
    sandbox.write_pickle().rename(run / planted)
    before = sandbox.snapshot()
    assert_refused(invoke("export", run), message)
    assert_untouched(sandbox, before)


def test_export_of_an_llm_run_never_reads_a_planted_pickle(sandbox: Sandbox) -> None:
    transformers = pytest.importorskip("transformers")
    import yaml

    run = sandbox.root / "shared" / "lm"
    final = run / "weights" / "finetuned"
    final.mkdir(parents=True)
    stages = {s: {"metrics": {}} for s in ("baseline", "prune", "finetune", "report")}
    (run / "state.json").write_text(json.dumps({"schema": "prunefx.run/1", "status": "complete", "stages": stages}))
    (run / "config.yaml").write_text(yaml.safe_dump({"task": "llm", "model": "evil_factory:make"}))
    transformers.LlamaConfig(vocab_size=256, hidden_size=16, intermediate_size=32, num_hidden_layers=1,
                             num_attention_heads=2).save_pretrained(final)
    sandbox.write_pickle().rename(final / "pytorch_model.bin")  # weights as a pickle, no safetensors beside it
    before = sandbox.snapshot()
    assert_refused(invoke("export", run), r"finetuned does not load as a causal LM from its safetensors")
    assert_untouched(sandbox, before)
