"""What every experiment table shares: where it is written, CSV rows, markdown tables, the machine it ran on.

    rows -> write_csv(rows, out / f"{stem}.csv", FIELDS); md_table(header, cells) -> lines of report.md
    machine_info(threads=2, repeats="5 per model") -> {"date": ..., "machine": ..., "load average ...": ...}

Every experiment is ``main(argv) -> Path`` (the markdown it wrote) with ``--out`` defaulting to :data:`RESULTS`.
"""

from __future__ import annotations

import contextlib
import csv
import datetime as dt
import importlib.metadata
import os
import platform
import statistics
import subprocess
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "experiments" / "results"  # every experiment's default --out
RUNS = ROOT / "runs" / "experiments"  # run directories experiments make (git-ignored)


def median(values: Iterable[float]) -> float | None:
    """The median, or None for no values (a tool that never ran)."""
    values = list(values)
    return statistics.median(values) if values else None


def csv_value(v: Any, digits: int | None = None) -> Any:
    """A cell as the CSV stores it: None as empty, floats rounded to ``digits`` decimals when given."""
    if v is None:
        return ""
    return round(v, digits) if isinstance(v, float) and digits is not None else v


def write_csv(
    rows: Iterable[Mapping[str, Any]], path: Path, fields: Sequence[str], *, digits: int | None = None
) -> Path:
    """``rows`` (only ``fields``, in that order) as CSV at ``path``; floats rounded to ``digits`` when given."""
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=list(fields), extrasaction="ignore")
        w.writeheader()
        for row in rows:
            w.writerow({k: csv_value(row.get(k), digits) for k in fields})
    return path


def write_result(out: Path, stem: str, rows: Iterable[Mapping[str, Any]], fields: Sequence[str], markdown: str
                 ) -> None:
    """An experiment's ``<out>/<stem>.csv`` and ``<stem>.md`` (the markdown also printed)."""
    write_csv(rows, out / f"{stem}.csv", fields)
    (out / f"{stem}.md").write_text(markdown)
    print(markdown)


def read_csv(path: Path) -> list[dict[str, Any]]:
    """Rows of a CSV :func:`write_csv` wrote, numbers parsed back (empty cells as None)."""
    with path.open(newline="") as f:
        return [{k: _number(v) for k, v in row.items()} for row in csv.DictReader(f)]


def _number(text: str) -> Any:
    if text == "":
        return None
    for kind in (int, float):
        with contextlib.suppress(ValueError):
            return kind(text)
    return text


def md_table(header: Sequence[str], rows: Iterable[Sequence[Any]]) -> list[str]:
    """A markdown table as lines."""
    return [
        "| " + " | ".join(header) + " |",
        "|" + "|".join("---" for _ in header) + "|",
        *("| " + " | ".join(str(c) for c in row) + " |" for row in rows),
    ]


def git_commit() -> str:
    out = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True, cwd=ROOT)
    return out.stdout.strip() or "?"


def cpu_name() -> str:
    with contextlib.suppress(OSError):
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    return platform.processor() or platform.machine()


def machine_info(threads: int | None = None, **extra: str) -> dict[str, str]:
    """Date, CPU, load, threads and versions, as table-header lines; ``extra`` appends the experiment's own."""
    import torch

    import prunefx

    info = {
        "date": dt.datetime.now(dt.timezone.utc).strftime("%Y-%m-%d %H:%M UTC"),
        "machine": f"{cpu_name()}; {os.cpu_count()} logical CPUs, {len(os.sched_getaffinity(0))} usable by this "
                   "process",
        "load average at start (1/5/15 min)": " ".join(f"{v:.1f}" for v in os.getloadavg()),
        "torch threads": str(threads if threads is not None else torch.get_num_threads()),
        "python": platform.python_version(),
        "torch": torch.__version__,
    }
    with contextlib.suppress(importlib.metadata.PackageNotFoundError):
        info["torchvision"] = importlib.metadata.version("torchvision")
    info["prunefx"] = f"{prunefx.__version__} (git {git_commit()})"
    return info | extra
