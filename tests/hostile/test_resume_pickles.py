"""Nothing a resume reads runs as code: a marker-writing pickle planted in each file of a recovery checkpoint (through
``prunefx.recover`` and through ``prunefx prune CFG resume=true``) is refused in one line naming the file."""

from __future__ import annotations

import copy
import shutil
from pathlib import Path

import pytest
import torch
from _hostile import Sandbox, _Payload, assert_refused, invoke
from torch import nn

pytest.importorskip("accelerate")

from prunefx.train.recover import RecoverConfig, RecoverError, recover


def _plant(path: Path, marker: Path) -> None:
    """Replace ``path`` by a torch file whose unpickling writes ``marker``."""
    path.unlink(missing_ok=True)
    torch.save({"state": _Payload(f"open({str(marker)!r}, 'w').close()")}, path)


def _task() -> tuple[nn.Module, nn.Module, list[torch.Tensor]]:
    torch.manual_seed(0)
    teacher = nn.Sequential(nn.Linear(6, 16), nn.ReLU(), nn.Linear(16, 3)).eval()
    student = nn.Sequential(nn.Linear(6, 8), nn.ReLU(), nn.Linear(8, 3))
    return teacher, student, [torch.randn(4, 6, generator=torch.Generator().manual_seed(i)) for i in range(2)]


def test_a_pickle_in_any_file_of_a_recover_checkpoint_is_refused_naming_it(sandbox: Sandbox) -> None:
    teacher, student, data = _task()
    made = sandbox.project / "made"
    recover(copy.deepcopy(student), teacher, data, config=RecoverConfig(steps=2, log_every=0), checkpoint_dir=made,
            log=lambda _m: None)
    files = sorted(p.relative_to(made) for p in made.rglob("*") if p.is_file())
    assert files and any(f.parent != Path(".") for f in files)  # the record and the state it points at
    longer = RecoverConfig(steps=4, log_every=0)  # a resume that continues, so every file of the state is read
    for name in files:
        ck = sandbox.project / f"ck-{'-'.join(name.parts)}"
        shutil.copytree(made, ck)
        _plant(ck / name, sandbox.marker)
        with pytest.raises(RecoverError) as caught:
            recover(copy.deepcopy(student), teacher, data, config=longer, checkpoint_dir=ck, resume=True,
                    log=lambda _m: None)
        message = str(caught.value)
        assert not sandbox.marker.exists(), f"{name}: the planted pickle ran"
        assert "\n" not in message and str(ck / name) in message, message
    # Files a resume has no business with (accelerate's names) are never read: the resume goes through.
    ck = sandbox.project / "extra"
    shutil.copytree(made, ck)
    state = next(p for p in ck.iterdir() if p.is_dir())
    for name in ("custom_checkpoint_0.pkl", "random_states_0.pkl", "optimizer.bin", "scheduler.bin"):
        torch.save({"state": _Payload(f"open({str(sandbox.marker)!r}, 'w').close()")}, state / name)
    result = recover(copy.deepcopy(student), teacher, data, config=longer, checkpoint_dir=ck, resume=True,
                     log=lambda _m: None)
    assert result.resumed_from == 2 and result.steps == 4 and not sandbox.marker.exists()


def test_a_checkpoint_in_accelerates_pickled_layout_is_refused_unread(sandbox: Sandbox) -> None:
    # what recover wrote before its own format: accelerate's state, the LR scheduler as a full pickle
    teacher, student, data = _task()
    ck = sandbox.project / "old"
    recover(copy.deepcopy(student), teacher, data, config=RecoverConfig(steps=2, log_every=0), checkpoint_dir=ck,
            log=lambda _m: None)
    state = ck / "state-2"
    for p in state.iterdir():
        p.unlink()
    _plant(state / "custom_checkpoint_0.pkl", sandbox.marker)
    with pytest.raises(RecoverError, match="written by an older prunefx"):
        recover(copy.deepcopy(student), teacher, data, config=RecoverConfig(steps=4, log_every=0), checkpoint_dir=ck,
                resume=True, log=lambda _m: None)
    assert not sandbox.marker.exists()


def test_a_pipeline_resume_refuses_a_pickle_in_each_file_of_its_recovery(sandbox: Sandbox,
                                                                        monkeypatch: pytest.MonkeyPatch) -> None:
    import prunefx.pipeline.backends.custom as custom

    task = ["model=_custom_task:keyword_model", "data=_custom_task:keyword_data",
            "metric=_custom_task:keyword_metric", "task_loss=null", "prune.criterion=l1", "prune.finetune.epochs=2"]
    config = str(Path(__file__).resolve().parents[2] / "configs" / "sine.yaml")
    real, calls = custom.recover, []

    def cut_in_the_second_epoch(*args, inputs, **kwargs):
        def counted(batch):
            calls.append(1)
            if len(calls) == 1 + 2 + 4 + 2:  # the loss-kind probe, the 2 val batches, an epoch of 4, 2 more steps
                raise KeyboardInterrupt
            return inputs(batch)
        return real(*args, inputs=counted, **kwargs)

    monkeypatch.setattr(custom, "recover", cut_in_the_second_epoch)
    assert invoke("prune", config, "trust_code=true", f"project={sandbox.project}", "name=made", *task).exit_code != 0
    monkeypatch.undo()
    made = sandbox.project / "made"
    recovery = made / "weights" / "finetune_recover"
    files = sorted(p.relative_to(made) for p in recovery.rglob("*") if p.is_file())
    assert len(files) >= 4, files  # recover.json, and the state of step 4
    for name in files:
        run = sandbox.project / f"r-{name.name}"
        shutil.copytree(made, run)
        (run / ".lock").unlink(missing_ok=True)
        _plant(run / name, sandbox.marker)
        result = invoke("prune", config, "trust_code=true", f"project={sandbox.project}", f"name={run.name}", *task,
                        "resume=true")
        assert not sandbox.marker.exists(), f"{name}: the planted pickle ran"
        assert_refused(result, f"cannot resume from .*{name.name}|{name.name} is not a recovery")
