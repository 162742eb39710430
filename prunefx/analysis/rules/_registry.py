"""One registry of op rules, keyed by what fx records as a node's target.

    from prunefx.analysis.rules import register_rule

    @register_rule(MyGate)            # an nn.Module type (call_module)
    @register_rule(torch.cat)         # a function (call_function)
    @register_rule("chunk")           # a Tensor method name (call_method)
    def my_rule(ctx): ...

A rule receives an :class:`prunefx.analysis.engine.Ctx` and returns the output's channel labels. A node
whose target has no rule freezes every channel it touches (never a guess).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from torch import nn

from prunefx.capture import semantics as _semantics

Rule = Callable[[Any], Any]


class OpRegistry:
    """Rules for module types, functions and method names; a later registration wins."""

    def __init__(self) -> None:
        self.modules: dict[type, Rule] = {}
        self.functions: dict[Any, Rule] = {}
        self.methods: dict[str, Rule] = {}

    def register(self, *targets: Any) -> Callable[[Rule], Rule]:
        def deco(rule: Rule) -> Rule:
            for t in targets:
                if isinstance(t, str):
                    self.methods[t] = rule
                elif isinstance(t, type) and issubclass(t, nn.Module):
                    self.modules[t] = rule
                elif callable(t):
                    self.functions[t] = rule
                else:
                    raise TypeError(
                        f"cannot register a rule for {t!r}: expected a Module type, a callable or a method name"
                    )
            return rule

        return deco

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


RULES = OpRegistry()
register_rule = RULES.register

# Train-only functions (dropout, stochastic depth) are declared in prunefx.capture.semantics, which runs graphs
# with evaluation semantics; re-exported here, next to register_rule, for plugins that register both.
TRAIN_ONLY = _semantics.TRAIN_ONLY
register_train_only = _semantics.register_train_only
