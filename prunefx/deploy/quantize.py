"""Post-training int8: the float model exported to ONNX, quantized by ONNX Runtime (static QDQ), checked, and the
layers whose int8 error dominates kept float.

    q = quantize(model, x, [torch.randn(8, 3, 32, 32) for _ in range(8)], out="deploy")
    print(q.table())          # per-layer int8 error, which layers stayed float and why
    q.int8_path, q.outputs    # the int8 .onnx file; int8 vs float error per output on held-out rows

The float model and the user's files are never changed: the export runs on a copy, ONNX Runtime works in a
temporary directory, and only ``out/<name>.float.onnx`` and ``out/<name>.int8.onnx`` are written (no link followed).
"""

from __future__ import annotations

import contextlib
import copy
import dataclasses
import fnmatch
import io
import logging
import os
import tempfile
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from torch import nn

from prunefx._extras import require
from prunefx._io import atomic_write
from prunefx.deploy.calibration import Feed, QuantizeError, only, reader, split
from prunefx.deploy.check import OutputError, error_of, output_names, run_onnx, worst
from prunefx.errors import PrunefxError
from prunefx.onnx_export import export_onnx

METHODS = ("minmax", "entropy", "percentile")
ACTIVATIONS = ("uint8", "int8")
# uint8 activations run ONNX Runtime's u8s8 kernels, faster on x86 (resnet18, batch 1, AVX2: 150 vs 167 ms): int8
# activations are chosen only when they lower the held-out error by this share or more
INT8_ACTIVATION_GAIN = 0.1
QUANT_OPS = ("Conv", "ConvTranspose", "Gemm", "MatMul")  # the ops int8 kernels speed up (ultralytics' choice too)


@dataclass(frozen=True)
class LayerError:
    """What one layer's int8 costs: the model's output error with only this layer quantized."""

    node: str  # ONNX node name ("/layer1/layer1.0/conv1/Conv")
    module: str | None  # the torch module it came from ("layer1.0.conv1"), when it can be named
    op_type: str
    error: float  # worst output's relative RMS error vs float, only this layer int8 (nan: not measured)
    share: float  # error / the all-int8 model's error
    precision: str  # "int8" or "float" in the delivered model
    reason: str  # why it stayed float ("" when int8)

    @property
    def name(self) -> str:
        """The module name when known, else the ONNX node's."""
        return self.module or self.node


@dataclass(frozen=True)
class Quantized:
    """The int8 model, its float twin, and how far apart they are on held-out calibration rows."""

    int8_path: Path
    float_path: Path
    method: str  # calibration method used ("minmax", "entropy", "percentile")
    activation: str  # activation type ("uint8", "int8"); weights are int8
    per_channel: bool  # per-channel weight scales (False after a fallback)
    reduce_range: bool  # 7-bit weights (CPUs without VNNI: their u8 x s8 kernels saturate int16 sums at 8 bits)
    choice: str  # why this method and activation: the held-out error of every candidate
    outputs: tuple[OutputError, ...]  # delivered int8 model vs float, per output
    all_int8: tuple[OutputError, ...]  # every quantizable layer int8 (before mixed precision)
    layers: tuple[LayerError, ...]  # every quantizable layer, worst first
    kept_float: tuple[str, ...]  # layers left float (module name, else node)
    fallbacks: tuple[str, ...]  # quantizer options that broke and what was done instead
    export: str  # the float export's check (ONNX Runtime vs PyTorch)
    held_out_batches: int
    calibration_batches: int
    notes: tuple[str, ...] = field(default=())

    @property
    def error(self) -> float:
        """The delivered int8 model's worst output relative RMS error vs float."""
        return worst(self.outputs)

    def table(self) -> str:
        """The per-layer error table, worst first, as aligned text."""
        width = max([len(r.name) for r in self.layers] + [5])
        lines = [f"{'layer':<{width}}  {'op':<13} {'int8 alone':>10} {'share':>6}  kept"]
        for r in self.layers:
            lines.append(f"{r.name:<{width}}  {r.op_type:<13} {r.error:>10.3g} {r.share:>6.0%}  {r.precision}"
                         + (f" ({r.reason})" if r.reason else ""))
        return "\n".join(lines)

    def describe(self) -> str:
        """A few lines: files, calibration choice, int8-vs-float error, what stayed float, fallbacks."""
        lines = [
            f"int8 model: {self.int8_path} (ONNX Runtime static QDQ, int8 weights "
            f"{'per channel' if self.per_channel else 'per tensor'}{', 7-bit range' if self.reduce_range else ''}, "
            f"{self.activation} activations, "
            f"{self.method} calibration on {self.calibration_batches} batch(es))",
            f"float model: {self.export}",
            f"calibration: {self.choice}",
            f"int8 vs float on {self.held_out_batches} held-out batch(es): "
            + "; ".join(e.describe() for e in self.outputs),
            f"all layers int8: worst rel. RMS {worst(self.all_int8):.3g}; kept float: "
            + (", ".join(self.kept_float) or "none"),
        ]
        lines += [f"fallback: {f}" for f in self.fallbacks] + list(self.notes)
        return "\n".join(lines)


