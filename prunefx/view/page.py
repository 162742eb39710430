"""The graph page: one self-contained HTML file that draws an analysed graph and its channel groups.

    text = groups_html(graph_data(dg))    # what ``prunefx.view.to_html`` and ``prunefx analyze SPEC --html F`` write

The CSS, the script and the data are inline and nothing is fetched, so the page opens from disk (file://)
in any browser, offline. Its Content-Security-Policy (``csp``) lets only that script and that style run: nothing
remote, no inline handler, no other script, so a run directory's graph.json cannot bring code into the page.
The layout of the whole graph is computed here (``prunefx.view.layout``), which keeps graphs of 1,000+ nodes
quick when every block is expanded; the page opens with the module blocks collapsed (``graph.modules``) and lays
out such a view itself with the same layered scheme, then handles selection, search, filter, zoom and pan.
This module takes plain data
(``prunefx.view.graph_data``) and imports nothing else from prunefx.
"""

from __future__ import annotations

import base64
import hashlib
import html
import json
import re
from collections.abc import Mapping
from functools import cache
from pathlib import Path
from typing import Any

from prunefx.view.layout import layout

ASSETS = Path(__file__).with_name("assets")
_MAX_LABEL = 40  # characters drawn in a box; longer names keep their tail ("...layers.conv_b.0")
_CHAR_PX = 6.7  # average advance of an 11px sans-serif character: box widths are computed without a browser


@cache
def asset(name: str) -> str:
    """The text of a file in ``assets/`` (template, style, script)."""
    return (ASSETS / name).read_text(encoding="utf-8")


@cache
def _sha256(name: str) -> str:
    """The CSP source that allows exactly the inlined text of asset ``name``."""
    digest = hashlib.sha256(asset(name).encode("utf-8")).digest()
    return f"'sha256-{base64.b64encode(digest).decode()}'"


def csp(*, script: bool) -> str:
    """The pages' Content-Security-Policy: the inlined page.css (and with ``script`` page.js), nothing else.

    default-src 'none' refuses every fetch, inline handler and other script; data: images are the favicon.
    """
    scripts = _sha256("page.js") if script else "'none'"
    return "; ".join(["default-src 'none'", f"script-src {scripts}", f"style-src {_sha256('page.css')}",
                      "img-src data:", "base-uri 'none'", "form-action 'none'"])


def _fill(template: str, values: Mapping[str, str]) -> str:
    """Replace every ``{{KEY}}`` in one pass (text put in is never scanned again)."""
    return re.sub(r"\{\{([A-Z]+)\}\}", lambda m: values[m.group(1)], template)


def _json_script(data: Any) -> str:
    """JSON safe inside <script>: '<' only occurs in strings, where \\u003c means the same."""
    return json.dumps(data, separators=(",", ":"), allow_nan=False).replace("<", "\\u003c")


def _short(label: str) -> str:
    return label if len(label) <= _MAX_LABEL else "\u2026" + label[-(_MAX_LABEL - 1):]


def _layout_data(graph: Mapping[str, Any], kept: bool) -> dict[str, Any]:
    """Box texts and widths (``kept``: room for 'k/n'), the layout of the whole graph, the metrics of block boxes."""
    texts, widths = [], []
    for n in graph["nodes"]:
        text = _short(n["label"])
        chars = len(text)
        total = sum(c for _, c in n["chan"])
        if kept and total and n.get("kept", total) < total:
            chars += len(f"  {n['kept']}/{total}")
        texts.append(text)
        widths.append(round(max(44.0, chars * _CHAR_PX + 16), 1))
    inputs = [i for i, n in enumerate(graph["nodes"]) if n["op"] == "placeholder"]
    lay = layout(widths, [tuple(e) for e in graph["edges"]], inputs)  # every block expanded: drawn as it is
    return {
        "x": lay.x, "y": lay.y, "w": widths, "text": texts, "node_height": lay.node_height,
        "width": lay.width, "height": lay.height, "edges": lay.edges, "trunks": lay.trunks,
        "char_px": _CHAR_PX, "max_label": _MAX_LABEL,
    }


def graph_page(title: str, subtitle: str, graph: Mapping[str, Any], *, report: str = "") -> str:
    """The page around ``graph`` (``graph_data``); ``report``: an HTML section shown above the graph, which
    also turns on the report view (kept / total per node, the plan's decisions, colour by kept fraction)."""
    mode = "report" if report else "groups"
    colour = ('<select id="colour" title="what the fill shows"><option value="groups">colour: groups</option>'
              '<option value="kept">colour: kept fraction</option></select>') if report else ""
    data = {"mode": mode, "graph": graph, "layout": _layout_data(graph, bool(report))}
    return _fill(asset("page.html"), {
        "TITLE": html.escape(title), "SUBTITLE": html.escape(subtitle), "MODE": mode, "REPORT": report,
        "COLOUR": colour, "CSS": asset("page.css"), "JS": asset("page.js"), "DATA": _json_script(data),
        "CSP": csp(script=True),
    })


def groups_html(graph: Mapping[str, Any]) -> str:
    """The analysis page: the graph top to bottom, each group in its colour; click a node for its groups."""
    s = graph["summary"]
    return graph_page(f"prunefx: {graph['model']}", f"{s['groups']} channel groups, {s['prunable_groups']} prunable",
                      graph)
