"""The HTML view of an analysed graph and its plan: ``to_html``; ``graph_data`` (the graph and the plan as plain
data), ``layout`` (the layered layout) and ``page`` (the self-contained page) with its ``assets/``.

    prunefx.view.to_html(dg, path="groups.html")              # what ``prunefx analyze SPEC --html F`` writes
    text = prunefx.view.to_html(result.graph, result.plan)    # plus kept / total per node and the plan's decisions

It sits above the plan (it draws one) and below the report and the pipeline, which draw a run's graph.json with it.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

from prunefx.view.page import groups_html

if TYPE_CHECKING:
    from prunefx.analysis.graph import DependencyGraph
    from prunefx.plan.plan import PruningPlan

__all__ = ["to_html"]


def to_html(dg: DependencyGraph, plan: PruningPlan | None = None, path: str | Path | None = None) -> str:
    """A self-contained interactive page of ``dg``, its groups and ``plan``'s decisions (written to ``path`` if set)."""
    # graph_data imports torch and the analysis; prunefx.report imports only the page, so it pays for neither
    from prunefx.view.graph_data import graph_data

    text = groups_html(graph_data(dg, plan))
    if path is not None:
        Path(path).write_text(text, encoding="utf-8")
    return text
