"""Writers never destroy data: save_pretrained refuses a user's directory and the checkpoint the model came from, and
a full, read-only or forbidden disk is one line naming the path and the fix (never a bare ``[Errno 28]``).

Tests run as root, which no chmod stops: the disk errors are raised by monkeypatched OS calls.
"""

from __future__ import annotations

import errno
import os
from pathlib import Path

import pytest
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
