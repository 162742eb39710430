"""Regenerate the docs' result tables from experiments/results: ``python -m experiments.readme [--check]``.

The Results page of the docs (``docs/results.md``), and README.md for the main job's table, hold between
``<!-- results:NAME -->`` and ``<!-- /results:NAME -->`` markers a copy of the generated
``experiments/results/NAME.md`` (its table and the line with the command that made it; for long files their
``## Summary`` section). Text outside the markers is written by people. ``--check`` exits 1 when a page is out
of date instead of rewriting it. The source files are named as paths, not linked: they lie outside the docs site
(``mkdocs build --strict`` refuses links to them).
"""

from __future__ import annotations

import argparse
import re
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "experiments" / "results"
PAGES = (ROOT / "docs" / "results.md", ROOT / "README.md")  # the pages holding markers
_BLOCK = re.compile(r"(<!-- results:(?P<name>[\w-]+) -->\n)(?P<body>.*?)(<!-- /results:(?P=name) -->)", re.S)


def excerpt(name: str) -> str:
    """What the Results page shows of ``results/NAME.md``: command/setup lines and the table, or its summary."""
    path = RESULTS / f"{name}.md"
    if not path.is_file():
        return f"_`experiments/results/{name}.md` has not been generated yet._\n"
    text = path.read_text()
    if "\n## Summary" in text:  # long per-model tables: the summary, the file for the rest
        summary = text.split("\n## Summary", 1)[1].split("\n## ", 1)[0].strip("\n")
        source = f"experiments/results/{name}.md"
        return f"From `{source}` (per-model rows there):\n\n{summary}\n"
    lines = text.splitlines()
    about = [line for line in lines[1:] if line.startswith(("Command", "Machine", "mAP", "Setup"))]
    table = [line for line in lines[1:] if line.startswith("|")]
    return (
        "\n".join([*about, "", *table])
        + f"\n\nSource: `experiments/results/{name}.md`.\n"
    )


def render(page: str) -> str:
    return _BLOCK.sub(lambda m: m.group(1) + excerpt(m.group("name")) + m.group(4), page)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--check", action="store_true", help="exit 1 if a page is out of date, write nothing")
    ap.add_argument("--page", type=Path, nargs="+", default=list(PAGES), help="the pages holding the markers")
    args = ap.parse_args(argv)
    stale = 0
    for page in args.page:
        old = page.read_text()
        new = render(old)
        if new == old:
            continue
        if args.check:
            print(f"{page} is out of date: run python -m experiments.readme")
            stale += 1
        else:
            page.write_text(new)
    return 1 if stale else 0

if __name__ == "__main__":
    sys.exit(main())
