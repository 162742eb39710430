"""Depth pruning's rewrite: residual blocks replaced by their stream (:class:`Bypass`), containers compacted.

How each block is called is read from one run of the model (:func:`block_calls`): which forward argument carries
the stream (matched by value against the captured graph's stream node) and where the stream sits in what the
block returns (a tensor, or one place of a tuple whose other places are None). A removed block becomes a
:class:`Bypass` that takes that argument, runs the block's tail ops on it (a ReLU after the add) and returns it in
the block's output structure. A container that iterates its children and knows their count elsewhere (a Hugging Face
decoder's layer list and its config) is compacted by a registered compactor (:func:`register_compactor`), which drops
identity bypasses and renumbers what refers to the layers' positions.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import torch
import torch.fx as fx
from torch import nn

from prunefx.analysis.blocks import ResidualBlock, TailOp
from prunefx.capture.semantics import EvalInterpreter
from prunefx.capture.trace import module_state_kept, training_mode
from prunefx.errors import PrunefxError

Undo = Callable[[], None]
# (model, container path, positions to drop) -> an undo when it compacted the container, None when not its kind
Compactor = Callable[[nn.Module, str, Sequence[int]], Undo | None]
_COMPACTORS: list[Compactor] = []


def register_compactor(fn: Compactor) -> Compactor:
    """Register a compactor: it drops identity bypasses from a container the model iterates (see module doc)."""
    if fn not in _COMPACTORS:
        _COMPACTORS.append(fn)
    return fn


@dataclass(frozen=True)
class BlockCall:
    """How a block is called: the forward parameter that carries its stream, and where its output holds it."""

    param: str  # the parameter's name in the block's forward
    position: int  # its position among the positional parameters (-1: keyword-only)
    out_index: int | None  # None: the block returns the stream itself; k: place k of a tuple / list
    out_len: int = 0
    out_list: bool = False


class Bypass(nn.Module):
    """A removed residual block: its input stream, through the block's tail ops, in the block's output structure."""

    def __init__(self, block: nn.Module, path: str, tail: Sequence[TailOp], call: BlockCall) -> None:
        super().__init__()
        self.removed = path
        self.call = call
        self.steps = tuple(tail)
        self.tail = nn.ModuleDict()
        for i, t in enumerate(self.steps):  # the tail's modules (a ReLU, a post-norm) stay with their weights
            if t.op == "call_module":
                self.tail[str(i)] = block.get_submodule(str(t.target))

    @property
    def identity(self) -> bool:
        """Whether it gives its input back unchanged (no tail op other than same-dtype casts and copies)."""
        return all(t.identity for t in self.steps)

    def _stream(self, args: tuple, kwargs: dict) -> torch.Tensor:
        c = self.call
        if c.param in kwargs:
            return kwargs[c.param]
        if 0 <= c.position < len(args):
            return args[c.position]
        raise TypeError(f"the removed block {self.removed} was called without its input {c.param!r}")

    def forward(self, *args: Any, **kwargs: Any) -> Any:
        x = self._stream(args, kwargs)
        for i, t in enumerate(self.steps):
            a = list(t.args)
            a[t.stream_at] = x
            kw = dict(t.kwargs)
            if t.op == "call_module":
                x = self.tail[str(i)](*a, **kw)
            elif t.op == "call_method":
                x = getattr(a[0], str(t.target))(*a[1:], **kw)
            else:
                x = t.target(*a, **kw)
        c = self.call
        if c.out_index is None:
            return x
        out = [None] * c.out_len
        out[c.out_index] = x
        return out if c.out_list else tuple(out)

    def extra_repr(self) -> str:
        return f"removed={self.removed!r}, tail={len(self.steps)} op(s)"


def _stream_values(gm: fx.GraphModule, names: set[str], inputs: tuple) -> dict[str, torch.Tensor]:
    """The values of the named nodes when the captured graph runs ``inputs`` (with evaluation semantics)."""
    got: dict[str, torch.Tensor] = {}

    class _Grab(EvalInterpreter):
        def run_node(self, n: fx.Node) -> Any:
            out = super().run_node(n)
            if n.name in names:
                got[n.name] = out.detach() if isinstance(out, torch.Tensor) else out
            return out

    with torch.no_grad(), module_state_kept(gm), training_mode(gm, False):
        _Grab(gm).run(*inputs)
    return got


def _close(a: Any, b: torch.Tensor) -> bool:
    if not isinstance(a, torch.Tensor) or a.shape != b.shape or a.dtype != b.dtype:
        return False
    a, b = a.detach(), b.detach()
    if not a.is_floating_point():
        return bool((a == b).all())
    scale = max(b.abs().max().item(), 1e-12) if b.numel() else 1.0
    return bool(((a - b).abs() <= 1e-5 * scale).all())


def _parameters(block: nn.Module) -> list[inspect.Parameter]:
    try:
        return list(inspect.signature(block.forward).parameters.values())
    except (TypeError, ValueError):
        return []


def _call_of(path: str, block: nn.Module, args: tuple, kwargs: dict, out: Any, x: torch.Tensor,
             y: torch.Tensor) -> BlockCall:
    params = _parameters(block)
    positional = [p for p in params if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)]
    given = [(positional[i].name if i < len(positional) else None, i, a) for i, a in enumerate(args)]
    given += [(k, next((i for i, p in enumerate(positional) if p.name == k), -1), v) for k, v in kwargs.items()]
    hits = [(name, i) for name, i, a in given if name is not None and _close(a, x)]
    if not hits:
        raise PrunefxError(f"{path}: no argument of its forward carries its input stream (matched by value)")
    name, position = hits[0]
    if _close(out, y):
        return BlockCall(name, position, None)
    if isinstance(out, (tuple, list)) and type(out) in (tuple, list):
        places = [i for i, o in enumerate(out) if _close(o, y)]
        if len(places) == 1 and all(o is None for i, o in enumerate(out) if i != places[0]):
            return BlockCall(name, position, places[0], len(out), isinstance(out, list))
        if places:
            raise PrunefxError(f"{path} returns more than its stream ({len(out)} values, others not None); removing "
                               "it would drop them (attention weights or a cache it returns)")
    raise PrunefxError(f"{path}: its output (a {type(out).__name__}) holds no value equal to its stream")


def block_calls(model: nn.Module, gm: fx.GraphModule, blocks: Sequence[ResidualBlock], inputs: tuple
                ) -> tuple[dict[str, BlockCall], dict[str, str]]:
    """How each of ``blocks`` is called, from one evaluation-mode run of ``model`` on ``inputs`` (see module doc),
    and why for each block whose call could not be read (it cannot be bypassed)."""
    values = _stream_values(gm, {n for b in blocks for n in (b.stream, b.output)}, inputs)
    seen: dict[str, tuple] = {}
    hooks = []
    for b in blocks:
        def hook(m: nn.Module, args: tuple, kwargs: dict, out: Any, path: str = b.path) -> None:
            seen.setdefault(path, (args, kwargs, out))
        hooks.append(model.get_submodule(b.path).register_forward_hook(hook, with_kwargs=True))
    was = model.training
    try:
        model.eval()
        with torch.no_grad():
            model(*inputs)
    finally:
        model.train(was)
        for h in hooks:
            h.remove()
    calls, failed = {}, {}
    for b in blocks:
        try:
            if b.path not in seen:
                raise PrunefxError(f"{b.path} was not called when the model ran its example inputs")
            args, kwargs, out = seen[b.path]
            calls[b.path] = _call_of(b.path, model.get_submodule(b.path), args, kwargs, out, values[b.stream],
                                     values[b.output])
        except PrunefxError as exc:
            failed[b.path] = str(exc).removeprefix(f"{b.path}: ").removeprefix(f"{b.path} ")
    return calls, failed


def _split(path: str) -> tuple[str, str]:
    parent, _, key = path.rpartition(".")
    return parent, key


def remove_blocks(model: nn.Module, blocks: Sequence[ResidualBlock], calls: dict[str, BlockCall], *,
                  compact: bool = True) -> Undo:
    """Replace each of ``blocks`` in ``model`` by its :class:`Bypass`; with ``compact``, let a registered compactor
    drop the identity bypasses from their container. Returns the undo that puts every block back."""
    undo: list[Undo] = []
    try:
        for b in blocks:
            parent_path, key = _split(b.path)
            parent = model.get_submodule(parent_path)
            old = parent.get_submodule(key)
            setattr(parent, key, Bypass(old, b.path, b.tail, calls[b.path]))
            undo.append(lambda p=parent, k=key, o=old: setattr(p, k, o))
        if compact:
            by_container: dict[str, list[int]] = {}
            for b in blocks:
                parent_path, key = _split(b.path)
                if key.isdigit() and model.get_submodule(b.path).identity:
                    by_container.setdefault(parent_path, []).append(int(key))
            for container, positions in by_container.items():
                for fn in _COMPACTORS:
                    done = fn(model, container, sorted(positions))
                    if done is not None:
                        undo.append(done)
                        break
    except BaseException:
        for u in reversed(undo):
            u()
        raise

    def put_back() -> None:
        for u in reversed(undo):
            u()

    return put_back
