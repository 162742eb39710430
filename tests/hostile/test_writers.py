"""Writers never destroy data: save_pretrained refuses a user's directory and the checkpoint the model came from, and
a full, read-only or forbidden disk is one line naming the path and the fix (never a bare ``[Errno 28]``).

Tests run as root, which no chmod stops: the disk errors are raised by monkeypatched OS calls.
"""

from __future__ import annotations

import errno
import os
from pathlib import Path

import pytest
import torch
from _hostile import Sandbox, assert_refused, assert_untouched, invoke

from prunefx.errors import PrunefxError, StorageError

SPEC = ["prune", "hostile_models:tiny", "--imgsz", "16", "--no-latency", "--out", "runs/x"]
DIGITS = ["prune", "digits_cnn.yaml", "project=runs", "name=r", "epochs=1"]


# ---- save_pretrained ---------------------------------------------------------------------------------------------


def _tiny_llama():
    transformers = pytest.importorskip("transformers")
    cfg = transformers.LlamaConfig(vocab_size=32, hidden_size=16, intermediate_size=32, num_hidden_layers=1,
                                   num_attention_heads=2, num_key_value_heads=2, max_position_embeddings=16)
    return transformers.LlamaForCausalLM(cfg).eval()


def _files(path: Path) -> dict[str, bytes]:
    return {p.name: p.read_bytes() for p in sorted(path.iterdir())}


def test_save_pretrained_refuses_a_directory_with_files(tmp_path: Path) -> None:
    from prunefx.integrations import transformers as pfx_hf

    mine = tmp_path / "mine"
    mine.mkdir()
    for name in ("model-00001-of-00002.safetensors", "model-00002-of-00002.safetensors"):
        (mine / name).write_bytes(b"the user's weights")
    (mine / "config.json").write_text('{"model_type": "theirs"}')
    (mine / "notes.txt").write_text("mine")
    before = _files(mine)
    with pytest.raises(PrunefxError, match=r"mine is not empty \(it holds config\.json, model-00001-of-00002"
                                           r"\.safetensors, model-00002-of-00002\.safetensors, \.\.\.\).*pass "
                                           r"overwrite=True"):
        pfx_hf.save_pretrained(_tiny_llama(), mine)
    assert _files(mine) == before
    (tmp_path / "a file").write_text("x")
    with pytest.raises(PrunefxError, match=r"a file is a file, not a directory"):
        pfx_hf.save_pretrained(_tiny_llama(), tmp_path / "a file")
    assert (tmp_path / "a file").read_text() == "x"


def test_save_pretrained_overwrite_replaces_a_directory(tmp_path: Path) -> None:
    from prunefx.integrations import transformers as pfx_hf

    model = _tiny_llama()
    out = tmp_path / "out"
    pfx_hf.save_pretrained(model, out)  # new: no overwrite needed
    (out / "notes.txt").write_text("kept")
    with pytest.raises(PrunefxError, match="is not empty"):
        pfx_hf.save_pretrained(model, out)
    pfx_hf.save_pretrained(model, out, overwrite=True)
    assert (out / "notes.txt").read_text() == "kept"
    again = type(model).from_pretrained(out)
    assert again.config.intermediate_size == 32


def test_save_pretrained_never_writes_over_its_source(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from prunefx.integrations import transformers as pfx_hf

    src = tmp_path / "src"
    _tiny_llama().save_pretrained(src)
    before = _files(src)
    model = type(_tiny_llama()).from_pretrained(src)
    (tmp_path / "link").symlink_to(src, target_is_directory=True)
    monkeypatch.chdir(tmp_path)
    for spelling in (src, "src", "link", tmp_path / "src" / ".." / "src"):
        with pytest.raises(PrunefxError, match=r"is the checkpoint the model was loaded from .*also with "
                                               r"overwrite=True.*give another directory"):
            pfx_hf.save_pretrained(model, spelling, overwrite=True)
    assert _files(src) == before


# ---- full, read-only and forbidden disks -------------------------------------------------------------------------


def _fail_fsync(monkeypatch: pytest.MonkeyPatch) -> None:
    def full(fd: int) -> None:
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))  # as write/fsync report it: no file name

    monkeypatch.setattr(os, "fsync", full)


