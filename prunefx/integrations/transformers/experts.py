"""Expert pruning of Hugging Face mixture-of-experts models: whole experts leave every MoE layer.

A MoE layer is a module with a router child (a ``weight`` of shape ``(E, hidden)``) and an experts child holding
``num_experts == E`` and its weights stacked along a leading dim of E (transformers' ``*Experts``: ``gate_up_proj``,
``down_proj``), called as ``experts(hidden, top_k_index, top_k_weights)``. Experts are scored on calibration data
from the routing the experts module receives:

- ``"contribution"`` (default): the sum over the tokens routed to an expert of its routing weight times the norm of
  its output (how much it adds to the layer's output over the data; one extra expert call per expert and layer, on
  its routed tokens only);
- ``"reap"`` (REAP, Lasby et al. 2026): the same averaged over the expert's routed tokens, so a rarely routed expert
  with large outputs scores high;
- ``"frequency"``: the routing weight mass an expert receives.

On a small trained Mixtral (``experiments/expert_plans.py``, 2 seeds) ``contribution`` kept perplexity best at
half and at a quarter of the experts, ``reap`` worst of the three at a quarter.

The same number of experts is kept in every layer (the config has one ``num_experts``), at least ``top_k``. The
rewrite slices the router's and the experts' leading dims and sets every count to the kept number (modules and the
model's own copy of its config). The pruned model must also pass the calls it passed before (its default call, a
cached generation). The oracle: the pruned model equals the original whose routers give the removed
experts a logit of -inf (each router's ``F.linear`` answered with those columns masked), which is exact for
softmax routing (Mixtral, Qwen-MoE, OLMoE); a router that scores otherwise fails it, and the experts are put back.
"""

from __future__ import annotations

import copy
import inspect
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn
from torch.overrides import TorchFunctionMode

from prunefx.analysis.outputs import default_free_outputs
from prunefx.errors import PrunefxError, VerificationError
from prunefx.integrations.transformers.api import stale_config
from prunefx.integrations.transformers.pretrained import own_config
from prunefx.integrations.transformers.runs import broken_call, calls_that_run
from prunefx.sensitivity import calibration_batches
from prunefx.verify import VerifyResult, compare_outputs, max_error

COUNTS = ("num_experts", "num_local_experts", "n_routed_experts")
CRITERIA = ("contribution", "reap", "frequency")


@dataclass(frozen=True)
class MoeLayer:
    """One MoE layer: its path, its router's and experts' paths, the experts it has and how many a token takes."""

    path: str
    router: str
    experts: str
    num_experts: int
    top_k: int


@dataclass(frozen=True)
class ExpertPlan:
    """The experts each MoE layer keeps (indices into the original's), with every expert's score."""

    keep: tuple[tuple[str, tuple[int, ...]], ...]
    scores: tuple[tuple[str, tuple[float, ...]], ...]
    criterion: str

    def summary(self) -> str:
        """The plan as text: per layer the experts kept and the lowest score kept vs the highest removed."""
        lines = [f"expert plan ({self.criterion}): {len(self.keep)} MoE layers"]
        scores = dict(self.scores)
        for path, kept in self.keep:
            s = scores[path]
            gone = [s[i] for i in range(len(s)) if i not in kept]
            lines.append(f"  {path}: {len(s)} -> {len(kept)} experts, kept {list(kept)}"
                         + (f" (lowest kept {min(s[i] for i in kept):.4g}, highest removed {max(gone):.4g})"
                            if gone else ""))
        return "\n".join(lines)

    def __str__(self) -> str:
        return self.summary()


@dataclass(frozen=True)
class ExpertResult:
    """What :func:`prune_experts` did: the model (pruned in place), the plan, the check and any warning."""

    model: nn.Module
    plan: ExpertPlan
    verified: VerifyResult | None
    warnings: tuple[str, ...] = ()
    active_params: tuple[int, int] = (0, 0)  # parameters one token runs through, before and after (active_params)


