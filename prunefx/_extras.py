"""Optional dependencies: import one, or fail with one line naming the prunefx extra that installs it."""

from __future__ import annotations

import importlib
from types import ModuleType

from prunefx.errors import PrunefxError

# top-level package -> the extra of pyproject.toml that brings it (each extra is named after what it enables)
EXTRAS = {
    "torchvision": "vision",
    "ultralytics": "yolo",
    "cv2": "yolo",  # opencv-python, an ultralytics dependency: draws the synthetic detection set
    "sklearn": "classify",
    "matplotlib": "plots",
    "transformers": "hf",
    "timm": "timm",
    "onnx": "deploy",
    "onnxruntime": "deploy",
    "accelerate": "recover",
}


# packages whose import name is not the name pip installs
PIP_NAMES = {"sklearn": "scikit-learn", "cv2": "opencv-python"}


class MissingExtraError(PrunefxError, ImportError):
    """An optional dependency is not installed; the message names the extra to install."""


def install_hint(package: str) -> str:
    """The pip command that brings ``package`` (a top-level package name of ``EXTRAS``)."""
    return f"pip install 'prunefx[{EXTRAS[package]}]'"


def require(module: str, what: str) -> ModuleType:
    """Import ``module``; if its package is not installed, raise MissingExtraError: '``what`` needs ...'."""
    top = module.partition(".")[0]
    try:
        return importlib.import_module(module)
    except ImportError as exc:
        # an ImportError raised inside an installed package (a broken install) is its own problem: re-raise it
        missing = (exc.name or "").partition(".")[0]
        if missing and missing != top:
            raise
        name = PIP_NAMES.get(top, top)
        raise MissingExtraError(f"{what} needs {name}, which is not installed: {install_hint(top)}") from None
