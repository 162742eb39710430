"""What only a fresh process shows: imports resolved from sys.path, and ultralytics' load mode fixed at import.

Each test runs Python as the ``prunefx`` console script does (``-P``: the current directory is not on sys.path).
"""

from __future__ import annotations

import os
import subprocess
import sys

from _hostile import PRUNEFX_ROOT, Sandbox

SHADOW = "open({marker!r}, 'w').write('{name}.py in the current directory was imported\\n')\n"

RESOLVE = """
import os, sys
from prunefx.pipeline.classify_model import classifier_factory
from prunefx.spec import load_spec

assert load_spec("hostile_models:tiny", imgsz=8).kind == "factory"  # a factory next to the user is still found
classifier_factory("prunefx.zoo:bn_cnn", num_classes=10, in_channels=1)()  # the default digits config's model
import sklearn  # what the digits dataset imports next
assert os.getcwd() not in sys.path, sys.path
"""

ULTRALYTICS_OWN_LOAD = """
from prunefx.integrations.ultralytics.env import setup_offline

setup_offline()
from ultralytics import YOLO

try:
    YOLO("evil.pt")
except TypeError as exc:
    print("refused:", exc)
"""


def _python(code: str, box: Sandbox) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONPATH": str(PRUNEFX_ROOT)}
    env.pop("ULTRALYTICS_SAFE_LOAD", None)  # prunefx's default, not the test runner's environment
    return subprocess.run([sys.executable, "-P", "-c", code], cwd=box.root, env=env, capture_output=True, text=True,
                          timeout=300)


def test_files_in_the_current_directory_never_shadow_packages(sandbox: Sandbox) -> None:
    (sandbox.root / "sklearn.py").write_text(SHADOW.format(marker=str(sandbox.marker), name="sklearn"))
    (sandbox.root / "hostile_models.py").write_text(
        "import sklearn  # the factory's own imports resolve to installed packages too\n"
        + (sandbox.root / "hostile_models.py").read_text()
    )
    done = _python(RESOLVE, sandbox)
    assert done.returncode == 0, done.stderr
    assert not sandbox.marker.exists(), sandbox.marker.read_text()


def test_ultralytics_own_loads_are_weights_only_after_setup(sandbox: Sandbox) -> None:
    sandbox.write_pickle()
    done = _python(ULTRALYTICS_OWN_LOAD, sandbox)
    assert done.returncode == 0, done.stderr
    assert "refused: " in done.stdout and "outside the supported Ultralytics checkpoint format" in done.stdout
    assert not sandbox.marker.exists()
