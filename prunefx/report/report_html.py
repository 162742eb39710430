"""report.html of a pruning run: the metric table, the plan's decisions and the graph with kept / total per layer.

    write_graph(run_dir, graph_data(result.graph, result.plan))   # at prune time, next to plan.json
    page = report_html(report, load_graph(run_dir))              # report.json's numbers + graph.json's graph

A run keeps its graph as ``graph.json`` (``prunefx.view.graph_data`` schema) so that the page can be redrawn
later (``prunefx report RUN --html``) without the model.
"""

from __future__ import annotations

import html
import json
import os
import re
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from prunefx._io import atomic_write, read_json
from prunefx.errors import PrunefxError
from prunefx.report.render import _COST_COLUMNS, _metric_names, _row, controls_table, report_warnings
from prunefx.report.verdict import verdict
from prunefx.view.page import asset, csp, graph_page
from prunefx.view.schema import GRAPH_SCHEMA, GraphError, validate_graph

GRAPH_NAME = "graph.json"  # in a run directory, next to plan.json
_BOLD = re.compile(r"[*][*](.+?)[*][*]")  # markdown emphasis in verdict()
_STRONG = r"<strong>\1</strong>"
SCROLL = "scroll-x"  # the class of the box every table sits in: page.css lets it scroll sideways (overflow-x: auto)


def write_graph(run_dir: str | os.PathLike[str], graph: Mapping[str, Any]) -> Path:
    """Save ``graph`` (``graph_data(dg, plan)``) as ``run_dir/graph.json``, which report.html is drawn from."""
    if graph.get("schema") != GRAPH_SCHEMA:
        raise PrunefxError(f"not a prunefx graph (schema {graph.get('schema')!r}); pass graph_data(dg, plan)")
    text = json.dumps(graph, separators=(",", ":"), allow_nan=False)
    return atomic_write(Path(run_dir) / GRAPH_NAME, text.encode(), root=run_dir)


def load_graph(run_dir: str | os.PathLike[str]) -> dict[str, Any] | None:
    """``run_dir/graph.json`` (None when the run has none), validated field by field (``prunefx.view.schema``).

    A file of another schema, or one any field of which has the wrong type or points outside the graph, is an error:
    the directory may be shared, and the file's values are drawn into report.html.
    """
    path = Path(run_dir) / GRAPH_NAME
    if not path.exists() and not path.is_symlink():
        return None
    data = read_json(path, PrunefxError, missing=f"{path} is a broken link; remove it or re-run the pruning",
                     what="is not valid JSON", fix="re-run the pruning to regenerate it")
    if not isinstance(data, dict) or data.get("schema") != GRAPH_SCHEMA:
        got = data.get("schema") if isinstance(data, dict) else type(data).__name__
        raise PrunefxError(f"{path} is not a prunefx graph (schema {got!r}, expected {GRAPH_SCHEMA!r}); "
                           "re-run the pruning to regenerate it")
    try:
        validate_graph(data)
    except GraphError as exc:
        raise GraphError(f"{path} is not a valid prunefx graph: {exc}; re-run the pruning to regenerate it") from exc
    return data


def _scrolling(table: str) -> str:
    """``table`` in a box that scrolls sideways, so a wide table never overflows the page."""
    return f'<div class="{SCROLL}">{table}</div>'


def _warnings(report: Mapping[str, Any]) -> str:
    """The report's warnings, report.md's list (``render.report_warnings``), for the top of the page."""
    items = "".join(f"<li><strong>warning</strong>: {html.escape(w)}</li>" for w in report_warnings(report))
    return f'<div class="warnings" role="alert"><h3>Warnings</h3><ul>{items}</ul></div>' if items else ""


def _metrics_table(report: Mapping[str, Any]) -> str:
    """The stages' costs and metrics, with report.md's cells (``render._row``)."""
    stages = report["stages"]
    metrics = _metric_names(stages)
    head = "".join(f"<th>{html.escape(c)}</th>" for c in ("stage", *_COST_COLUMNS, *metrics))
    rows = "".join(
        f'<tr data-stage="{html.escape(name)}"><td>{html.escape(name)}</td>'
        + "".join(f"<td>{html.escape(cell)}</td>" for cell in _row(stage, metrics)) + "</tr>"
        for name, stage in stages.items()
    )
    return _scrolling(f'<table class="metrics"><thead><tr>{head}</tr></thead><tbody>{rows}</tbody></table>')


def _controls(report: Mapping[str, Any]) -> str:
    """The controls' table and the verdict, as report.md ends with them (empty when the run has no controls)."""
    table = controls_table(report)
    if table is None:
        return ""
    header, rows = table
    head = "".join(f"<th>{html.escape(c)}</th>" for c in header)
    body = "".join("<tr>" + "".join(f"<td>{html.escape(c)}</td>" for c in row) + "</tr>" for row in rows)
    # verdict() writes markdown bold around the sentences that answer the question; keep that emphasis
    sentences = "".join(f'<p class="verdict">{_BOLD.sub(_STRONG, html.escape(line))}</p>' for line in verdict(report))
    table = f'<table class="metrics controls"><thead><tr>{head}</tr></thead><tbody>{body}</tbody></table>'
    return f"<h3>Controls</h3>{_scrolling(table)}<h3>Verdict</h3>{sentences}"


def _section(report: Mapping[str, Any]) -> str:
    settings = report.get("settings", {})
    notes = [f"Created {report['created']} with prunefx {report['prunefx']}. Costs: relative change vs baseline in "
             "parentheses; metrics: absolute change. FLOPs = 2 x MACs."]
    if isinstance(settings.get("verify"), str):
        notes.append(f"verify (pruned model vs the masked original): {settings['verify']}")
    paragraphs = "".join(f'<p class="note">{html.escape(n)}</p>' for n in notes)
    stages = " / ".join(report["stages"])
    return (f'<section class="report">{_warnings(report)}<details open><summary>Results: {html.escape(stages)}'
            f"</summary>{_metrics_table(report)}{paragraphs}{_controls(report)}</details></section>")


def _widths_only(title: str, report: Mapping[str, Any]) -> str:
    """The page of a run without graph.json: the results and the widths per group as a table."""
    rows = "".join(
        f'<tr><td class="mono">{html.escape(w["name"])}</td><td class="num">{w["before"]}</td>'
        f'<td class="num">{w["after"]}</td></tr>' for w in report["widths"]
    )
    table = _scrolling(f'<table class="list"><tr><th>group</th><th>before</th><th>after</th></tr>{rows}</table>')
    return (f'<!doctype html><html lang="en"><head><meta charset="utf-8">'
            f'<meta http-equiv="Content-Security-Policy" content="{csp(script=False)}"><link rel="icon" href="data:,">'
            f"<title>{html.escape(title)}</title><style>{asset('page.css')}</style></head><body class=\"report\">"
            f"<header><h1>{html.escape(title)}</h1></header>{_section(report)}"
            '<main><aside id="panel" class="wide"><p class="empty">This run has no graph.json (written next to '
            "plan.json when the model is pruned), so the graph cannot be drawn. Widths per group:</p>"
            f"{table}</aside></main>"
            "</body></html>\n")


def report_html(report: Mapping[str, Any], graph: Mapping[str, Any] | None = None) -> str:
    """report.html: the metric table, and with ``graph`` the plan's per-group decisions and kept / total per node."""
    title = f"prunefx report: {report['model']}"
    if graph is None:
        return _widths_only(title, report)
    return graph_page(title, graph["plan"]["summary"] if graph.get("plan") else "", graph, report=_section(report))
