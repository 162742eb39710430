"""Structured LLM-pruning baselines, reimplemented, against prunefx at half the parameters, right after the cut.

    python -m experiments.llm_baselines            # 8-layer stdlib LM, seeds 0 and 1, TEACHER_STEPS training steps
    python -m experiments.llm_baselines --quick    # 4 layers, one seed, 60 training steps (smoke test)

The model is :func:`prunefx.examples.stdlib_lm.trained_lm` (byte-level Llama, hidden 128, 4 query heads over 2 KV
heads, MLP 384) trained :data:`TEACHER_STEPS` steps, near its plateau (cached; ``experiments/llm_recovery.py``
measures how much doubling the steps still gains). Every method keeps 50% of the parameters WITHOUT the embeddings
(input embedding and lm_head not counted; each row says the exact fraction, all within 2%), starts from the same
weights, and is scored by perplexity per byte on the 8 held-out batches with no fine-tuning. Calibration: the first
4 training batches (64 windows of 128 bytes), the same for every method. Under GQA every method keeps or removes
whole KV groups (a KV head with its 2 query heads), so all choose among the same structures.

Baselines, reimplemented here from the papers' definitions (not their code), labelled "reimplemented"; their
statistics come from one pass over the unpruned model; a removed head's ``o_proj`` columns and a removed MLP
channel's ``down_proj`` column are zeroed (exactly the model with those structures removed; the parameters are
counted as that smaller model would hold them):

- ``Wanda-sp`` (An et al. 2023): channel j of ``o_proj`` / ``down_proj``'s input scores sum_i |W_ij| * ||X_j||_2;
  a KV group sums its heads' columns; the same ratio in every layer (half the groups, half the MLP channels).
- ``FLAP`` (An et al., AAAI 2024): fluctuation Var_tokens(X_j) * ||W_:,j||^2, summed per KV group; scores
  standardised per structure type (all layers' KV groups together, all layers' MLP channels together), ranked
  globally, kept by score until the budget (each weighted by its parameters: the adaptive structure); then the
  baseline bias: the removed channels' mean input times their columns, added as a bias to ``o_proj`` /
  ``down_proj`` (counted in the parameters).
- ``LLM-Pruner`` (Ma et al., NeurIPS 2023), block-wise: a group is a KV group (its q, k, v rows and ``o_proj``
  columns) or an MLP channel (``gate`` / ``up`` rows, ``down`` column); importance summed over the group's weight
  vectors (rows / columns): ``L2`` ||w||_2 per vector, ``Taylor`` first order, |sum w * dL/dw| per vector (loss on
  the calibration batches); the first and last layers are left whole (in --quick's 4 layers only the first, else
  no budget is left), the others pruned with one ratio, the MLP taking what the whole KV groups leave.
- ``random`` (control): uniform as Wanda-sp, structures drawn at random.
- ``..., MLP only`` (diagnostic, not the papers' recipes): each method's own scores with every KV group kept and
  the MLP cut uniformly to the budget (FLAP's bias on ``down_proj`` only): the structure prunefx's plans choose
  here, so these rows separate the criterion from the structure.
- ``ShortGPT`` (Men et al. 2024): whole layers removed by block influence (1 - cos of a layer's input and output),
  ``pfx_hf.prune_depth``'s default criterion, as many as gets closest to the budget.

prunefx rows: ``pfx_hf.prune`` (KV groups and MLP widths, uniform across layers, global plan), with and without the
least-squares re-fit on the calibration batches; ``..., per layer``: each layer its own widths (``per_layer=True``:
the structure FLAP adapts, which a Llama config cannot hold; saved with ``prunefx.save``); every one checked by
prunefx's oracle. The best prunefx row is chosen on the calibration loss (not on the held-out bytes). Writes
``<out>/llm_baselines.csv`` and ``.md``.
"""

from __future__ import annotations

import argparse
import copy
import os
import random
import statistics
import sys
import time
import warnings
from pathlib import Path

from experiments._table import cpu_name, write_result

