"""Run ultralytics offline, with its settings and fonts inside the project instead of the user's home.

Call :func:`setup_offline` before the first ``import ultralytics``: ultralytics decides at import time whether it
is online (``YOLO_OFFLINE``), where its config dir is (``YOLO_CONFIG_DIR``) and whether it loads checkpoints
weights-only (``ULTRALYTICS_SAFE_LOAD``, which prunefx turns on unless it is set).
"""

from __future__ import annotations

import importlib.util
import os
import shutil
import sys
import warnings
from pathlib import Path
from typing import Any

# check_font() fetches these from GitHub when they are not in the config dir: Arial.ttf on every train/val (and for
# plot labels), Arial.Unicode.ttf when a class name is not ASCII. Any TTF with that name stops the download.
FONT_NAMES = ("Arial.ttf", "Arial.Unicode.ttf")


def default_config_dir() -> Path:
    """``<repo>/.cache/yolo`` in a source checkout of prunefx, else ``<cwd>/.cache/yolo``."""
    repo = Path(__file__).resolve().parents[3]  # prunefx/integrations/ultralytics/env.py -> the checkout
    root = repo if (repo / "pyproject.toml").is_file() else Path.cwd()
    return root / ".cache" / "yolo"


def setup_offline(cache_dir: Path | str | None = None) -> Path:
    """Make ultralytics work offline and keep its state in ``cache_dir``; idempotent, returns ``YOLO_CONFIG_DIR``.

    The config dir is ``cache_dir`` if given, else an already set ``YOLO_CONFIG_DIR``, else
    :func:`default_config_dir`.
    """
    config_dir = Path(cache_dir or os.environ.get("YOLO_CONFIG_DIR") or default_config_dir()).expanduser().absolute()
    os.environ["YOLO_CONFIG_DIR"] = str(config_dir)
    # Skips the DNS probe at import (and with it analytics, hub checks and update checks).
    os.environ["YOLO_OFFLINE"] = "1"
    # A missing optional package (onnx for export, ...) must fail, not be pip-installed into the environment.
    os.environ["YOLO_AUTOINSTALL"] = "false"
    # ultralytics' restricted loading for every checkpoint it loads itself (YOLO(path), validators): weights-only
    # with its allow-list, and model yamls built without eval. prunefx's own loads choose explicitly (io.py).
    os.environ.setdefault("ULTRALYTICS_SAFE_LOAD", "1")

    if not _installed("ultralytics"):  # without the yolo extra there is nothing to keep offline (nor matplotlib)
        return config_dir
    fonts_dir = config_dir / "Ultralytics"  # what ultralytics' get_user_config_dir() appends
    fonts_dir.mkdir(parents=True, exist_ok=True)
    fonts = [_place_font(fonts_dir / name) for name in FONT_NAMES]

    if "ultralytics.utils" in sys.modules:
        _patch_imported_ultralytics(fonts_dir, fonts)
    return config_dir


def _installed(package: str) -> bool:
    try:
        return importlib.util.find_spec(package) is not None
    except (ValueError, ImportError):  # removed from sys.modules, or a finder that refuses it
        return False


def cpu_train_kwargs(*, plots: bool = False, **overrides: Any) -> dict[str, Any]:
    """Keyword arguments for ultralytics ``train()`` that are safe and quick on a CPU-only machine.

    ``overrides`` (any ultralytics train argument) take precedence over the defaults.
    """
    kwargs: dict[str, Any] = {
        "device": "cpu",
        # fp32: AMP does nothing on a CPU, and on a GPU its check loads yolo26n.pt (a download when absent).
        "amp": False,
        # In-process loading: a worker process competes with training for the few cores (ultralytics already
        # trains on cpu_count - 1 threads); for small images loading is ~15 % of an epoch.
        "workers": 0,
        # Plots (label statistics, sample batches, curves) cost seconds of CPU; off unless asked for.
        "plots": plots,
        "exist_ok": True,
    }
    kwargs.update(overrides)
    return kwargs


def _place_font(target: Path) -> Path:
    """Copy matplotlib's bundled DejaVuSans to ``target`` unless a font is already there."""
    if not target.is_file() or target.stat().st_size == 0:
        import matplotlib

        source = Path(matplotlib.get_data_path()) / "fonts" / "ttf" / "DejaVuSans.ttf"
        tmp = target.with_name(f".{target.name}.{os.getpid()}.tmp")
        shutil.copyfile(source, tmp)
        os.replace(tmp, target)  # a concurrent reader never sees a half-copied font
    return target


def _patch_imported_ultralytics(fonts_dir: Path, fonts: list[Path]) -> None:
    """Best effort when ultralytics was imported first: its online flag and config dir are already fixed."""
    import ultralytics.utils as uutils
    from matplotlib import font_manager

    # Modules copied the flag with `from ultralytics.utils import ONLINE`: each loaded copy must be reset.
    copies = ("ultralytics.utils", "ultralytics.utils.checks", "ultralytics.utils.events")
    loaded = [m for m in copies if m in sys.modules]
    known = {f.fname for f in font_manager.fontManager.ttflist}
    # check_font() also accepts a font that matplotlib knows under a path containing the requested name.
    unknown_fonts = [f for f in fonts if str(f) not in known] if Path(uutils.USER_CONFIG_DIR) != fonts_dir else []
    if not unknown_fonts and not any(sys.modules[m].ONLINE for m in loaded):
        return  # ultralytics uses this config dir, or an earlier call already patched it
    warnings.warn(
        f"ultralytics was imported before prunefx's setup_offline() (its config dir is {uutils.USER_CONFIG_DIR}); "
        "patching its online flag and fonts. Call setup_offline() before the first ultralytics import.",
        RuntimeWarning,
        stacklevel=3,
    )
    for m in loaded:
        sys.modules[m].ONLINE = False
    for font in unknown_fonts:
        font_manager.fontManager.addfont(str(font))
