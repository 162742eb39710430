"""Top-to-bottom layered layout of a DAG in pure Python: where the HTML view draws each node and edge.

    lay = layout([60, 80, 60], [(0, 1), (1, 2), (0, 2)])   # node widths, edges (source, target)

Sugiyama's scheme, kept linear enough for graphs of a few thousand nodes:
1. layers by longest path from the inputs, then each node sinks to just above its first consumer when
   that does not lengthen edges (shape arithmetic, parameters and constants sit by their reader);
2. an edge that skips layers runs down a *trunk* of virtual points below its source, one trunk per source
   shared by all of that source's long edges (a tensor read by many later layers, as in DenseNet, is one
   line with branches, not one line per reader: virtual points grow with the span, not with span x readers);
3. order within layers by barycentre sweeps (fewer crossings);
4. x by repeated sweeps that pull each node towards the mean of its neighbours, solved per layer as an
   isotonic regression (pool-adjacent-violators) under the minimum spacing, so order is kept and chains
   and trunks come out straight.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from itertools import pairwise

Point = tuple[float, float]


@dataclass(frozen=True)
class Layout:
    """Node boxes (centre x, top y), edge polylines and the canvas size; all in pixels."""

    x: tuple[float, ...]
    y: tuple[float, ...]
    layer: tuple[int, ...]
    node_height: float
    width: float
    height: float
    edges: tuple[tuple[Point, ...], ...]  # per input edge: source bottom (or its trunk) .. target top
    trunks: tuple[tuple[int, tuple[Point, ...]], ...]  # (source node, polyline below it) for skipping edges


# Edges between virtual points weigh most so that trunks run straight; ordinary edges least.
_W_TRUNK, _W_MIXED, _W_PLAIN = 8.0, 2.0, 1.0
_W_CENTRE = 0.05


def _topological(n: int, preds: list[list[int]], succs: list[list[int]]) -> list[int]:
    indeg = [len(p) for p in preds]
    order = [v for v in range(n) if indeg[v] == 0]
    for v in order:  # the list grows while it is walked: Kahn's algorithm
        for s in succs[v]:
            indeg[s] -= 1
            if indeg[s] == 0:
                order.append(s)
    if len(order) != n:
        raise ValueError("layout needs a DAG; the edges contain a cycle")
    return order


def _layers(n: int, preds: list[list[int]], succs: list[list[int]], inputs: set[int]) -> list[int]:
    topo = _topological(n, preds, succs)
    layer = [0] * n
    for v in topo:
        if preds[v]:
            layer[v] = max(layer[u] for u in preds[v]) + 1
    # Then each node sinks to just above its first reader when that does not lengthen the drawing's edges
    # (at least as many readers as inputs): a shape read (x.shape -> getitem -> floordiv -> reshape) sits
    # by the reshape, not beside the input with a long edge per size. Nodes computed from weights and
    # constants only (a relative-position bias) always sink: at the top they would sit beside the input.
    data = [False] * n
    for v in topo:
        data[v] = v in inputs or any(data[u] for u in preds[v])
    for v in reversed(topo):
        if v in inputs or not succs[v]:
            continue
        below = min(layer[s] for s in succs[v]) - 1
        if below > layer[v] and (not data[v] or len(succs[v]) >= len(preds[v])):
            layer[v] = below
    return layer


def _isotonic(desired: list[float], weight: list[float], sep: list[float]) -> list[float]:
    """Closest positions (weighted least squares) to ``desired`` with x[i+1] - x[i] >= sep[i]."""
    offset = [0.0]
    for s in sep:
        offset.append(offset[-1] + s)
    blocks: list[list[float]] = []  # [value, weight, count]
    for d, o, w in zip(desired, offset, weight, strict=True):
        blocks.append([d - o, w, 1])
        while len(blocks) > 1 and blocks[-2][0] > blocks[-1][0]:
            v2, w2, c2 = blocks.pop()
            v1, w1, c1 = blocks[-1]
            blocks[-1] = [(v1 * w1 + v2 * w2) / (w1 + w2), w1 + w2, c1 + c2]
    out: list[float] = []
    for value, _, count in blocks:
        out.extend([value] * int(count))
    return [v + o for v, o in zip(out, offset, strict=True)]


def layout(
    widths: Sequence[float],
    edges: Sequence[tuple[int, int]],
    inputs: Sequence[int] = (),
    *,
    node_height: float = 26.0,
    layer_gap: float = 30.0,
    node_gap: float = 16.0,
    trunk_gap: float = 8.0,
    order_sweeps: int = 6,
    place_sweeps: int = 24,
    margin: float = 24.0,
) -> Layout:
    """Lay out a DAG of ``len(widths)`` boxes top to bottom (edges point from producer to consumer).

    ``inputs``: the nodes data enters by (the model's inputs); a node that depends on none of them is
    drawn just above its first reader. Empty: every node without predecessors is an input.
    """
    n = len(widths)
    preds: list[list[int]] = [[] for _ in range(n)]
    succs: list[list[int]] = [[] for _ in range(n)]
    for s, t in edges:
        if not (0 <= s < n and 0 <= t < n) or s == t:
            raise ValueError(f"bad edge ({s}, {t}) for {n} nodes")
        if t not in succs[s]:
            succs[s].append(t)
            preds[t].append(s)
    sources = {v for v in range(n) if not preds[v]}
    layer = _layers(n, preds, succs, set(inputs) & sources if inputs else sources)

    # The proper layered graph: real nodes, then one virtual point per layer crossed by each trunk.
    lay = list(layer)
    wid = [float(w) for w in widths]
    up: list[list[tuple[int, float]]] = [[] for _ in range(n)]
    down: list[list[tuple[int, float]]] = [[] for _ in range(n)]
    trunk: dict[int, list[int]] = {}

    def add_vertex(L: int) -> int:
        lay.append(L)
        wid.append(0.0)
        up.append([])
        down.append([])
        return len(lay) - 1

    def link(a: int, b: int) -> None:
        w = _W_TRUNK if a >= n and b >= n else _W_MIXED if a >= n or b >= n else _W_PLAIN
        down[a].append((b, w))
        up[b].append((a, w))

    for s in range(n):
        far = [t for t in succs[s] if layer[t] > layer[s] + 1]
        if far:
            chain, prev = [], s
            for L in range(layer[s] + 1, max(layer[t] for t in far)):
                v = add_vertex(L)
                link(prev, v)
                chain.append(v)
                prev = v
            trunk[s] = chain
        for t in succs[s]:
            link(s if layer[t] == layer[s] + 1 else trunk[s][layer[t] - layer[s] - 2], t)

    m = len(lay)
    depth = max(lay, default=-1) + 1
    rows: list[list[int]] = [[] for _ in range(depth)]
    for v in range(m):  # real nodes in graph order, each trunk's points after its source: a sane start
        rows[lay[v]].append(v)
    pos = [0.0] * m
    for row in rows:
        for i, v in enumerate(row):
            pos[v] = float(i)

    def sort_rows(indices: range, side: list[list[tuple[int, float]]]) -> None:
        for L in indices:
            row = rows[L]
            key = {}
            for v in row:
                nb = side[v]
                key[v] = sum(pos[u] * w for u, w in nb) / sum(w for _, w in nb) if nb else pos[v]
            row.sort(key=key.__getitem__)
            for i, v in enumerate(row):
                pos[v] = float(i)

    for sweep in range(order_sweeps):
        if sweep % 2 == 0:
            sort_rows(range(1, depth), up)
        else:
            sort_rows(range(depth - 2, -1, -1), down)

    def gap(a: int, b: int) -> float:
        if a >= n and b >= n:
            return trunk_gap
        return (wid[a] + wid[b]) / 2 + (node_gap if a < n and b < n else node_gap / 2)

    seps = [[gap(a, b) for a, b in pairwise(row)] for row in rows]
    x = [0.0] * m
    for row, sep in zip(rows, seps, strict=True):
        acc = 0.0
        for i, v in enumerate(row):
            x[v] = acc
            acc += sep[i] if i < len(sep) else 0.0
        for v in row:  # centred on x = 0, where the weak pull below holds the drawing
            x[v] -= acc / 2

    def place(indices: range, sides: tuple[list[list[tuple[int, float]]], ...]) -> None:
        for L in indices:
            row = rows[L]
            desired, weight = [], []
            for v in row:
                total, wsum = 0.0, _W_CENTRE  # a weak pull to x = 0: no drift over a thousand layers
                for side in sides:
                    for u, w in side[v]:
                        total += x[u] * w
                        wsum += w
                desired.append(total / wsum)
                weight.append(wsum)
            for v, xv in zip(row, _isotonic(desired, weight, seps[L]), strict=True):
                x[v] = xv

    for sweep in range(place_sweeps):
        if sweep < place_sweeps // 2:  # first align to one side at a time, then settle between both
            sides = (up,) if sweep % 2 == 0 else (down,)
        else:
            sides = (up, down)
        place(range(1, depth) if sweep % 2 == 0 else range(depth - 2, -1, -1), sides)
    for L in range(1, depth):  # a link of a plain chain drawn vertical wherever its row leaves room
        row = rows[L]
        for i, v in enumerate(row):
            if len(up[v]) != 1 or len(down[up[v][0][0]]) != 1:
                continue
            want = x[up[v][0][0]]
            if (i == 0 or want - x[row[i - 1]] >= seps[L][i - 1]) and (
                i == len(row) - 1 or x[row[i + 1]] - want >= seps[L][i]
            ):
                x[v] = want

    left = min((x[v] - wid[v] / 2 for v in range(m)), default=0.0)
    right = max((x[v] + wid[v] / 2 for v in range(m)), default=0.0)
    shift = margin - left
    x = [xv + shift for xv in x]
    step = node_height + layer_gap
    top = [margin + lay[v] * step for v in range(m)]

    def r(p: float) -> float:
        return round(p, 1)

    trunks = []
    for s, chain in trunk.items():
        pts = [(r(x[s]), r(top[s] + node_height))]
        for v in chain:
            pts += [(r(x[v]), r(top[v])), (r(x[v]), r(top[v] + node_height))]
        trunks.append((s, tuple(pts)))
    polylines = []
    for s, t in edges:
        if layer[t] == layer[s] + 1:
            start = (r(x[s]), r(top[s] + node_height))
        else:
            v = trunk[s][layer[t] - layer[s] - 2]
            start = (r(x[v]), r(top[v] + node_height))
        polylines.append((start, (r(x[t]), r(top[t]))))
    return Layout(
        x=tuple(r(x[v]) for v in range(n)),
        y=tuple(r(top[v]) for v in range(n)),
        layer=tuple(layer),
        node_height=node_height,
        width=r(right - left + 2 * margin),
        height=r(2 * margin + depth * step - layer_gap),
        edges=tuple(polylines),
        trunks=tuple(trunks),
    )
