"""A recovery's resumable checkpoint, written by the main process and read by every process as JSON and weights-only
tensors: nothing a resume reads runs as code.

    checkpoint_dir/recover.json           the step, the config, the progress lines and evaluations so far
    checkpoint_dir/state-N/model.pt       the student's state_dict (torch.save; read weights-only)
    checkpoint_dir/state-N/optimizer.pt   the optimiser's state_dict, its param groups' lr and initial_lr included
    checkpoint_dir/state-N/train.json     each process's RNG states and the GradScaler's numbers
    checkpoint_dir/state-N/best.pt        the student's state_dict at the best evaluation so far (keep_best; its
                                          evaluation is recover.json's "best")

The LR schedule is a function of the step, so the step is all of its state. accelerate's ``save_state`` is not used:
its ``load_state`` unpickles registered objects in full (``custom_checkpoint_*.pkl``), and FSDP's / DeepSpeed's
checkpoints hold pickles of their own, so a checkpoint_dir is refused under those engines.
"""

from __future__ import annotations

import json
import os
import random
import shutil
import stat
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import torch

from prunefx._io import atomic_torch_save, atomic_write, load_torch_file, read_json, refused_global
from prunefx.errors import PrunefxError, UntrustedFileError

STATE_FILE = "recover.json"  # the record that points at the last complete state-N
MODEL_FILE, OPTIMIZER_FILE, TRAIN_FILE, BEST_FILE = "model.pt", "optimizer.pt", "train.json", "best.pt"
FORMAT = "prunefx.recover-state/1"
# Settings a resumed run may change: how long it runs, how often it reports and which state it returns; anything
# else would not continue it.
RESUMABLE_CHANGES = {"steps", "log_every", "eval_every", "checkpoint_every", "keep_best", "metric_goal"}
_PICKLING_ENGINES = ("FSDP", "DEEPSPEED", "MEGATRON_LM")


class RecoverError(PrunefxError):
    """Recovery cannot run or continue; the message names the problem and the fix."""


def check_engine(acc: Any, root: Path | None) -> None:
    """Refuse a checkpoint_dir under an engine whose state this module cannot save without pickles."""
    kind = getattr(getattr(acc, "distributed_type", None), "name", "")
    if root is not None and kind in _PICKLING_ENGINES:
        raise RecoverError(f"recover: checkpoint_dir is not supported under {kind} (its checkpoints are pickles, "
                           "which a resume would run); run without checkpoint_dir, or under DDP or one process")


def resume_point(root: Path | None, config: Mapping[str, Any], steps: int, resume: bool) -> tuple[int, dict]:
    """The step to continue from (0: a fresh run) and the checkpoint's record; refuses a directory this run must not
    write into."""
    if root is None:
        if resume:
            raise RecoverError("recover: resume=True needs the checkpoint_dir of the run to continue")
        return 0, {}
    if not (root / STATE_FILE).is_file():
        if resume:
            raise RecoverError(f"recover: {root} holds no recovery checkpoint ({STATE_FILE}); run without resume "
                               "first, or give the checkpoint_dir of the run to continue")
        if root.exists() and any(root.iterdir()):
            raise RecoverError(f"recover: checkpoint_dir {root} exists and is not empty; give a new or empty "
                               "directory (nothing in it is overwritten)")
        return 0, {}
    saved = _record(root)
    if not resume:
        raise RecoverError(f"recover: {root} holds a recovery checkpoint at step {saved['step']}; pass resume=True "
                           "to continue it, or give another checkpoint_dir")
    changed = sorted(k for k in set(config) | set(saved["config"])
                     if k not in RESUMABLE_CHANGES and config.get(k) != saved["config"].get(k))
    if changed:
        raise RecoverError(f"recover: the checkpoint in {root} was made with other settings ({', '.join(changed)}); "
                           "resume with the same config (only steps and the reporting intervals may change)")
    if saved["step"] > steps:
        raise RecoverError(f"recover: the checkpoint in {root} is at step {saved['step']}, past steps={steps}; "
                           "give at least its steps (equal: the finished run is loaded, nothing trained)")
    return saved["step"], saved


def earlier(saved: Mapping[str, Any], start: int, acc: Any) -> tuple[list[dict[str, Any]], list[dict[str, Any]],
                                                                    torch.Tensor]:
    """The progress lines and evaluations of the run a checkpoint at ``start`` continues (none for a fresh run), and
    this process's loss sum and step count since the last progress line before it."""
    since = torch.zeros(2, dtype=torch.float64)
    if not start:
        return [], [], since
    if len(saved["since"]) == acc.num_processes:
        since += torch.tensor(saved["since"][acc.process_index], dtype=torch.float64)
    # An evaluation at the checkpoint's step is made again by the resumed run (its start).
    return ([h for h in saved["history"] if h["step"] <= start], [e for e in saved["evals"] if e["step"] < start],
            since)


