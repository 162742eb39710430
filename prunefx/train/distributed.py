"""torch.distributed for the training loop: one context object, launched by torchrun or spawned by prunefx.

Under ``torchrun --nproc_per_node N -m ...`` every process calls :func:`init_from_env`, which reads RANK /
WORLD_SIZE / LOCAL_RANK and joins the process group (NCCL on GPUs, gloo on CPU). Without torchrun,
:func:`spawn` starts N local workers itself and turns a worker's failure into one clear error (the others are
stopped, nothing hangs). A single process gets :data:`LOCAL`, whose collectives are no-ops.

>>> dist = init_from_env("auto")          # in each worker
>>> total = dist.all_reduce_sum(torch.tensor([correct, seen], dtype=torch.float64))
>>> spawn(worker_fn, (job,), nproc=2)    # from a plain process: runs worker_fn(*args) in 2 ranks
"""

from __future__ import annotations

import datetime
import os
import socket
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
import torch.distributed as tdist

from prunefx.errors import PrunefxError

# Set by torchrun (and by spawn below) in every worker.
_ENV = ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT")


class DistributedError(PrunefxError):
    """A worker process failed, or the process group could not be set up; names the rank and the cause."""


@dataclass(frozen=True)
class DistContext:
    """This process's place in the job: rank, world size, device; collectives that are no-ops alone."""

    rank: int = 0
    world_size: int = 1
    local_rank: int = 0
    device: torch.device = field(default_factory=lambda: torch.device("cpu"))

    @property
    def is_main(self) -> bool:
        return self.rank == 0

    @property
    def distributed(self) -> bool:
        return self.world_size > 1

    def barrier(self) -> None:
        if self.distributed:
            tdist.barrier()

    def all_reduce_sum(self, t: torch.Tensor) -> torch.Tensor:
        """Sum of ``t`` over ranks (gloo/NCCL need the tensor on this rank's device)."""
        if not self.distributed:
            return t
        t = t.to(self.device)
        tdist.all_reduce(t, op=tdist.ReduceOp.SUM)
        return t.cpu()

    def all_gather(self, obj: Any) -> list[Any]:
        """Every rank's ``obj`` (picklable), in rank order."""
        if not self.distributed:
            return [obj]
        out: list[Any] = [None] * self.world_size
        tdist.all_gather_object(out, obj)
        return out

    def broadcast(self, obj: Any) -> Any:
        """Rank 0's ``obj`` in every rank (the other ranks' argument is ignored)."""
        if not self.distributed:
            return obj
        box = [obj if self.is_main else None]
        tdist.broadcast_object_list(box, src=0, device=self.device if self.device.type == "cuda" else None)
        return box[0]


LOCAL = DistContext()


def launched_by_torchrun() -> bool:
    """True inside a worker started by torchrun (or by :func:`spawn`): WORLD_SIZE and RANK are set."""
    return "WORLD_SIZE" in os.environ and "RANK" in os.environ


def resolve_device(device: str, local_rank: int = 0) -> torch.device:
    """``auto`` -> this rank's GPU when CUDA is available, else the CPU; ``cuda`` -> ``cuda:<local_rank>``."""
    if device == "auto":
        device = "cuda" if torch.cuda.is_available() else "cpu"
    if device == "cuda":
        device = f"cuda:{local_rank}"
    try:
        dev = torch.device(device)
    except RuntimeError as exc:
        raise DistributedError(f"unknown device {device!r} ({exc}); use cpu, cuda, cuda:N or auto") from exc
    if dev.type == "cuda":
        if not torch.cuda.is_available():
            raise DistributedError(f"device {device} asked for, but this torch sees no CUDA GPU; use device=cpu")
        if (dev.index or 0) >= torch.cuda.device_count():
            raise DistributedError(f"device {device}: only {torch.cuda.device_count()} GPU(s) here; one rank per GPU "
                                   "(nproc <= number of GPUs)")
    return dev


