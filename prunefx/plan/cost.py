"""MACs and parameter counts as a function of each group's kept channels."""

from __future__ import annotations

import math

import numpy as np
from torch import nn

from prunefx.analysis.graph import DependencyGraph
from prunefx.analysis.roles import IN, Kind, RecordKey
from prunefx.metrics import measure


class CostModel:
    """MACs and parameter counts as a function of each group's kept channels.

    Starts from measured per-module MACs (``prunefx.metrics.measure``) and scales each module by the
    fraction of its input/output channels that remain; parameters scale by the kept fraction of every
    sliced dim. Ops outside modules (functional matmuls) are kept constant.
    """

    def __init__(self, model, dg: DependencyGraph, example_inputs) -> None:
        self.dg = dg
        m = measure(model, example_inputs, by="leaf")
        self.macs_total = float(m.macs)
        self.params_total = float(m.params)
        gindex = {g.id: g for g in dg.groups}
        root_to = {}
        for g in gindex.values():
            for k, r in enumerate(g.roots.tolist()):
                root_to[r] = (g.id, k)
        # per record: arrays (group id, channel index) per position, -1 when never pruned
        self._pos: dict[RecordKey, tuple[np.ndarray, np.ndarray]] = {}
        by_module: dict[str, list[RecordKey]] = {}
        for key, roots in dg.record_roots.items():
            gid = np.array([root_to.get(r, (-1, -1))[0] for r in roots.tolist()], dtype=np.int64)
            ch = np.array([root_to.get(r, (-1, -1))[1] for r in roots.tolist()], dtype=np.int64)
            self._pos[key] = (gid, ch)
            if key.kind is Kind.MODULE:
                by_module.setdefault(key.name, []).append(key)
        # a module's MACs scale with the kept fraction of every channel dim it has (out, in, channel, each
        # normalized dim of a LayerNorm); a depthwise conv's in and out are the same channels: counted once
        self._modules: list[tuple[float, list[RecordKey]]] = []
        named = dict(model.named_modules())
        for name, macs in m.per_module.items():
            mod = named.get(name)
            roles = by_module.get(name, [])
            if isinstance(mod, nn.modules.conv._ConvNd) and mod.groups > 1 and mod.groups == mod.in_channels:
                roles = [k for k in roles if k.role != IN]
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

    def _frac(self, key, keep: dict[int, np.ndarray]) -> float:
        gid, ch = self._pos[key]
        if len(gid) == 0:
            return 1.0
        kept = np.ones(len(gid), dtype=bool)
        for g in np.unique(gid[gid >= 0]).tolist():
            if g in keep:
                sel = gid == g
                kept[sel] = keep[g][ch[sel]]
        return float(kept.mean())

    def macs(self, keep: dict[int, np.ndarray]) -> float:
        scaled = sum(m * math.prod(self._frac(k, keep) for k in roles) for m, roles in self._modules)
        return self.macs_total - self._macs_scaled + scaled

    def params(self, keep: dict[int, np.ndarray]) -> float:
        scaled = sum(n * math.prod(self._frac(k, keep) for k in keys) for n, keys in self._params)
        return self.params_total - self._params_scaled + scaled