FIELDS = ["seed", "layers", "method", "kind", "ppl", "calib_loss", "params_kept", "kv_groups", "mlp", "seconds"]
TARGET = 0.5  # of the parameters without embeddings
# The teacher's training steps (16 x 128 bytes each, about 14 passes over the corpus): 8x the embedded default's
# 600. Near a plateau: the last doubling (2400 -> 4800) lowered held-out loss by 1.2% / 2.3% (seeds 0 / 1; the one
# before, 1200 -> 2400, by 11-14%), as experiments/results/llm_recovery.md prints. Training one took 55 min at
# 1 thread on 2 cores shared with other jobs (cached). Shared with llm_recovery, so both tables prune the same models.
TEACHER_STEPS = 4800
REIMPL, PFX = "reimplemented", "prunefx"


# ---- counting ---------------------------------------------------------------------------------------------------

def _embedding_params(model) -> int:
    tables = {id(p): p for m in (model.get_input_embeddings(), model.get_output_embeddings()) if m is not None
              for p in m.parameters()}
    return sum(p.numel() for p in tables.values())


def _count(model) -> int:
    """Parameters without the input embedding and the lm_head."""
    return sum(p.numel() for p in model.parameters()) - _embedding_params(model)


class Shape:
    """The per-layer structure sizes of a Llama: KV groups and their parameters, MLP channels and theirs."""

    def __init__(self, model):
        cfg = model.config
        self.layers = list(model.model.layers)
        self.n = len(self.layers)
        self.heads, self.kv = cfg.num_attention_heads, cfg.num_key_value_heads
        self.rep = self.heads // self.kv
        self.hd = getattr(cfg, "head_dim", None) or cfg.hidden_size // self.heads
        self.hidden, self.inter = cfg.hidden_size, cfg.intermediate_size
        layer = self.layers[0]
        attn = sum(p.numel() for p in layer.self_attn.parameters())
        mlp = sum(p.numel() for p in layer.mlp.parameters())
        self.group_cost, self.channel_cost = attn // self.kv, mlp // self.inter
        self.layer_rest = sum(p.numel() for p in layer.parameters()) - attn - mlp  # the norms
        self.total = _count(model)
        self.outside = self.total - self.n * sum(p.numel() for p in layer.parameters())  # the final norm
        self.budget = TARGET * self.total

    def params(self, keep: list[tuple[list[int], list[int]]], biases: int = 0) -> int:
        """Parameters of the model with only ``keep[i] = (kv groups, mlp channels)`` of layer i left."""
        return (self.outside + self.n * self.layer_rest + biases
                + sum(len(g) * self.group_cost + len(c) * self.channel_cost for g, c in keep))

    def group_rows(self, g: int) -> tuple[slice, slice]:
        """(q rows / o columns, k and v rows) of KV group g."""
        w = self.rep * self.hd
        return slice(g * w, (g + 1) * w), slice(g * self.hd, (g + 1) * self.hd)


# ---- calibration statistics ---------------------------------------------------------------------------------------

def _stats(model, shape: Shape, calib, loss_fn) -> dict:
    """One pass over the unpruned model: per layer, o_proj / down_proj input channels' token count, sum, sum of
    squares; and the gradient of the calibration loss for every weight (Taylor)."""
    acc: dict[tuple[int, str], list] = {}

    def hook(key):
        def record(_module, args):
            x = args[0].detach().reshape(-1, args[0].shape[-1]).double()
            s = acc.setdefault(key, [0, 0.0, 0.0])
            s[0] += x.shape[0]
            s[1] = s[1] + x.sum(0)
            s[2] = s[2] + x.pow(2).sum(0)
        return record

    handles = [m.register_forward_pre_hook(hook((i, name))) for i, layer in enumerate(shape.layers)
               for name, m in (("o", layer.self_attn.o_proj), ("down", layer.mlp.down_proj))]
    model.zero_grad()
    try:
        for x, y in calib:
            (loss_fn(model(x), (x, y)) / len(calib)).backward()
    finally:
        for h in handles:
            h.remove()
    out = {}
    for (i, name), (n, s, q) in acc.items():
        mean = s / n
        out[i, name] = {"norm": q.sqrt(), "mean": mean, "var": (q - n * mean.pow(2)) / (n - 1)}
    grads = {id(p): p.grad.detach().clone() for p in model.parameters() if p.grad is not None}
    model.zero_grad()
    return {"act": out, "grad": grads}


