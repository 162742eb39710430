"""Every keyed registry warns when code outside prunefx replaces an entry prunefx registered, unless replace=True."""

from __future__ import annotations

import warnings

import pytest
import torch
from torch import nn

from prunefx.errors import RegistryOverrideWarning, RuleOverrideWarning


def _registrations():
    """(name, register a replacement of a built-in entry, with replace=...) for each keyed registry."""
    from prunefx.analysis.outputs import register_free_outputs
    from prunefx.analysis.rules import register_rule
    from prunefx.capture.torch_export import register_export
    from prunefx.family import TORCH, register_family
    from prunefx.metrics.layer_cases import register_timed_layer
    from prunefx.transform.fixers import register_fixer

    return [
        ("rule", lambda replace: register_rule(torch.cat, replace=replace)(lambda ctx: None)),
        ("fixer", lambda replace: register_fixer(nn.Linear, replace=replace)(lambda m, w: None)),
        ("timed layer", lambda replace: register_timed_layer(nn.Linear, lambda *a: None, replace=replace)),
        ("family", lambda replace: register_family("torch", TORCH.__class__(), replace=replace)),
        ("export", lambda replace: register_export(_ExportFirst, replace=replace)),
        ("free outputs", lambda replace: register_free_outputs(_ExportFirst, "x", replace=replace)),
    ]


class _ExportFirst(nn.Module):
    pass


@pytest.fixture(autouse=True)
def _restore_registries():
    """Put every table back as it was: the replacements below must not leak into other tests."""
    from prunefx import family
    from prunefx.analysis import outputs
    from prunefx.analysis.rules import RULES
    from prunefx.capture import torch_export
    from prunefx.metrics import layer_cases
    from prunefx.transform import fixers

    tables = [RULES.functions, fixers._FIXERS, layer_cases._BUILDERS, family._FAMILIES, torch_export._EXPORT,
              outputs._FREE_OUTPUTS]
    saved = [dict(t) for t in tables]
    yield
    for table, old in zip(tables, saved, strict=True):
        table.clear()
        table.update(old)


def _prime_builtin_export_and_outputs() -> None:
    """Entries for _ExportFirst registered as from a prunefx module, so that replacing them is an override."""
    from prunefx import _registry
    from prunefx.analysis import outputs
    from prunefx.capture import torch_export

    namespace = {"__name__": "prunefx.integrations.example", "_registry": _registry, "outputs": outputs,
                 "torch_export": torch_export, "M": _ExportFirst}
    exec("_registry.put(torch_export._EXPORT, M, lambda m: {}, what='register_export', depth=1)\n"
         "_registry.put(outputs._FREE_OUTPUTS, M, ('y',), what='register_free_outputs', depth=1)", namespace)


@pytest.mark.parametrize("name", [n for n, _ in _registrations()])
def test_replacing_a_builtin_entry_warns_unless_asked(name: str) -> None:
    _prime_builtin_export_and_outputs()
    register = dict(_registrations())[name]
    with pytest.warns(RegistryOverrideWarning, match="replace=True"):
        register(False)
    with warnings.catch_warnings():
        warnings.simplefilter("error", RegistryOverrideWarning)
        register(True)


def test_a_new_entry_and_prunefx_own_registrations_do_not_warn() -> None:
    from prunefx.transform.fixers import register_fixer

    class Fresh(nn.Module):
        pass

    with warnings.catch_warnings():
        warnings.simplefilter("error", RegistryOverrideWarning)
        register_fixer(Fresh)(lambda m, w: None)
        register_fixer(Fresh)(lambda m, w: None)  # the user's own entry, replaced by the user: no warning
    assert issubclass(RuleOverrideWarning, RegistryOverrideWarning)