def _no_cache(model: nn.Module) -> dict[str, bool]:
    """``use_cache=False`` where the forward takes it: a KV cache is no output to compare, nor worth building."""
    try:
        return {"use_cache": False} if "use_cache" in inspect.signature(model.forward).parameters else {}
    except (TypeError, ValueError):
        return {}


def _stacked(m: nn.Module, n: int) -> list[str]:
    return [k for k, t in (*m.named_parameters(recurse=False), *m.named_buffers(recurse=False))
            if t is not None and t.dim() >= 1 and t.shape[0] == n]


def moe_layers(model: nn.Module) -> list[MoeLayer]:
    """Every MoE layer of ``model`` (see the module doc)."""
    found = []
    for name, m in model.named_modules():
        children = dict(m.named_children())
        for ename, experts in children.items():
            n = getattr(experts, "num_experts", None)
            if not isinstance(n, int) or not any(t.dim() == 3 for t in experts.parameters(recurse=False)):
                continue
            routers = [r for r, c in children.items() if r != ename and isinstance(getattr(c, "weight", None),
                       torch.Tensor) and c.weight.dim() == 2 and c.weight.shape[0] == n]
            if len(routers) != 1:
                continue
            router = children[routers[0]]
            top_k = getattr(router, "top_k", None) or getattr(m, "top_k", None)
            prefix = f"{name}." if name else ""
            found.append(MoeLayer(name, prefix + routers[0], prefix + ename, n, int(top_k or 1)))
    return found


def active_params(model: nn.Module) -> int:
    """Parameters one token runs through: all of them, less, in every MoE layer, the experts it is not routed to
    (``1 - top_k / E`` of the stacked expert weights)."""
    total = sum(p.numel() for p in model.parameters())
    for x in moe_layers(model):
        stacked = sum(p.numel() for p in model.get_submodule(x.experts).parameters())
        total -= round(stacked * (1 - x.top_k / x.num_experts))
    return total


def _routing(model: nn.Module, layers: Sequence[MoeLayer], batches: list[tuple], criterion: str
             ) -> dict[str, torch.Tensor]:
    """Each layer's expert scores on ``batches``, from the (hidden, top_k_index, top_k_weights) its experts get."""
    sums = {x.path: torch.zeros(x.num_experts, dtype=torch.float64) for x in layers}
    counts = {x.path: torch.zeros(x.num_experts, dtype=torch.float64) for x in layers}
    busy = set()

    def hook(m: nn.Module, args: tuple, layer: MoeLayer) -> None:
        if layer.path in busy or len(args) < 3:
            return
        hidden, index, weight = args[0], args[1], args[2]
        hidden = hidden.reshape(-1, hidden.shape[-1])
        index, weight = index.reshape(hidden.shape[0], -1), weight.reshape(hidden.shape[0], -1).double()
        for j in range(layer.num_experts):
            rows, slot = torch.where(index == j)
            if not len(rows):
                continue
            counts[layer.path][j] += len(rows)
            if criterion == "frequency":
                sums[layer.path][j] += weight[rows, slot].sum()
                continue
            busy.add(layer.path)  # the extra call below must not be counted again
            try:
                out = m(hidden[rows], torch.full((len(rows), 1), j, dtype=index.dtype),
                        torch.ones(len(rows), 1, dtype=hidden.dtype))
            finally:
                busy.discard(layer.path)
            sums[layer.path][j] += (weight[rows, slot] * out.double().norm(dim=-1)).sum()

    handles = [model.get_submodule(x.experts).register_forward_pre_hook(
        lambda m, args, layer=x: hook(m, args, layer)) for x in layers]
    was = model.training
    try:
        model.eval()
        with torch.no_grad():
            for inputs, _ in batches:
                model(*inputs, **_no_cache(model))
    finally:
        model.train(was)
        for h in handles:
            h.remove()
    if criterion in ("frequency", "contribution"):
        return sums
    return {p: sums[p] / counts[p].clamp(min=1) for p in sums}


