"""Where a model runs when timed: torch eager (CPU, or CUDA synchronised) or ONNX Runtime, as one callable.

    dep = Deployment(backend="onnxruntime", threads=2)
    with prepared(model, (x,), dep) as run:   # the model exported, placed and warmed for this backend
        run()                                  # one forward, finished when it returns

A ``Deployment`` names everything a latency depends on besides the model: backend, device, threads, batch and
dtype. It is also the key of a latency table (:mod:`prunefx.metrics.latency_table`).
"""

from __future__ import annotations

import contextlib
import copy
import io
import itertools
import platform
import warnings
from collections.abc import Callable, Iterator
from dataclasses import asdict, dataclass, replace
from typing import Any

import torch
from torch import nn
from torch.utils._pytree import tree_flatten, tree_map_only

from prunefx._defaults import ONNX_OPSET  # declared with the help texts' defaults (importable without torch)
from prunefx._extras import install_hint
from prunefx.metrics.common import MetricsError, as_args, rejected, untouched

BACKENDS = ("torch", "onnxruntime")
DTYPES = {"float32": torch.float32, "float16": torch.float16, "bfloat16": torch.bfloat16}
ORT_THREADS = "threads not spinning"  # how ort_session runs ONNX Runtime's thread pool (see there)
_INSTALL_ORT = install_hint("onnxruntime")


