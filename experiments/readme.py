"""Regenerate README.md's tables from experiments/results: ``python -m experiments.readme [--check]``.

The README's Results section holds, between ``<!-- results:NAME -->`` and ``<!-- /results:NAME -->`` markers,
a copy of the generated ``experiments/results/NAME.md`` (its table and the line with the command that made
it; for long files their ``## Summary`` section). Text outside the markers is written by people. ``--check``
exits 1 when the README is out of date instead of rewriting it.
"""

from __future__ import annotations

import argparse
import re
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "experiments" / "results"
_BLOCK = re.compile(r"(<!-- results:(?P<name>[\w-]+) -->\n)(?P<body>.*?)(<!-- /results:(?P=name) -->)", re.S)


def excerpt(name: str) -> str:
    """What the README shows of ``results/NAME.md``: command/setup lines and the table, or its summary."""
    path = RESULTS / f"{name}.md"
    if not path.is_file():
        return f"_`experiments/results/{name}.md` has not been generated yet._\n"
    text = path.read_text()
    if "\n## Summary" in text:  # long per-model tables: the summary, the file for the rest
        summary = text.split("\n## Summary", 1)[1].split("\n## ", 1)[0].strip("\n")
        source = f"experiments/results/{name}.md"
        return f"From [`{source}`]({source}) (per-model rows there):\n\n{summary}\n"
    lines = text.splitlines()
    about = [line for line in lines[1:] if line.startswith(("Command", "Machine", "mAP", "Setup"))]
    table = [line for line in lines[1:] if line.startswith("|")]
    return (
        "\n".join([*about, "", *table])
        + f"\n\nSource: [`experiments/results/{name}.md`](experiments/results/{name}.md).\n"
    )


def render(readme: str) -> str:
    return _BLOCK.sub(lambda m: m.group(1) + excerpt(m.group("name")) + m.group(4), readme)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--check", action="store_true", help="exit 1 if README.md is out of date, write nothing")
    ap.add_argument("--readme", type=Path, default=ROOT / "README.md")
    args = ap.parse_args(argv)
    old = args.readme.read_text()
    new = render(old)
    if args.check:
        if new != old:
            print(f"{args.readme} is out of date: run python -m experiments.readme")
            return 1
        return 0
    args.readme.write_text(new)
    return 0


if __name__ == "__main__":
    sys.exit(main())