def plan_experts(layers: Sequence[MoeLayer], scores: dict[str, torch.Tensor], criterion: str, *,
                 keep: float | None = None, experts: int | None = None) -> ExpertPlan:
    """Keep the ``experts`` (or ``keep`` fraction, rounded) highest-scored experts in every layer."""
    if (keep is None) == (experts is None):
        raise PrunefxError("give one expert target: keep=<fraction of experts kept> or experts=<experts per layer>")
    n = {x.num_experts for x in layers}
    if len(n) != 1:
        raise PrunefxError(f"the MoE layers have different expert counts ({sorted(n)}); the config holds one")
    total = n.pop()
    if experts is None:
        if not 0 < keep <= 1:
            raise PrunefxError(f"keep={keep} is no fraction of the experts: give a value in (0, 1]")
        experts = max(1, round(total * keep))
    top_k = max(x.top_k for x in layers)
    if not top_k <= experts <= total:
        raise PrunefxError(f"{experts} experts per layer cannot be kept: each token is routed to top_k={top_k} of "
                           f"{total}; keep between {top_k} and {total}")
    chosen = []
    for x in layers:
        s = scores[x.path]
        order = sorted(range(total), key=lambda i: (-float(s[i]), i))
        chosen.append((x.path, tuple(sorted(order[:experts]))))
    return ExpertPlan(tuple(chosen), tuple((x.path, tuple(float(v) for v in scores[x.path])) for x in layers),
                      criterion)


def _slice(model: nn.Module, layers: Sequence[MoeLayer], plan: ExpertPlan) -> None:
    """Rewrite: the router's and experts' stacked tensors sliced to the kept experts, every count set."""
    keep = dict(plan.keep)
    for x in layers:
        idx = torch.tensor(keep[x.path])
        for path in (x.router, x.experts):
            m = model.get_submodule(path)
            for key in _stacked(m, x.num_experts):
                t = getattr(m, key)
                new = t.detach()[idx.to(t.device)].clone()
                if isinstance(t, nn.Parameter):
                    setattr(m, key, nn.Parameter(new, requires_grad=t.requires_grad))
                else:
                    m.register_buffer(key, new, persistent=key not in m._non_persistent_buffers_set)
        for path in (x.path, x.router, x.experts):
            m = model.get_submodule(path)
            for name in COUNTS:
                if getattr(m, name, None) == x.num_experts:
                    setattr(m, name, len(idx))
    own_config(model)
    n = len(next(iter(keep.values())))
    for cfg in {id(c): c for c in (model.config, *(getattr(model.config, k) for k in vars(model.config)
                                                   if hasattr(getattr(model.config, k), "model_type")))}.values():
        for name in COUNTS:
            if getattr(cfg, name, None) == layers[0].num_experts:
                setattr(cfg, name, n)


class _MaskedRouters(TorchFunctionMode):
    """``F.linear`` with a router's weight answered with the removed experts' logits at -inf."""

    def __init__(self, removed: dict[int, torch.Tensor]) -> None:
        super().__init__()
        self.removed = removed

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        out = func(*args, **kwargs)
        if func is F.linear and len(args) > 1 and id(args[1]) in self.removed:
            out = out.clone()
            out[..., self.removed[id(args[1])]] = float("-inf")
        return out


def verify_experts(original: nn.Module, pruned: nn.Module, layers: Sequence[MoeLayer], plan: ExpertPlan,
                   example_inputs: tuple, *, rtol: float = 1e-4) -> VerifyResult:
    """``pruned`` against ``original`` (unpruned) whose routers give the removed experts a logit of -inf."""
    keep = dict(plan.keep)
    removed = {}
    for x in layers:
        gone = [i for i in range(x.num_experts) if i not in keep[x.path]]
        removed[id(original.get_submodule(x.router).weight)] = torch.tensor(gone, dtype=torch.long)
    extra = _no_cache(original)
    with torch.no_grad():
        with _MaskedRouters(removed):
            reference = original.eval()(*example_inputs, **extra)
        got = pruned.eval()(*example_inputs, **extra)
    scores = compare_outputs(reference, got, default_free_outputs(original))
    worst = max_error(scores.errors)
    ok = not scores.problems and bool(scores.errors) and worst <= rtol
    what = "original with the removed experts' router logits at -inf"
    message = (f"pruned model == {what}: max rel error {worst:.2e}" if ok else
               f"pruned model != {what}: " + (scores.problems[0] if scores.problems else f"max rel error {worst:.2e}"))
    return VerifyResult(ok=ok, exact=True, max_rel_error=worst, errors=tuple(scores.errors), inexact_groups=(),
                        runs_eval=True, runs_train=False, message=message, notes=("checked in evaluation mode",),
                        outputs=tuple(scores.names), problems=tuple(scores.problems))