def _wanda_sp(shape: Shape, stats) -> list[tuple]:
    """Per layer: (KV-group scores, MLP-channel scores) by sum_i |W_ij| ||X_j||_2 over o_proj / down_proj columns."""
    out = []
    for i, layer in enumerate(shape.layers):
        o = layer.self_attn.o_proj.weight.detach().double().abs().sum(0) * stats["act"][i, "o"]["norm"]
        d = layer.mlp.down_proj.weight.detach().double().abs().sum(0) * stats["act"][i, "down"]["norm"]
        out.append(([float(o[shape.group_rows(g)[0]].sum()) for g in range(shape.kv)], d))
    return out


def _flap(shape: Shape, stats) -> list[tuple]:
    """Per layer: fluctuation Var(X_j) ||W_:,j||^2 per KV group (summed) and per MLP channel, unstandardised."""
    out = []
    for i, layer in enumerate(shape.layers):
        o = layer.self_attn.o_proj.weight.detach().double().pow(2).sum(0) * stats["act"][i, "o"]["var"]
        d = layer.mlp.down_proj.weight.detach().double().pow(2).sum(0) * stats["act"][i, "down"]["var"]
        out.append(([float(o[shape.group_rows(g)[0]].sum()) for g in range(shape.kv)], d))
    return out


def _llm_pruner(shape: Shape, stats, kind: str) -> list[tuple]:
    """Per layer: group importance summed over its weight vectors, L2 norm or |sum w * grad| per vector."""
    import torch

    def per_vector(w, dim: int):  # dim 1: rows (output channels), 0: columns (input channels)
        w_ = w.detach().double()
        if kind == "l2":
            return w_.norm(dim=dim)
        return (w_ * stats["grad"][id(w)].double()).sum(dim).abs()

    out = []
    for layer in shape.layers:
        a, m = layer.self_attn, layer.mlp
        q, k, v = (per_vector(p.weight, 1) for p in (a.q_proj, a.k_proj, a.v_proj))
        o = per_vector(a.o_proj.weight, 0)
        groups = []
        for g in range(shape.kv):
            wide, narrow = shape.group_rows(g)
            groups.append(float(q[wide].sum() + o[wide].sum() + k[narrow].sum() + v[narrow].sum()))
        mlp = per_vector(m.gate_proj.weight, 1) + per_vector(m.up_proj.weight, 1) + per_vector(m.down_proj.weight, 0)
        out.append((groups, torch.as_tensor(mlp)))
    return out


# ---- choosing the structures ---------------------------------------------------------------------------------------

def _uniform_counts(shape: Shape, pruned: list[int], groups: int | None = None) -> tuple[int, int]:
    """(KV groups, MLP channels) kept in each of the ``pruned`` layers (the others whole) to meet the budget, the
    groups' kept fraction as close to the channels' as whole groups allow (one ratio per layer); ``groups``: that
    many KV groups kept, the MLP alone meets the budget."""
    whole = (shape.n - len(pruned)) * (shape.kv * shape.group_cost + shape.inter * shape.channel_cost)
    per_layer = (shape.budget - shape.outside - shape.n * shape.layer_rest - whole) / len(pruned)
    best = None
    for g in range(1, shape.kv + 1) if groups is None else (groups,):
        c = round((per_layer - g * shape.group_cost) / shape.channel_cost)
        if not 1 <= c <= shape.inter:
            continue
        gap = abs(g / shape.kv - c / shape.inter)
        if best is None or gap < best[0]:
            best = (gap, g, c)
    if best is None:
        raise ValueError(f"no uniform width over {len(pruned)} layers meets the budget")
    return best[1], best[2]


def _top(scores, k: int) -> list[int]:
    import torch

    return sorted(torch.as_tensor(scores, dtype=torch.float64).argsort(descending=True)[:k].tolist())


