"""A planted graph.json (a run directory may be shared): the loader refuses markup in any typed field and any index
outside the graph, and every page allows only its own inlined script and style (no handler, nothing remote)."""

from __future__ import annotations

import base64
import hashlib
import json
import re
from html.parser import HTMLParser
from pathlib import Path

import pytest
from _hostile_graph import NOT_TEXT, PAYLOAD, TEXT, field, leaves, planted, sample_run, where

from prunefx.errors import PrunefxError
from prunefx.report import groups_html, load_graph, report_html
from prunefx.view.page import asset


@pytest.fixture(scope="module")
def sample() -> tuple[dict, dict]:
    return sample_run()


def _plant(run: Path, graph: dict) -> Path:
    (run / "graph.json").write_text(json.dumps(graph))
    return run


def test_markup_in_any_typed_field_of_a_planted_graph_json_is_refused(sample, tmp_path: Path) -> None:
    graph, _ = sample
    assert load_graph(_plant(tmp_path, graph)) == graph  # the real thing loads
    accepted, refused, seen = [], [], set()
    for path, _value in leaves(graph):
        if field(path) in seen:  # one occurrence of each field
            continue
        seen.add(field(path))
        try:
            load_graph(_plant(tmp_path, planted(graph, path, PAYLOAD)))
        except PrunefxError as exc:
            named = "schema" if path == ("schema",) else where(path)
            assert named in str(exc), (named, str(exc))  # the message names the field
            refused.append(field(path))
        else:
            accepted.append(field(path))
    assert sorted(accepted) == sorted(TEXT & seen)  # only free text loads; the page escapes it
    assert set(refused) >= NOT_TEXT and len(refused) >= 25, refused  # ids, counts, indices, flags, op names
    assert len(seen) >= 45  # the sample fills in (nearly) every field of the schema


@pytest.mark.parametrize("damage,message", [
    pytest.param(lambda g: g["edges"].append([0, len(g["nodes"])]), "edges[", id="edge to no node"),
    pytest.param(lambda g: g["edges"].append([3, 1]), "not a forward edge", id="backward edge"),
    pytest.param(lambda g: g["nodes"][1]["chan"].append([999, 1]), "nodes[1].chan", id="unknown group in a node"),
    pytest.param(lambda g: g["groups"][0]["members"][0]["node"].append(10**6), "groups[0]", id="member on no node"),
    pytest.param(lambda g: g["ties"].append({"groups": [999], "why": "x"}), "ties[", id="tie with an unknown group"),
    pytest.param(lambda g: g["groups"][1].update(id=g["groups"][0]["id"]), "distinct", id="duplicate group id"),
    pytest.param(lambda g: g["summary"].update(nodes=1), "summary.nodes", id="summary that does not count"),
    pytest.param(lambda g: g["nodes"][1].update(kept=10**6), "nodes[1].kept", id="more kept than there are"),
    pytest.param(lambda g: g["nodes"][1].update(module="no.such.block"), "nodes[1].module", id="node in no block"),
    pytest.param(lambda g: g["modules"][0].update(parent=len(g["modules"])), "modules[0].parent",
                 id="block inside a later block"),
    pytest.param(lambda g: g["modules"].append(dict(g["modules"][0])), "distinct", id="two blocks, one path"),
    pytest.param(lambda g: g["nodes"][1].pop("kept"), "nodes[1].kept", id="kept missing beside a plan"),
    pytest.param(lambda g: g["groups"][0].update(onclick="x"), "onclick", id="unknown key"),
    pytest.param(lambda g: g["groups"][0].pop("members"), "members", id="missing key"),
    pytest.param(lambda g: g["groups"][0].update(id=0.5), "groups[0].id", id="a float id"),
    pytest.param(lambda g: g["groups"][0].update(channels=True), "groups[0].channels", id="a bool count"),
    pytest.param(lambda g: g.update(model=["m"]), "model", id="a list for a string"),
    pytest.param(lambda g: g["nodes"].__setitem__(0, "node"), "nodes[0]", id="not an object"),
])
def test_a_graph_json_pointing_outside_itself_or_mistyped_is_refused(sample, tmp_path: Path, damage, message) -> None:
    graph = json.loads(json.dumps(sample[0]))
    damage(graph)
    with pytest.raises(PrunefxError, match=re.escape(message)):
        load_graph(_plant(tmp_path, graph))


class _Page(HTMLParser):
    """Every tag with its attributes, in order, and the text inside each <script> and <style>."""

    def __init__(self) -> None:
        super().__init__(convert_charrefs=False)
        self.tags: list[tuple[str, dict]] = []
        self.bodies: list[tuple[str, dict, str]] = []
        self._open: tuple[str, dict] | None = None

    def handle_starttag(self, tag, attrs):
        self.tags.append((tag, dict(attrs)))
        if tag in ("script", "style"):
            self._open = self.tags[-1]
            self.bodies.append((tag, dict(attrs), ""))

    def handle_endtag(self, tag):
        self._open = None

    def handle_data(self, data):
        if self._open is not None:  # the parser may hand a long body over in pieces
            tag, attrs, body = self.bodies[-1]
            self.bodies[-1] = (tag, attrs, body + data)


def _sha(text: str) -> str:
    return "'sha256-" + base64.b64encode(hashlib.sha256(text.encode()).digest()).decode() + "'"


@pytest.mark.parametrize("kind", ["groups", "report", "report without graph.json"])
def test_every_page_runs_only_its_own_inlined_script_and_style(sample, kind: str) -> None:
    graph, report = sample
    page = {"groups": lambda: groups_html(graph), "report": lambda: report_html(report, graph),
            "report without graph.json": lambda: report_html(report)}[kind]()
    parsed = _Page()
    parsed.feed(page)
    names = [t for t, _ in parsed.tags]
    (meta,) = [a for t, a in parsed.tags if t == "meta" and a.get("http-equiv") == "Content-Security-Policy"]
    first_active = min(names.index(t) for t in ("style", "script", "link") if t in names)
    assert parsed.tags.index(("meta", meta)) < first_active  # in force before anything it governs
    policy = dict(d.strip().split(" ", 1) for d in meta["content"].split(";"))
    scripts = [body for t, a, body in parsed.bodies if t == "script" and a.get("type") != "application/json"]
    styles = [body for t, _, body in parsed.bodies if t == "style"]
    assert policy["default-src"] == "'none'" and policy["img-src"] == "data:" and "unsafe" not in meta["content"]
    assert policy["script-src"] == (" ".join(map(_sha, scripts)) if scripts else "'none'")
    assert len(scripts) == (0 if kind == "report without graph.json" else 1)
    assert styles and policy["style-src"] == " ".join(map(_sha, styles))
    handlers = [(t, k) for t, a in parsed.tags for k in a if k.startswith("on") or k == "style"]
    assert not handlers  # an inline handler would be refused by the policy, a style attribute dropped


def test_the_script_puts_markup_into_the_page_only_through_its_escaping_template() -> None:
    """One ``innerHTML`` write, in setHtml, which takes only h`...` markup (every value in it escaped)."""
    js = asset("page.js")
    assert js.count("innerHTML") == 1 and "el.innerHTML = html.s;" in js
    assert not re.search(r"outerHTML|insertAdjacentHTML|document\.write|\beval\(|new Function|setAttribute\(.on", js)
