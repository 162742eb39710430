"""report.html / report_html without a browser: self-contained pages, the data they embed, the run's graph.json."""

from __future__ import annotations

import json
import re
from html.parser import HTMLParser
from pathlib import Path

import pytest
import torch
import torchvision

import prunefx
from prunefx.errors import PrunefxError
from prunefx.metrics import measure
from prunefx.report import Stage, build_report, groups_html, load_graph, write_graph, write_report
from prunefx.view import to_html
from prunefx.view.graph_data import graph_data

X = torch.randn(1, 3, 64, 64)


@pytest.fixture(scope="module")
def pruned():
    model = torchvision.models.resnet18().eval()
    base = Stage(measure(model, X), None, {"top1": 0.7})
    result = prunefx.prune(model, X, prunefx.PlanConfig(ratio=0.5))
    after = Stage(measure(model, X), None, {"top1": 0.6})
    widths = [(result.graph.groups[g.group].label, g.before, g.after) for g in result.plan.groups]
    report = build_report(model="torchvision:resnet18", baseline=base, pruned=after, widths=widths,
                          settings={"verify": result.verified.message})
    return result, report


class _Refs(HTMLParser):
    """Every tag and every src / href attribute of a page."""

    def __init__(self) -> None:
        super().__init__()
        self.tags: list[str] = []
        self.refs: list[str] = []

    def handle_starttag(self, tag, attrs):
        self.tags.append(tag)
        self.refs += [v for k, v in attrs if k in ("src", "href") and v is not None]


def embedded(page: str) -> dict:
    match = re.search(r'<script id="data" type="application/json">(.*?)</script>', page, re.S)
    assert match, "no data block"
    return json.loads(match.group(1))


def assert_self_contained(page: str) -> None:
    refs = _Refs()
    refs.feed(page)
    assert all(r.startswith(("data:", "#")) for r in refs.refs), refs.refs  # nothing fetched, not even a favicon
    assert "link" not in refs.tags or all(r.startswith("data:") for r in refs.refs)
    assert not re.search(r"<script[^>]*\bsrc=|@import|url\((?!#)", page)


def test_groups_page_is_one_file_with_the_graph_data_inside(pruned) -> None:
    result, _ = pruned
    data = graph_data(result.graph)
    page = groups_html(data)
    assert_self_contained(page)
    inside = embedded(page)
    assert inside["mode"] == "groups" and inside["graph"] == json.loads(json.dumps(data))
    lay = inside["layout"]
    assert len(lay["x"]) == len(lay["y"]) == len(lay["w"]) == len(data["nodes"])
    assert len(lay["edges"]) == len(data["edges"])


def test_markup_in_names_cannot_break_the_page(pruned) -> None:
    result, _ = pruned
    data = graph_data(result.graph)
    data["model"] = "</script><script>alert(1)</script>"
    data["nodes"][1]["label"] = "<b>conv</b>"
    page = groups_html(data)
    assert "<script>alert(1)" not in page and "<b>conv</b>" not in page
    assert embedded(page)["graph"]["model"] == data["model"]


def test_run_directory_gets_report_html_with_the_graph(pruned, tmp_path: Path) -> None:
    result, report = pruned
    write_graph(tmp_path, graph_data(result.graph, result.plan))
    written = {p.name for p in write_report(tmp_path, report)}
    assert "report.html" in written
    page = (tmp_path / "report.html").read_text()
    assert_self_contained(page)
    inside = embedded(page)
    assert inside["mode"] == "report" and inside["graph"] == load_graph(tmp_path)
    assert '<tr data-stage="pruned">' in page and "top1" in page


def test_run_without_graph_json_still_gets_its_widths(pruned, tmp_path: Path) -> None:
    _, report = pruned
    write_report(tmp_path, report)
    page = (tmp_path / "report.html").read_text()
    assert_self_contained(page)
    assert "no graph.json" in page and page.count("<td class=\"mono\">") == len(report["widths"])
    assert load_graph(tmp_path) is None


def test_a_foreign_graph_json_is_refused(tmp_path: Path) -> None:
    (tmp_path / "graph.json").write_text('{"schema": "something/2"}')
    with pytest.raises(PrunefxError, match="not a prunefx graph"):
        load_graph(tmp_path)
    (tmp_path / "graph.json").write_text("{")
    with pytest.raises(PrunefxError, match="not valid JSON"):
        load_graph(tmp_path)
    with pytest.raises(PrunefxError, match="not a prunefx graph"):
        write_graph(tmp_path, {"nodes": []})


def test_to_html_writes_the_page(pruned, tmp_path: Path) -> None:
    result, _ = pruned
    text = to_html(result.graph, path=tmp_path / "g.html")
    assert (tmp_path / "g.html").read_text() == text == groups_html(graph_data(result.graph))
    assert to_html(result.graph, result.plan) == groups_html(graph_data(result.graph, result.plan))