def _fail_mkdir_in(monkeypatch: pytest.MonkeyPatch, under: Path, code: int) -> None:
    real = os.mkdir

    def mkdir(path, *args, **kwargs):
        if Path(os.path.abspath(path)).parent == under:
            raise OSError(code, os.strerror(code), str(path))
        return real(path, *args, **kwargs)

    monkeypatch.setattr(os, "mkdir", mkdir)


@pytest.mark.parametrize("args", [SPEC, DIGITS], ids=["spec", "config"])
def test_a_full_disk_is_one_line_naming_the_file(sandbox: Sandbox, monkeypatch: pytest.MonkeyPatch,
                                                 args: list[str]) -> None:
    sandbox.project.mkdir()
    before = sandbox.snapshot()
    _fail_fsync(monkeypatch)
    result = invoke(*args)
    where = r"runs/\.x\.\w+" if args is SPEC else r"runs/r"
    assert_refused(result, rf"cannot write {where}/config\.yaml: no space left on the device; free space there, "
                           r"or give project= \(pipeline config\) or --out \(CLI\) a directory on a disk with room")
    assert_untouched(sandbox, before)
    assert not [p for p in sandbox.project.rglob("*.tmp")]  # the half-written file is gone


@pytest.mark.parametrize(("code", "message"), [
    (errno.EROFS, r"the file system is read-only; give project= \(pipeline config\) or --out \(CLI\) a directory on "
                  r"a writable disk"),
    (errno.EACCES, r"permission denied; fix its permissions, or give project= .* a directory you can write"),
])
@pytest.mark.parametrize("args", [SPEC, DIGITS], ids=["spec", "config"])
def test_a_project_directory_that_cannot_be_written(sandbox: Sandbox, monkeypatch: pytest.MonkeyPatch,
                                                    args: list[str], code: int, message: str) -> None:
    sandbox.project.mkdir()
    before = sandbox.snapshot()
    _fail_mkdir_in(monkeypatch, sandbox.project, code)
    result = invoke(*args)
    assert_refused(result, rf"cannot write runs/{'x' if args is SPEC else 'r'}: {message}")
    assert_untouched(sandbox, before)
    assert list(sandbox.project.iterdir()) == []


