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


def test_the_wheel_describes_itself_with_the_readme(built: dict[str, Path]) -> None:
    """The long description is README.md, the docs' front door (its links into docs/ are relative)."""
    with zipfile.ZipFile(built["wheel"]) as whl:
        (metadata,) = [n for n in whl.namelist() if n.endswith(".dist-info/METADATA")]
        text = whl.read(metadata).decode()
    assert "Description-Content-Type: text/markdown" in text
    assert (ROOT / "README.md").read_text().strip() in text


_OUTSIDE = """
import json, sys
import prunefx, prunefx.report, prunefx.cli.main
from prunefx.view.page import groups_html
from prunefx.view.schema import GRAPH_SCHEMA
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


# ---- dependencies: ranges for users, exact versions for CI, extras named after what they enable --------------

def _pyproject() -> dict:
    import tomllib

    return tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]


def test_core_dependencies_are_ranges_and_ci_pins_them() -> None:
    """``pip install prunefx`` keeps an installed torch in range: no exact pin; CI's constraints pin each one."""
    core = _pyproject()["dependencies"]
    names = {d.split(">")[0].split("=")[0].split("<")[0].strip().lower() for d in core}
    assert names == {"torch", "numpy", "typer", "rich", "pyyaml"}, names
    assert not [d for d in core if "==" in d], core
    pins = {line.split("==")[0].lower() for line in (ROOT / ".ci" / "constraints.txt").read_text().splitlines()
            if "==" in line and not line.startswith("#")}
    assert names <= pins, names - pins
    assert "thop" not in pins  # it replaces ultralytics-thop


def test_the_torch_floor_is_the_torch_ci_tests_oldest() -> None:
    """pyproject.toml's torch floor is the exact torch .ci/oldest_torch.sh installs first (and .ci/run calls it)."""
    import re

    (floor,) = [d.split(">=")[1] for d in _pyproject()["dependencies"] if d.startswith("torch>=")]
    script = (ROOT / ".ci" / "oldest_torch.sh").read_text()
    (oldest,) = re.findall(r"^OLDEST_TORCH=(\S+)", script, re.M)
    assert oldest.startswith(floor + "."), (oldest, floor)  # torch>=2.13 and 2.13.0
    assert "bash .ci/oldest_torch.sh" in (ROOT / ".ci" / "run").read_text()


def test_every_extra_a_message_names_exists() -> None:
    from prunefx._extras import EXTRAS

    extras = _pyproject()["optional-dependencies"]
    assert set(EXTRAS.values()) <= set(extras), set(EXTRAS.values()) - set(extras)
    assert {"vision", "yolo", "classify", "plots", "hf", "timm", "deploy", "all", "test"} <= set(extras)


def _core_site(site: Path) -> Path:
    """A site-packages holding only the core dependencies and what they require (links to the installed ones)."""
    from importlib.metadata import PackageNotFoundError, distribution

    from packaging.requirements import Requirement

    todo = [Requirement(d).name for d in _pyproject()["dependencies"]]
    seen: set[str] = set()
    site.mkdir()
    while todo:
        name = todo.pop().lower().replace("_", "-")
        if name in seen:
            continue
        seen.add(name)
        try:
            dist = distribution(name)
        except PackageNotFoundError:
            continue  # an optional requirement of a requirement that is not installed here either
        for req in map(Requirement, dist.requires or ()):
            if req.marker is None or req.marker.evaluate({"extra": ""}):
                todo.append(req.name)
        for top in {f.parts[0] for f in dist.files or () if f.parts[0] != ".."}:
            real = Path(dist.locate_file(top))
            if real.exists() and not (site / top).exists():
                (site / top).symlink_to(real)
    return site


_WITHOUT_EXTRAS = """
import importlib.util, json, sys
sys.path[:0] = [sys.argv[1], sys.argv[2]]  # the core's site-packages, the source tree
import prunefx
# prunefx.cli is the top-level cli/ folder (setup.py maps it; the editable install's finder is not loaded here)
spec = importlib.util.spec_from_file_location("prunefx.cli", sys.argv[2] + "/cli/__init__.py",
                                              submodule_search_locations=[sys.argv[2] + "/cli"])
prunefx.cli = sys.modules["prunefx.cli"] = importlib.util.module_from_spec(spec)
spec.loader.exec_module(prunefx.cli)
import torch
from torch import nn
import prunefx.cli.main, prunefx.pipeline, prunefx.report
from prunefx.report import plots
from prunefx.spec import load_spec

model = nn.Sequential(nn.Conv2d(3, 8, 3), nn.BatchNorm2d(8), nn.ReLU(), nn.Conv2d(8, 4, 3))
result = prunefx.prune(model, torch.randn(1, 3, 16, 16), {"ratio": 0.25}, criterion="l1")
errors = []
for name in ("torchvision:resnet18", "ultralytics:yolov8n.yaml"):
    try:
        load_spec(name)
    except ImportError as exc:
        errors.append(f"{type(exc).__name__}: {exc}")
optional = ("torchvision", "ultralytics", "sklearn", "matplotlib", "cv2", "transformers", "timm", "onnx")
print(json.dumps({"ok": result.verified.ok, "errors": errors, "plots": plots.available(),
                  "importable": [m for m in optional if importlib.util.find_spec(m) is not None]}))
"""


def test_the_core_runs_without_any_extra_and_names_the_missing_one(tmp_path: Path) -> None:
    """Only the core dependencies importable (python -S, no site-packages): prune and verify work, and a part
    that needs an extra says which one to install."""
    site = _core_site(tmp_path / "site")
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"} | {"YOLO_CONFIG_DIR": str(tmp_path / "yolo")}
    proc = subprocess.run([sys.executable, "-S", "-c", _WITHOUT_EXTRAS, str(site), str(ROOT)], cwd=tmp_path,
                          capture_output=True, text=True, timeout=300, env=env)
    assert proc.returncode == 0, proc.stderr[-3000:]
    out = json.loads(proc.stdout.strip().splitlines()[-1])
    assert out["ok"] and out["importable"] == [] and out["plots"] is False, out
    assert out["errors"] == [
        "MissingExtraError: a torchvision:NAME model needs torchvision, which is not installed: "
        "pip install 'prunefx[vision]'",
        "MissingExtraError: a YOLO model needs ultralytics, which is not installed: pip install 'prunefx[yolo]'",
    ], out["errors"]