def module_of(node_name: str, modules: set[str], weight: str = "") -> str | None:
    """The torch module an exported node came from: its weight's name ("layer1.0.conv1.weight"), else its node
    name's scopes ("/layer1/layer1.0/conv1/Conv"; a folded GraphModule's scopes are fx node names, not modules)."""
    if weight.endswith(".weight") and weight.removesuffix(".weight") in modules:
        return weight.removesuffix(".weight")
    name = ""
    for part in node_name.strip("/").split("/")[:-1]:
        name = part if not name or part.startswith(name + ".") else f"{name}.{part}"
    return name if name in modules else None


class _Quantizer:
    """ONNX Runtime's quantize_static with the options that work on this model (fallbacks are sticky)."""

    def __init__(self, source: Path, work: Path, feeds: tuple[Feed, ...], per_channel: bool, reduce_range: bool):
        self.source, self.work, self.feeds, self.per_channel = source, work, feeds, per_channel
        self.reduce_range = reduce_range
        self.extra: dict[str, Any] = {}
        self.fallbacks: list[str] = []
        self.count = 0

    def __call__(self, method: str, activation: str, *, exclude: Sequence[str] = (),
                 only_nodes: Sequence[str] | None = None) -> Path:
        from onnxruntime.quantization import CalibrationMethod, QuantFormat, QuantType, quantize_static

        self.count += 1
        target = self.work / f"q{self.count}.onnx"
        methods = {"minmax": CalibrationMethod.MinMax, "entropy": CalibrationMethod.Entropy,
                   "percentile": CalibrationMethod.Percentile}
        while True:
            try:
                with _quiet():
                    quantize_static(
                        str(self.source), str(target), reader(self.feeds), quant_format=QuantFormat.QDQ,
                        op_types_to_quantize=list(QUANT_OPS), per_channel=self.per_channel,
                        reduce_range=self.reduce_range,
                        activation_type=QuantType.QUInt8 if activation == "uint8" else QuantType.QInt8,
                        weight_type=QuantType.QInt8, nodes_to_quantize=list(only_nodes) if only_nodes else None,
                        nodes_to_exclude=list(exclude), calibrate_method=methods[method],
                        extra_options=dict(self.extra),
                        # ranges are calibrated once per method; every later model of the search reuses them
                        calibration_cache_path=str(self.work / f"ranges-{method}.json"),
                    )
                return target
            except Exception as exc:  # an ORT quantizer bug on this model: retry without the option that broke
                what = f"{type(exc).__name__}: {str(exc).splitlines()[0][:160] if str(exc) else ''}"
                if self.per_channel and not self.extra.get("QDQDisableWeightAdjustForInt32Bias"):
                    # ORT 1.31/1.32 raised "truth value of an array" in _adjust_weight_scale_for_int32_bias
                    self.extra["QDQDisableWeightAdjustForInt32Bias"] = True
                    self.fallbacks.append(f"per-channel quantization raised {what}; retried with ONNX Runtime's "
                                          "weight-scale adjustment for int32 biases off")
                elif self.per_channel:
                    self.per_channel = False
                    self.fallbacks.append(f"per-channel quantization still raised {what}; weights quantized "
                                          "per tensor instead")
                else:
                    raise QuantizeError(
                        f"ONNX Runtime could not quantize this model ({what}); keep the failing layers float with "
                        "keep_float=['pattern'], or report the model"
                    ) from exc


