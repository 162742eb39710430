"""What an op rule may read and do: the typed view of :class:`prunefx.analysis.engine.Ctx`.

Rules sit below the engine (they never import it), so they are typed against this protocol, which declares exactly
the attributes and methods rules and integrations use. ``tests/analysis/test_rule_contract.py`` checks that the
engine's concrete ``Ctx`` provides every one of them.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Protocol

if TYPE_CHECKING:
    import numpy as np
    import torch.fx as fx
    from torch import nn

    from prunefx.analysis.labels import Lab
    from prunefx.analysis.roles import ModuleRole


class EngineView(Protocol):
    """The parts of the analysis engine a rule reads (``ctx.engine``)."""

    gm: fx.GraphModule
    modules: dict[str, nn.Module]
    tensors: set[str]  # qualified names of the graph module's parameters and buffers it may label


class Ctx(Protocol):
    """What a rule sees: its node, argument values and labels, and the operations it may perform."""

    engine: EngineView
    node: fx.Node
    module: nn.Module | None
    args: tuple[Any, ...]
    kwargs: dict[str, Any]

    # ---- reading -------------------------------------------------------------------------------
    @property
    def name(self) -> str: ...

    @property
    def out(self) -> Any: ...

    def value(self, a: Any) -> Any: ...

    def aval(self, a: Any) -> Any: ...

    def lab(self, a: Any) -> Lab: ...

    def arg(self, i: int, key: str, default: Any = None) -> Any: ...

    def is_tensor(self, a: Any) -> bool: ...

    def shape(self, a: Any) -> tuple[int, ...]: ...

    def owner(self) -> str: ...

    def source(self) -> str: ...

    def where(self) -> str: ...

    # ---- acting --------------------------------------------------------------------------------
    def fresh(self, n: int) -> np.ndarray: ...

    def union(self, a: np.ndarray, b: np.ndarray, reason: str | None = None) -> None: ...

    def freeze(self, what: Any, reason: str) -> None: ...

    def freeze_values(self, operands: Any, only_floats: bool = False) -> None: ...

    def inexact(self, atoms: np.ndarray, reason: str) -> None: ...

    def member(self, role: ModuleRole, atoms: np.ndarray, name: str | None = None) -> None: ...

    def product(self, grid: np.ndarray, factors: list[tuple[int, np.ndarray]], literal: list[bool]) -> None: ...

    def divide(self, blocks: np.ndarray, out: np.ndarray, at: tuple[str, tuple, str]) -> None: ...

    def tag_batch(self, atoms: np.ndarray | None) -> None: ...

    def param(self, qualname: str, dim: int, atoms: np.ndarray) -> None: ...

    def inside(self, qualname: str, dim: int, atoms: np.ndarray) -> None: ...

    def constant(self, path: tuple, atoms: np.ndarray, at: tuple[str, str] | None = None) -> None: ...

    def equal_count(self, segments: list[np.ndarray], why: str) -> None: ...

    def note(self, atoms: np.ndarray, text: str) -> None: ...