def test_the_pipeline_module_says_the_same(sandbox: Sandbox, monkeypatch: pytest.MonkeyPatch,
                                           capsys: pytest.CaptureFixture[str]) -> None:
    """``python -m prunefx.pipeline``: the same one line and exit code 2, not an OSError traceback."""
    from prunefx.pipeline.__main__ import main

    _fail_fsync(monkeypatch)
    assert main(DIGITS[1:]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("error: cannot write runs/r/config.yaml: no space left"), err


def test_atomic_write_names_the_file_it_could_not_write(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from prunefx._io import atomic_write

    (tmp_path / "keep.json").write_text("previous")
    _fail_fsync(monkeypatch)
    with pytest.raises(StorageError, match=r"cannot write .*keep\.json: no space left") as info:
        atomic_write(tmp_path / "keep.json", b"new")
    assert isinstance(info.value, OSError) and info.value.errno == errno.ENOSPC  # still an OSError for callers
    assert (tmp_path / "keep.json").read_text() == "previous"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["keep.json"]


# ---- links planted in a run or a destination: never written through ----------------------------------------------


@pytest.mark.parametrize("plant", ["weights", "weights/pruned.pt", "plan.json"])
def test_a_link_planted_while_a_stage_runs_is_never_written_through(sandbox: Sandbox, plant: str) -> None:
    """A shared run directory: a link planted after the stage's start check still never redirects its writes."""
    from prunefx._io import atomic_torch_save, atomic_write
    from prunefx.errors import UnsafePathError
    from prunefx.pipeline.rundir import RunDir, RunLock

    run = RunDir.open(sandbox.project, "r", {})
    victim = sandbox.outside / "keep.txt"
    before = sandbox.snapshot()
    with pytest.raises(UnsafePathError, match=rf"runs/r/{plant} is a symbolic link \(to .*outside.*\); prunefx does "
                                              r"not write through links inside .*runs/r: remove the link"):
        with run.stage("prune"):
            if plant == "weights":
                (run.root / "weights").symlink_to(sandbox.outside, target_is_directory=True)
            else:
                (run.root / "weights").mkdir()
                (run.root / plant).symlink_to(victim)
            if plant == "plan.json":
                atomic_write(run.root / "plan.json", b'{"schema": "prunefx.plan/1"}')
            else:
                atomic_torch_save({"w": 1}, run.root / "weights" / "pruned.pt")  # as the backends save weights
    assert sandbox.snapshot() == before
    assert not list(sandbox.outside.glob(".*.tmp"))
    assert (run.root / plant).is_symlink()  # refused, not replaced: the link is there for the user to see
    RunLock.release_root(run.root)


def test_report_write_refuses_a_link_planted_in_a_finished_run(sandbox: Sandbox) -> None:
    """``prunefx report RUN --write`` rewrites report.json/.md/.html in the run: a link there is refused."""
    from prunefx.metrics import measure
    from prunefx.report import Stage, build_report, write_report

    run = sandbox.project / "done"
    x = torch.randn(1, 3, 8, 8)
    stage = [Stage(measure(torch.nn.Conv2d(3, c, 3), x)) for c in (8, 4)]
    write_report(run, build_report(model="m", baseline=stage[0], pruned=stage[1]))
    (run / "report.md").unlink()
    (run / "report.md").symlink_to(sandbox.outside / "keep.txt")
    before = sandbox.snapshot()
    result = invoke("report", str(run), "--write")
    assert_refused(result, r"runs/done/report\.md is a symbolic link \(to .*keep\.txt\); .*remove the link")
    assert sandbox.snapshot() == before


def test_a_confined_write_never_leaves_its_root(tmp_path: Path) -> None:
    from prunefx._io import atomic_write, open_in, safe_name
    from prunefx.errors import UnsafePathError

    root, outside = tmp_path / "dst", tmp_path / "outside"
    root.mkdir()
    outside.mkdir()
    (root / "inner").symlink_to(outside, target_is_directory=True)
    for path in (root / ".." / "outside" / "x", root / "inner" / "x", root / "inner" / ".." / ".." / "outside" / "x"):
        with pytest.raises(UnsafePathError, match=r"is not inside .*dst|is a symbolic link"):
            atomic_write(path, b"x", root=root)
    with pytest.raises(UnsafePathError, match=r"symbolic link"):
        open_in(root, root / "inner" / "lock", os.O_RDWR | os.O_CREAT)
    assert list(outside.iterdir()) == []
    atomic_write(root / "ok.json", b"{}", root=root)
    assert (root / "ok.json").read_bytes() == b"{}" and oct((root / "ok.json").stat().st_mode)[-3:] != "600"
    assert safe_name("model-00001-of-00002.safetensors", where="index.json") == "model-00001-of-00002.safetensors"
    for bad in ("../victim/model.safetensors", "/etc/passwd", "a\\b", "..", "", 5):
        with pytest.raises(UnsafePathError, match=r"index\.json weight_map: .* is not a plain file name"):
            safe_name(bad, where="index.json weight_map")


def test_save_onto_a_directory_is_one_line_naming_it(tmp_path: Path) -> None:
    import prunefx
    from prunefx._io import atomic_write

    model = torch.nn.Sequential(torch.nn.Conv2d(3, 8, 3), torch.nn.BatchNorm2d(8), torch.nn.ReLU(),
                                torch.nn.Conv2d(8, 4, 3))
    result = prunefx.prune(model, torch.randn(1, 3, 8, 8), prunefx.PlanConfig(ratio=0.5), criterion="l1")
    adir = tmp_path / "adir"
    adir.mkdir()
    (adir / "mine.txt").write_text("kept")
    with pytest.raises(PrunefxError, match=r"^prunefx\.save: .*adir is a directory; give the path of the file to "
                                           r"write, e\.g\. .*adir/pruned\.pt$"):
        prunefx.save(result.model, result.plan, adir)
    with pytest.raises(StorageError, match=r"^cannot write .*adir: it is a directory; give the path of a file"):
        atomic_write(adir, b"x")  # every writer: the directory named, never a temp file
    assert [p.name for p in adir.iterdir()] == ["mine.txt"] and not list(tmp_path.glob(".*.tmp"))