@contextlib.contextmanager
def _quiet() -> Iterator[None]:
    """ONNX Runtime's quantizer logs advice on the root logger and prints progress: neither is the user's problem."""
    root = logging.getLogger()
    level = root.level
    root.setLevel(logging.ERROR)
    try:
        with contextlib.redirect_stdout(io.StringIO()):
            yield
    finally:
        root.setLevel(level)


def _has_vnni() -> bool:
    """Whether this CPU has VNNI (or AMX) int8 dot products; unknown (not Linux x86) counts as yes."""
    try:
        with open("/proc/cpuinfo") as f:
            flags = next((line for line in f if line.startswith("flags")), None)
    except OSError:
        return True
    if flags is None:
        return True
    return bool({"avx512_vnni", "avx_vnni", "amx_int8"} & set(flags.split()))


def _int8_nodes(path: Path) -> set[str]:
    """Nodes of a QDQ model whose weight (input 1) is dequantized from int8: the layers that run int8."""
    import onnx

    graph = onnx.load(str(path)).graph
    dq = {o for n in graph.node if n.op_type == "DequantizeLinear" for o in n.output}
    return {n.name for n in graph.node if n.op_type in QUANT_OPS and len(n.input) > 1 and n.input[1] in dq}


def _match(patterns: Iterable[str], layers: dict[str, str | None], what: str) -> set[str]:
    """The nodes whose module or node name matches any pattern; a pattern matching nothing is an error."""
    found: set[str] = set()
    for pattern in patterns:
        hits = {n for n, m in layers.items() if fnmatch.fnmatchcase(n, pattern)
                or (m is not None and fnmatch.fnmatchcase(m, pattern))}
        if not hits:
            names = ", ".join(m or n for n, m in list(layers.items())[:8])
            raise QuantizeError(f"{what} pattern {pattern!r} matches no quantizable layer; the layers are {names}"
                                f"{', ...' if len(layers) > 8 else ''} (fnmatch patterns on module or node names)")
        found |= hits
    return found