def save_state(acc: Any, root: Path, step: int, record: Mapping[str, Any], model: torch.nn.Module,
         optimizer: torch.optim.Optimizer, since: torch.Tensor, best: Mapping[str, torch.Tensor] | None = None) -> None:
    """The state for ``step`` (every process's RNG gathered to the main one, which alone writes; ``best``: the
    student's state at the best evaluation), then the record that points to it, then the previous state removed."""
    from accelerate.utils import gather_object

    acc.wait_for_everyone()
    every = acc.gather(since.reshape(1, 2).to(acc.device)).cpu().tolist()  # each process's running loss sum
    rngs = gather_object([_rng_state()])
    if acc.is_main_process:
        state = root / f"state-{step}"
        state.mkdir(parents=True, exist_ok=True)
        # confined to root: a link planted in the checkpoint directory is refused, never written through
        atomic_torch_save(acc.unwrap_model(model).state_dict(), state / MODEL_FILE, root=root)
        atomic_torch_save(optimizer.state_dict(), state / OPTIMIZER_FILE, root=root)
        if best is not None:
            atomic_torch_save(dict(best), state / BEST_FILE, root=root)
        scaler = getattr(acc, "scaler", None)
        atomic_write(state / TRAIN_FILE, json.dumps({
            "format": FORMAT, "step": step, "rng": rngs,
            "scaler": scaler.state_dict() if scaler is not None else None}).encode(), root=root)
        previous = _record(root)["step"] if (root / STATE_FILE).is_file() else None
        atomic_write(root / STATE_FILE, json.dumps({**record, "step": step, "since": every}, indent=1).encode(),
                     root=root)
        if previous is not None and previous != step:
            shutil.rmtree(root / f"state-{previous}", ignore_errors=True)  # ours: written by the save before
    acc.wait_for_everyone()


def load_state(acc: Any, root: Path, step: int, model: torch.nn.Module, optimizer: torch.optim.Optimizer) -> None:
    """Every process puts the state of ``step`` into the (prepared) model, its optimiser, the scaler and its RNGs."""
    state = root / f"state-{step}"
    train = state / TRAIN_FILE
    if not train.is_file() and (state / "custom_checkpoint_0.pkl").exists():
        raise RecoverError(f"recover: {state} was written by an older prunefx (accelerate's pickled state, which is "
                           f"not read); delete {root} to start this recovery over")
    _regular(train, root)
    record = read_json(train, RecoverError, missing=f"recover: {train} is missing; {_fix(root)}",
                       what="is not a recovery state", fix=_fix(root), expect=dict)
    rngs, scaler = record.get("rng"), record.get("scaler")
    if (record.get("format") != FORMAT or record.get("step") != step or not isinstance(rngs, list) or not rngs
            or not all(isinstance(r, dict) for r in rngs) or not isinstance(scaler, (dict, type(None)))):
        raise _damaged(train, root, f"not a {FORMAT} record of step {step}")
    weights = _tensors(state / MODEL_FILE, root)
    if not isinstance(weights, dict) or not all(isinstance(k, str) and isinstance(v, torch.Tensor)
                                                for k, v in weights.items()):
        raise _damaged(state / MODEL_FILE, root, "not a state_dict of tensors")
    moments = _tensors(state / OPTIMIZER_FILE, root)
    if not isinstance(moments, dict) or not {"state", "param_groups"} <= set(moments):
        raise _damaged(state / OPTIMIZER_FILE, root, "not an optimiser state_dict")
    # every file read and checked before the model changes
    _into(state / MODEL_FILE, root, lambda: acc.unwrap_model(model).load_state_dict(weights))
    _into(state / OPTIMIZER_FILE, root, lambda: optimizer.load_state_dict(moments))
    if any("initial_lr" not in g or "lr" not in g for g in optimizer.param_groups):
        raise _damaged(state / OPTIMIZER_FILE, root, "its param groups have no lr / initial_lr")
    if scaler is not None and getattr(acc, "scaler", None) is not None:
        _into(train, root, lambda: acc.scaler.load_state_dict(scaler))
    # A run resumed on another process count continues with the RNGs it seeded (its data split differs anyway).
    if len(rngs) == acc.num_processes:
        _into(train, root, lambda: _set_rng_state(rngs[acc.process_index]))


def load_best(root: Path, step: int) -> dict[str, torch.Tensor] | None:
    """The best evaluation's state saved with the state of ``step`` (weights-only), or None when none was saved."""
    path = root / f"state-{step}" / BEST_FILE
    if not os.path.lexists(path):
        return None
    weights = _tensors(path, root)
    if not isinstance(weights, dict) or not all(isinstance(k, str) and isinstance(v, torch.Tensor)
                                                for k, v in weights.items()):
        raise _damaged(path, root, "not a state_dict of tensors")
    return weights


def config_record(config: Any) -> dict[str, Any]:
    """A config dataclass as the JSON it is saved as (tuples as lists)."""
    from dataclasses import asdict

    return json.loads(json.dumps(asdict(config), default=list))


