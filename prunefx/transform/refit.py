"""Re-fit after the cut: least-squares weights for every layer that lost input channels (retraining-free recovery).

For each layer that reads a pruned group, the weights and bias that best reproduce the ORIGINAL layer's output
from the inputs it still has are solved in closed form on calibration data (the structured relative of ThiNet /
FLAP / OBS-style reconstruction; it generalises bias compensation, which only moves the intercept):

    min_W ||X W - Y||^2 + lambda ||W - W0||^2,   W = (X^T X + lambda I)^-1 (X^T Y + lambda W0)

* ``Y``: the original layer's output on the original model's own input to it (the kept output channels).
* ``X``: the pruned model's input to the pruned layer, as the pruned network computes it upstream, with the
  layers before it already re-fitted. Regressing on these rather than on the original's kept channels also
  corrects the error the cut made upstream, which is what the pruned model will actually see.
* Conv layers regress each output position on its input patch (``unfold`` with the layer's kernel, stride, padding
  and dilation; Conv1d through a 2-D view); grouped convs are solved group by group on that group's inputs
  (depthwise: one channel's patch per output channel).
* Rows (output positions x batch) are subsampled, seeded, to at most ``max_rows // batches`` per batch and call,
  which bounds memory; ``X^T X`` and ``X^T Y`` are accumulated in float64 over the batches (normal equations).
  The targets of every layer are sampled in one pass of the original and held together (at most ``max_rows`` x
  kept outputs values per layer, in the model's dtype) when that bound fits in ``max_target_bytes`` (default
  1 GiB); otherwise (an LLM: dozens of ``q/k/v/o/gate/up/down`` layers, 8192 rows of 4096-11008 outputs each, tens
  of GB) each layer's targets are taken just before its fit, by a pass of the original stopped after that layer's
  last call, so one layer's targets are held at a time. Same rows, same weights either way (tested); the second
  costs one pass to count the calls plus one partial pass of the original per layer (an 8-layer Llama, hidden 512,
  16 layers re-fitted: 36 s / +537 MB peak held together, 75 s / +145 MB layer by layer, one CPU thread).
* ``lambda = ridge * mean(diag(X^T X))``: scale-free, and pulling towards the current (sliced) weights ``W0``
  rather than towards zero, so a direction the calibration does not excite keeps its trained value. The default
  1e-3 is the dampening GPTQ / SparseGPT use scaled down tenfold (they pull towards zero, this pulls towards W0);
  on a small BN CNN cut to half its channels, 1e-6..1e-2 left the held-out output error within 0.016..0.022
  (0.34 without the re-fit), 1e-1 gave 0.025.
* The intercept: a ones column when the layer has a bias; a bias-free layer whose only consumer is a BatchNorm
  with running statistics gets one too and folds it into that BatchNorm's ``running_mean`` (as bias
  compensation does); otherwise there is none.
* A layer is never made worse: a seeded ``holdout`` share of the rows (default 0.2) is left out of a first
  fit and the errors before and after are measured on it (rows that fit did not see). When the re-fit is better
  there, the weights applied are solved again on every row; when it is not, the old weights stay and the report
  says why. ``holdout=0`` fits once on every row and measures on them.

Layers are re-fitted in the order the original model first calls them, so a later layer's regressors come from
the re-fitted layers before it: one pass of the pruned model over the calibration data per layer, each stopped
right after that layer (plus one pass of the original for the targets); a ResNet-18 at 64 px, 8 batches of 8,
re-fitted its 12 layers in 10-18 s on 2 shared CPU cores, forward passes most of it. Call it after
``apply_plan``; it changes values, never shapes.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from prunefx.analysis.graph import DependencyGraph
from prunefx.analysis.roles import OUT, Kind, RecordKey
from prunefx.capture.trace import training_mode
from prunefx.errors import PrunefxError
from prunefx.plan import PruningPlan
from prunefx.transform.compensate import _pruned_inputs, _single_bn_follower, _weight_in_dim
from prunefx.transform.keep import keep_by_root, kept_positions

DEFAULT_RIDGE = 1e-3  # lambda relative to mean(diag(X^T X)); see the module docstring
DEFAULT_MAX_ROWS = 8192  # calibration rows per layer (per call site), spread evenly over the batches
DEFAULT_HOLDOUT = 0.2  # share of the rows left out of the fit: the errors before/after are measured on them
DEFAULT_MAX_TARGET_BYTES = 1 << 30  # above this bound on every layer's targets together, they are taken per layer


@dataclass(frozen=True)
class RefitLayer:
    """One layer's re-fit: rows used and its calibration relative error ||Y_new - Y_orig|| / ||Y_orig||."""

    name: str
    rows: int  # rows of the first fit (the final one adds the held-out rows)
    before: float  # the pruned layer as the cut left it (upstream already re-fitted)
    after: float  # with the re-fitted weights; equal to before when they were not kept
    applied: bool  # False: the re-fit was not better, the old weights stay (why says so)
    why: str = ""
    held_out: int = 0  # rows left out of the fit, on which before/after were measured (0: measured on the fit's)


