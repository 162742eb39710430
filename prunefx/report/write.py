"""A run's report files: ``write_report`` (report.json, report.md, report.html, PNG plots) and ``write_report_html``.

    write_report(run_dir, build_report(...))            # at the end of a run
    write_report_html(run_dir, load_report(run_dir))    # ``prunefx report RUN --html``: the page again

Both validate the report first. This module sits above the schema (``report.py``) and the renderers
(``render.py``, ``plots.py``, ``report_html.py``), none of which imports another's writer.
"""

from __future__ import annotations

import json
import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from prunefx._io import atomic_write
from prunefx.report.plots import (
    MISSING,
    accuracy_vs_flops_png,
    available,
    plottable_metric,
    sensitivity_png,
    widths_png,
)
from prunefx.report.render import render_markdown
from prunefx.report.report import JSON_NAME, validate_report
from prunefx.report.report_html import load_graph, report_html


def write_report(run_dir: str | os.PathLike[str], report: dict[str, Any]) -> list[Path]:
    """Validate ``report`` and write report.json, report.md, report.html and its PNG plots into ``run_dir``.

    Returns the written paths. ``widths.png`` needs widths; ``accuracy_vs_flops.png`` needs a sweep
    of at least two points with a shared metric; ``sensitivity.png`` the measured curves of a sensitivity plan
    (``settings["sensitivity"]``).
    """
    validate_report(report)
    out = Path(run_dir)
    out.mkdir(parents=True, exist_ok=True)
    files = {JSON_NAME: (json.dumps(report, indent=2, allow_nan=False) + "\n").encode()}
    drawn = available()
    if report["widths"] and drawn:
        target = (report.get("settings") or {}).get("target")
        if isinstance(target, Mapping):
            target = ", ".join(f"{k} {v}" for k, v in target.items())
        title = f"{report['model']}" + (f", target: {target}" if target else "")
        files["widths.png"] = widths_png(report["widths"], title)
    curves = (report.get("settings") or {}).get("sensitivity")
    if isinstance(curves, Mapping) and curves.get("curves") and drawn:  # scope "sensitivity": what it planned on
        files["sensitivity.png"] = sensitivity_png(curves, report["model"])
    if plottable_metric(report["sweep"]) is not None and drawn:
        files["accuracy_vs_flops.png"] = accuracy_vs_flops_png(report["sweep"], report["stages"]["baseline"])
    markdown = render_markdown(report, plots=[n for n in files if n.endswith(".png")])
    files["report.md"] = (markdown if drawn else f"{markdown.rstrip()}\n\n{MISSING}\n").encode()
    files["report.html"] = report_html(report, load_graph(out)).encode()  # the graph from graph.json, when there
    for name, data in files.items():
        atomic_write(out / name, data, root=out)  # a link planted in the run is refused, not written through
    return [out / name for name in files]


def write_report_html(run_dir: str | os.PathLike[str], report: Mapping[str, Any]) -> Path:
    """(Re)write ``run_dir/report.html`` from ``report`` and the run's graph.json; returns its path."""
    validate_report(report)
    page = report_html(report, load_graph(run_dir)).encode()
    return atomic_write(Path(run_dir) / "report.html", page, root=run_dir)