def _uniform(shape: Shape, scores: list[tuple], pruned: list[int], groups: int | None = None
             ) -> list[tuple[list[int], list[int]]]:
    g, c = _uniform_counts(shape, pruned, groups)
    return [(_top(gs, g), _top(cs, c)) if i in pruned else (list(range(shape.kv)), list(range(shape.inter)))
            for i, (gs, cs) in enumerate(scores)]


def _global(shape: Shape, scores: list[tuple], biases: int) -> list[tuple[list[int], list[int]]]:
    """FLAP's adaptive structure: scores standardised per structure type over all layers, ranked together, kept
    in order while the parameters stay closest to the budget (each structure weighted by its parameters)."""
    import torch

    def standard(t):
        return (t - t.mean()) / t.std()

    att = standard(torch.tensor([gs for gs, _ in scores], dtype=torch.float64))
    mlp = standard(torch.stack([torch.as_tensor(cs, dtype=torch.float64) for _, cs in scores]))
    units = [(float(att[i, g]), shape.group_cost, i, "g", g) for i in range(shape.n) for g in range(shape.kv)]
    units += [(float(mlp[i, c]), shape.channel_cost, i, "c", c) for i in range(shape.n) for c in range(shape.inter)]
    units.sort(key=lambda u: -u[0])
    room = shape.budget - shape.outside - shape.n * shape.layer_rest - biases
    cum = torch.tensor([u[1] for u in units], dtype=torch.float64).cumsum(0)
    n = int((cum - room).abs().argmin()) + 1
    keep = [([], []) for _ in range(shape.n)]
    for _, _, i, what, j in units[:n]:
        keep[i][0 if what == "g" else 1].append(j)
    return [(sorted(g), sorted(c)) for g, c in keep]


def _apply(model, shape: Shape, keep, stats=None) -> None:
    """Zero the removed KV groups' o_proj columns and MLP channels' down_proj columns; with ``stats`` (FLAP) add
    their mean contribution on calibration as a bias of o_proj / down_proj."""
    import torch
    from torch import nn

    with torch.no_grad():
        for i, (layer, (groups, channels)) in enumerate(zip(model.model.layers, keep, strict=True)):
            columns = [c for g in groups for c in range(shape.group_rows(g)[0].start, shape.group_rows(g)[0].stop)]
            for name, parent, kept in (("o", layer.self_attn, columns), ("down", layer.mlp, channels)):
                attr = "o_proj" if name == "o" else "down_proj"
                linear = getattr(parent, attr)
                gone = torch.ones(linear.in_features, dtype=torch.bool)
                gone[kept] = False
                if stats is not None and bool(gone.any()):
                    w = linear.weight.double()
                    bias = (w[:, gone] @ stats["act"][i, name]["mean"][gone]).to(linear.weight.dtype)
                    new = nn.Linear(linear.in_features, linear.out_features, bias=True, dtype=linear.weight.dtype)
                    new.weight.copy_(linear.weight)
                    new.bias.copy_(bias)
                    setattr(parent, attr, new)
                    linear = new
                linear.weight[:, gone] = 0.0


BASELINES = ("Wanda-sp", "FLAP", "LLM-Pruner, L2", "LLM-Pruner, Taylor", "random")
MLP_ONLY = ", MLP only"  # diagnostic: every KV group kept, the MLP cut uniformly in every layer to the budget