@dataclass(frozen=True)
class Refit:
    """What :func:`refit` did: each re-fitted layer's error before and after, the layers skipped and why."""

    layers: tuple[RefitLayer, ...]
    skipped: tuple[tuple[str, str], ...]  # (layer, reason)
    batches: int
    ridge: float
    max_rows: int
    holdout: float = 0.0
    targets: str = "one pass"  # or "per layer": how the original's outputs were taken (see max_target_bytes)
    original_passes: int = 0  # forwards of the original run for the targets (a per-layer one stops early)

    @property
    def before(self) -> float:
        """All re-fitted layers' relative error together, before: sqrt(mean of the squared per-layer errors)."""
        return _rms([x.before for x in self.layers])

    @property
    def after(self) -> float:
        """The same after the re-fit (a layer whose re-fit was not kept counts with its error before)."""
        return _rms([x.after for x in self.layers])

    def to_dict(self) -> dict[str, Any]:
        """Plain data for a report: totals, per layer, skipped."""
        return {
            "before": self.before, "after": self.after, "batches": self.batches, "ridge": self.ridge,
            "max_rows": self.max_rows, "holdout": self.holdout, "targets": self.targets,
            "original_passes": self.original_passes,
            "layers": [{"name": x.name, "rows": x.rows, "held_out": x.held_out, "before": x.before,
                        "after": x.after, "applied": x.applied, "why": x.why} for x in self.layers],
            "skipped": [{"name": n, "why": w} for n, w in self.skipped],
        }


def _rms(values: list[float]) -> float:
    return math.sqrt(sum(v * v for v in values) / len(values)) if values else 0.0