def quantize(
    model: nn.Module,
    example_inputs: Any,
    calibration: Iterable[Any],
    *,
    out: str | os.PathLike[str],
    name: str = "model",
    method: str = "auto",
    activation: str = "auto",
    per_channel: bool = True,
    reduce_range: bool | None = None,
    keep_float: Sequence[str] = (),
    force_int8: Sequence[str] = (),
    mixed: bool = True,
    per_layer: bool = True,
    dominance: float = 0.5,
    min_gain: float = 0.2,
    max_float: int = 3,
) -> Quantized:
    """Quantize ``model`` to int8 with ONNX Runtime (static QDQ), checked against its float export on held-out rows.

    ``calibration``: at least 2 batches of real inputs (the last quarter is held out for the checks).
    ``method`` / ``activation``: "auto" tries every calibration method and activation type and keeps the one
    with the lowest held-out error. ``reduce_range`` (None: on CPUs without VNNI) quantizes weights to 7 bits, as
    ONNX Runtime advises there: its AVX2 int8 kernels saturate 16-bit pair sums of full 8-bit weights, so the int8
    model would not compute what its QDQ graph says. ``keep_float`` / ``force_int8``: fnmatch patterns on module
    or ONNX node names forced either way. ``mixed``: a layer whose int8 error alone is at least ``dominance`` of
    the all-int8 error stays float when that lowers the error by ``min_gain`` (relative) or more, up to
    ``max_float`` layers. ``per_layer=False`` skips the per-layer table (one quantization per layer) and with it
    mixed precision: for large models when only the all-int8 model and its error are wanted.
    """
    if not isinstance(model, nn.Module):
        raise QuantizeError(f"quantize() needs a torch.nn.Module, got {type(model).__name__}")
    require("onnx", "quantize()")
    require("onnxruntime.quantization", "quantize()")
    methods = METHODS if method == "auto" else (method,)
    activations = ACTIVATIONS if activation == "auto" else (activation,)
    if not set(methods) <= set(METHODS) or not set(activations) <= set(ACTIVATIONS):
        raise QuantizeError(f"method must be 'auto' or one of {', '.join(METHODS)} and activation 'auto' or one of "
                            f"{', '.join(ACTIVATIONS)}; got {method!r}, {activation!r}")
    if not (os.sep not in name and name not in ("", ".", "..")):
        raise QuantizeError(f"name {name!r} must be a plain file name stem, e.g. 'model'")
    data = split(calibration)
    out = Path(out)
    if out.is_symlink() or (out.exists() and not out.is_dir()):
        raise QuantizeError(f"out={out} is a link or a file; give quantize() a plain directory to write into")
    out.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix="prunefx-quantize-") as tmp:
        work = Path(tmp)
        try:
            exported = export_onnx(copy.deepcopy(model), example_inputs, work / "float.onnx", dynamic_batch=True)
        except PrunefxError as exc:
            raise QuantizeError(f"the model does not export to ONNX, so it cannot be quantized: "
                                f"{str(exc).splitlines()[0]}") from None
        except Exception as exc:  # the forward itself failed on the example inputs: bad input, said in one line
            raise QuantizeError(f"the model failed on the example inputs ({type(exc).__name__}: "
                                f"{str(exc).splitlines()[0] if str(exc) else ''}); pass inputs its forward accepts"
                                ) from exc
        result = _search(work, exported.path, data, dict(
            methods=methods, activations=activations, per_channel=per_channel, keep_float=keep_float,
            force_int8=force_int8, mixed=mixed and per_layer, per_layer=per_layer,
            reduce_range=not _has_vnni() if reduce_range is None else reduce_range, dominance=dominance,
            min_gain=min_gain, max_float=max_float,
            modules={n for n, _ in model.named_modules() if n},
        ))
        float_path = atomic_write(out / f"{name}.float.onnx", exported.path.read_bytes(), root=out)
        int8_path = atomic_write(out / f"{name}.int8.onnx", result["int8"].read_bytes(), root=out)
    names = output_names(float_path)
    # the delivered files checked once more, as written, by the code that shares nothing with the quantizer
    reference = run_onnx(float_path, data.held_out)
    outputs = error_of(reference, int8_path, data.held_out, names)
    return Quantized(
        int8_path, float_path, result["method"], result["activation"], result["per_channel"], result["reduce_range"],
        result["choice"],
        outputs, result["all_int8"], result["layers"], result["kept_float"], result["fallbacks"],
        dataclasses.replace(exported, path=float_path).describe(), len(data.held_out), len(data.calibrate),
    )


