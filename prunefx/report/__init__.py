"""Pruning-run reports: report.json (validated schema), report.md, report.html, PNG plots and a terminal table.

>>> report = build_report(model="resnet50", baseline=Stage(m0, lat0, {"top1": 0.76}), pruned=Stage(m1, lat1))
>>> write_report("runs/r50", report); render_table(load_report("runs/r50"))
"""

from prunefx.report.render import refit_line, render_markdown, render_table
from prunefx.report.report import SCHEMA, ReportError, Stage, SweepPoint, build_report, load_report, validate_report
from prunefx.report.report_html import load_graph, report_html, write_graph
from prunefx.report.write import write_report, write_report_html
from prunefx.view.page import groups_html
from prunefx.view.schema import GraphError, validate_graph

__all__ = [
    "SCHEMA",
    "GraphError",
    "ReportError",
    "Stage",
    "SweepPoint",
    "build_report",
    "groups_html",
    "load_graph",
    "report_html",
    "write_graph",
    "write_report_html",
    "load_report",
    "refit_line",
    "render_markdown",
    "render_table",
    "validate_graph",
    "validate_report",
    "write_report",
]
