"""MACs and parameter counts as a function of each group's kept channels."""

from __future__ import annotations

import math
from typing import Any

import numpy as np
import torch.fx as fx
from torch import nn

from prunefx.analysis.graph import DependencyGraph
from prunefx.analysis.roles import CHANNEL, IN, OUT, Kind, RecordKey
from prunefx.capture.values import value
from prunefx.metrics import measure


class CostModel:
    """MACs and parameter counts as a function of each group's kept channels.

    Starts from measured per-module MACs (``prunefx.metrics.measure``; for a torch.export analysis, the MACs of
    the graph's contractions attributed to the module owning each weight, which also works on the meta device)
    and scales each module by the fraction of its input/output channels that remain; parameters scale by the kept
    fraction of every sliced dim. Ops outside modules (functional matmuls) are kept constant.
    """

    def __init__(self, model, dg: DependencyGraph, example_inputs) -> None:
        self.dg = dg
        if dg.capture == "export" and dg.parts is None:  # parts: the whole model runs (the target is its MACs)
            self.macs_total, per_module = graph_macs(dg)
            self.params_total = float(sum(p.numel() for p in model.parameters()))
        else:
            m = measure(model, example_inputs, by="module")
            self.macs_total, per_module = float(m.macs), _own_macs(model, m.per_module)
            self.params_total = float(m.params)
        # every group channel's class id, sorted, with its (group id, channel index)
        roots = np.concatenate([g.roots for g in dg.groups]) if dg.groups else np.empty(0, np.int64)
        gids = np.concatenate([np.full(g.channels, g.id) for g in dg.groups]) if dg.groups else np.empty(0, np.int64)
        chans = np.concatenate([np.arange(g.channels) for g in dg.groups]) if dg.groups else np.empty(0, np.int64)
        order = np.argsort(roots, kind="stable")
        roots, gids, chans = roots[order], gids[order], chans[order]
        # per record: arrays (group id, channel index) per position, -1 when never pruned
        self._pos: dict[RecordKey, tuple[np.ndarray, np.ndarray]] = {}
        by_module: dict[str, list[RecordKey]] = {}
        for key, rec_roots in dg.record_roots.items():
            idx = np.clip(np.searchsorted(roots, rec_roots), 0, max(len(roots) - 1, 0))
            hit = (roots[idx] == rec_roots) & (rec_roots >= 0) if len(roots) else np.zeros(len(rec_roots), bool)
            self._pos[key] = (np.where(hit, gids[idx], -1) if len(roots) else np.full(len(rec_roots), -1),
                              np.where(hit, chans[idx], -1) if len(roots) else np.full(len(rec_roots), -1))
            if key.kind is Kind.MODULE:
                by_module.setdefault(key.name, []).append(key)
        # a module's MACs scale with the kept fraction of every channel dim it has (out, in, channel, each
        # normalized dim of a LayerNorm); a depthwise conv's in and out are the same channels: counted once
        self._modules: list[tuple[float, list[RecordKey]]] = []
        named = dict(model.named_modules())
        for name, macs in per_module.items():
            mod = named.get(name)
            roles = by_module.get(name, []) or _weight_dims(mod, name, self._pos)
            if isinstance(mod, nn.modules.conv._ConvNd) and mod.groups > 1 and mod.groups == mod.in_channels:
                roles = [k for k in roles if k.role != IN]
            if isinstance(mod, nn.MultiheadAttention) and any(k.role == CHANNEL for k in roles):
                self._modules.extend(_attention_parts(dg, name, float(macs), roles))
                continue
            self._modules.append((float(macs), roles))
        self._macs_scaled = sum(m for m, _ in self._modules)
        self._params: list[tuple[int, list[RecordKey]]] = []
        sizes = {n: t.numel() for n, t in (*model.named_parameters(), *model.named_buffers())}
        pnames = {n for n, _ in model.named_parameters()}
        by_param: dict[str, list] = {}
        for key in self._pos:
            if key.kind is Kind.PARAM and key.name in pnames:
                by_param.setdefault(key.name, []).append(key)
        self._params = [(sizes[n], keys) for n, keys in by_param.items()]
        self._params_scaled = sum(s for s, _ in self._params)
        # per record, the groups whose channels it holds and where (found once: a plan search asks many times)
        self._sel = {key: [(int(g), gid == g) for g in np.unique(gid[gid >= 0]).tolist()]
                     for key, (gid, _) in self._pos.items()}
        self._touching: dict[str, dict[int, list[int]]] = {"macs": {}, "params": {}}  # group -> entries it scales
        for what, entries in (("macs", self._modules), ("params", self._params)):
            for i, (_, keys) in enumerate(entries):
                for g in {g for k in keys for g, _ in self._sel[k]}:
                    self._touching[what].setdefault(g, []).append(i)

    def _frac(self, key, keep: dict[int, np.ndarray]) -> float:
        gid, ch = self._pos[key]
        if len(gid) == 0:
            return 1.0
        kept = np.ones(len(gid), dtype=bool)
        for g, sel in self._sel[key]:
            if g in keep:
                kept[sel] = keep[g][ch[sel]]
        return float(kept.mean())

    def macs(self, keep: dict[int, np.ndarray]) -> float:
        scaled = sum(m * math.prod(self._frac(k, keep) for k in roles) for m, roles in self._modules)
        return self.macs_total - self._macs_scaled + scaled

    def params(self, keep: dict[int, np.ndarray]) -> float:
        scaled = sum(n * math.prod(self._frac(k, keep) for k in keys) for n, keys in self._params)
        return self.params_total - self._params_scaled + scaled

    def change(self, keep: dict[int, np.ndarray], update: dict[int, np.ndarray], what: str = "macs") -> float:
        """How much the MACs (``what="macs"``) or parameters change when the groups in ``update`` keep those masks
        instead of ``keep``'s: only the layers and tensors those groups reach are recounted."""
        entries = self._modules if what == "macs" else self._params
        after = {**keep, **update}
        idx = sorted({i for g in update for i in self._touching[what].get(g, ())})
        return sum(entries[i][0] * (math.prod(self._frac(k, after) for k in entries[i][1])
                                    - math.prod(self._frac(k, keep) for k in entries[i][1])) for i in idx)

    def coupled(self) -> dict[int, set[int]]:
        """Group id -> the groups whose channels meet it in one module or parameter (their costs multiply there,
        so one's width changes what cutting the other saves); every group is coupled with itself."""
        out: dict[int, set[int]] = {}
        for keys in [roles for _, roles in self._modules] + [keys for _, keys in self._params]:
            gids = {int(g) for k in keys for g in np.unique(self._pos[k][0]).tolist() if g >= 0}
            for g in gids:
                out.setdefault(g, set()).update(gids)
        return out




