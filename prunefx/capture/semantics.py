"""Run a training-mode graph with evaluation semantics: deterministic, and no model state updated.

prunefx traces in training mode (the graph then holds every layer that learns), so what a module decided from
``self.training`` at trace time is baked into the graph: ``F.batch_norm(..., True, momentum, eps)`` from a
BatchNorm written functionally (timm ``BatchNormAct2d``), ``num_batches_tracked.add_(1)``, drop-path as
``x.new_empty(shape).bernoulli_(keep).div_(keep)``, dropout called with ``training=True``. The shape pass and the
oracle run such graphs through :class:`EvalInterpreter`, which gives each of these its evaluation meaning:

- functions registered with :func:`register_train_only` (dropout flavours, stochastic depth) are the identity,
  and attention dropout (``scaled_dot_product_attention(dropout_p=...)``) is off;
- ``F.batch_norm`` / ``F.instance_norm`` with running statistics use them (``training=False``);
- random draws are replaced by their expectation (``bernoulli_(p)`` fills ``p``, ``rand`` gives 0.5, ``randn`` 0,
  ``new_empty``/``empty`` zeros), so two runs of the same graph draw the same "mask" whatever its shape;
- in-place methods on a parameter or buffer of the model (counters, caches) do not mutate it;
- fx's immutable argument lists reach functions as plain lists (some mutate their arguments).
"""

from __future__ import annotations

import inspect
from collections.abc import Callable
from typing import Any

import torch
import torch.fx as fx
import torch.nn.functional as F
from torch.fx.immutable_collections import immutable_dict, immutable_list

# Functions that a training-mode trace calls with ``training=True`` baked in (dropout flavours, stochastic depth):
# evaluation runs them as the identity, i.e. with eval semantics, so runs are deterministic.
TRAIN_ONLY: set[Callable[..., Any]] = set()


def register_train_only(*fns: Callable[..., Any]) -> None:
    """Declare functions that only act in training (random masks): the identity when a model is evaluated."""
    TRAIN_ONLY.update(fns)


register_train_only(F.dropout, F.dropout1d, F.dropout2d, F.dropout3d, F.alpha_dropout, F.feature_alpha_dropout)

# Discontinuous ops: a change of their input below round-off can change their output by a whole step (two
# near-equal scores swap places in a top-k). The oracle compares at their inputs (prunefx.verify).
DISCRETE: set[Any] = {
    torch.topk, torch.sort, torch.argsort, torch.argmax, torch.argmin, torch.kthvalue, torch.max, torch.min,
    torch.median, torch.mode, torch.unique, torch.nonzero, torch.searchsorted, torch.bucketize, torch.msort,
    "topk", "sort", "argsort", "argmax", "argmin", "kthvalue", "max", "min", "median", "mode", "unique", "nonzero",
}


def register_discrete(*targets: Any) -> None:
    """Declare ops whose output jumps (selections, NMS): the oracle compares their inputs, then replays them."""
    DISCRETE.update(targets)


# Functions whose randomness is an argument: (argument name, position, its evaluation value).
_EVAL_ARGUMENT: dict[Any, tuple[str, int, Any]] = {
    F.scaled_dot_product_attention: ("dropout_p", 4, 0.0),  # attention dropout, baked in by a training trace
    F.rrelu: ("training", 3, False),
}

_BN_SIG = inspect.signature(F.batch_norm)
_IN_SIG = inspect.signature(F.instance_norm)


def _mean_of(kind: str, args: tuple, kwargs: dict) -> float:
    """The expectation of a fill-in-place random method's distribution (its arguments as the method takes them)."""
    a = list(args) + [None] * 3
    if kind == "bernoulli_":
        p = kwargs.get("p", a[0] if a[0] is not None else 0.5)
        return p
    if kind == "uniform_":
        lo = kwargs.get("from", a[0] if a[0] is not None else 0.0)
        hi = kwargs.get("to", a[1] if a[1] is not None else 1.0)
        return (lo + hi) / 2
    if kind == "normal_":
        return kwargs.get("mean", a[0] if a[0] is not None else 0.0)
    if kind == "exponential_":
        return 1.0 / kwargs.get("lambd", a[0] if a[0] is not None else 1.0)
    return 0.0


_RANDOM_FILL = ("bernoulli_", "uniform_", "normal_", "exponential_", "random_", "geometric_", "cauchy_", "log_normal_")


def _plain(x: Any) -> Any:
    if isinstance(x, immutable_list):
        return [_plain(v) for v in x]
    if isinstance(x, immutable_dict):
        return {k: _plain(v) for k, v in x.items()}
    if type(x) is tuple:  # not named tuples or torch.return_types (their fields are read by attribute)
        return tuple(_plain(v) for v in x)
    return x


