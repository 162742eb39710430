"""Every table of report.html sits in a box that scrolls sideways, so a wide table never overflows the window."""

from __future__ import annotations

import re
from html.parser import HTMLParser

import pytest
import torch

from prunefx.metrics import measure
from prunefx.report import Stage, build_report, report_html
from prunefx.report.report_html import SCROLL
from prunefx.view.page import asset

X = torch.zeros(1, 3, 16, 16)


class _Tables(HTMLParser):
    """For each <table>, whether an open ancestor element has class ``SCROLL``."""

    VOID = {"meta", "link", "br", "img", "input", "hr", "col", "path"}

    def __init__(self) -> None:
        super().__init__()
        self.stack: list[tuple[str, bool]] = []
        self.wrapped: list[bool] = []

    def handle_starttag(self, tag, attrs):
        if tag == "table":
            self.wrapped.append(any(scrolls for _, scrolls in self.stack))
        if tag not in self.VOID:
            self.stack.append((tag, SCROLL in (dict(attrs).get("class") or "").split()))

    def handle_endtag(self, tag):
        while self.stack:  # close up to the matching element (tolerates implied ends such as </p>)
            if self.stack.pop()[0] == tag:
                break


def _report(controls: bool) -> dict:
    m = torch.nn.Sequential(torch.nn.Conv2d(3, 8, 3), torch.nn.Conv2d(8, 4, 3))
    small = torch.nn.Sequential(torch.nn.Conv2d(3, 4, 3), torch.nn.Conv2d(4, 4, 3))
    big, few = measure(m, (X,)), measure(small, (X,))
    runs = {"metric": "top1", "total_epochs": 4, "finetune_epochs": 1,
            "runs": [("narrow", "uniformly narrower", 4, Stage(few, None, {"top1": 0.5}))]}
    return build_report(model="m", baseline=Stage(big, None, {"top1": 0.9}), pruned=Stage(few, None, {"top1": 0.6}),
                        widths=[("0", 8, 4)], controls=runs if controls else None)


@pytest.mark.parametrize("controls", [False, True])
def test_every_table_is_in_a_scrolling_box(controls: bool) -> None:
    tables = _Tables()
    tables.feed(report_html(_report(controls)))  # no graph.json: the results and the widths table
    assert len(tables.wrapped) == (3 if controls else 2)
    assert all(tables.wrapped)


def test_the_box_scrolls_sideways_in_the_pages_stylesheet() -> None:
    # page.css is the only style the page's Content-Security-Policy allows: the rule must be there
    rule = re.search(r"\." + re.escape(SCROLL) + r"\s*\{([^}]*)\}", asset("page.css"))
    assert rule and re.search(r"overflow-x:\s*auto", rule.group(1))