def _own_macs(model: nn.Module, per_module: dict[str, int]) -> dict[str, float]:
    """Each module's MACs without its children's: a leaf's all, a layer computing with its own weights besides
    children (nn.MultiheadAttention's projections and attention; its out_proj is never called) its own part."""
    named = dict(model.named_modules())
    own = {}
    for name, macs in per_module.items():
        children = (f"{name}.{c}" if name else c for c, _ in named[name].named_children()) if name in named else ()
        rest = macs - sum(per_module.get(c, 0) for c in children)
        if rest > 0:
            own[name] = float(rest)
    return own


def _attention_parts(dg: DependencyGraph, name: str, macs: float, roles: list[RecordKey]
                     ) -> list[tuple[float, list[RecordKey]]]:
    """nn.MultiheadAttention's MACs split by what each part scales with: the q, k, v projections with its input
    and its heads, the output projection with its heads and its output, QK^T and AV with its heads alone (one
    product over all three would count the embedding's cut twice, and the attention's once too often)."""
    calls = [n for n in dg.gm.graph.nodes if n.op == "call_module" and n.target == name]
    args = [(n.args[0] if n.args else n.kwargs.get("query"),
             n.args[1] if len(n.args) > 1 else n.kwargs.get("key")) for n in calls]
    if not calls or not all(hasattr(value(a), "shape") and value(a).dim() >= 2 for pair in args for a in pair):
        return [(macs, roles)]  # shapes unknown: the plain product
    mod = dg.gm.get_submodule(name)
    first = 1 if mod.batch_first else 0
    inner = mod.out_proj.in_features
    q_proj = kv_proj = out = att = 0.0
    for q, k in ((value(a), value(b)) for a, b in args):
        rows_q, rows_k = q.numel() / q.shape[-1], k.numel() / k.shape[-1]
        src = k.shape[first] if k.dim() == 3 else k.shape[0]
        q_proj += rows_q * q.shape[-1] * inner
        kv_proj += 2 * rows_k * k.shape[-1] * inner
        out += rows_q * inner * mod.out_proj.out_features
        att += 2 * rows_q * src * inner
    scale = macs / (q_proj + kv_proj + out + att)
    by = {role: [r for r in roles if r.role == role] for role in (IN, CHANNEL, OUT)}
    # the key/value projections read the key's channels: the query's own when every call attends to itself,
    # else the columns of the separate k_proj_weight (kdim), unknown (held constant) otherwise
    self_attention = all(a is b for a, b in args)
    kv_in = by[IN] if self_attention else [
        key for key in dg.record_roots if key.kind is Kind.PARAM and key.name == f"{name}.k_proj_weight"
        and getattr(key.role, "dim", None) == 1]
    return [(q_proj * scale, by[IN] + by[CHANNEL]), (kv_proj * scale, kv_in + by[CHANNEL]),
            (out * scale, by[CHANNEL] + by[OUT]), (att * scale, by[CHANNEL])]