def _size(args: tuple, kwargs: dict) -> tuple:
    size = kwargs.get("size", args)
    if len(size) == 1 and isinstance(size[0], (list, tuple, torch.Size)):
        size = size[0]
    return tuple(size)


def _factory_kwargs(kwargs: dict) -> dict:
    return {k: kwargs[k] for k in ("dtype", "device", "layout", "requires_grad") if k in kwargs}


def _rand(args, kwargs):
    return torch.full(_size(args, kwargs), 0.5, **_factory_kwargs(kwargs))


def _zeros(args, kwargs):
    return torch.zeros(_size(args, kwargs), **_factory_kwargs(kwargs))


# torch.* random draws and uninitialised allocations -> their expectation (or zeros): deterministic values.
_DETERMINISTIC: dict[Any, Callable[[tuple, dict], Any]] = {
    torch.rand: _rand,
    torch.randn: _zeros,
    torch.empty: _zeros,
    torch.rand_like: lambda a, k: torch.full_like(a[0], 0.5, **_factory_kwargs(k)),
    torch.randn_like: lambda a, k: torch.zeros_like(a[0], **_factory_kwargs(k)),
    torch.empty_like: lambda a, k: torch.zeros_like(a[0], **_factory_kwargs(k)),
    torch.bernoulli: lambda a, k: (a[0] if len(a) < 2 or not isinstance(a[1], float) else torch.full_like(a[0], a[1])),
    torch.randperm: lambda a, k: torch.arange(a[0], **_factory_kwargs(k)),
    torch.normal: lambda a, k: _normal(a, k),
}


def _normal(args: tuple, kwargs: dict) -> Any:
    mean = kwargs.get("mean", args[0] if args else 0.0)
    if isinstance(mean, torch.Tensor):
        return mean.clone()
    size = kwargs.get("size", args[2] if len(args) > 2 else ())
    return torch.full(tuple(size), float(mean), **_factory_kwargs(kwargs))


class EvalInterpreter(fx.Interpreter):
    """An fx.Interpreter that runs a training-mode graph with evaluation semantics (see the module docstring).

    Module calls follow the modules' own ``training`` flags: run it under ``training_mode(gm, False)``.
    """

    def call_function(self, target: Any, args: tuple, kwargs: dict) -> Any:
        if target in TRAIN_ONLY:
            return args[0] if args else next(iter(kwargs.values()))
        if target is F.batch_norm or target is F.instance_norm:
            return self._norm(target, args, kwargs)
        if _hashable(target) and target in _EVAL_ARGUMENT:
            name, pos, value = _EVAL_ARGUMENT[target]
            if len(args) > pos:
                args = (*args[:pos], value, *args[pos + 1 :])
            elif name in kwargs:
                kwargs = {**kwargs, name: value}
        det = _DETERMINISTIC.get(target) if _hashable(target) else None
        if det is not None:
            return det(args, kwargs)
        return super().call_function(target, _plain(args), _plain(kwargs))

    def call_method(self, target: str, args: tuple, kwargs: dict) -> Any:
        self_obj = args[0]
        if isinstance(self_obj, torch.Tensor):
            if target in _RANDOM_FILL:
                fill = _mean_of(target, args[1:], kwargs)
                if isinstance(fill, torch.Tensor):
                    return self_obj.copy_(fill.expand_as(self_obj))
                return self_obj.fill_(fill)
            if target in ("new_empty", "new_empty_strided"):
                return self_obj.new_zeros(*_plain(args[1:]), **_plain(kwargs))
            if target.endswith("_") and not target.endswith("__") and self._on_state():
                return self_obj  # an in-place update of a parameter/buffer (a counter, a cache): not in eval
        return super().call_method(target, _plain(args), _plain(kwargs))

    def run_node(self, n: fx.Node) -> Any:
        self._node = n
        return super().run_node(n)

    def _on_state(self) -> bool:
        """The current node's tensor is a parameter or buffer of the model (fetched by get_attr)."""
        first = self._node.args[0] if self._node.args else None
        return isinstance(first, fx.Node) and first.op == "get_attr"

    def _norm(self, target: Any, args: tuple, kwargs: dict) -> Any:
        sig = _BN_SIG if target is F.batch_norm else _IN_SIG
        bound = sig.bind(*args, **kwargs)
        p = bound.arguments
        if p.get("running_mean") is not None and p.get("running_var") is not None:
            p["training" if target is F.batch_norm else "use_input_stats"] = False
        return target(*bound.args, **bound.kwargs)


def _hashable(x: Any) -> bool:
    try:
        hash(x)
    except TypeError:
        return False
    return True


__all__ = ["DISCRETE", "EvalInterpreter", "TRAIN_ONLY", "register_discrete", "register_train_only"]