def _baseline(name: str, shape: Shape, stats, seed: int) -> tuple[list[tuple], dict | None, int]:
    """A baseline's kept (KV groups, MLP channels) per layer, the statistics of its bias (FLAP) and its biases'
    parameters."""
    import torch

    every = list(range(shape.n))
    inner = list(range(1, shape.n - 1)) if shape.n >= 6 else list(range(1, shape.n))  # LLM-Pruner's layers
    mlp_only = name.endswith(MLP_ONLY)
    base = name.removesuffix(MLP_ONLY)
    if mlp_only:  # the structure prunefx's plans choose here: the method's scores, only its MLP choice matters
        def place(scores, _layers):
            return _uniform(shape, scores, every, groups=shape.kv)
    else:
        def place(scores, layers):
            return _uniform(shape, scores, layers)
    if base == "Wanda-sp":
        return place(_wanda_sp(shape, stats), every), None, 0
    if base == "FLAP":
        biases = shape.n * shape.hidden if mlp_only else 2 * shape.n * shape.hidden  # o_proj has nothing removed
        keep = place(_flap(shape, stats), every) if mlp_only else _global(shape, _flap(shape, stats), biases)
        return keep, stats, biases
    if base.startswith("LLM-Pruner"):
        return place(_llm_pruner(shape, stats, base.split(", ")[1].lower()), inner), None, 0
    rng, g = random.Random(seed), torch.Generator().manual_seed(seed)
    scores = [([rng.random() for _ in range(shape.kv)], torch.rand(shape.inter, generator=g)) for _ in every]
    return place(scores, every), None, 0


# ---- the experiment -----------------------------------------------------------------------------------------------

def _row(seed, layers, method, kind, model, calib, val, kept, kv, mlp, seconds) -> dict:
    from prunefx.examples import stdlib_lm as lm

    return {"seed": seed, "layers": layers, "method": method, "kind": kind,
            "ppl": round(lm.metric(model, val)["ppl"], 4), "calib_loss": round(_calib_loss(model, calib), 5),
            "params_kept": round(kept, 4), "kv_groups": kv, "mlp": mlp, "seconds": round(seconds, 2)}


def _calib_loss(model, calib) -> float:
    import math

    from prunefx.examples import stdlib_lm as lm

    return math.log(lm.metric(model, calib)["ppl"])


def _widths(keep) -> tuple[str, str]:
    kv = {len(g) for g, _ in keep}
    mlp = [len(c) for _, c in keep]
    return (str(kv.pop()) if len(kv) == 1 else "/".join(str(len(g)) for g, _ in keep),
            str(mlp[0]) if len(set(mlp)) == 1 else "/".join(map(str, mlp)))


def _prunefx_variants() -> dict[str, dict]:
    return {
        "taylor, normalised, re-fit": {"criterion": "taylor", "normalize": "mean", "refit": True},
        "taylor, normalised": {"criterion": "taylor", "normalize": "mean", "refit": False},
        "activation, re-fit": {"criterion": "activation", "normalize": "none", "refit": True},
        "activation": {"criterion": "activation", "normalize": "none", "refit": False},
        "l2, re-fit": {"criterion": "l2", "normalize": "none", "refit": True},
        "l2": {"criterion": "l2", "normalize": "none", "refit": False},
        # per-layer widths (pfx_hf.prune(per_layer=True)): the adaptive structure FLAP has, saved with prunefx.save
        # (a Llama config holds one width per field)
        "activation, re-fit, per layer": {"criterion": "activation", "normalize": "none", "refit": True,
                                          "per_layer": True},
        "activation, per layer": {"criterion": "activation", "normalize": "none", "refit": False, "per_layer": True},
        "taylor, normalised, re-fit, per layer": {"criterion": "taylor", "normalize": "mean", "refit": True,
                                                  "per_layer": True},
    }


