"""One registry of op rules, keyed by what fx records as a node's target.

    from prunefx.analysis.rules import register_rule

    @register_rule(MyGate)            # an nn.Module type (call_module)
    @register_rule(torch.cat)         # a function (call_function)
    @register_rule("chunk")           # a Tensor method name (call_method)
    def my_rule(ctx: Ctx): ...

A rule receives a :class:`~prunefx.analysis.rules._context.Ctx` (the engine's ``Ctx``, typed by that protocol) and
returns the output's channel labels. A node whose target has no rule freezes every channel it touches (never a guess).

Replacing one of prunefx's built-in rules warns (:class:`~prunefx.errors.RuleOverrideWarning`) unless the
registration says so: ``register_rule(torch.cat, replace=True)``.
"""

from __future__ import annotations

import warnings
from collections.abc import Callable
from typing import Any

from torch import nn

from prunefx.analysis.rules._context import Ctx
from prunefx.capture import semantics as _semantics
from prunefx.errors import RuleOverrideWarning

Rule = Callable[[Ctx], Any]


class OpRegistry:
    """Rules for module types, functions and method names; a later registration wins (replacing a built-in one
    warns unless ``replace=True``)."""

    def __init__(self) -> None:
        self.modules: dict[type, Rule] = {}
        self.functions: dict[Any, Rule] = {}
        self.methods: dict[str, Rule] = {}
        self._builtin: set[tuple[str, Any]] = set()  # (table, target) of the rules prunefx itself registers

    def register(self, *targets: Any, replace: bool = False) -> Callable[[Rule], Rule]:
        """Decorator: ``rule(ctx: Ctx)`` handles nodes whose target is one of ``targets`` (an ``nn.Module`` type, a
        function or ATen overload, or a Tensor method name) and returns the output's channel labels.

        An op under ``torch.export`` is an ATen overload (``torch.ops.aten.cat.default``): register those too
        (see ``rules/aten.py``), or export graphs freeze it. Replacing a built-in rule warns unless ``replace``.
        """

        def deco(rule: Rule) -> Rule:
            for t in targets:
                table = self._table(t)
                old = getattr(self, table).get(t)
                if old is not None and old is not rule and not replace and (table, t) in self._builtin:
                    warnings.warn(
                        f"register_rule({t!r}) replaces prunefx's built-in rule {_qualname(old)} with "
                        f"{_qualname(rule)}; pass replace=True if that is intended",
                        RuleOverrideWarning,
                        stacklevel=3,
                    )
                getattr(self, table)[t] = rule
            return rule

        return deco

    def _table(self, t: Any) -> str:
        if isinstance(t, str):
            return "methods"
        if isinstance(t, type) and issubclass(t, nn.Module):
            return "modules"
        if callable(t):
            return "functions"
        raise TypeError(f"cannot register a rule for {t!r}: expected a Module type, a callable or a method name")

    def mark_builtin(self) -> None:
        """Every rule registered so far is built in: replacing one later warns unless ``replace=True``."""
        self._builtin |= {(table, t) for table in ("modules", "functions", "methods") for t in getattr(self, table)}

    def is_builtin(self, target: Any) -> bool:
        return (self._table(target), target) in self._builtin

    def items(self) -> list[tuple[Any, Rule]]:
        """Every (target, rule) pair: module types, then functions, then method names."""
        return [*self.modules.items(), *self.functions.items(), *self.methods.items()]

    def for_module(self, module: nn.Module) -> Rule | None:
        """Exact type first; else a registered base class whose forward the module does not override."""
        cls = type(module)
        rule = self.modules.get(cls)
        if rule is not None:
            return rule
        for base in cls.__mro__[1:]:
            rule = self.modules.get(base)
            if rule is not None:
                return rule if cls.forward is base.forward else None
        return None

    def for_function(self, fn: Any) -> Rule | None:
        try:
            return self.functions.get(fn)
        except TypeError:  # unhashable target
            return None

    def for_method(self, name: str) -> Rule | None:
        return self.methods.get(name)


def _qualname(rule: Any) -> str:
    return f"{getattr(rule, '__module__', '?')}.{getattr(rule, '__qualname__', repr(rule))}"


RULES = OpRegistry()
register_rule = RULES.register

# Train-only functions (dropout, stochastic depth) are declared in prunefx.capture.semantics, which runs graphs
# with evaluation semantics; re-exported here, next to register_rule, for plugins that register both.
TRAIN_ONLY = _semantics.TRAIN_ONLY
register_train_only = _semantics.register_train_only