def prune_experts(model: nn.Module, calibration: Iterable[Any], *, keep: float | None = None,
                  experts: int | None = None, criterion: str = "contribution", check: bool = True,
                  rtol: float = 1e-4, scores: Mapping[str, Sequence[float]] | None = None) -> ExpertResult:
    """Remove whole experts from every MoE layer of ``model`` in place, scored on ``calibration`` (batches of model
    inputs: token ids, or a tokenizer's dict), to ``keep`` of them or ``experts`` per layer (see the module doc).
    ``scores``: your own, per MoE layer path (:func:`moe_layers`) one score per expert (higher: kept first); the
    calibration batches then only feed the check."""
    if scores is not None:
        return _prune(model, calibration, keep, experts, "given", check, rtol, scores)
    if criterion not in CRITERIA:
        raise PrunefxError(f"unknown expert criterion {criterion!r}: give one of {', '.join(CRITERIA)}")
    return _prune(model, calibration, keep, experts, criterion, check, rtol, None)


def _prune(model: nn.Module, calibration: Iterable[Any], keep: float | None, experts: int | None, criterion: str,
           check: bool, rtol: float, given: Mapping[str, Sequence[float]] | None) -> ExpertResult:
    layers = moe_layers(model)
    if not layers:
        raise PrunefxError(f"{type(model).__name__} has no MoE layer prunefx knows (a router with a weight of shape "
                           "(experts, hidden) beside an experts module with num_experts and stacked weights)")
    batches = calibration_batches(calibration, None, model)
    if given is None:
        scores = _routing(model, layers, batches, criterion)
    else:
        missing = [x.path for x in layers if x.path not in given or len(given[x.path]) != x.num_experts]
        if missing:
            raise PrunefxError(f"scores= lacks one score per expert for {missing[0]}: give a sequence of "
                               f"{layers[0].num_experts} scores for each MoE layer of moe_layers(model)")
        scores = {x.path: torch.as_tensor(given[x.path], dtype=torch.float64) for x in layers}
    plan = plan_experts(layers, scores, criterion, keep=keep, experts=experts)
    original = copy.deepcopy(model) if check else None
    ran = calls_that_run(model, batches[0][0]) if check else ()  # what must still run after the cut
    active_before = active_params(model)
    _slice(model, layers, plan)
    verified = None
    if check:
        verified = verify_experts(original, model, layers, plan, batches[0][0], rtol=rtol)
        why = verified.message if not verified.ok else broken_call(model, batches[0][0], ran)
        if why is not None:
            _restore(model, original, layers)
            raise VerificationError(f"expert pruning failed its check, the experts are back: {why}")
    said = stale_config(model, "expert-pruned", "the model runs, but its config family cannot say the new expert "
                        "count")
    return ExpertResult(model, plan, verified, (said,) if said else (), (active_before, active_params(model)))


def _restore(model: nn.Module, original: nn.Module, layers: Sequence[MoeLayer]) -> None:
    """Put the original's router and experts modules (and its config) back into ``model``."""
    for x in layers:
        parent, _, key = x.path.rpartition(".")
        setattr(model.get_submodule(parent), key, original.get_submodule(x.path))
    cfg = original.config
    for m in model.modules():
        if hasattr(m, "config") and hasattr(m.config, "model_type"):
            m.config = cfg
