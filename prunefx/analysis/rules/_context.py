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
    def name(self) -> str:
        """The module's qualified name for a ``call_module`` node, else the node's name."""
        ...

    @property
    def out(self) -> Any:
        """The node's recorded output value (meta tensors, ints, tuples of them)."""
        ...

    def value(self, a: Any) -> Any:
        """The recorded value of an argument (a node's meta tensor or int; lists and tuples element-wise)."""
        ...

    def aval(self, a: Any) -> Any:
        """The analysis value of an argument: a ``Lab`` for a tensor, a ``SizeRef`` / int for a size, structures
        recursively."""
        ...

    def lab(self, a: Any) -> Lab:
        """The channel labels of a tensor argument (an all-unlabelled ``Lab`` of its rank when it carries none)."""
        ...

    def arg(self, i: int, key: str, default: Any = None) -> Any:
        """Positional argument ``i``, else keyword ``key``, else ``default``; a traced integer as its value."""
        ...

    def is_tensor(self, a: Any) -> bool:
        """Whether the argument's recorded value is a tensor."""
        ...

    def shape(self, a: Any) -> tuple[int, ...]:
        """The recorded shape of a tensor argument."""
        ...

    def owner(self) -> str:
        """The qualified name of the innermost module whose forward made this node ('' at the top level)."""
        ...

    def source(self) -> str:
        """`` at file:line: `code` `` of the model line that made this node ('' when unknown), for messages."""
        ...

    def where(self) -> str:
        """This node, as messages name it."""
        ...

    # ---- acting --------------------------------------------------------------------------------
    def fresh(self, n: int) -> np.ndarray:
        """``n`` new channel atoms, coupled with nothing yet (an op that creates channels: a conv's output)."""
        ...

    def union(self, a: np.ndarray, b: np.ndarray, reason: str | None = None) -> None:
        """Couple ``a[i]`` with ``b[i]`` for every i: they are kept or removed together (a residual add).
        ``reason`` is what a frozen class says when one side is frozen."""
        ...

    def freeze(self, what: Any, reason: str) -> None:
        """Mark every channel of ``what`` (atoms, a ``Lab``, a structure of them, a size computed from channel
        counts) as never prunable, with ``reason`` shown to the user. Unknown or unsupported uses must freeze."""
        ...

    def freeze_values(self, operands: Any, only_floats: bool = False) -> None:
        """Freeze the channels that scalars among ``operands`` were computed from: the op uses them as numbers
        (``x * c ** -0.5``), which pruning would change. ``only_floats``: ints are sizes this rule has checked."""
        ...

    def inexact(self, atoms: np.ndarray, reason: str) -> None:
        """These channels may be pruned, but the pruned model equals the masked original only approximately (a
        statistic over channels): the oracle compares them with a tolerance and says why."""
        ...

    def member(self, role: ModuleRole, atoms: np.ndarray, name: str | None = None) -> None:
        """Record that ``role`` (OUT, IN, CHANNEL, Normalized(j)) of a module (this node's, or ``name``) is
        indexed by these channels: the rewrite slices it, the oracle masks it."""
        ...

    def product(self, grid: np.ndarray, factors: list[tuple[int, np.ndarray]], literal: list[bool]) -> None:
        """A flat dim made of several factor dims (a reshape): position ``grid[...]`` goes when any factor's index
        goes; one factor becomes the prunable unit after the walk (``prunefx.analysis.products``)."""
        ...

    def divide(self, blocks: np.ndarray, out: np.ndarray, at: tuple[str, tuple, str]) -> None:
        """``out``'s count is a width // k laid out as ``blocks`` (k, len(out)), with k the literal at ``at``;
        per-block offsets or whole blocks are decided after the walk (``prunefx.analysis.divisions``)."""
        ...

    def tag_batch(self, atoms: np.ndarray | None) -> None:
        """These channels index independent slices of a contraction (the heads of q @ k^T), not summed ones."""
        ...

    def param(self, qualname: str, dim: int, atoms: np.ndarray) -> None:
        """Record that dim ``dim`` of parameter or buffer ``qualname`` is indexed by these channels (frozen when
        a parametrization stops the rewrite from slicing it exactly)."""
        ...

    def inside(self, qualname: str, dim: int, atoms: np.ndarray) -> None:
        """As :meth:`param`, for channels that exist only inside a leaf module's forward (nn.MultiheadAttention's
        heads): the oracle masks them by zeroing these positions of the original's parameter."""
        ...

    def constant(self, path: tuple, atoms: np.ndarray, at: tuple[str, str] | None = None) -> None:
        """A literal at ``("args", i, ...)`` of this node (or of the node ``at`` names) equals the count of these
        channels: the rewrite sets it to the kept count."""
        ...

    def equal_count(self, segments: list[np.ndarray], why: str) -> None:
        """These segments must keep equal counts (not the same positions): ``torch.split`` into equal parts."""
        ...

    def note(self, atoms: np.ndarray, text: str) -> None:
        """A remark shown with the group these channels end up in (not a freeze)."""
        ...
