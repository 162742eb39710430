"""Plugins: modules that teach prunefx a library's layers, imported only once that library is in use.

The core never imports an integration. An integration is named here by the top-level package it serves
(``register_plugin("ultralytics", "prunefx.integrations.ultralytics.plugin")``) or through the ``prunefx.plugins``
entry-point group (name = that package, value = the plugin module); :func:`activate` imports the plugin of every
such package that is already imported (a model of that library exists, so importing it costs nothing new).
"""

from __future__ import annotations

import importlib
import sys
from importlib.metadata import entry_points

_PLUGINS: dict[str, str] = {}  # top-level package -> plugin module
_loaded_entry_points = False


def register_plugin(package: str, module: str) -> None:
    """Import ``module`` (which registers rules, fixers, leaves...) once ``package`` has been imported."""
    _PLUGINS[package] = module


def _entry_points() -> None:
    global _loaded_entry_points
    if _loaded_entry_points:
        return
    _loaded_entry_points = True
    for ep in entry_points(group="prunefx.plugins"):
        _PLUGINS.setdefault(ep.name, ep.value)


def activate() -> None:
    """Import the plugin of every registered package that is imported now (idempotent, cheap)."""
    _entry_points()
    for package, module in list(_PLUGINS.items()):
        if package in sys.modules and module not in sys.modules:
            importlib.import_module(module)
