"""Dependencies point down: every import inside prunefx is checked against the allowed directions (LAYOUT.md)."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
CORE = {"capture", "passes", "analysis", "importance", "plan", "transform", "verify", "checkpoint", "steps",
        "sensitivity", "compensation", "api", "depth"}
BASE = {"errors", "_io", "_plugins", "_config", "_state", "_gc", "_defaults", "_extras", "_renamed", "_registry"}
# unit -> the units it may import (besides itself and BASE)
ALLOWED: dict[str, set[str]] = {
    "capture": set(),
    "passes": {"capture"},  # model -> model rewrites that keep the function (fold_bn)
    "analysis": {"capture"},
    "metrics": {"capture", "passes"},  # timed as deployed (BatchNorm folded); keyword inputs bound as captured
    "importance": {"analysis", "capture"},
    "plan": {"analysis", "capture", "importance", "metrics", "passes"},
    "transform": {"analysis", "capture", "plan"},
    "verify": {"analysis", "capture", "plan"},
    "view": {"analysis", "capture", "plan"},  # the graph page: an analysed graph and its plan, drawn as HTML
    "checkpoint": {"analysis", "capture", "plan", "transform"},
    # k cuts composed into one plan; the cut itself is api's
    "steps": {"analysis", "capture", "plan", "transform", "verify"},
    # measured sensitivity: prunes copies of the model (transform) to measure the damage curves a plan reads
    "sensitivity": {"analysis", "capture", "importance", "plan", "transform"},
    # depth pruning: residual blocks found, scored on data, removed, checked by its own oracle
    "depth": {"analysis", "capture", "plan", "transform", "verify", "sensitivity"},
    # whether prune() compensates biases: measured on held-out calibration batches (as sensitivity measures damage)
    "compensation": {"analysis", "capture", "importance", "plan", "transform", "sensitivity"},
    "api": {"analysis", "capture", "importance", "metrics", "plan", "transform", "verify", "steps", "sensitivity",
            "compensation"},
    "onnx_export": {"capture", "metrics", "passes"},  # ONNX files checked with ONNX Runtime
    "deploy": {"capture", "metrics", "passes", "onnx_export"},  # int8 with ONNX Runtime, checked against float
    "report": {"metrics", "view"},  # report.html draws a run's graph.json with the view's page
    "data": set(),
    "train": {"analysis", "capture", "data"},
    "zoo": set(),
    # example tasks for the custom pipeline (configs/sine.yaml): torch, and data's language-model windows
    "examples": {"data"},
    "inputs": {"capture"},  # example inputs from text (--input shapes, tensor files) as capture's Inputs
    "family": {"checkpoint", "onnx_export", "plan"},  # how a model's library saves, exports and costs it
    "integrations": CORE | {"metrics", "train", "data", "report", "view", "integrations", "onnx_export", "family"},
    "spec": CORE | {"integrations", "metrics", "family", "inputs"},
    "pipeline": CORE
    # examples: the llm task's embedded default (the stdlib-trained Llama and its corpus)
    | {"metrics", "report", "view", "train", "data", "integrations", "spec", "zoo", "family", "examples", "__init__"},
    "cli": CORE
    | {"metrics", "report", "view", "train", "data", "integrations", "spec", "zoo", "pipeline", "onnx_export", "family",
       "inputs", "__init__", "deploy"},
    # the public names: prunefx.recover is train's, prunefx.quantize deploy's, imported on use
    "__init__": CORE | {"integrations", "train", "deploy"},
}
UNITS = set(ALLOWED) | BASE
# Libraries the core must never import, not even lazily inside a function.
FORBIDDEN_IN_CORE = ("torchvision", "ultralytics", "typer", "timm", "transformers")


def _files() -> list[tuple[str, Path]]:
    out = [(str(p.relative_to(ROOT / "prunefx").with_suffix("")), p) for p in (ROOT / "prunefx").rglob("*.py")]
    out += [("cli/" + p.stem, p) for p in (ROOT / "cli").glob("*.py")]
    return out


def _unit(rel: str) -> str:
    head = rel.split("/")[0]
    return head if head in ALLOWED or head in BASE else rel


def _imports(path: Path) -> list[tuple[str, int]]:
    tree = ast.parse(path.read_text(), filename=str(path))
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found += [(a.name, node.lineno) for a in node.names]
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            if node.module == "prunefx":  # from prunefx import x: x is a unit, or a name of the public facade
                found += [(f"prunefx.{a.name if a.name in UNITS else '__init__'}", node.lineno) for a in node.names]
            else:
                found.append((node.module, node.lineno))
        elif isinstance(node, ast.ImportFrom) and node.level:
            found.append(("<relative>", node.lineno))
    return found


@pytest.mark.parametrize("rel,path", _files(), ids=lambda x: str(x) if isinstance(x, str) else "")
def test_imports_point_down(rel: str, path: Path) -> None:
    unit = _unit(rel)
    assert unit in ALLOWED or unit in BASE, f"{rel}: not placed in the layering table (tests/test_layering.py)"
    allowed = ALLOWED.get(unit, set()) | BASE | {unit}
    bad = []
    for module, line in _imports(path):
        if module == "<relative>":
            bad.append(f"line {line}: relative import (use absolute prunefx.* imports)")
            continue
        parts = module.split(".")
        if parts[0] == "prunefx" and len(parts) > 1:
            target = parts[1]
            if target not in allowed and not (unit == "cli" and target == "cli"):
                bad.append(f"line {line}: {unit} imports prunefx.{target}")
        elif unit in CORE and parts[0] in FORBIDDEN_IN_CORE:
            bad.append(f"line {line}: the core imports {parts[0]}")
    assert not bad, f"{path.relative_to(ROOT)}: " + "; ".join(bad)


def test_every_unit_in_the_table_exists() -> None:
    units = {_unit(rel) for rel, _ in _files()}
    assert set(ALLOWED) - {"__init__"} <= units | {"__init__"}, set(ALLOWED) - units


def _module(rel: str) -> str:
    """The dotted name a file of ``_files()`` imports as (``analysis/__init__`` -> ``prunefx.analysis``)."""
    return ".".join(["prunefx", *rel.split("/")]).removesuffix(".__init__")


def test_no_two_modules_import_each_other() -> None:
    """A circle inside one folder (analysis/graph <-> view, report <-> report_html) is read in no order at all."""
    deps = {_module(rel): {m for m, _ in _imports(path)} for rel, path in _files()}
    circles = sorted(f"{a} <-> {b}" for a in deps for b in deps[a] if a < b and a in deps.get(b, ()))
    assert not circles, circles


def _layout_rows() -> list[set[str]]:
    """The units each row of LAYOUT.md's table names, top (imported by everything below) to bottom."""
    import re

    text = (ROOT / "prunefx" / "LAYOUT.md").read_text()
    rows = []
    for line in text.splitlines():
        first = line.split("|")[1] if line.startswith("| `") else ""
        names = {re.sub(r"\.py$|/$", "", n) for n in re.findall(r"`([\w./]+)`", first)}
        if names:
            rows.append({n for n in names if n in ALLOWED})
    return rows


def test_layout_lists_units_in_import_order() -> None:
    """LAYOUT.md's floor rule holds: a unit may import only units of its own row or the rows above it."""
    rows = _layout_rows()
    listed = set().union(*rows)
    assert set(ALLOWED) <= listed, f"units missing from LAYOUT.md: {sorted(set(ALLOWED) - listed)}"
    above: set[str] = set()
    bad = []
    for row in rows:
        above |= row
        bad += [f"{u} imports {sorted(ALLOWED[u] - above)}, listed below it" for u in sorted(row) if ALLOWED[u] - above]
    assert not bad, "; ".join(bad)
