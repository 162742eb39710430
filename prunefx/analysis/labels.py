"""What the analysis carries along each fx edge: channel labels for tensors, provenance for sizes."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, TypeVar

import numpy as np

T = TypeVar("T")


@dataclass(frozen=True, eq=False)
class Lab:
    """Channel labels of one tensor: per dim, an atom array of that dim's length, or None.

    ``dims[d] is None``: dim d carries no channel identity (batch, spatial, a model input's channels).
    ``dims[d][i] == -1``: position i of dim d belongs to no class and is never removed.
    """

    dims: tuple[np.ndarray | None, ...]

    @staticmethod
    def none(ndim: int) -> Lab:
        return Lab((None,) * ndim)

    @property
    def ndim(self) -> int:
        return len(self.dims)

    def labeled(self) -> list[int]:
        return [d for d, a in enumerate(self.dims) if a is not None]

    def atoms(self) -> np.ndarray:
        parts = [a for a in self.dims if a is not None]
        return np.concatenate(parts) if parts else np.empty(0, dtype=np.int64)

    def replace(self, d: int, arr: np.ndarray | None) -> Lab:
        dims = list(self.dims)
        dims[d] = arr
        return Lab(tuple(dims))


@dataclass(frozen=True, eq=False)
class SizeRef:
    """An int computed from tensor sizes while tracing (``x.size(1)``, ``c // 2``).

    ``sources``: label arrays of the labeled dims it was read from (empty: it only depends on fixed dims).
    ``exact``: it *is* one dim's size (no arithmetic), so a view using it can be tied to that dim.
    The arithmetic forms a rule can still follow after pruning (at most one is set):
    ``product``: the product of the sizes of ``sources`` (``h * c`` from ``b, h, n, c = q.shape``);
    ``div``: ``len(sources[0]) // div`` exactly (``c // num_heads``); ``div_at``: where that divisor is written, as
    ``(node name, ("args", 1), owner)``, when it is a literal of the code (then it may follow the count of kept blocks
    instead: whole heads pruned, head_dim kept);
    ``literal``: ``(node name, ("args", i), owner, value)`` of an int literal that this value is a multiple of, the
    other factors sizes of dims never pruned (``b * num_heads``): rewriting that literal rewrites the value.
    """

    value: int
    sources: tuple[np.ndarray, ...] = ()
    exact: bool = False
    product: bool = False
    div: int = 0
    div_at: tuple[str, tuple, str] | None = None
    literal: tuple[str, tuple, str, int] | None = None


@dataclass(frozen=True, eq=False)
class ScalarRef:
    """A non-int scalar computed in the graph from sizes of labeled dims (``1.0 / math.sqrt(x.size(1))``).

    No rule can rewrite such a value after pruning, so whatever tensor op it reaches freezes ``sources``.
    """

    value: object
    sources: tuple[np.ndarray, ...]


def size_sources(x: object) -> tuple[np.ndarray, ...]:
    """Label arrays a scalar's value depends on (a SizeRef's or ScalarRef's sources; () for anything else)."""
    return x.sources if isinstance(x, (SizeRef, ScalarRef)) else ()


def int_value(x: object) -> object:
    return x.value if isinstance(x, SizeRef) else x


def instances(x: Any, kind: type[T]) -> list[T]:
    """The ``kind`` objects in ``x``, in order: tuples, lists and dict values are walked (a node's label, its args)."""
    if isinstance(x, kind):
        return [x]
    if isinstance(x, (list, tuple)):
        return [y for item in x for y in instances(item, kind)]
    if isinstance(x, dict):
        return [y for item in x.values() for y in instances(item, kind)]
    return []
