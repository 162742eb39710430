"""The package's source files and the module names they import as (for tests/test_imports.py, test_packaging.py)."""

from __future__ import annotations

from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
SOURCES = {"prunefx": ROOT / "prunefx", "prunefx.cli": ROOT / "cli"}  # package name -> folder


def module_name(path: Path) -> str:
    """The dotted name ``path`` (a .py file under one of SOURCES) imports as."""
    for package, folder in SOURCES.items():
        if path.is_relative_to(folder):
            parts = path.relative_to(folder).with_suffix("").parts
            return ".".join([package, *parts[:-1]] + ([] if parts[-1] == "__init__" else [parts[-1]]))
    raise ValueError(path)


def source_files() -> list[Path]:
    """Every .py file of prunefx/ and cli/, sorted."""
    files = []
    for folder in SOURCES.values():
        # a link back to cli/ (worktrees make prunefx/cli one) is the same code under the same name
        files += [p for p in sorted(folder.rglob("*.py")) if "__pycache__" not in p.parts
                  and not p.relative_to(ROOT).as_posix().startswith("prunefx/cli/")]
    return files