_GROUPED = {"_grouped_mm", "grouped_mm_fallback"}  # (S, K) x (E, K, N): a mixture of experts' dispatch
_CONTRACTIONS = {"linear", "addmm", "mm", "bmm", "matmul", "conv1d", "conv2d", "conv3d", "scaled_dot_product_attention",
                 *_GROUPED}
_VIEWS = {"transpose", "t", "permute", "view", "reshape", "contiguous", "_to_copy", "alias"}


def _through_views(node: Any) -> Any:
    """The node a weight argument reads through views and copies (a stacked expert weight transposed)."""
    while isinstance(node, fx.Node) and node.op == "call_function" and node.args and getattr(
            getattr(node.target, "overloadpacket", None), "__name__", None) in _VIEWS:
        node = node.args[0]
    return node


def _weight_dims(mod: nn.Module | None, name: str, records: dict[RecordKey, object]) -> list[RecordKey]:
    """A layer with no module record (its forward is its own code: Falcon's ``x @ self.weight.T``) scales with its
    weight's sliced dims: the records of its own parameter with the most dims (a bias repeats the out dim)."""
    if mod is None:
        return []
    params = sorted(mod.named_parameters(recurse=False), key=lambda kv: -kv[1].dim())
    for pname, _ in params[:1]:
        qual = f"{name}.{pname}" if name else pname
        return [k for k in records if k.kind is Kind.PARAM and k.name == qual]
    return []


def graph_macs(dg: DependencyGraph) -> tuple[float, dict[str, float]]:
    """MACs of a torch.export graph's contractions (read from export's fake values, so nothing runs) and their
    split per module: a layer's MACs go to the module owning its weight, the rest (attention products) to the
    innermost module in ``nn_module_stack``."""
    per_module: dict[str, float] = {}
    total = 0.0
    for node in dg.gm.graph.nodes:
        name = getattr(getattr(node.target, "overloadpacket", None), "__name__", None)
        if node.op != "call_function" or name not in _CONTRACTIONS:
            continue
        shapes = [tuple(a.meta["val"].shape) if isinstance(a, fx.Node) and hasattr(a.meta.get("val"), "shape")
                  else None for a in node.args[:3]]
        out = node.meta.get("val")
        out = out[0] if isinstance(out, (tuple, list)) else out
        if out is None or None in shapes[:2]:
            continue
        n_out = math.prod(out.shape)
        if name == "linear":
            macs, weight = n_out * shapes[1][-1], node.args[1]
        elif name == "addmm":
            macs, weight = n_out * shapes[1][-1], node.args[2]
        elif name.startswith("conv"):
            macs, weight = n_out * math.prod(shapes[1][1:]), node.args[1]
        elif name in _GROUPED:  # each row meets one group's (K, N) matrix
            macs, weight = n_out * shapes[0][-1], _through_views(node.args[1])
        elif name == "scaled_dot_product_attention":  # q.k^T and attn.v
            q, k = shapes[0], shapes[1]
            macs, weight = 2 * math.prod(q[:-1]) * k[-2] * q[-1], None
        else:
            macs, weight = n_out * shapes[0][-1], None
        owner = str(weight.target).rpartition(".")[0] if getattr(weight, "op", None) == "get_attr" else None
        if owner is None:
            stack = node.meta.get("nn_module_stack") or {}
            owner = next(reversed(stack.values()))[0] if stack else ""
        per_module[owner] = per_module.get(owner, 0.0) + macs
        total += macs
    return total, per_module