def init_from_env(device: str = "auto", *, timeout_s: float = 1800.0) -> DistContext:
    """Join the process group torchrun (or :func:`spawn`) described in the environment; alone: :data:`LOCAL`."""
    if not launched_by_torchrun() or int(os.environ["WORLD_SIZE"]) == 1:
        return DistContext(device=resolve_device(device))
    rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    local_rank = int(os.environ.get("LOCAL_RANK", rank))
    dev = resolve_device(device, local_rank)
    if dev.type == "cuda":
        torch.cuda.set_device(dev)
    backend = "nccl" if dev.type == "cuda" else "gloo"
    if not tdist.is_initialized():
        try:
            # The timeout bounds how long a rank waits for a peer that died without the launcher noticing.
            tdist.init_process_group(backend, timeout=datetime.timedelta(seconds=timeout_s),
                                     **({"device_id": dev} if dev.type == "cuda" else {}))
        except Exception as exc:  # rendezvous failures come in many types
            raise DistributedError(f"rank {rank} of {world} could not join the {backend} process group at "
                                   f"{os.environ.get('MASTER_ADDR')}:{os.environ.get('MASTER_PORT')} "
                                   f"({type(exc).__name__}: {exc})") from exc
    return DistContext(rank, world, local_rank, dev)


def shutdown() -> None:
    if tdist.is_available() and tdist.is_initialized():
        tdist.destroy_process_group()


def free_port() -> int:
    """A TCP port free on this machine right now (for the spawned workers' rendezvous)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def spawn(fn: Callable[..., Any], args: tuple[Any, ...], nproc: int, *, threads: int | None = None) -> None:
    """Run ``fn(*args)`` in ``nproc`` fresh local processes forming one process group (torchrun's environment).

    ``fn`` must be importable (a module-level function). If any worker raises or dies, the others are
    terminated and :class:`DistributedError` names the rank that failed first and its last error line.
    """
    import tempfile

    import torch.multiprocessing as mp

    if nproc < 1:
        raise DistributedError(f"nproc must be >= 1, got {nproc}")
    threads = threads or max(1, (os.cpu_count() or 1) // nproc)
    with tempfile.TemporaryDirectory(prefix="prunefx-ranks-") as failures:
        try:
            mp.start_processes(_worker, args=(fn, args, nproc, free_port(), threads, failures), nprocs=nproc,
                               join=True, start_method="spawn")
        except mp.ProcessRaisedException as exc:
            lines = [ln for ln in str(exc).strip().splitlines() if ln.strip()]
            rank, line = _first_failure(failures) or (exc.error_index, lines[-1] if lines else str(exc))
            raise DistributedError(
                f"worker rank {rank} of {nproc} failed: {line}; the other workers were stopped"
            ) from None
        except mp.ProcessExitedException as exc:
            raise DistributedError(
                f"worker rank {exc.error_index} of {nproc} died (exit code {exc.exit_code}, "
                f"signal {exc.signal_name}); the other workers were stopped"
            ) from None


def _first_failure(failures: str) -> tuple[int, str] | None:
    """The (rank, error) that happened first. A rank's crash makes its peers fail too ("connection closed by
    peer"), and whichever of them the parent notices first is a matter of timing: the earliest is the cause."""
    import json

    records = [json.loads(p.read_text()) for p in Path(failures).glob("*.json")]
    if not records:
        return None
    first = min(records, key=lambda r: r["time"])
    return first["rank"], first["error"]


def _worker(
    rank: int, fn: Callable[..., Any], args: tuple[Any, ...], world: int, port: int, threads: int, failures: str
) -> None:
    os.environ.update(
        {
            "RANK": str(rank),
            "WORLD_SIZE": str(world),
            "LOCAL_RANK": str(rank),
            "LOCAL_WORLD_SIZE": str(world),
            "MASTER_ADDR": "127.0.0.1",
            "MASTER_PORT": str(port),
        }
    )
    # accelerate (recovery) re-sets torch's threads from the physical cores unless this says how many there are
    os.environ.setdefault("OMP_NUM_THREADS", str(threads))
    torch.set_num_threads(threads)
    try:
        fn(*args)
    except BaseException as exc:
        import json
        import time

        record = {"rank": rank, "time": time.time(), "error": f"{type(exc).__name__}: {exc}".splitlines()[0]}
        (Path(failures) / f"{rank}.json").write_text(json.dumps(record))
        raise
    finally:
        shutdown()


__all__ = [
    "LOCAL",
    "DistContext",
    "DistributedError",
    "free_port",
    "init_from_env",
    "launched_by_torchrun",
    "resolve_device",
    "shutdown",
    "spawn",
]
