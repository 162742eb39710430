"""report.graph_layout: a layered top-to-bottom layout; its geometric promises on random and model-shaped DAGs."""

from __future__ import annotations

import random
from itertools import pairwise

import pytest

from prunefx.view.layout import layout


def random_dag(n: int, seed: int, fan: int = 3, reach: int = 40) -> list[tuple[int, int]]:
    """Edges from earlier to later nodes, some reaching far back (skips, concats of many inputs)."""
    rng = random.Random(seed)
    edges = set()
    for t in range(1, n):
        for _ in range(rng.randint(1, fan)):
            edges.add((rng.randrange(max(0, t - reach), t), t))
    return sorted(edges)


def dense_block(layers: int) -> list[tuple[int, int]]:
    """DenseNet's pattern: every layer's output is read by all later concats (node 0 is the input)."""
    edges, feats = [], [0]
    node = 0
    for _ in range(layers):
        cat = node + 1
        edges += [(f, cat) for f in feats]
        conv = cat + 1
        edges.append((cat, conv))
        feats.append(conv)
        node = conv
    return edges


def check(widths: list[float], edges: list[tuple[int, int]], **kw) -> None:
    lay = layout(widths, edges, **kw)
    n, h = len(widths), lay.node_height
    for s, t in edges:  # edges point down, from the source (or its trunk) to the target's top centre
        assert lay.layer[t] > lay.layer[s] and lay.y[t] > lay.y[s]
    for (s, t), pts in zip(edges, lay.edges, strict=True):
        assert pts[-1] == (lay.x[t], lay.y[t])
        if lay.layer[t] == lay.layer[s] + 1:
            assert pts[0] == (lay.x[s], round(lay.y[s] + h, 1))
        else:  # leaves the source's trunk at the bottom of the row above the target
            step = (lay.y[t] - lay.y[s]) / (lay.layer[t] - lay.layer[s])
            assert pts[0] in dict(lay.trunks)[s] and pts[0][1] == pytest.approx(lay.y[t] - step + h, abs=0.2)
    for s, pts in lay.trunks:  # a trunk hangs from its source and runs straight down
        assert pts[0] == (lay.x[s], round(lay.y[s] + h, 1))
        assert all(b[1] > a[1] or (b[1] == a[1] and b == a) for a, b in pairwise(pts))
    rows: dict[int, list[int]] = {}
    for v in range(n):
        rows.setdefault(lay.layer[v], []).append(v)
    for row in rows.values():  # boxes of one row never overlap
        row.sort(key=lambda v: lay.x[v])
        for a, b in pairwise(row):
            assert lay.x[b] - lay.x[a] >= (widths[a] + widths[b]) / 2 - 0.2, (a, b)
    assert min(lay.x[v] - widths[v] / 2 for v in range(n)) >= 0
    assert max(lay.x[v] + widths[v] / 2 for v in range(n)) <= lay.width + 0.2
    assert max(lay.y) + h <= lay.height + 0.2


@pytest.mark.parametrize("seed", range(6))
def test_random_dags(seed: int) -> None:
    rng = random.Random(seed)
    n = rng.randint(2, 150)
    check([rng.uniform(40, 200) for _ in range(n)], random_dag(n, seed), inputs=[0])


def test_dense_block_shares_one_trunk_per_source() -> None:
    edges = dense_block(24)
    n = 1 + 2 * 24
    check([80.0] * n, edges, inputs=[0])
    lay = layout([80.0] * n, edges, [0])
    long_sources = {s for s, t in edges if lay.layer[t] > lay.layer[s] + 1}
    assert sorted(s for s, _ in lay.trunks) == sorted(long_sources)


def test_a_chain_is_one_straight_column() -> None:
    lay = layout([60.0, 90.0, 50.0, 70.0], [(0, 1), (1, 2), (2, 3)], [0])
    assert lay.layer == (0, 1, 2, 3) and len(set(lay.x)) == 1 and not lay.trunks


def test_weight_only_nodes_sit_above_their_reader() -> None:
    # 0 input -> 1 -> 2 -> 3 -> 4; a parameter (5) read through a view (6) by node 4 only.
    lay = layout([50.0] * 7, [(0, 1), (1, 2), (2, 3), (3, 4), (5, 6), (6, 4)], [0])
    assert lay.layer[6] == lay.layer[4] - 1 and lay.layer[5] == lay.layer[4] - 2
    assert not lay.trunks  # nothing skips a layer


def test_shape_reads_sink_to_their_reader() -> None:
    # x (0) -> conv chain 1..4 -> reshape (7), with x.shape (5) -> getitem (6) -> reshape: the size read
    # sits just above the reshape; only x's edge to it is long.
    edges = [(0, 1), (1, 2), (2, 3), (3, 4), (4, 7), (0, 5), (5, 6), (6, 7)]
    lay = layout([50.0] * 8, edges, [0])
    assert (lay.layer[5], lay.layer[6], lay.layer[7]) == (3, 4, 5)


def test_bad_input() -> None:
    with pytest.raises(ValueError, match="cycle"):
        layout([10.0] * 3, [(0, 1), (1, 2), (2, 0)])
    with pytest.raises(ValueError, match="bad edge"):
        layout([10.0] * 2, [(0, 2)])
    empty = layout([], [])
    assert empty.x == () and empty.edges == ()