def _search(work: Path, float_path: Path, data: Any, opts: dict[str, Any]) -> dict[str, Any]:
    """Pick calibration and activation type, measure each layer, decide mixed precision; returns the int8 file."""
    import onnx

    graph = onnx.load(str(float_path)).graph
    inputs = {i.name for i in graph.input}
    calibrate = tuple(only(f, inputs) for f in data.calibrate)
    held = tuple(only(f, inputs) for f in data.held_out)
    nodes = {n.name: n.op_type for n in graph.node}
    weights = {n.name: n.input[1] for n in graph.node if len(n.input) > 1}
    candidates = {n: t for n, t in nodes.items() if t in QUANT_OPS}
    if not candidates:
        ops = ", ".join(sorted(set(nodes.values()))[:10])
        raise QuantizeError(f"nothing to quantize: the exported model has no {'/'.join(QUANT_OPS)} node (its ops: "
                            f"{ops}); int8 speeds up only those, so deploy the float ONNX model")
    layers = {n: module_of(n, opts["modules"], weights.get(n, "")) for n in candidates}
    forced_float = _match(opts["keep_float"], layers, "keep_float")
    forced_int8 = _match(opts["force_int8"], layers, "force_int8")
    if forced_float & forced_int8:
        both = ", ".join(sorted(layers[n] or n for n in forced_float & forced_int8))
        raise QuantizeError(f"{both} matched both keep_float and force_int8; drop it from one of them")
    names = [o.name for o in graph.output]
    reference = run_onnx(float_path, held)
    quant = _Quantizer(float_path, work, calibrate, opts["per_channel"], opts["reduce_range"])

    def error(path: Path) -> tuple[OutputError, ...]:
        return error_of(reference, path, held, names)

    # 1. calibration method x activation type, all layers but the forced-float ones int8, by held-out error
    tried = []
    for m in opts["methods"]:
        for a in opts["activations"]:
            path = quant(m, a, exclude=sorted(forced_float))
            tried.append((worst(error(path)), m, a, path))
    best, method, act, base = min(tried, key=lambda t: t[0])  # ties keep the first: minmax, uint8
    faster = [t for t in tried if t[1] == method and t[2] == "uint8"]
    if act == "int8" and faster and faster[0][0] * (1 - INT8_ACTIVATION_GAIN) < best:
        _, method, act, base = faster[0]
    choice = (f"{method}, {act} activations (lowest error; uint8 unless int8 is {INT8_ACTIVATION_GAIN:.0%} better): "
              "held-out error of " + ", ".join(f"{m}/{a} {e:.3g}" for e, m, a, _ in tried))
    all_int8 = error(base)
    ran_int8 = _int8_nodes(base)
    missing = sorted(layers[n] or n for n in forced_int8 - ran_int8)
    if missing:
        raise QuantizeError(f"ONNX Runtime did not quantize {', '.join(missing)} (force_int8); its inputs are not "
                            "weights int8 kernels take: drop it from force_int8")
    # 2. per-layer cost, one layer quantized at a time (the rest float). Comparing each layer's dequantized
    # output with the float model's at the same point would charge every layer with the error of all layers
    # before it; one layer alone is what keeping it float would save, which is the decision mixed precision makes.
    total = worst(all_int8)
    cost = {n: worst(error(quant(method, act, only_nodes=[n]))) if n in ran_int8 else float("nan")
            for n in candidates if n not in forced_float and opts["per_layer"]}
    # 3. mixed precision: the dominant layers, worst first, kept float when that buys accuracy
    reasons = {n: "keep_float" for n in forced_float}
    reasons |= {n: "ONNX Runtime left it float" for n in candidates if n not in forced_float and n not in ran_int8}
    chosen, current, delivered = set(forced_float), total, base
    if opts["mixed"] and total > 0:
        order = sorted((n for n in cost if n in ran_int8 and n not in forced_int8), key=lambda n: -cost[n])
        for n in order:
            if len(chosen) - len(forced_float) >= opts["max_float"] or cost[n] < opts["dominance"] * total:
                break
            trial = quant(method, act, exclude=sorted(chosen | {n}))
            err = worst(error(trial))
            if err <= (1 - opts["min_gain"]) * current:
                reasons[n] = (f"int8 alone {cost[n]:.3g} = {cost[n] / total:.0%} of the all-int8 error; float "
                              f"lowers the model's error {current:.3g} -> {err:.3g}")
                chosen.add(n)
                current, delivered = err, trial
    rows = tuple(sorted(
        (LayerError(n, layers[n], candidates[n], cost.get(n, float("nan")),
                    cost.get(n, float("nan")) / total if total > 0 else 0.0,
                    "float" if n in reasons else "int8", reasons.get(n, ""))
         for n in candidates),
        key=lambda r: -r.error if r.error == r.error else float("inf")))  # worst first, unmeasured last
    return dict(int8=delivered, method=method, activation=act, per_channel=quant.per_channel,
                reduce_range=quant.reduce_range, choice=choice,
                all_int8=all_int8, layers=rows, kept_float=tuple(r.name for r in rows if r.precision == "float"),
                fallbacks=tuple(quant.fallbacks))