@dataclass(frozen=True)
class Deployment:
    """How a model is run when timed; every field changes the latency, so all of them key a latency table."""

    backend: str = "torch"  # "torch" (eager) or "onnxruntime" (CPU execution provider, or CUDA's on device cuda)
    device: str = "cpu"  # "cpu", "cuda", "cuda:1"
    threads: int | None = None  # intra-op threads; None: torch's current count (resolve() fixes it)
    batch: int | None = None  # batch of the timed forward; None: the example inputs' batch
    dtype: str = "float32"
    fold_bn: bool = True  # torch backend: fold eval BatchNorm into convs first (ONNX Runtime does it itself)

    def __post_init__(self) -> None:
        if self.backend not in BACKENDS:
            raise MetricsError(f"unknown latency backend {self.backend!r}; choose one of {', '.join(BACKENDS)}")
        if self.dtype not in DTYPES:
            raise MetricsError(f"unknown dtype {self.dtype!r}; choose one of {', '.join(DTYPES)}")
        if self.threads is not None and self.threads < 1:
            raise MetricsError(f"threads must be a positive integer or None (torch's default), got {self.threads}")
        if self.batch is not None and self.batch < 1:
            raise MetricsError(f"batch must be a positive integer or None (the example's batch), got {self.batch}")
        try:
            device = torch.device(self.device)
        except RuntimeError as exc:
            raise MetricsError(f"device {self.device!r} is not a device name ({exc}); use 'cpu' or 'cuda'") from None
        if device.type not in ("cpu", "cuda"):
            raise MetricsError(f"latency is measured on 'cpu' or 'cuda', got device {self.device!r}")

    def resolve(self, example_inputs: Any = None) -> Deployment:
        """This deployment with threads and batch made concrete; raises if the device or backend is missing."""
        check_available(self)
        batch = self.batch
        if batch is None and example_inputs is not None:
            from prunefx.metrics.common import batch_size

            batch = batch_size(as_args(example_inputs))
        return replace(self, threads=self.threads or torch.get_num_threads(), batch=batch)

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready fields."""
        return asdict(self)

    def describe(self) -> str:
        """One line for tables: backend, device, threads, batch, dtype."""
        what = "torch eager" + (", BatchNorm folded" if self.fold_bn else "") if self.backend == "torch" else (
            f"ONNX Runtime {_ort_version()} ({ORT_THREADS}), opset {ONNX_OPSET}"
        )
        return f"{what}, {self.device}, {self.threads} threads, batch {self.batch}, {self.dtype}"


def _ort_version() -> str:
    try:
        import onnxruntime

        return onnxruntime.__version__
    except ImportError:
        return "(not installed)"


def check_available(dep: Deployment) -> None:
    """Raise a MetricsError naming the fix when ``dep`` cannot run here (no such GPU, onnxruntime missing)."""
    device = torch.device(dep.device)
    if device.type == "cuda":
        if not torch.cuda.is_available():
            raise MetricsError(f"device {dep.device!r} but CUDA is not available here; use device 'cpu'")
        if device.index is not None and device.index >= torch.cuda.device_count():
            raise MetricsError(
                f"device {dep.device!r} does not exist: this machine has {torch.cuda.device_count()} CUDA device(s)"
            )
    if dep.backend == "onnxruntime":
        try:
            import onnxruntime
        except ImportError:
            raise MetricsError(
                f"the onnxruntime backend needs onnxruntime, which is not installed: {_INSTALL_ORT}"
            ) from None
        if device.type == "cuda" and "CUDAExecutionProvider" not in onnxruntime.get_available_providers():
            raise MetricsError(
                "onnxruntime here has no CUDAExecutionProvider (install onnxruntime-gpu), or time on device 'cpu'"
            )
    if dep.dtype != "float32" and dep.backend == "onnxruntime":
        raise MetricsError("the onnxruntime backend times float32 exports only; use dtype 'float32'")
    if dep.dtype == "float16" and device.type == "cpu":
        raise MetricsError("float16 is timed on CUDA only; use dtype 'float32' or 'bfloat16' on the CPU")


def machine_name(dep: Deployment) -> str:
    """The processor that runs ``dep`` (CPU model, or the CUDA device's name): part of a latency table's key."""
    device = torch.device(dep.device)
    if device.type == "cuda":
        return torch.cuda.get_device_name(device)
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def backend_version(dep: Deployment) -> str:
    """Version string of what executes the forward (and, for ONNX Runtime, its thread policy: it changes the times)."""
    if dep.backend == "onnxruntime":
        return f"onnxruntime {_ort_version()}, {ORT_THREADS}"
    return f"torch {torch.__version__}"


def with_batch(args: tuple[Any, ...], batch: int | None) -> tuple[Any, ...]:
    """``args`` with every tensor's leading dim repeated or cut to ``batch`` (None: unchanged)."""
    if batch is None:
        return args

    def resize(t: torch.Tensor) -> torch.Tensor:
        if t.dim() == 0 or t.shape[0] == batch:
            return t
        reps = -(-batch // t.shape[0])
        return t.repeat(reps, *([1] * (t.dim() - 1)))[:batch].contiguous()

    return tree_map_only(torch.Tensor, resize, args)


def onnx_bytes(
    model: nn.Module,
    args: tuple[Any, ...],
    *,
    opset: int = ONNX_OPSET,
    dynamic_batch: bool = False,
) -> tuple[bytes, list[str], list[str]]:
    """``model`` exported to ONNX in memory (TorchScript exporter, eval mode): (bytes, input names, output names)."""
    flat_in = [t for t in tree_flatten(args)[0] if isinstance(t, torch.Tensor)]
    inputs = [f"input{i}" for i in range(len(flat_in))]
    with untouched(model), torch.no_grad():
        flat_out = [t for t in tree_flatten(model(*args))[0] if isinstance(t, torch.Tensor)]
    outputs = [f"output{i}" for i in range(len(flat_out))]
    dynamic = {n: {0: "batch"} for n in (*inputs, *outputs)} if dynamic_batch else None
    buffer = io.BytesIO()
    try:
        with untouched(model), warnings.catch_warnings():
            # the TorchScript exporter is deprecated in favour of torch.export's, which needs onnxscript and
            # fails on more models; ultralytics' exporter makes the same choice
            warnings.simplefilter("ignore", DeprecationWarning)
            warnings.simplefilter("ignore", torch.jit.TracerWarning)
            torch.onnx.export(
                model, args, buffer, opset_version=opset, input_names=inputs, output_names=outputs,
                dynamic_axes=dynamic, dynamo=False, do_constant_folding=True,
            )
    except Exception as exc:  # any exporter failure is reported as this model's problem
        raise MetricsError(
            f"ONNX export of {type(model).__name__} failed: {type(exc).__name__}: {str(exc).splitlines()[0]}; "
            "time it with the torch backend instead"
        ) from exc
    return buffer.getvalue(), inputs, outputs


def ort_session(data: bytes, dep: Deployment) -> Any:
    """An ONNX Runtime session for ``data`` with ``dep``'s threads and execution provider (all graph optimisations)."""
    check_available(dep)
    import onnxruntime as ort

    so = ort.SessionOptions()
    so.intra_op_num_threads = dep.threads or torch.get_num_threads()
    so.inter_op_num_threads = 1
    so.execution_mode = ort.ExecutionMode.ORT_SEQUENTIAL
    so.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
    # Idle intra-op threads spin by default. Sessions timed in alternating rounds (base and pruned, a table's
    # layers) then steal the cores from the one running: two MobileNetV2 sessions alternating on 2 threads of a
    # 2-core machine took a median 14.4 ms with p90 1.5x the median, 6.3 ms and 1.1x without spinning.
    so.add_session_config_entry("session.intra_op.allow_spinning", "0")
    so.add_session_config_entry("session.inter_op.allow_spinning", "0")
    so.log_severity_level = 3  # warnings about unused initialisers are not the user's problem
    providers = ["CUDAExecutionProvider"] if torch.device(dep.device).type == "cuda" else ["CPUExecutionProvider"]
    return ort.InferenceSession(data, so, providers=providers)


def _placed(model: nn.Module, device: torch.device, dtype: torch.dtype, channels_last: bool) -> nn.Module:
    # Moving or re-laying-out a module happens in place, so that work is done on a copy.
    current = next(itertools.chain(model.parameters(), model.buffers()), None)
    same = current is None or (current.device == device and current.dtype == dtype)
    if same and not channels_last:
        return model
    clone = copy.deepcopy(model).to(device=device, dtype=dtype)
    return clone.to(memory_format=torch.channels_last) if channels_last else clone


def _placed_inputs(args: tuple[Any, ...], device: torch.device, dtype: torch.dtype, channels_last: bool):
    def place(t: torch.Tensor) -> torch.Tensor:
        t = t.to(device=device, dtype=dtype if t.is_floating_point() else t.dtype)
        return t.contiguous(memory_format=torch.channels_last) if channels_last and t.dim() == 4 else t

    return tree_map_only(torch.Tensor, place, args)


def _deployed(model: nn.Module, args: tuple[Any, ...], dep: Deployment) -> tuple[nn.Module, str]:
    """The module torch runs: BatchNorm folded when asked and possible (a model that cannot be traced runs as is)."""
    if not dep.fold_bn or not any(isinstance(m, nn.modules.batchnorm._BatchNorm) for m in model.modules()):
        return model, "as is"
    from prunefx.errors import PrunefxError
    from prunefx.passes import FOLD_KEY, fold_bn

    try:
        with untouched(model):
            gm = fold_bn(model, args)
    except PrunefxError as exc:
        return model, f"as is (BatchNorm not folded: {str(exc).splitlines()[0][:120]})"
    info = gm.meta[FOLD_KEY]
    return gm, f"BatchNorm folded ({len(info['folded'])} of {len(info['folded']) + len(info['kept'])})"


@dataclass(frozen=True)
class Runner:
    """One finished forward per call, and what actually runs (``deployed``: "BatchNorm folded (20 of 20)")."""

    run: Callable[[], Any]
    deployed: str

    def __call__(self) -> Any:
        return self.run()


@contextlib.contextmanager
def prepared(
    model: nn.Module, example_inputs: Any, dep: Deployment, *, channels_last: bool = False
) -> Iterator[Runner]:
    """A callable running one finished forward of ``model`` as ``dep`` deploys it; torch's threads restored after.

    ``dep.batch`` resizes the inputs. The torch backend runs in eval mode under no_grad (module attributes are
    restored afterwards) and synchronises CUDA; ONNX Runtime runs an in-memory export of ``model``.
    """
    args = as_args(example_inputs, model)
    dep = dep.resolve(args)
    args = with_batch(args, dep.batch)
    device = torch.device(dep.device)
    if device.type == "cuda" and device.index is None:  # "cuda" means the current device: name it
        device = torch.device("cuda", torch.cuda.current_device())
    previous = torch.get_num_threads()
    try:
        torch.set_num_threads(dep.threads)
        if dep.backend == "onnxruntime":
            yield Runner(_ort_runner(model, args, dep), f"ONNX Runtime {_ort_version()}, opset {ONNX_OPSET}")
        else:
            with untouched(model):
                placed = _placed(model, device, DTYPES[dep.dtype], channels_last)
                placed_args = _placed_inputs(args, device, DTYPES[dep.dtype], channels_last)
                runner, deployed = _deployed(placed, placed_args, dep)
                yield Runner(_torch_runner(runner, placed_args, device), deployed)
    finally:
        torch.set_num_threads(previous)


def _torch_runner(runner: nn.Module, args: tuple[Any, ...], device: torch.device) -> Callable[[], Any]:
    cuda = device.type == "cuda"

    def run() -> Any:
        with torch.no_grad():
            try:
                out = runner(*args)
            except Exception as exc:  # any failure of the forward is a bad-input error
                raise rejected(exc, args) from exc
        if cuda:
            torch.cuda.synchronize(device)
        return out

    return run


def _ort_runner(model: nn.Module, args: tuple[Any, ...], dep: Deployment) -> Callable[[], Any]:
    data, names, _ = onnx_bytes(model, args)
    session = ort_session(data, dep)
    feed_names = [i.name for i in session.get_inputs()]
    flat = [t for t in tree_flatten(args)[0] if isinstance(t, torch.Tensor)]
    # the exporter drops inputs the graph does not use: feed only those it kept
    feed = {n: t.detach().cpu().numpy() for n, t in zip(names, flat, strict=True) if n in feed_names}

    def run() -> Any:
        return session.run(None, feed)

    return run
