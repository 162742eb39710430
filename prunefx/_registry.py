"""How every keyed registry records an entry: replacing one that prunefx registered warns unless ``replace=True``."""

from __future__ import annotations

import sys
import warnings
from collections.abc import MutableMapping
from typing import Any

from prunefx.errors import RegistryOverrideWarning

# (registry, key) -> the module that registered the entry; a registry is told apart by its table's identity
_OWNERS: dict[tuple[int, Any], str] = {}


def put(table: MutableMapping[Any, Any], key: Any, value: Any, *, what: str, replace: bool = False,
        depth: int = 2) -> None:
    """``table[key] = value``, recording who registered it (the module ``depth`` frames up); replacing an entry
    prunefx registered from code outside prunefx warns with :class:`RegistryOverrideWarning` unless ``replace``."""
    caller = sys._getframe(depth).f_globals.get("__name__", "")
    owner = _OWNERS.get((id(table), key))
    if (owner is not None and _ours(owner) and not _ours(caller) and not replace
            and table.get(key) is not value):
        warnings.warn(
            f"{what}({_name(key)}) replaces the entry prunefx registered in {owner}; pass replace=True if that is "
            "intended", RegistryOverrideWarning, stacklevel=depth + 1)
    table[key] = value
    _OWNERS[(id(table), key)] = caller


def _ours(module: str) -> bool:
    return module == "prunefx" or module.startswith("prunefx.")


def _name(key: Any) -> str:
    return getattr(key, "__qualname__", None) or repr(key)


__all__ = ["put"]
