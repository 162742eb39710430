"""report.md and report.html list the same warnings, every one, before the results."""

from __future__ import annotations

from html.parser import HTMLParser
from pathlib import Path

import pytest
import torch

from prunefx.metrics import measure
from prunefx.report import Stage, build_report, write_report

X = torch.zeros(1, 3, 16, 16)
WARNINGS = ["top1 is tied between baseline and pruned", "latency <b>noisy</b> & unreliable: load 7.5 on 2 cores"]


class _Order(HTMLParser):
    """The text of each <li> inside the warnings box, and where (in start tags seen) the box and the tables begin."""

    def __init__(self) -> None:
        super().__init__()
        self.tags = 0
        self.warnings_at: int | None = None
        self.tables_at: list[int] = []
        self.items: list[str] = []
        self._in_li = False

    def handle_starttag(self, tag, attrs):
        self.tags += 1
        if "warnings" in (dict(attrs).get("class") or "").split() and self.warnings_at is None:
            self.warnings_at = self.tags
        if tag == "table":
            self.tables_at.append(self.tags)
        if tag == "li" and self.warnings_at is not None and not self.tables_at:
            self._in_li = True
            self.items.append("")

    def handle_endtag(self, tag):
        if tag == "li":
            self._in_li = False

    def handle_data(self, data):
        if self._in_li:
            self.items[-1] += data


@pytest.fixture(scope="module")
def report() -> dict:
    m = torch.nn.Sequential(torch.nn.Conv2d(3, 8, 3), torch.nn.Conv2d(8, 4, 3))
    small = torch.nn.Sequential(torch.nn.Conv2d(3, 4, 3), torch.nn.Conv2d(4, 4, 3))
    return build_report(model="m", baseline=Stage(measure(m, (X,)), None, {"top1": 0.9}),
                        pruned=Stage(measure(small, (X,)), None, {"top1": 0.9}), widths=[("0", 8, 4)],
                        warnings=WARNINGS)


def test_both_files_list_every_warning_and_the_page_shows_them_before_the_tables(report: dict,
                                                                                 tmp_path: Path) -> None:
    write_report(tmp_path, report)
    md = (tmp_path / "report.md").read_text()
    for w in WARNINGS:
        assert f"- **warning**: {w}" in md
    assert md.index("## Warnings") < md.index("| stage |")  # first in report.md too
    page = _Order()
    page.feed((tmp_path / "report.html").read_text())
    assert page.items == [f"warning: {w}" for w in WARNINGS]  # each, in order, its markup shown as text
    assert page.warnings_at is not None and page.tables_at and page.warnings_at < min(page.tables_at)


def test_no_warnings_no_box(report: dict, tmp_path: Path) -> None:
    write_report(tmp_path, {**report, "warnings": []})
    page = _Order()
    page.feed((tmp_path / "report.html").read_text())
    assert page.warnings_at is None
    assert "## Warnings" not in (tmp_path / "report.md").read_text()