def run(seeds: list[int], layers: int, steps: int) -> list[dict]:
    import torch

    import prunefx
    from prunefx.examples import stdlib_lm as lm
    from prunefx.integrations import transformers as pfx_hf

    torch.set_num_threads(1)
    data = lm.make_data()
    calib, val = data["train"][:4], data["val"]

    def loss(out, ids):
        return lm.task_loss(out, (ids, ids))

    rows = []
    for seed in seeds:
        teacher = lm.trained_lm(seed, steps, layers=layers)
        shape = Shape(teacher)
        full = [(list(range(shape.kv)), list(range(shape.inter)))] * layers
        rows.append(_row(seed, layers, "unpruned", "-", teacher, calib, val, 1.0, str(shape.kv), str(shape.inter),
                         0.0))
        print(rows[-1], flush=True)
        t0 = time.perf_counter()
        stats = _stats(teacher, shape, calib, lm.task_loss)
        stat_seconds = time.perf_counter() - t0
        for name in (*BASELINES, *(b + MLP_ONLY for b in BASELINES)):
            model = copy.deepcopy(teacher)
            t0 = time.perf_counter()
            keep, bias_stats, _ = _baseline(name, shape, stats, seed)
            _apply(model, shape, keep, bias_stats)
            seconds = time.perf_counter() - t0 + (stat_seconds if name != "random" else 0.0)
            kind = "control" if name.startswith("random") else REIMPL
            kind += ", diagnostic" if name.endswith(MLP_ONLY) else ""
            biases = sum(m.bias.numel() for layer in model.model.layers for m in (layer.self_attn.o_proj,
                                                                                   layer.mlp.down_proj)
                         if m.bias is not None)  # FLAP's, where its layer lost channels
            rows.append(_row(seed, layers, name, kind, model, calib, val, shape.params(keep, biases) / shape.total,
                             *_widths(keep), seconds))
            print(rows[-1], flush=True)
        assert shape.params(full) == shape.total  # the counting reproduces the model's own
        # ShortGPT: as many whole layers as gets closest to the budget, by block influence
        k = min(range(1, layers), key=lambda k: abs((shape.total - k * (shape.total - shape.outside) / layers)
                                                    - shape.budget))
        model = copy.deepcopy(teacher)
        t0 = time.perf_counter()
        result = pfx_hf.prune_depth(model, calib[0][0][:2], remove=k, calibration=[x for x, _ in calib])
        assert result.verified.accepted, result.verified.message
        gone = ",".join(p.rsplit(".", 1)[1] for p in result.plan.remove)
        rows.append(_row(seed, layers, f"ShortGPT ({k} layers: {gone})", REIMPL + " (prunefx depth)", model, calib,
                         val, _count(model) / shape.total, str(shape.kv), str(shape.inter),
                         time.perf_counter() - t0))
        print(rows[-1], flush=True)
        # prunefx: PlanConfig(params=) counts every parameter, the target is without the embeddings
        fixed = _embedding_params(teacher)
        width = (TARGET * shape.total + fixed) / (shape.total + fixed)
        for name, how in _prunefx_variants().items():
            model = copy.deepcopy(teacher)
            kwargs = {"calibration": calib, "refit": how["refit"]}
            if how["criterion"] == "taylor":
                kwargs["loss_fn"] = loss
            t0 = time.perf_counter()
            with warnings.catch_warnings():  # per layer: the config cannot say the widths (prunefx.save can)
                warnings.simplefilter("ignore", pfx_hf.ConfigStaleWarning)
                result = pfx_hf.prune(model, calib[0][0][:2],
                                      prunefx.PlanConfig(params=width, normalize=how["normalize"]),
                                      criterion=how["criterion"], per_layer=how.get("per_layer", False), **kwargs)
            seconds = time.perf_counter() - t0
            assert result.verified.accepted, result.verified.message
            kept = [(range(layer.self_attn.k_proj.out_features // shape.hd), range(layer.mlp.down_proj.in_features))
                    for layer in model.model.layers]
            rows.append(_row(seed, layers, name, PFX, model, calib, val, _count(model) / shape.total, *_widths(kept),
                             seconds))
            print(rows[-1], flush=True)
    return rows


def _best_prunefx(rows: list[dict]) -> str:
    """The prunefx variant with the lowest calibration loss (mean over seeds)."""
    names = list(dict.fromkeys(r["method"] for r in rows if r["kind"] == PFX))
    return min(names, key=lambda n: statistics.mean(r["calib_loss"] for r in rows if r["method"] == n))


def _method_key(r: dict) -> str:
    return r["method"].split(" (")[0] if r["method"].startswith("ShortGPT") else r["method"]


def _markdown(rows: list[dict], argv: list[str], steps: int) -> str:
    from prunefx.examples.stdlib_lm import corpus_hash

    load = os.getloadavg()
    layers = rows[0]["layers"]
    lines = [
        "# Structured LLM-pruning baselines (reimplemented) vs prunefx, half the parameters, right after the cut", "",
        f"Machine: {cpu_name()}, {os.cpu_count()} CPUs, 1 torch thread, load average {load[0]:.1f}. Command: "
        f"`python -m experiments.llm_baselines {' '.join(argv)}`. Corpus hash {corpus_hash()}. A {layers}-layer "
        f"stdlib LM trained {steps} steps (hidden 128, 4 query heads over 2 KV heads, MLP 384); target: 50% of the "
        "parameters without the "
        "embeddings (input embedding and lm_head not counted); every method keeps or removes whole KV groups. "
        "Perplexity per byte on the held-out bytes right after the cut, no fine-tuning (lower is better); mean over "
        "seeds, range in brackets; calibration loss (nats per byte) on the 4 calibration batches. \"reimplemented\": "
        "written in `experiments/llm_baselines.py` from the papers' definitions, not the authors' code (see its "
        "docstring). Widths per layer: KV groups kept (of 2) and MLP channels kept (of 384); \"/\" per layer, \";\" "
        "per seed. \", MLP only\" rows (diagnostic, not the papers' recipes): the method's own scores with every KV "
        "group kept and the MLP cut uniformly to the budget, the structure prunefx's plans choose, so they separate "
        "criterion from structure. prunefx rows without \"re-fit\" use the same information as the baselines "
        "(weights, activations, gradients on the calibration batches); \"re-fit\" also solves least squares on "
        "them. Seconds: scoring and cut (the baselines' one statistics pass counted in each).", "",
        "| method | kind | ppl | calibration loss | params kept (w/o emb.) | KV groups | MLP | seconds |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for key in dict.fromkeys(_method_key(r) for r in rows):
        sel = [r for r in rows if _method_key(r) == key]
        ppl = [r["ppl"] for r in sel]
        rng = f" [{min(ppl):.3f}, {max(ppl):.3f}]" if len(ppl) > 1 else ""
        method = " / ".join(r["method"] for r in sel) if key == "ShortGPT" else key
        kv = " ; ".join(dict.fromkeys(r["kv_groups"] for r in sel))
        mlp = " ; ".join(dict.fromkeys(r["mlp"] for r in sel))
        lines.append(f"| {method} | {sel[0]['kind']} | {statistics.mean(ppl):.3f}{rng} | "
                     f"{statistics.mean(r['calib_loss'] for r in sel):.4f} | "
                     f"{statistics.mean(r['params_kept'] for r in sel):.4f} | {kv} | {mlp} | "
                     f"{statistics.mean(r['seconds'] for r in sel):.1f} |")
    best = _best_prunefx(rows)
    seeds = sorted({r["seed"] for r in rows})

    def ppl(method, seed):
        return next(r["ppl"] for r in rows if _method_key(r) == method and r["seed"] == seed)

    lines += ["", f"prunefx's best plan, chosen on the calibration loss: **{best}**. Against each baseline, held-out "
              "ppl per seed (prunefx / baseline):", ""]
    for key in dict.fromkeys(_method_key(r) for r in rows if r["kind"] not in (PFX, "-")):
        pairs = [(ppl(best, s), ppl(key, s)) for s in seeds]
        verdict = "at least as good" if all(a <= b for a, b in pairs) else "WORSE on some seed"
        each = ", ".join(f"seed {s}: {a:.3f} / {b:.3f}" for s, (a, b) in zip(seeds, pairs, strict=True))
        lines.append(f"- {key}: {each}: {verdict}")
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="4 layers, one seed, 60 training steps")
    ap.add_argument("--seeds", default="0,1")
    ap.add_argument("--out", default="experiments/results")
    args = ap.parse_args(argv)
    seeds, layers, steps = ([0], 4, 60) if args.quick else ([int(s) for s in args.seeds.split(",")], 8, TEACHER_STEPS)
    rows = run(seeds, layers, steps)
    stem = "llm_baselines_quick" if args.quick else "llm_baselines"
    write_result(Path(args.out), stem, rows, FIELDS, _markdown(rows, argv, steps))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
