"""The sdist and the wheel hold every package of the source tree (``cli/`` as ``prunefx.cli``), the HTML view's
assets and the ``prunefx`` command, and the wheel's code imports and draws a page without the source tree.

Built offline as CI does (``python -m build --no-isolation``: the sdist, then the wheel from it), through the same
setuptools hooks, from a copy of the files the build reads, so the tree is never written to.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tarfile
import zipfile
from pathlib import Path

import pytest
from _sources import ROOT, source_files

ASSETS = ROOT / "prunefx" / "view" / "assets"
_HOOK = "import sys; from setuptools import build_meta as b; print(getattr(b, sys.argv[1])(sys.argv[2]))"


def _ignore(folder: str, names: list[str]) -> set[str]:
    # prunefx/cli is a worktree's link back to cli/: the build maps cli/ there itself
    return {"__pycache__"} | ({"cli"} if Path(folder) == ROOT / "prunefx" else set())


def _hook(name: str, src: Path, out: Path) -> Path:
    out.mkdir(exist_ok=True)
    proc = subprocess.run([sys.executable, "-c", _HOOK, name, str(out)], cwd=src, capture_output=True, text=True,
                          timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return out / proc.stdout.strip().splitlines()[-1]


@pytest.fixture(scope="module")
def built(tmp_path_factory) -> dict[str, Path]:
    """The sdist built from a copy of the tree and the wheel built from the unpacked sdist."""
    tmp = tmp_path_factory.mktemp("build")
    src = tmp / "src"
    for name in ("prunefx", "cli"):
        shutil.copytree(ROOT / name, src / name, ignore=_ignore)
    for name in ("pyproject.toml", "setup.py", "README.md"):
        shutil.copy2(ROOT / name, src / name)
    sdist = _hook("build_sdist", src, tmp / "dist")
    with tarfile.open(sdist) as tar:
        tar.extractall(tmp / "unpacked", filter="data")
    (unpacked,) = (tmp / "unpacked").iterdir()
    wheel = _hook("build_wheel", unpacked, tmp / "dist")
    return {"sdist": sdist, "wheel": wheel}


def _in_wheel(path: Path) -> str:
    """Where a source file lies in the wheel (cli/x.py -> prunefx/cli/x.py)."""
    rel = path.relative_to(ROOT).as_posix()
    return "prunefx/" + rel if rel.startswith("cli/") else rel


def test_the_wheel_holds_every_module_the_assets_and_the_command(built: dict[str, Path]) -> None:
    with zipfile.ZipFile(built["wheel"]) as whl:
        names = set(whl.namelist())
        missing = sorted(_in_wheel(p) for p in source_files() if _in_wheel(p) not in names)
        assert not missing, f"not in the wheel: {missing}"
        for asset in sorted(ASSETS.iterdir()):
            assert whl.read(f"prunefx/view/assets/{asset.name}") == asset.read_bytes(), asset.name
        (entry_points,) = [n for n in names if n.endswith(".dist-info/entry_points.txt")]
        assert "prunefx = prunefx.cli.main:main" in whl.read(entry_points).decode()
    assert not any(n.startswith(("cli/", "tests/")) for n in names)  # no top-level `cli` package, no tests


def test_the_sdist_holds_every_source_file_and_the_assets(built: dict[str, Path]) -> None:
    with tarfile.open(built["sdist"]) as tar:
        names = {n.split("/", 1)[1] for n in tar.getnames() if "/" in n}
    wanted = [p.relative_to(ROOT).as_posix() for p in [*source_files(), *ASSETS.iterdir()]]
    assert not [w for w in wanted if w not in names], sorted(set(wanted) - names)
    assert {"pyproject.toml", "setup.py", "README.md"} <= names


_OUTSIDE = """
import json, sys
import prunefx, prunefx.report, prunefx.cli.main
from prunefx.view.page import GRAPH_SCHEMA, groups_html
counts = ("nodes", "edges", "groups", "prunable_groups", "frozen_groups", "channels", "prunable_channels",
          "auto_leaves", "unknown_ops")
graph = {"schema": GRAPH_SCHEMA, "model": "m", "summary": {**dict.fromkeys(counts, 0), "frozen_reasons": {}},
         "nodes": [], "edges": [], "groups": [], "ties": [], "auto_leaves": {}, "unknown_ops": {}, "plan": None}
prunefx.report.validate_graph(graph)
modules = (prunefx, prunefx.report, prunefx.cli.main, sys.modules["prunefx.view.page"])
print(json.dumps({"files": [m.__file__ for m in modules], "page": len(groups_html(graph))}))
"""


def test_the_wheel_imports_and_draws_a_page_without_the_source_tree(built: dict[str, Path], tmp_path: Path) -> None:
    """Unpacked on ``PYTHONPATH`` it shadows the editable install: every module comes from the wheel or fails."""
    site = tmp_path / "site"
    with zipfile.ZipFile(built["wheel"]) as whl:
        whl.extractall(site)
    env = {**os.environ, "PYTHONPATH": str(site)}
    proc = subprocess.run([sys.executable, "-c", _OUTSIDE], cwd=tmp_path, capture_output=True, text=True, timeout=300,
                          env=env)
    assert proc.returncode == 0, proc.stderr[-3000:]
    out = json.loads(proc.stdout.strip().splitlines()[-1])
    assert all(Path(f).is_relative_to(site) for f in out["files"]), out["files"]
    assert out["page"] > 10_000  # the template with the inlined script and style
