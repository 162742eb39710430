"""The HTML view in a real browser: headless Chromium (Debian's chromium + chromium-driver) driven by selenium.

Pages load from file:// with no console message and no fetch; what the page shows (summary, a clicked node's
groups and members, frozen reasons, search, filter, zoom, the report's numbers) equals the analysis; graphs of
1,000+ nodes draw every node (how fast: ``python -m experiments.bench_html``); markup in a run's graph.json shows
as text and runs nothing. One browser serves the whole module.
"""

from __future__ import annotations

import os
import time
from pathlib import Path

import pytest
import torch
import torchvision
from torch import nn

import prunefx
from prunefx.metrics import measure
from prunefx.report import Stage, build_report, write_graph, write_report
from prunefx.spec import load_spec, meta_torchvision
from prunefx.view import to_html
from prunefx.view.graph_data import graph_data

webdriver = pytest.importorskip("selenium.webdriver", reason="selenium is in the test extra: pip install -e '.[test]'")
from selenium.webdriver.common.by import By
from selenium.webdriver.common.keys import Keys
from selenium.webdriver.support.ui import Select, WebDriverWait

from prunefx.analysis.roles import Kind

CHROMIUM = os.environ.get("PRUNEFX_CHROMIUM", "/usr/bin/chromium")
CHROMEDRIVER = os.environ.get("PRUNEFX_CHROMEDRIVER", "/usr/bin/chromedriver")
WINDOW = (1500, 950)
# The docs' screenshots (docs/images/, shown by docs/html-view.md) are written here when set (e.g.
# PRUNEFX_SCREENSHOTS=docs/images); else to a temp dir.
SCREENSHOTS = os.environ.get("PRUNEFX_SCREENSHOTS")


@pytest.fixture(scope="module")
def browser():
    if not (Path(CHROMIUM).is_file() and Path(CHROMEDRIVER).is_file()):
        pytest.skip(f"no {CHROMIUM} / {CHROMEDRIVER}: apt-get install -y chromium chromium-driver (.ci/run does)")
    options = webdriver.ChromeOptions()
    options.binary_location = CHROMIUM
    for arg in ("--headless=new", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage", "--hide-scrollbars",
                f"--window-size={WINDOW[0]},{WINDOW[1]}", "--force-device-scale-factor=1"):
        options.add_argument(arg)
    options.set_capability("goog:loggingPrefs", {"browser": "ALL"})
    driver = webdriver.Chrome(service=webdriver.ChromeService(CHROMEDRIVER), options=options)
    yield driver
    driver.quit()


def open_page(driver, path: Path) -> float:
    """Load ``path`` from disk, wait until drawn; wall seconds from the request to the first frame after drawing."""
    t0 = time.perf_counter()
    driver.get(path.as_uri())
    WebDriverWait(driver, 60, poll_frequency=0.01).until(
        lambda d: d.execute_script("return document.body.dataset.ready") == "1")
    wall = time.perf_counter() - t0
    assert driver.get_log("browser") == []  # no error, no warning, no log line
    assert driver.execute_script("return performance.getEntriesByType('resource').length") == 0  # nothing fetched
    return wall


def js(driver, script: str, *args):
    return driver.execute_script(script, *args)


def expand_all(driver) -> None:
    """Open every module block (the page loads collapsed): one box per node, as the analysis has them."""
    n = js(driver, "return window.prunefxView.expandAll()")
    assert js(driver, "return document.querySelectorAll('#nodes g.n').length") == n


def click_node(driver, name: str) -> None:
    """Bring the node (a module or an fx node name) into view as a user would scroll to it, then click its box."""
    i = js(driver, "return window.prunefxView.reveal(arguments[0])", name)
    assert i >= 0, name
    driver.find_element(By.CSS_SELECTOR, f'#nodes g.n[data-i="{i}"]').click()


