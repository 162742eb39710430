"""How long a fresh process takes to import torch, prunefx and its API, and to print ``prunefx --help``.

    python -m experiments.import_time [--quick] [--repeats 11]

Each candidate is one fresh ``python`` process, timed from start to exit (interpreter start-up included, so the
bare interpreter is a row too). Rounds alternate the candidates, in a rotated order each round, so load that
comes and goes falls on all of them alike; the table gives the median of the rounds and their range.
``prunefx --help`` runs what the console script runs (``from prunefx.cli.main import main; main()``), so it
needs no installed script.
"""

from __future__ import annotations

import argparse
import os
import shlex
import subprocess
import sys
import time
from pathlib import Path

from experiments import _table as table

FIELDS = ["candidate", "command", "repeats", "median_s", "min_s", "max_s"]
# name -> the code one fresh interpreter runs (argv after it: the console script's arguments)
CANDIDATES: dict[str, tuple[str, ...]] = {
    "python (nothing imported)": ("pass",),
    "import torch": ("import torch",),
    "import prunefx": ("import prunefx",),
    "from prunefx import prune (the API, first use)": ("from prunefx import prune",),
    "prunefx --help": ("from prunefx.cli.main import main; main()", "--help"),
}


def _time_once(code: tuple[str, ...]) -> float:
    t0 = time.perf_counter()
    subprocess.run([sys.executable, "-c", *code], check=True, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
                   cwd=table.ROOT)
    return time.perf_counter() - t0


def run(repeats: int) -> list[dict]:
    """Median, min and max wall time per candidate over ``repeats`` alternating rounds (one warm-up round first)."""
    names = list(CANDIDATES)
    times: dict[str, list[float]] = {n: [] for n in names}
    for n in names:  # warm-up: the first import of a package reads its files from disk, later ones from the cache
        _time_once(CANDIDATES[n])
    for r in range(repeats):
        for n in names[r % len(names):] + names[: r % len(names)]:
            times[n].append(_time_once(CANDIDATES[n]))
    return [{"candidate": n, "command": shlex.join(["python", "-c", *CANDIDATES[n]]), "repeats": repeats,
             "median_s": table.median(times[n]), "min_s": min(times[n]), "max_s": max(times[n])} for n in names]


def write(rows: list[dict], out: Path, stem: str, command: str, info: dict[str, str]) -> Path:
    out.mkdir(parents=True, exist_ok=True)
    table.write_csv(rows, out / f"{stem}.csv", FIELDS, digits=4)
    load = " ".join(f"{v:.1f}" for v in os.getloadavg())
    lines = ["# Import time: torch, prunefx, and `prunefx --help`", "",
             f"Command: `{command}`. Each row is a fresh process timed from start to exit "
             f"(interpreter start-up included); median [min, max] of {rows[0]['repeats']} rounds that alternate the "
             f"candidates (one warm-up round first). Load average (1/5/15 min) at the end: {load}.", "",
             *(f"- {k}: {v}" for k, v in info.items()), "",
             *table.md_table(["candidate", "command", "median s", "[min, max] s"],
                             [(r["candidate"], f"`{r['command']}`", f"{r['median_s']:.2f}",
                               f"[{r['min_s']:.2f}, {r['max_s']:.2f}]") for r in rows])]
    path = out / f"{stem}.md"
    path.write_text("\n".join(lines) + "\n")
    return path


def main(argv: list[str] | None = None) -> Path:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="2 rounds")
    ap.add_argument("--repeats", type=int, default=11)
    ap.add_argument("--out", type=Path, default=table.RESULTS)
    args = ap.parse_args(argv)
    repeats = 2 if args.quick else args.repeats
    command = "python -m experiments.run import_time" + ("".join(f" {a}" for a in argv) if argv else "")
    info = table.machine_info(repeats=f"{repeats} alternating rounds per candidate")
    rows = run(repeats)
    for r in rows:
        print(f"{r['candidate']}: {r['median_s']:.3f} s [{r['min_s']:.3f}, {r['max_s']:.3f}]", flush=True)
    return write(rows, args.out, "import_time_quick" if args.quick else "import_time", command, info)


if __name__ == "__main__":
    main(sys.argv[1:])
