"""Modules renamed in a release, still importable under their old names for one more release (a FutureWarning)."""

from __future__ import annotations

import importlib
import importlib.abc
import importlib.util
import sys
import types
import warnings
from typing import Any

# old name -> new name; an entry leaves after one release (docs/api.md lists what is deprecated and until when)
RENAMED = {
    "prunefx.export": "prunefx.onnx_export",
    "prunefx.capture.export": "prunefx.capture.torch_export",
    "prunefx.integrations.ultralytics.export": "prunefx.integrations.ultralytics.yolo_export",
    "prunefx.integrations.transformers.config": "prunefx.integrations.transformers.pretrained",
    "prunefx.pipeline.config": "prunefx.pipeline.run_config",
    "prunefx.verify_depth": "prunefx.verify.depth",
}


class _Alias(types.ModuleType):
    """The old module: every attribute read from the new one (so later changes there show through)."""

    def __getattr__(self, name: str) -> Any:
        return getattr(importlib.import_module(self.__dict__["_renamed_to"]), name)

    def __dir__(self) -> list[str]:
        return dir(importlib.import_module(self.__dict__["_renamed_to"]))


class _AliasLoader(importlib.abc.Loader):
    def __init__(self, new: str) -> None:
        self.new = new

    def create_module(self, spec: importlib.machinery.ModuleSpec) -> types.ModuleType:
        module = _Alias(spec.name)
        module.__dict__["_renamed_to"] = self.new
        return module

    def exec_module(self, module: types.ModuleType) -> None:
        warnings.warn(f"{module.__name__} was renamed {self.new}; the old name goes in the next release",
                      FutureWarning, stacklevel=3)
        importlib.import_module(self.new)


class _RenamedFinder(importlib.abc.MetaPathFinder):
    def find_spec(self, fullname: str, path: Any, target: Any = None) -> importlib.machinery.ModuleSpec | None:
        new = RENAMED.get(fullname)
        return None if new is None else importlib.util.spec_from_loader(fullname, _AliasLoader(new))


def install() -> None:
    """Put the finder on ``sys.meta_path`` once (importing ``prunefx`` does)."""
    if not any(isinstance(f, _RenamedFinder) for f in sys.meta_path):
        sys.meta_path.insert(0, _RenamedFinder())