def refit(
    original: nn.Module,
    pruned: nn.Module,
    dg: DependencyGraph,
    plan: PruningPlan,
    calibration: Iterable[Sequence[Any]],
    *,
    ridge: float = DEFAULT_RIDGE,
    max_rows: int = DEFAULT_MAX_ROWS,
    holdout: float = DEFAULT_HOLDOUT,
    seed: int = 0,
    max_target_bytes: int = DEFAULT_MAX_TARGET_BYTES,
) -> Refit:
    """Re-fit, in place, every layer of ``pruned`` that lost input channels to reproduce ``original``'s output.

    ``original``: the model before the cut (unchanged); ``pruned``: it after ``apply_plan(.., dg, plan)``;
    ``calibration``: batches of positional model inputs (each a tuple, run as ``model(*batch)``);
    ``max_target_bytes``: the most the original's outputs may take held for every layer at once (else per layer).
    """
    batches = [(b,) if isinstance(b, torch.Tensor) else tuple(b) for b in calibration]  # a tensor: one input
    if not batches:
        raise PrunefxError("refit: calibration yielded no batch; pass a few batches of model inputs")
    if not ridge >= 0 or max_rows < 1 or not 0 <= holdout < 1:
        raise PrunefxError(f"refit: ridge must be >= 0, max_rows >= 1 and holdout in [0, 1), got ridge={ridge}, "
                           f"max_rows={max_rows}, holdout={holdout}")
    layers, skipped = _layers(original, pruned, dg, plan)
    index = {n: i for i, n in enumerate(layers)}  # seeds each layer's row subsample
    per_layer = _target_bytes_bound(original, layers, max_rows) > max_target_bytes
    passes = len(batches)
    if per_layer:  # counted first: each layer's pass of the original then stops after its last call
        order, calls = _calls(original, layers, batches)
        targets: dict[str, list[list[torch.Tensor]]] = {}
    else:
        targets, order = _targets(original, layers, index, batches, max_rows, seed)
    for name in layers:
        if name not in order:
            skipped.append((name, "not called on the calibration data"))
    followers = _single_bn_follower(dg.gm)
    done = []
    for name in order:
        if per_layer:
            targets, _ = _targets(original, {name: layers[name]}, index, batches, max_rows, seed, calls[name])
            passes += sum(1 for n in calls[name] if n)
        result = _refit_one(pruned, name, index[name], layers[name], targets.pop(name), batches, ridge, max_rows,
                            holdout, seed, followers)
        if isinstance(result, str):
            skipped.append((name, result))
        else:
            done.append(result)
    return Refit(tuple(done), tuple(skipped), len(batches), ridge, max_rows, holdout,
                 "per layer" if per_layer else "one pass", passes)


def check_calibration(model: nn.Module, batches: Sequence[tuple]) -> None:
    """Run every calibration batch through ``model`` (evaluation mode, no gradients) before anything is changed,
    so that a batch the model cannot take is refused while the model is still whole."""
    if not batches:
        raise PrunefxError("calibration yielded no batch; pass a few batches of model inputs, e.g. [x1, x2, ...]")
    with training_mode(model, False), torch.no_grad():
        for i, batch in enumerate(batches):
            try:
                _run(model, batch)
            except Exception as exc:  # any failure of the user's batch is reported as bad input
                raise PrunefxError(
                    f"calibration batch {i} does not run through the model ({type(exc).__name__}: "
                    f"{str(exc).splitlines()[0][:200] if str(exc) else ''}); pass batches of model inputs shaped "
                    "like the example inputs"
                ) from exc


class _Enough(BaseException):  # control flow, not an error (BaseException: a model's `except Exception` lets it by)
    """Raised by the re-fit's hook after the layer's last call in a batch."""


@dataclass(frozen=True)
class _Layer:
    """How to read a layer: matrix (Linear / Conv1D) or conv, its weight's input dim, its kept output positions."""

    conv: bool
    in_dim: int
    kept_out: torch.Tensor


def _layers(
    original: nn.Module, pruned: nn.Module, dg: DependencyGraph, plan: PruningPlan
) -> tuple[dict[str, _Layer], list[tuple[str, str]]]:
    """The layers that lost input channels and can be re-fitted; the others with the reason."""
    shared = _shared_parameters(pruned)
    sorted_roots, keep = keep_by_root(dg, plan)
    out, skipped = {}, []
    for name in _pruned_inputs(dg, plan):
        m = pruned.get_submodule(name)
        why = _refusal(m, _weight_in_dim(dg, name), shared)
        if why:
            skipped.append((name, why))
            continue
        in_dim = 1 if isinstance(m, nn.modules.conv._ConvNd) else _weight_in_dim(dg, name)
        out_dim = 1 - in_dim if m.weight.dim() == 2 else 0  # Linear (out, in), Conv1D (in, out), conv (out, ...)
        roots = dg.record_roots.get(RecordKey(Kind.MODULE, name, OUT))
        was = original.get_submodule(name).weight.shape[out_dim]
        kept = torch.as_tensor(kept_positions(roots, sorted_roots, keep)) if roots is not None else torch.arange(was)
        if len(kept) != m.weight.shape[out_dim]:
            skipped.append((name, f"its output width ({m.weight.shape[out_dim]}) does not match the plan's kept "
                                  f"outputs ({len(kept)})"))
            continue
        out[name] = _Layer(isinstance(m, nn.modules.conv._ConvNd), in_dim, kept)
    return out, skipped


