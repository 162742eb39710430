"""Every Python block in README.md runs as pasted: each in a fresh interpreter, in an empty directory."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest

README = Path(__file__).resolve().parents[1] / "README.md"


def blocks(lang: str) -> list[tuple[int, str]]:
    """(line number, text) of every fenced block of ``lang`` in README.md."""
    text = README.read_text()
    out = []
    for m in re.finditer(rf"^```{lang}\n(.*?)^```", text, flags=re.M | re.S):
        out.append((text[: m.start()].count("\n") + 1, m.group(1)))
    return out


@pytest.mark.slow
@pytest.mark.parametrize("line,code", blocks("python"), ids=lambda v: f"line{v}" if isinstance(v, int) else "")
def test_python_block_runs_as_pasted(line: int, code: str, tmp_path: Path) -> None:
    proc = subprocess.run([sys.executable, "-c", code], cwd=tmp_path, capture_output=True, text=True, timeout=900)
    assert proc.returncode == 0, f"README.md line {line}:\n{proc.stderr[-3000:]}"


def test_readme_has_python_blocks() -> None:
    assert len(blocks("python")) >= 2  # the one-call API and the step-by-step API