def panel_groups(driver) -> list[dict]:
    """The group cards in the side panel: id, state, reasons, member names."""
    return js(driver, """return [...document.querySelectorAll('#panel .group')].map((c) => ({
        id: +c.dataset.groupId, state: c.querySelector('.state').textContent,
        reasons: [...c.querySelectorAll('.reason')].map((r) => r.textContent),
        notes: [...c.querySelectorAll('.note')].map((r) => r.textContent),
        members: [...c.querySelectorAll('tr.member')].map((r) => r.dataset.member)}));""")


def lit(driver, cls: str) -> set[str]:
    return set(js(driver, f"return [...document.querySelectorAll('#nodes g.n.{cls}')].map((g) => g.dataset.name)"))


class Gate(nn.Module):
    def forward(self, x):
        return x if x.sum() > 0 else -x  # tensor-valued control flow: an automatic leaf


class Toy(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.a, self.gate, self.b, self.c = nn.Conv2d(3, 8, 3), Gate(), nn.Conv2d(8, 8, 3), nn.Conv2d(8, 4, 1)

    def forward(self, x):
        return self.c(torch.i0(self.b(self.gate(self.a(x)))))  # i0: an op without a rule


@pytest.fixture(scope="module")
def pages(tmp_path_factory) -> dict[str, tuple[prunefx.DependencyGraph, Path]]:
    out = tmp_path_factory.mktemp("pages")
    yolo = load_spec("ultralytics:yolov8n.yaml", imgsz=64)
    models = {"resnet18": (torchvision.models.resnet18(), (torch.randn(1, 3, 64, 64),)),
              "yolov8n": (yolo.model, yolo.example_inputs), "toy": (Toy(), (torch.randn(1, 3, 16, 16),))}
    pages = {}
    for name, (model, inputs) in models.items():
        dg = prunefx.analyze(model, inputs)
        to_html(dg, path=out / f"{name}.html")
        pages[name] = (dg, out / f"{name}.html")
    return pages


@pytest.fixture(scope="module")
def report_run(tmp_path_factory):
    """YOLOv8n pruned (40% of the prunable channels) and its run directory with report.html."""
    run = tmp_path_factory.mktemp("run")
    yolo = load_spec("ultralytics:yolov8n.yaml", imgsz=64)
    base = Stage(measure(yolo.model, yolo.example_inputs), None, {"map50_95": 0.87})
    result = prunefx.prune(yolo.model, yolo.example_inputs, prunefx.PlanConfig(ratio=0.4, round_to=8), check=False)
    after = Stage(measure(yolo.model, yolo.example_inputs), None, {"map50_95": 0.84})
    widths = [(result.graph.groups[g.group].label, g.before, g.after) for g in result.plan.groups]
    report = build_report(model="ultralytics:yolov8n.yaml", baseline=base, pruned=after, widths=widths)
    write_graph(run, graph_data(result.graph, result.plan))
    write_report(run, report)
    return yolo.model, result, report, run / "report.html"


@pytest.mark.parametrize("name", ["resnet18", "yolov8n", "toy"])
def test_summary_bar_equals_the_json(browser, pages, name: str) -> None:
    dg, path = pages[name]
    open_page(browser, path)
    shown = js(browser, "return Object.fromEntries([...document.querySelectorAll('[data-summary]')]"
                        ".map((e) => [e.dataset.summary, +e.textContent]))")
    d = dg.to_dict()
    prunable = [g for g in d["groups"] if g["prunable"]]
    assert shown == {
        "nodes": d["nodes"], "groups": len(d["groups"]), "prunable_groups": len(prunable),
        "prunable_channels": sum(g["channels"] for g in prunable), "channels": sum(g["channels"] for g in d["groups"]),
        "frozen_groups": len(d["groups"]) - len(prunable), "auto_leaves": len(d["auto_leaves"]),
        "unknown_ops": len(d["unknown_ops"]),
    }
    reasons = js(browser, "return Object.fromEntries([...document.querySelectorAll('[data-summary-reason]')]"
                          ".map((e) => [e.dataset.summaryReason, +e.textContent]))")
    expected: dict[str, int] = {}
    for g in d["groups"]:
        for key in dict.fromkeys(r.split(" (node")[0] for r in g["reasons"]):
            expected[key] = expected.get(key, 0) + 1
    assert reasons == expected
    expand_all(browser)
    assert js(browser, "return document.querySelectorAll('#nodes g.n:not(.blk)').length") == d["nodes"]


def test_click_resnet_layer1_0_conv1_shows_its_group_and_lights_its_members(browser, pages) -> None:
    dg, path = pages["resnet18"]
    open_page(browser, path)
    expand_all(browser)  # its group reaches into other blocks: each member lit as itself
    click_node(browser, "layer1.0.conv1")
    assert browser.find_element(By.CSS_SELECTOR, "#panel .node-name").text == "layer1.0.conv1"
    out = dg.group_of("layer1.0.conv1")
    cards = panel_groups(browser)
    assert cards[0]["id"] == out.id and cards[0]["state"] == "prunable"
    assert cards[0]["members"] == [m.name for m in out.members if m.kind is Kind.MODULE] + [
        m.name for m in out.members if m.kind is Kind.PARAM]  # module rows, then their parameter slices
    assert {c["id"] for c in cards[1:]} == {dg.group_of("layer1.0.conv1", "in").id}
    assert lit(browser, "mem") == set(out.modules()) and lit(browser, "sel") == {"layer1.0.conv1"}
    assert "resnet.py" in browser.find_element(By.CSS_SELECTOR, "#panel .src").text
    browser.find_element(By.CSS_SELECTOR, f'#panel .group[data-group-id="{cards[1]["id"]}"] .gh').click()
    assert lit(browser, "mem") == set(dg.groups[cards[1]["id"]].modules())  # another card: its members light up


def test_click_yolov8n_model_2_cv1_conv_shows_both_chunk_groups(browser, pages) -> None:
    dg, path = pages["yolov8n"]
    open_page(browser, path)
    expand_all(browser)  # the members sit in several blocks: each lit as itself, not as its block
    click_node(browser, "model.2.cv1.conv")
    halves = dg.groups_of("model.2.cv1.conv")  # C2f: cv1's output is chunked into two groups of equal count
    cards = panel_groups(browser)
    assert [c["id"] for c in cards[: len(halves)]] == [g.id for g in halves] and len(halves) == 2
    for card, g in zip(cards[: len(halves)], halves, strict=True):
        assert sorted(card["members"]) == sorted(m.name for m in g.members)
        other = next(h.id for h in halves if h.id != g.id)
        assert any(n.startswith(f"tied: keeps as many channels as group {other}") for n in card["notes"])
    assert lit(browser, "mem") == set(halves[0].modules())


def test_a_frozen_node_shows_why(browser, pages) -> None:
    dg, path = pages["resnet18"]
    open_page(browser, path)
    click_node(browser, "fc")
    card = panel_groups(browser)[0]  # its output; then the group of its input columns
    assert card["id"] == dg.group_of("fc").id
    assert card["state"] == "frozen" and card["reasons"] == [f"frozen: {dg.group_of('fc').reasons[0]}"]
    dg, path = pages["toy"]
    open_page(browser, path)
    click_node(browser, "gate")
    reasons = js(browser, "return [...document.querySelectorAll('#panel > .reason')].map((e) => e.textContent)")
    assert reasons[0] == f"traced as a leaf: {dg.auto_leaves['gate']}"
    click_node(browser, "i0")  # no rule, but probed: its inferred map is shown
    reasons = js(browser, "return [...document.querySelectorAll('#panel > .reason')].map((e) => e.textContent)")
    assert f"inferred rule (probed, checked by the oracle): {dg.inferred_ops['i0']}" in reasons


def test_search_finds_a_module_and_brings_it_into_view(browser, pages) -> None:
    _, path = pages["resnet18"]
    open_page(browser, path)
    box = browser.find_element(By.ID, "search")
    box.send_keys("layer3.1.conv")
    assert js(browser, "return [...document.querySelectorAll('#results li')].map((l) => l.dataset.i).length") == 2
    box.send_keys("2", Keys.ENTER)
    assert browser.find_element(By.CSS_SELECTOR, "#panel .node-name").text == "layer3.1.conv2"
    assert lit(browser, "sel") == {"layer3.1.conv2"}
    inside = js(browser, """const c = document.getElementById('canvas').getBoundingClientRect();
        const b = document.querySelector('#nodes g.n.sel').getBoundingClientRect();
        return b.left >= c.left && b.right <= c.right && b.top >= c.top && b.bottom <= c.bottom;""")
    assert inside


def test_filter_by_reason_and_zoom(browser, pages) -> None:
    dg, path = pages["yolov8n"]
    open_page(browser, path)
    expand_all(browser)
    browser.find_element(By.CSS_SELECTOR, '.chip.reason[data-reason="model output"]').click()
    # Expected: the nodes whose output channels, or the groups they are a member of, are frozen as model outputs.
    data = graph_data(dg)
    frozen = {g["id"] for g in data["groups"] if any(r.startswith("model output") for r in g["reasons"])}
    hit = {i for g in data["groups"] if g["id"] in frozen for i in g["nodes"]}
    hit |= {i for i, n in enumerate(data["nodes"]) if {gid for gid, _ in n["chan"]} & frozen}
    shown = js(browser, "return [...document.querySelectorAll('#nodes g.n:not(.dim)')].map((g) => +g.dataset.i)")
    assert sorted(shown) == sorted(hit) and len(hit) >= 6  # the head's last convs and what reads them
    before = browser.find_element(By.ID, "zoomlabel").text
    browser.find_element(By.ID, "zin").click()
    assert int(browser.find_element(By.ID, "zoomlabel").text.rstrip("%")) == round(int(before.rstrip("%")) * 1.25)


def test_report_page_numbers_equal_the_run(browser, report_run) -> None:
    model, result, report, path = report_run
    open_page(browser, path)
    cells = js(browser, "return [...document.querySelectorAll('table.metrics tbody tr')].map((r) => "
                        "[...r.cells].map((c) => c.textContent))")
    assert [row[0] for row in cells] == ["baseline", "pruned"]
    for row, stage in zip(cells, ("baseline", "pruned"), strict=True):
        assert float(row[1].split()[0]) == pytest.approx(report["stages"][stage]["macs"] / 1e9, abs=6e-4)
    gp = result.plan.pruned[0]
    conv = result.graph.groups[gp.group].modules("out")[0]
    click_node(browser, conv)
    kept = int(browser.find_element(By.CSS_SELECTOR, "#panel .kept").text)
    assert kept == model.get_submodule(conv).out_channels and gp.after < gp.before
    browser.find_element(By.CSS_SELECTOR, "#svg").click()  # background: back to the overview with the decisions
    rows = js(browser, "return [...document.querySelectorAll('#panel tr[data-group]')].map((r) => +r.dataset.group)")
    assert rows == [g.id for g in result.graph.groups]


def test_group_colours_are_distinct_and_frozen_is_grey(browser, pages) -> None:
    dg, path = pages["yolov8n"]
    open_page(browser, path)
    rgb = js(browser, """const probe = document.createElement('i'); document.body.appendChild(probe);
        return arguments[0].map((g) => { probe.style.color = window.prunefxView.groupColor(g);
            return getComputedStyle(probe).color.match(/\\d+/g).map(Number); });""", [g.id for g in dg.groups])
    for a in range(len(rgb)):  # groups near each other in the graph have ids near each other
        for b in range(a + 1, min(a + 4, len(rgb))):
            if dg.groups[a].prunable and dg.groups[b].prunable:
                distance = sum((x - y) ** 2 for x, y in zip(rgb[a], rgb[b], strict=True)) ** 0.5
                assert distance > 40, (a, b, rgb[a], rgb[b])
    frozen = [c for g, c in zip(dg.groups, rgb, strict=True) if not g.prunable]
    assert frozen and all(c == frozen[0] and max(c) - min(c) == 0 for c in frozen)


@pytest.mark.slow
@pytest.mark.parametrize("name", ["densenet201", "maxvit_t"])
def test_a_large_graph_draws_every_node_and_edge(browser, tmp_path: Path, name: str) -> None:
    """DenseNet-201 (713 nodes, 2,515 edges) and MaxViT-T (1,633 nodes); their render time is a benchmark."""
    dg = prunefx.analyze(meta_torchvision(name), torch.randn(1, 3, 224, 224, device="meta"))
    path = tmp_path / f"{name}.html"
    to_html(dg, path=path)
    open_page(browser, path)
    expand_all(browser)
    data = graph_data(dg)
    shown = js(browser, "return [...document.querySelectorAll('#nodes g.n')].map((g) => g.dataset.name)")
    assert shown == [n["target"] for n in data["nodes"]] and len(shown) == len(dg.gm.graph.nodes) > 700
    assert js(browser, "return document.querySelectorAll('#edges path.e:not(.trunk)').length") == len(data["edges"])
    click_node(browser, data["nodes"][-2]["target"])  # the panel of a node at the far end of the graph
    assert browser.find_element(By.CSS_SELECTOR, "#panel .node-name").text == data["nodes"][-2]["target"]


def test_screenshots(browser, pages, report_run, tmp_path: Path) -> None:
    """The pictures of docs/html-view.md: the groups page of YOLOv8n with a C2f's cv1 clicked, and the report of a
    pruned YOLOv8n scrolled to the neck (its concats), with the plan's decisions in the panel."""
    out = Path(SCREENSHOTS) if SCREENSHOTS else tmp_path
    out.mkdir(parents=True, exist_ok=True)
    from PIL import Image

    for name, path, click, reveal in (("groups_yolov8n.png", pages["yolov8n"][1], "model.2.cv1.conv", None),
                                      ("report_yolov8n.png", report_run[3], None, "model.12.cv1.conv")):
        open_page(browser, path)
        if click:
            click_node(browser, click)
        if reveal:
            assert js(browser, "return window.prunefxView.reveal(arguments[0])", reveal) >= 0
        browser.save_screenshot(str(out / name))
        with Image.open(out / name) as im:
            assert im.size == (WINDOW[0], js(browser, "return window.innerHeight"))
            colours = len({c for _, c in im.convert("RGB").getcolors(maxcolors=1 << 20)})
        assert colours > 200  # text, group colours and edges were drawn, not a blank page


# ---- a hostile graph.json: markup in every text field shows as text; nothing in the page runs it

PWNED = "return window.__pwned === undefined ? null : window.__pwned"


def _interact(driver, graph: dict) -> None:
    """Draw every part of the page that shows graph.json's values: each node's panel, the overview, search, filter."""
    for node in graph["nodes"]:
        assert js(driver, "return window.prunefxView.select(arguments[0])", node["target"]) >= 0
    driver.find_element(By.CSS_SELECTOR, "#svg").click()  # back to the overview
    driver.find_element(By.ID, "search").send_keys("img")
    choice = Select(driver.find_element(By.ID, "filter"))
    for i in range(len(choice.options)):
        choice.select_by_index(i)


def _csp_stops(driver) -> list[str]:
    """Put an inline handler and an inline script into the drawn page, as an escaping bug would; what ran."""
    js(driver, """window.__csp = [];
        document.addEventListener('securitypolicyviolation', (e) => window.__csp.push(e.effectiveDirective));
        document.body.insertAdjacentHTML('beforeend', '<img id="planted" src="x" onerror="window.__pwned = 3">');
        const s = document.createElement('script');
        s.textContent = 'window.__pwned = 4';
        document.body.appendChild(s);""")
    WebDriverWait(driver, 10).until(lambda d: js(d, PWNED) is not None or len(js(d, "return window.__csp")) >= 3)
    logs = driver.get_log("browser")  # the refusals, logged: drained here so the next page starts clean
    assert all("Content Security Policy" in e["message"] for e in logs), logs
    return js(driver, "return window.__csp")


def test_markup_in_every_text_field_of_graph_json_shows_as_text_and_runs_nothing(browser, tmp_path: Path) -> None:
    from _hostile_graph import PAYLOAD, map_text, sample_run

    graph, report = sample_run()
    graph = map_text(graph, lambda s: PAYLOAD + s)  # the same text everywhere: names still match their groups
    report["model"] = PAYLOAD
    write_graph(tmp_path, graph)
    write_report(tmp_path, report)  # report.html from graph.json: it loads (valid), every string a payload
    open_page(browser, tmp_path / "report.html")
    _interact(browser, graph)
    assert js(browser, PWNED) is None
    assert js(browser, "return document.querySelectorAll('img, script').length") == 2  # the data and page.js
    assert browser.find_element(By.TAG_NAME, "h1").text == f"prunefx report: {PAYLOAD}"
    shown = js(browser, "return document.body.innerText")
    assert shown.count(PAYLOAD) >= 10, shown  # summary, overview rows and decisions, search results
    # Escaping is the first wall; the page's CSP the second: a handler or script that got into the DOM is refused.
    refused = _csp_stops(browser)
    assert js(browser, PWNED) is None and set(refused) == {"img-src", "script-src-attr", "script-src-elem"}, refused


def test_markup_in_number_fields_runs_nothing_even_past_the_loader(browser, tmp_path: Path) -> None:
    """A page drawn from a graph the loader would refuse: the script prints every number through Number()."""
    from _hostile_graph import PAYLOAD, sample_run

    from prunefx.view.page import graph_page

    graph, _ = sample_run()
    graph["summary"] = {k: PAYLOAD if k != "frozen_reasons" else dict.fromkeys(v, PAYLOAD)
                        for k, v in graph["summary"].items()}
    for g in graph["groups"]:
        g["channels"] = PAYLOAD
        if g.get("plan") is not None:
            g["plan"].update(before=PAYLOAD, after=PAYLOAD)
    path = tmp_path / "page.html"
    path.write_text(graph_page("t", "s", graph, report="<section></section>"), encoding="utf-8")
    open_page(browser, path)
    _interact(browser, graph)
    assert js(browser, PWNED) is None and js(browser, "return document.querySelectorAll('img').length") == 0
    chips = js(browser, "return [...document.querySelectorAll('[data-summary]')].map((e) => e.textContent)")
    assert chips and set(chips) == {"NaN"}  # not a number, shown as one: NaN



# ---- the collapsed view: one box per module call, expanded on click; search by module path

def _tiny_llama():
    transformers = pytest.importorskip("transformers")
    cfg = transformers.LlamaConfig(hidden_size=32, intermediate_size=64, num_hidden_layers=1, num_attention_heads=4,
                                   num_key_value_heads=2, vocab_size=64)
    return transformers.LlamaForCausalLM(cfg).eval(), (torch.randint(0, 64, (1, 8)),), "export"


@pytest.fixture(scope="module")
def zoo(tmp_path_factory) -> dict[str, tuple[dict, Path]]:
    """graph_data and page of DenseNet-121 (64x64), a tiny Llama (torch.export) and YOLOv8s (no weights)."""
    out = tmp_path_factory.mktemp("zoo")
    yolo = load_spec("ultralytics:yolov8s.yaml", imgsz=64)
    models = {"densenet121": (torchvision.models.densenet121(), (torch.randn(1, 3, 64, 64),), "fx"),
              "llama": _tiny_llama(), "yolov8s": (yolo.model, yolo.example_inputs, "fx")}
    pages = {}
    for name, (model, inputs, capture) in models.items():
        dg = prunefx.analyze(model, inputs, capture=capture)
        to_html(dg, path=out / f"{name}.html")
        pages[name] = (graph_data(dg), out / f"{name}.html")
    return pages


def shown(driver) -> list[dict]:
    """The boxes drawn: a block (path, nodes inside) or a node (its index)."""
    return js(driver, """return [...document.querySelectorAll('#nodes g.n')].map((g) => g.dataset.b !== undefined
        ? {block: g.dataset.name, count: +g.querySelector('.count').textContent} : {node: +g.dataset.i});""")


def _inside(data: dict, path: str) -> list[int]:
    """Indices of the nodes in block ``path`` and its sub-blocks."""
    under = {path} | {b["path"] for b in data["modules"] if b["path"].startswith(path + ".")}
    return [i for i, n in enumerate(data["nodes"]) if n["module"] in under and _within(data, n["module"], path)]


def _within(data: dict, module: str, path: str) -> bool:
    index = {b["path"]: k for k, b in enumerate(data["modules"])}
    k = index[module]
    while k >= 0:
        if data["modules"][k]["path"] == path:
            return True
        k = data["modules"][k]["parent"]
    return False


def _children(data: dict, path: str) -> tuple[set[str], set[int]]:
    """The direct sub-blocks and the direct nodes of block ``path``."""
    k = next(j for j, b in enumerate(data["modules"]) if b["path"] == path)
    return ({b["path"] for b in data["modules"] if b["parent"] == k},
            {i for i, n in enumerate(data["nodes"]) if n["module"] == path})


@pytest.mark.parametrize("name,block", [("densenet121", "features.denseblock1"), ("llama", "model.layers.0.self_attn"),
                                        ("yolov8s", "model.3")])
def test_the_collapsed_view_shows_a_few_blocks_and_expands_one_into_its_children(browser, zoo, name, block,
                                                                                  tmp_path: Path) -> None:
    data, path = zoo[name]
    open_page(browser, path)
    boxes = shown(browser)
    blocks = [b for b in boxes if "block" in b]
    print(f"{name}: {len(data['nodes'])} nodes, {len(boxes)} boxes at load, {len(blocks)} blocks")
    assert 2 <= len(blocks) < 40 and len(boxes) <= 60 and len(boxes) < len(data["nodes"]) / 3
    assert block in {b["block"] for b in blocks}
    if name == "llama":  # the export's 37 mask and position ops of LlamaModel: one box, not 37
        assert "model (ops before its sub-modules)" in {b["block"] for b in blocks}
    # Every node is drawn exactly once, as itself or inside the block box that holds it.
    assert sum(b["count"] for b in blocks) + sum(1 for b in boxes if "node" in b) == len(data["nodes"])
    modules = {b["path"] for b in data["modules"]}
    for b in blocks:  # a module's block holds its nodes; a fold box, a module's ops that precede its sub-modules
        if b["block"] in modules:
            assert b["count"] == len(_inside(data, b["block"]))
        else:
            assert b["block"].endswith("(ops before its sub-modules)") and b["count"] > 8
    out = Path(SCREENSHOTS) if SCREENSHOTS else tmp_path
    out.mkdir(parents=True, exist_ok=True)
    browser.save_screenshot(str(out / f"collapsed_{name}.png"))
    js(browser, "return window.prunefxView.reveal(arguments[0])", data["nodes"][_inside(data, block)[0]]["target"])
    js(browser, "window.prunefxView.collapseAll()")
    assert js(browser, "return window.prunefxView.showBlock(arguments[0])", block) >= 0
    browser.find_element(By.CSS_SELECTOR, f'#nodes g.n.blk[data-name="{block}"]').click()
    after = shown(browser)
    subs, direct = _children(data, block)
    assert block not in {b.get("block") for b in after}
    assert subs <= {b.get("block") for b in after} and direct <= {b.get("node") for b in after}
    assert len(after) == len(boxes) - 1 + len(subs) + len(direct)
    assert browser.get_log("browser") == []


def test_search_for_a_module_path_highlights_the_aten_nodes_of_an_export_capture(browser, zoo, tmp_path) -> None:
    data, path = zoo["llama"]
    open_page(browser, path)
    box = browser.find_element(By.ID, "search")
    box.send_keys("q_proj")
    want = {i for i, n in enumerate(data["nodes"]) if "q_proj" in n["module"]}
    assert len(want) == 2  # its weight (get_attr) and its ATen op, whose own name says nothing of q_proj
    results = js(browser, "return [...document.querySelectorAll('#results li')].map((l) => +l.dataset.i)")
    assert want <= set(results)
    hit = js(browser, "return [...document.querySelectorAll('#nodes g.n.hit')].map((g) => g.dataset.name)")
    assert hit == ["model.layers.0.self_attn"]  # collapsed: the block holding them is marked
    box.send_keys(Keys.ENTER)  # the first result: its blocks open and it is selected
    sel = js(browser, "return [...document.querySelectorAll('#nodes g.n.sel')].map((g) => +g.dataset.i)")
    assert len(sel) == 1 and sel[0] in want
    assert "model.layers.0.self_attn.q_proj" in browser.find_element(By.CSS_SELECTOR, "#panel .crumbs").text
    hit = js(browser, "return [...document.querySelectorAll('#nodes g.n.hit')].map((g) => +g.dataset.i)")
    assert set(hit) == want  # both visible now, both marked
    out = Path(SCREENSHOTS) if SCREENSHOTS else tmp_path
    browser.save_screenshot(str(out / "search_llama_q_proj.png"))
    # A crumb folds its block back into one box: the node's panel goes with it.
    browser.find_element(By.CSS_SELECTOR, '#panel .crumbs a[data-collapse]').click()
    assert "model" in {b.get("block") for b in shown(browser)}  # the outermost crumb: all of the model in one box
    assert not js(browser, "return document.querySelector('#panel .node-name')")


def test_a_shared_module_shows_its_call_sites_and_slices_are_explained(browser, zoo) -> None:
    data, path = zoo["yolov8s"]
    calls = [n["label"] for n in data["nodes"] if n["op"] == "call_module" and n["target"] == "model.0.act"]
    assert len(calls) > 40 and len(set(calls)) == len(calls)  # one SiLU, one label per call
    assert calls[:2] == ["model.0.act@0 in model.0", "model.0.act@1 in model.1"]
    open_page(browser, path)
    assert "xN" in browser.find_element(By.CSS_SELECTOR, "#panel .help-slices").text
    js(browser, "window.prunefxView.expandAll()")
    labels = js(browser, "return [...document.querySelectorAll('#nodes g.n[data-name=\"model.0.act\"] text')]"
                         ".map((t) => t.textContent)")
    assert len(labels) == len(calls) and labels[1] == "model.0.act@1 in model.1"
    # A member's slice cell says in words what its notation means (the flatten-like xN form included).
    data_l, path_l = zoo["llama"]
    repeated = next(m for g in data_l["groups"] for m in g["members"] if "]x" in m["slices"])
    open_page(browser, path_l)
    js(browser, "window.prunefxView.expandAll()")
    node = data_l["nodes"][repeated["node"][0]]
    i = js(browser, "return window.prunefxView.select(arguments[0])", node["name"])
    assert i == repeated["node"][0]
    cells = js(browser, "return [...document.querySelectorAll('#panel td.slices')]"
                        ".map((c) => [c.textContent, c.title])")
    title = dict(cells)[repeated["slices"]]
    assert "each filling" in title and "positions" in title