def _refusal(m: nn.Module, in_dim: int | None, shared: dict[int, list[str]]) -> str:
    """Why ``m`` cannot be re-fitted here ('' when it can)."""
    kind = type(m).__name__
    weight = getattr(m, "weight", None)
    if isinstance(weight, nn.Parameter) and len(shared.get(id(weight), ())) > 1:
        return f"{kind}: its weight is shared ({', '.join(shared[id(weight)])}); a re-fit would change every user"
    if isinstance(m, nn.modules.conv._ConvNd):
        if m.transposed:
            return f"{kind}: transposed convs are not re-fitted"
        if m.weight.dim() not in (3, 4):
            return f"{kind}: only 1-D and 2-D convs are re-fitted"
        if m.padding_mode != "zeros":
            return f"{kind}: padding_mode={m.padding_mode!r} is not re-fitted (only zero padding)"
        return ""  # torch's own layout (out, in / groups, *kernel), whatever the records say of a grouped one
    is_hf_conv1d = kind == "Conv1D" and hasattr(m, "nf") and in_dim == 0  # transformers' Conv1D, weight (in, out)
    if (isinstance(m, nn.Linear) and in_dim == 1) or is_hf_conv1d:
        return ""
    return f"{kind}: only Linear, Conv1d/Conv2d and transformers' Conv1D are re-fitted"


def _shared_parameters(model: nn.Module) -> dict[int, list[str]]:
    names: dict[int, list[str]] = {}
    for n, p in model.named_parameters(remove_duplicate=False):
        names.setdefault(id(p), []).append(n)
    return names


def _device(model: nn.Module) -> torch.device:
    return next((p.device for p in model.parameters()), torch.device("cpu"))


def _run(model: nn.Module, batch: tuple) -> None:
    device = _device(model)
    model(*(x.to(device) if isinstance(x, torch.Tensor) else x for x in batch))


def _rows_index(n: int, cap: int, seed: int, *key: int) -> torch.Tensor | None:
    """The same seeded subsample of ``n`` rows for the original and the pruned run (None: all rows)."""
    if n <= cap:
        return None
    g = torch.Generator().manual_seed(hash((seed, *key)) & 0x7FFFFFFF)
    return torch.randperm(n, generator=g)[:cap].sort().values


def _target_bytes_bound(original: nn.Module, layers: dict[str, _Layer], max_rows: int) -> int:
    """An upper bound on the bytes of every layer's targets held at once (one call per batch: ``max_rows`` rows)."""
    return sum(max_rows * len(layer.kept_out) * original.get_submodule(name).weight.element_size()
               for name, layer in layers.items())


def _calls(original: nn.Module, layers: dict[str, _Layer], batches: list[tuple]) -> tuple[list[str], dict]:
    """The order of the layers' first calls and each layer's number of calls per batch (nothing held)."""
    order: list[str] = []
    calls = {n: [0] * len(batches) for n in layers}
    at = [0]

    def hook(name: str):
        def fn(module: nn.Module, args: tuple, output: Any) -> None:
            if name not in order:
                order.append(name)
            calls[name][at[0]] += 1

        return fn

    _passes(original, {n: hook(n) for n in layers}, batches, at)
    return order, calls