# ---- reading ----------------------------------------------------------------------------------------------------


def _record(root: Path) -> dict[str, Any]:
    """recover.json, type-checked."""
    path = root / STATE_FILE
    _regular(path, root)
    saved = read_json(path, RecoverError, missing=f"recover: {path} is missing; {_fix(root)}",
                      what="is not a recovery record", fix=_fix(root), expect=dict)
    step, history, evals, since = (saved.get(k) for k in ("step", "history", "evals", "since"))
    ok = (type(step) is int and step >= 0 and isinstance(saved.get("config"), dict)
          and all(isinstance(x, list) and all(isinstance(r, dict) and type(r.get("step")) is int for r in x)
                  for x in (history, evals))
          and isinstance(since, list) and all(isinstance(s, list) and len(s) == 2
                                              and all(type(v) in (int, float) for v in s) for s in since))
    if not ok:
        raise _damaged(path, root, "its step, config, history, evals or since is missing or of the wrong type")
    return saved


def _tensors(path: Path, root: Path) -> Any:
    """A state file read weights-only (tensors and plain data), or one line naming it."""
    _regular(path, root)
    try:
        return load_torch_file(path)
    except UntrustedFileError as exc:
        wanted = refused_global(exc)
        raise _damaged(path, root, f"it holds objects beyond tensors{f' (it needs {wanted})' if wanted else ''}, "
                                   "which prunefx never unpickles") from None
    except Exception as exc:  # noqa: BLE001 - truncated, empty or not a torch file: all mean a damaged state
        raise _damaged(path, root, f"unreadable: {type(exc).__name__}: {_one_line(exc)}") from None


def _regular(path: Path, root: Path) -> None:
    """Refuse a missing file, a link or anything but a regular file (a FIFO would block the read)."""
    try:
        mode = os.lstat(path).st_mode
    except FileNotFoundError:
        raise RecoverError(f"recover: {path} is missing; {_fix(root)}") from None
    if not stat.S_ISREG(mode):
        raise _damaged(path, root, "not a regular file (prunefx writes none but regular files there)")


def _into(path: Path, root: Path, put: Any) -> None:
    """``put()`` (a load_state_dict): its refusal of the file's contents as one line naming the file."""
    try:
        put()
    except (RuntimeError, ValueError, KeyError, TypeError, IndexError, AttributeError) as exc:
        raise _damaged(path, root, f"it does not fit this run: {type(exc).__name__}: {_one_line(exc)}") from None


def _damaged(path: Path, root: Path, why: str) -> RecoverError:
    return RecoverError(f"recover: cannot resume from {path}: {why}; {_fix(root)}")


def _fix(root: Path) -> str:
    return f"the checkpoint was changed or damaged: delete {root} to start this recovery over"


def _one_line(exc: BaseException) -> str:
    return " ".join(str(exc).split())[:200]  # torch's load_state_dict puts the mismatches on the next lines


# ---- random number generators -----------------------------------------------------------------------------------


def _rng_state() -> dict[str, Any]:
    """This process's RNG states as plain numbers: Python's, NumPy's, torch's CPU and CUDA generators."""
    version, words, gauss = random.getstate()
    state: dict[str, Any] = {"python": [version, list(words), gauss], "torch": torch.get_rng_state().tolist()}
    try:
        import numpy as np
    except ImportError:
        pass
    else:
        name, keys, pos, has_gauss, cached = np.random.get_state()
        state["numpy"] = [name, keys.tolist(), int(pos), int(has_gauss), float(cached)]
    if torch.cuda.is_available() and torch.cuda.is_initialized():
        state["cuda"] = [s.tolist() for s in torch.cuda.get_rng_state_all()]
    return state


def _set_rng_state(state: Mapping[str, Any]) -> None:
    version, words, gauss = state["python"]
    random.setstate((version, tuple(words), gauss))
    torch.set_rng_state(_bytes(state["torch"]))
    if "numpy" in state:
        import numpy as np

        name, keys, pos, has_gauss, cached = state["numpy"]
        np.random.set_state((name, np.asarray(keys, dtype=np.uint32), pos, has_gauss, cached))
    if "cuda" in state and torch.cuda.is_available():  # the devices this machine has (a resume may have fewer)
        for device, values in enumerate(state["cuda"][:torch.cuda.device_count()]):
            torch.cuda.set_rng_state(_bytes(values), device)


def _bytes(values: Sequence[int]) -> torch.Tensor:
    if not isinstance(values, list) or not all(type(v) is int and 0 <= v < 256 for v in values):
        raise ValueError("an RNG state is not a list of bytes")
    return torch.tensor(values, dtype=torch.uint8)


__all__ = ["STATE_FILE", "RecoverError", "check_engine", "config_record", "earlier", "load_best", "load_state",
           "resume_point", "save_state"]
