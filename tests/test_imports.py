"""Every module of prunefx (and its ``cli/``, installed as ``prunefx.cli``) imports, and every import that runs later
(inside a function, or under ``if TYPE_CHECKING:``) names a module and an attribute that exist.

A lazy import runs only when its code path does: a renamed module broke ``prunefx export RUN`` of every
classification run and no test imported it. The modules are imported in one fresh interpreter (transformers,
ultralytics and onnx together take seconds, and stay out of the test process).
"""

from __future__ import annotations

import ast
import json
import subprocess
import sys

import pytest
from _sources import ROOT, module_name, source_files

# The extras of pyproject.toml, by import name: a lazy import of one is checked only where it is installed.
OPTIONAL = {"onnx", "onnxslim", "onnxruntime", "transformers", "timm", "torch_pruning"}


def _deferred(tree: ast.Module) -> list[ast.Import | ast.ImportFrom]:
    """The imports of a module that do not run when it is imported: in a function body or under TYPE_CHECKING."""
    out: list[ast.Import | ast.ImportFrom] = []

    def visit(node: ast.AST, deferred: bool) -> None:
        for child in ast.iter_child_nodes(node):
            inner = deferred or isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef))
            if isinstance(child, ast.If) and "TYPE_CHECKING" in ast.unparse(child.test):
                for stmt in child.body:
                    visit(ast.Module(body=[stmt], type_ignores=[]), True)
                for stmt in child.orelse:
                    visit(ast.Module(body=[stmt], type_ignores=[]), deferred)
                continue
            if isinstance(child, (ast.Import, ast.ImportFrom)) and deferred:
                out.append(child)
            visit(child, inner)

    visit(tree, False)
    return out


def lazy_targets() -> list[dict]:
    """Every deferred import as ``{"where": file:line, "module": absolute name, "names": [...]}``."""
    targets = []
    for path in source_files():
        name = module_name(path)
        package = name if path.name == "__init__.py" else name.rpartition(".")[0]
        for node in _deferred(ast.parse(path.read_text(), str(path))):
            where = f"{path.relative_to(ROOT)}:{node.lineno}"
            if isinstance(node, ast.Import):
                targets += [{"where": where, "module": a.name, "names": []} for a in node.names]
            else:
                base = node.module or ""
                if node.level:  # relative: resolved against the importing module's package
                    parent = package.rsplit(".", node.level - 1)[0] if node.level > 1 else package
                    base = f"{parent}.{base}" if base else parent
                targets.append({"where": where, "module": base, "names": [a.name for a in node.names if a.name != "*"]})
    return targets


_PROBE = r"""
import importlib, importlib.util, json, pkgutil, sys, traceback
request = json.loads(sys.stdin.read())
import prunefx, prunefx.cli
walked, failed = ["prunefx", "prunefx.cli"], {}
def walk_error(name):
    failed[name] = traceback.format_exc(limit=-3)
for package, path in (("prunefx.", prunefx.__path__), ("prunefx.cli.", prunefx.cli.__path__)):
    walked += [m.name for m in pkgutil.walk_packages(path, package, onerror=walk_error)]
for name in sorted(set(walked)):
    try:
        importlib.import_module(name)
    except BaseException:  # noqa: BLE001 - report every module that does not import, with its traceback
        failed[name] = traceback.format_exc(limit=-3)
unresolved, skipped = [], []
for t in request["targets"]:
    top = t["module"].split(".")[0]
    if top in request["optional"] and importlib.util.find_spec(top) is None:
        skipped.append(t["where"])
        continue
    try:
        module = importlib.import_module(t["module"])
    except BaseException as exc:  # noqa: BLE001 - a missing or broken module is the finding
        unresolved.append(f"{t['where']}: import {t['module']}: {type(exc).__name__}: {exc}")
        continue
    for attr in t["names"]:
        if hasattr(module, attr):
            continue
        try:
            importlib.import_module(f"{t['module']}.{attr}")  # from package import submodule
        except ImportError:
            unresolved.append(f"{t['where']}: from {t['module']} import {attr}: no such name")
print(json.dumps({"walked": sorted(set(walked)), "failed": failed, "unresolved": unresolved, "skipped": skipped}))
"""


@pytest.fixture(scope="module")
def probe(tmp_path_factory) -> dict:
    """Import every module and resolve every deferred import in one fresh interpreter, outside the repository."""
    request = json.dumps({"targets": lazy_targets(), "optional": sorted(OPTIONAL)})
    proc = subprocess.run([sys.executable, "-c", _PROBE], input=request, capture_output=True, text=True,
                          cwd=tmp_path_factory.mktemp("imports"), timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return json.loads(proc.stdout.strip().splitlines()[-1])


def test_every_folder_with_python_files_is_a_package() -> None:
    """A folder without ``__init__.py`` is left out of the wheel by find_packages (and out of pkgutil's walk)."""
    folders = {p.parent for p in source_files()}
    missing = sorted(str(f.relative_to(ROOT)) for f in folders if not (f / "__init__.py").is_file())
    assert not missing, f"no __init__.py in {missing}"


def test_every_module_imports(probe: dict) -> None:
    assert probe["failed"] == {}, "\n".join(f"{k}:\n{v}" for k, v in probe["failed"].items())
    on_disk = {module_name(p) for p in source_files()}
    assert on_disk <= set(probe["walked"]), f"not reached by the walk: {sorted(on_disk - set(probe['walked']))}"


def test_every_deferred_import_resolves(probe: dict) -> None:
    assert len(lazy_targets()) > 100  # the scan sees the function-local imports (about 180 today)
    assert probe["unresolved"] == [], "\n".join(probe["unresolved"])
    if probe["skipped"]:
        print(f"not installed, not checked: {probe['skipped']}")