def _passes(model: nn.Module, hooks: dict[str, Any], batches: list[tuple], at: list[int],
            run: list[int] | None = None) -> None:
    """``batches`` through ``model`` (evaluation mode, no gradients) with forward ``hooks`` (module name -> hook).

    ``at[0]`` is the batch index while it runs; a hook ends a batch's pass early by raising :class:`_Enough`;
    ``run``: per batch, 0 skips it.
    """
    handles = [model.get_submodule(n).register_forward_hook(h) for n, h in hooks.items()]
    try:
        with training_mode(model, False), torch.no_grad():
            for b, batch in enumerate(batches):
                if run is not None and not run[b]:
                    continue
                at[0] = b
                try:
                    _run(model, batch)
                except _Enough:
                    pass
    finally:
        for h in handles:
            h.remove()


def _targets(
    original: nn.Module,
    layers: dict[str, _Layer],
    index: dict[str, int],
    batches: list[tuple],
    max_rows: int,
    seed: int,
    stop_after: list[int] | None = None,
) -> tuple[dict[str, list[list[torch.Tensor]]], list[str]]:
    """Each layer's sampled output rows (kept output channels), per batch and call, and the order of first calls.

    ``stop_after`` (one layer only): its calls per batch; each batch's pass stops after the last of them.
    """
    rows: dict[str, list[list[torch.Tensor]]] = {n: [[] for _ in batches] for n in layers}
    order: list[str] = []
    cap = max(1, max_rows // len(batches))
    at = [0]

    def hook(name: str):
        def fn(module: nn.Module, args: tuple, output: torch.Tensor) -> None:
            if name not in order:
                order.append(name)
            y = _output_rows(output.detach(), layers[name].conv)
            calls = rows[name][at[0]]
            pick = _rows_index(y.shape[0], cap, seed, index[name], at[0], len(calls))
            y = y if pick is None else y[pick.to(y.device)]
            calls.append(y[:, layers[name].kept_out.to(y.device)])
            if stop_after is not None and len(calls) == stop_after[at[0]]:
                raise _Enough  # the rest of the original's forward cannot add to this layer's rows

        return fn

    _passes(original, {n: hook(n) for n in layers}, batches, at, stop_after)
    return rows, order


def _output_rows(y: torch.Tensor, conv: bool) -> torch.Tensor:
    """(rows, out channels): a conv's channels are dim 1, a matrix layer's the last dim."""
    return (y.movedim(1, -1) if conv else y).reshape(-1, y.shape[1] if conv else y.shape[-1])


def _input_rows(m: nn.Module, x: torch.Tensor) -> torch.Tensor:
    """(rows, features): a matrix layer's inputs, or a conv's input patches ordered like ``weight.flatten(1)``."""
    if not isinstance(m, nn.modules.conv._ConvNd):
        return x.reshape(-1, x.shape[-1])
    x = F.pad(x, m._reversed_padding_repeated_twice)  # the layer's own zero padding, "same" included
    if x.dim() == 3:  # Conv1d as a 2-D conv of height 1
        x, kernel, stride, dilation = x.unsqueeze(2), (1, *m.kernel_size), (1, *m.stride), (1, *m.dilation)
    else:
        kernel, stride, dilation = m.kernel_size, m.stride, m.dilation
    patches = F.unfold(x, kernel, dilation=dilation, stride=stride)  # (N, C * k, L)
    return patches.transpose(1, 2).reshape(-1, patches.shape[1])


def _weights(m: nn.Module, layer: _Layer) -> torch.Tensor:
    """The current weights as (groups, features, outputs per group), float64."""
    w = m.weight.detach().double()
    if not layer.conv:
        return (w.T if layer.in_dim == 1 else w).unsqueeze(0)
    g = m.groups
    return w.reshape(g, w.shape[0] // g, -1).transpose(1, 2)


def _refit_one(
    pruned: nn.Module,
    name: str,
    index: int,
    layer: _Layer,
    targets: list[list[torch.Tensor]],
    batches: list[tuple],
    ridge: float,
    max_rows: int,
    holdout: float,
    seed: int,
    followers: dict[str, str],
) -> RefitLayer | str:
    """Solve and apply one layer's re-fit; a string says why it was skipped."""
    m = pruned.get_submodule(name)
    groups = m.groups if layer.conv else 1
    bn = followers.get(name) if m.bias is None else None
    bn_module = pruned.get_submodule(bn) if bn is not None else None
    intercept = m.bias is not None or bn_module is not None
    w0 = _weights(m, layer)  # (G, d, o)
    d, o = w0.shape[1], w0.shape[2]
    b0 = torch.zeros(groups, 1, o, dtype=torch.float64, device=w0.device)
    if m.bias is not None:
        b0 = m.bias.detach().double().reshape(groups, 1, o)
    w0 = torch.cat([w0, b0], 1) if intercept else w0
    k = w0.shape[1]
    rows = sum(len(y) for calls in targets for y in calls)  # known from the targets: refuse before the pass
    if rows < k:
        return (f"fewer calibration rows ({rows}) than unknowns per output ({k}); pass more calibration batches "
                f"or raise max_rows")
    # [fit, held out]: X'X, X'Y, Y'Y and the row count of each
    acc = [[torch.zeros(groups, k, k, dtype=torch.float64, device=w0.device),
            torch.zeros(groups, k, o, dtype=torch.float64, device=w0.device),
            torch.zeros((), dtype=torch.float64, device=w0.device), 0] for _ in range(2)]
    state = {"batch": 0, "call": 0, "bad": ""}
    cap = max(1, max_rows // len(batches))

    def hook(module: nn.Module, args: tuple) -> None:
        b, c = state["batch"], state["call"]
        state["call"] += 1
        calls = targets[b]
        if c >= len(calls) or not args:
            state["bad"] = ("called more often by the pruned model than by the original" if args else
                            "called with its input as a keyword argument (not seen by a forward pre-hook)")
            return
        x = _input_rows(module, args[0].detach())
        y = calls[c].double()
        n = x.shape[0]
        pick = _rows_index(n, cap, seed, index, b, c)
        x = (x if pick is None else x[pick.to(x.device)]).double()
        if x.shape[0] != y.shape[0]:
            state["bad"] = f"the pruned model's input rows ({x.shape[0]}) do not match the original's ({y.shape[0]})"
            return
        if intercept:
            x = torch.cat([x, torch.ones(x.shape[0], 1, dtype=x.dtype, device=x.device)], 1)
        held = _held_out(x.shape[0], holdout, seed, index, b, c)
        held = held.to(x.device) if held is not None else None
        for part, (xp, yp) in enumerate(((x, y), (None, None)) if held is None else
                                        ((x[~held], y[~held]), (x[held], y[held]))):
            if xp is None or not len(xp):
                continue
            xs = _split(xp, groups, d, intercept)  # (G, rows, k)
            ys = yp.reshape(yp.shape[0], groups, o).transpose(0, 1)  # (G, rows, o)
            acc[part][0].add_(xs.transpose(1, 2) @ xs)
            acc[part][1].add_(xs.transpose(1, 2) @ ys)
            acc[part][2].add_(yp.square().sum())
            acc[part][3] += len(xp)
        if c + 1 == len(calls):
            raise _Enough  # the rest of the forward cannot change this layer's rows: skip it

    handle = m.register_forward_pre_hook(hook)
    try:
        with training_mode(pruned, False), torch.no_grad():
            for b, batch in enumerate(batches):
                state["batch"], state["call"] = b, 0
                try:
                    _run(pruned, batch)
                except _Enough:
                    pass
                if state["call"] != len(targets[b]) and not state["bad"]:
                    state["bad"] = "called a different number of times by the pruned model than by the original"
    finally:
        handle.remove()
    if state["bad"]:
        return state["bad"]
    (xtx, xty, yty, fit_rows), measured = acc[0], acc[1] if acc[1][3] else acc[0]
    if fit_rows < k:
        return (f"fewer calibration rows in the fit ({fit_rows}) than unknowns per output ({k}); pass more "
                f"calibration batches or raise max_rows")
    if yty.item() == 0.0 or measured[2].item() == 0.0:
        return "the original layer's output is zero on the calibration data"
    scale = torch.diagonal(xtx, dim1=1, dim2=2).mean(1)  # (G,)
    if bool((scale == 0).any()):
        return "its kept inputs are all zero on the calibration data"
    try:
        w = _solve(xtx, xty, w0, ridge)
    except RuntimeError as exc:  # singular: ridge=0 on collinear inputs
        return f"the least-squares system is singular ({str(exc).splitlines()[0][:120]}); use ridge > 0"
    before, after = _error(*measured[:3], w0), _error(*measured[:3], w)
    held_out = acc[1][3]
    if not math.isfinite(after) or after >= before:
        where = "on the held-out rows" if held_out else "on the calibration"
        return RefitLayer(name, fit_rows, before, before, False,
                          f"re-fit not better {where} ({after:.4g} vs {before:.4g}): old weights kept", held_out)
    if held_out:  # validated: the weights applied are fitted on every row
        w = _solve(xtx + acc[1][0], xty + acc[1][1], w0, ridge)
    _write(m, layer, w[:, :d], groups)
    if intercept:
        c = w[:, d].reshape(-1)
        if m.bias is not None:
            m.bias.data.copy_(c.to(m.bias.dtype))
        else:  # BN(z + c) with running mean mu == BN(z) with running mean mu - c
            bn_module.running_mean.data.sub_(c.to(bn_module.running_mean.dtype))
    return RefitLayer(name, fit_rows, before, after, True, held_out=held_out)


def _solve(xtx: torch.Tensor, xty: torch.Tensor, w0: torch.Tensor, ridge: float) -> torch.Tensor:
    """argmin ||XW - Y||^2 + lambda ||W - W0||^2 per group, lambda = ridge * mean(diag(X'X))."""
    lam = ridge * torch.diagonal(xtx, dim1=1, dim2=2).mean(1).reshape(-1, 1, 1)
    eye = torch.eye(xtx.shape[-1], dtype=xtx.dtype, device=xtx.device)
    return torch.linalg.solve(xtx + lam * eye, xty + lam * w0)


def _held_out(n: int, share: float, seed: int, *key: int) -> torch.Tensor | None:
    """Which of ``n`` sampled rows are left out of the fit (seeded; None: none)."""
    if share <= 0:
        return None
    g = torch.Generator().manual_seed(hash((seed, -1, *key)) & 0x7FFFFFFF)
    return torch.rand(n, generator=g) < share


def _split(x: torch.Tensor, groups: int, d: int, intercept: bool) -> torch.Tensor:
    """(groups, rows, d [+1]): each group's own input features, the ones column shared."""
    parts = x[:, : groups * d].reshape(x.shape[0], groups, d).transpose(0, 1)
    if intercept:
        ones = x[:, -1:].expand(x.shape[0], 1).unsqueeze(0).expand(groups, -1, -1)
        parts = torch.cat([parts, ones], 2)
    return parts


def _error(xtx: torch.Tensor, xty: torch.Tensor, yty: torch.Tensor, w: torch.Tensor) -> float:
    """||X W - Y|| / ||Y|| from the normal equations: sqrt(tr(W'AW) - 2 tr(W'B) + Y'Y) / sqrt(Y'Y)."""
    sq = (w * (xtx @ w)).sum() - 2 * (w * xty).sum() + yty
    return math.sqrt(max(sq.item(), 0.0) / yty.item())


def _write(m: nn.Module, layer: _Layer, w: torch.Tensor, groups: int) -> None:
    """(groups, features, outputs per group) back into the layer's own weight layout."""
    weight = m.weight
    if not layer.conv:
        new = w[0].T if layer.in_dim == 1 else w[0]
    else:
        new = w.transpose(1, 2).reshape(weight.shape)
    weight.data.copy_(new.to(weight.dtype))
