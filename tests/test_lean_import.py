"""``import prunefx`` stays cheap: it imports no optional framework (its time over ``import torch`` is a benchmark:
``python -m experiments.run import_time``, not a timed test)."""

from __future__ import annotations

import json
import subprocess
import sys

HEAVY = ("torchvision", "ultralytics", "typer", "rich", "matplotlib", "yaml", "cv2", "timm", "transformers")
_PROBE = """
import json, sys, time
t0 = time.perf_counter(); import torch; t1 = time.perf_counter(); import prunefx; t2 = time.perf_counter()
print(json.dumps({"torch": t1 - t0, "prunefx": t2 - t1, "modules": sorted(sys.modules)}))
"""


def _probe() -> dict:
    out = subprocess.run([sys.executable, "-c", _PROBE], capture_output=True, text=True, check=True)
    return json.loads(out.stdout.strip().splitlines()[-1])


def test_import_prunefx_loads_no_optional_framework() -> None:
    modules = _probe()["modules"]
    loaded = sorted({m.split(".")[0] for m in modules} & set(HEAVY))
    assert not loaded, f"import prunefx imported {loaded}"


def test_public_names_resolve_on_first_use() -> None:
    """The facade is lazy (``prunefx.errors`` alone imports no torch), and every public name resolves."""
    probe = """
import sys, prunefx.errors
assert "torch" not in sys.modules, "prunefx.errors imported torch"
import prunefx
missing = [n for n in prunefx.__all__ if getattr(prunefx, n, None) is None]
assert not missing, missing
assert sorted(prunefx._PUBLIC) == sorted(prunefx.__all__)
"""
    subprocess.run([sys.executable, "-c", probe], check=True, capture_output=True, text=True)


def test_public_names_win_over_same_named_submodules() -> None:
    """``prunefx.verify`` stays the function after anything imports the submodule ``prunefx.verify``."""
    probe = """
import prunefx
import prunefx.api  # imports the submodule prunefx.verify
from prunefx.verify import VerifyResult
assert callable(prunefx.verify) and prunefx.verify.__module__ == "prunefx.verify", prunefx.verify
assert callable(prunefx.prune) and prunefx.VerifyResult is VerifyResult
"""
    subprocess.run([sys.executable, "-c", probe], check=True, capture_output=True, text=True)


def test_cli_help_imports_no_torch() -> None:
    """``import prunefx.cli.main`` and ``prunefx [COMMAND] --help`` import no torch: commands import it to run."""
    probe = """
import contextlib, io, sys
import prunefx.cli.main as cli
assert "torch" not in sys.modules, "import prunefx.cli.main imported torch"
for argv in (["--help"], ["analyze", "--help"], ["flops", "--help"], ["prune", "--help"], ["export", "--help"],
             ["report", "--help"], ["data", "shapes", "--help"]):
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        try:
            cli.app(argv, prog_name="prunefx")
        except SystemExit as exc:
            assert exc.code == 0, (argv, exc.code, out.getvalue())
    assert "Usage" in out.getvalue(), (argv, out.getvalue())
heavy = sorted(m for m in ("torch", "torchvision", "numpy", "matplotlib", "ultralytics", "yaml") if m in sys.modules)
assert not heavy, f"prunefx --help imported {heavy}"
"""
    proc = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr[-3000:]
