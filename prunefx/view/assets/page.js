/* prunefx graph view: draws the layout computed in Python, then handles selection, search, filter, zoom, pan.
   Data: <script id="data" type="application/json"> {graph: prunefx.graph/1, layout: {...}, mode: "groups"|"report"}. */
(function () {
  "use strict";
  const t0 = performance.now();
  const D = JSON.parse(document.getElementById("data").textContent);
  const G = D.graph, L = D.layout, REPORT = D.mode === "report";
  const nodes = G.nodes, groups = G.groups, N = nodes.length;
  const $ = (id) => document.getElementById(id);

  // ---- markup. graph.json may come from a shared run directory, so no value of it is ever markup: every
  // ${...} in an h`...` template is escaped (a number printed as one), only fragments made by h pass as they
  // are, and setHtml takes nothing else. The page's CSP allows no style attributes: colours and widths ride in
  // data-bg / data-edge / data-w and paint() sets them through the CSSOM.
  class Html { constructor(s) { this.s = s; } }
  const ESC = {"&": "&amp;", "<": "&lt;", ">": "&gt;", '"': "&quot;", "'": "&#39;"};
  const esc = (s) => String(s).replace(/[&<>"']/g, (c) => ESC[c]);
  const piece = (v) => v instanceof Html ? v.s : Array.isArray(v) ? v.map(piece).join("")
    : typeof v === "number" ? String(v) : v === undefined || v === null ? "" : esc(v);
  function h(strings, ...values) {
    let s = strings[0];
    for (let k = 0; k < values.length; k++) s += piece(values[k]) + strings[k + 1];
    return new Html(s);
  }
  const cat = (...parts) => new Html(parts.map(piece).join(""));
  function paint(root) {
    for (const el of root.querySelectorAll("[data-bg]")) el.style.background = el.dataset.bg;
    for (const el of root.querySelectorAll("[data-edge]")) el.style.borderLeftColor = el.dataset.edge;
    for (const el of root.querySelectorAll("[data-w]")) el.style.width = el.dataset.w;
  }
  function setHtml(el, html) {
    if (!(html instanceof Html)) throw new TypeError("setHtml takes h`...` markup only");
    el.innerHTML = html.s;
    paint(el);
  }
  const byId = new Map(groups.map((g) => [g.id, g]));
  const wrapDots = (s) => new Html(esc(s).replace(/\./g, ".<wbr>"));  // long qualified names break at their dots

  // ---- colours: one per group (golden-angle hues, three lightness bands), frozen grey, fixed light grey
  const FROZEN = "#bdbdbd", FIXED = "#e9e9e9", NONE = "#ffffff";
  function groupColor(gid) {
    if (gid < 0) return FIXED;
    const g = byId.get(gid);
    if (g && !g.prunable) return FROZEN;
    // Blues and violets look darker than yellows at equal HSL lightness: lift them so black text stays readable.
    const hue = (gid * 137.508) % 360, lift = hue > 200 && hue < 300 ? 10 : hue > 40 && hue < 190 ? -4 : 0;
    const light = Math.min(80, [68, 58, 76][gid % 3] + lift), sat = [70, 62, 75][(gid >> 1) % 3];
    return `hsl(${hue.toFixed(1)},${sat}%,${light}%)`;
  }
  function keptColor(frac) { // red (all removed) -> amber -> green (all kept)
    const hue = 4 + 126 * Math.max(0, Math.min(1, frac));
    return `hsl(${hue.toFixed(0)},62%,${62 + 10 * (1 - Math.abs(frac - 0.5) * 2)}%)`;
  }

  // ---- per node facts: channel total, the groups it carries, the groups it is a member of
  const total = new Int32Array(N), carries = [], memberOf = [];
  const carriers = new Map();  // group id -> node indices whose output carries it
  for (let i = 0; i < N; i++) {
    let t = 0; const gs = [];
    for (const [g, c] of nodes[i].chan) { t += c; if (g >= 0 && !gs.includes(g)) gs.push(g); }
    total[i] = t; carries.push(gs); memberOf.push([]);
    for (const g of gs) { if (!carriers.has(g)) carriers.set(g, []); carriers.get(g).push(i); }
  }
  for (const g of groups) for (const m of g.members) for (const i of m.node) {
    if (!memberOf[i].some((x) => x.g === g.id && x.role === m.role)) memberOf[i].push({g: g.id, role: m.role, slices: m.slices});
  }
  const preds = Array.from({length: N}, () => []);
  for (const [s, t] of G.edges) if (!preds[t].includes(s)) preds[t].push(s);
  const leafSet = new Set(Object.keys(G.auto_leaves)), unknownSet = new Set(Object.keys(G.unknown_ops));
  const reasonsOf = (gid) => (byId.get(gid)?.reasons || []).map((r) => r.split(" (node")[0]);

  // ---- summary bar
  function renderSummary() {
    const s = G.summary, chips = [];
    const chip = (key, value, text, cls = "") => chips.push(h`<span class="chip ${cls}" title="${text}"><b data-summary="${key}">${Number(value)}</b> ${text}</span>`);
    chip("nodes", s.nodes, "nodes");
    chip("groups", s.groups, "groups");
    chip("prunable_groups", s.prunable_groups, "prunable groups");
    chips.push(h`<span class="chip"><b data-summary="prunable_channels">${Number(s.prunable_channels)}</b> of <b data-summary="channels">${Number(s.channels)}</b> channels prunable</span>`);
    chip("frozen_groups", s.frozen_groups, "frozen groups");
    chip("auto_leaves", s.auto_leaves, "auto-leaves", s.auto_leaves ? "warn" : "");
    chip("unknown_ops", s.unknown_ops, "ops without a rule", s.unknown_ops ? "warn" : "");
    for (const [r, c] of Object.entries(s.frozen_reasons)) {
      chips.push(h`<span class="chip reason" data-reason="${r}" title="frozen because: ${r} (click to filter)"><b data-summary-reason="${r}">${Number(c)}</b> frozen: ${r}</span>`);
    }
    setHtml($("summary"), h`${chips}`);
    $("summary").addEventListener("click", (ev) => {
      const c = ev.target.closest(".chip.reason");
      if (c) { $("filter").value = "reason:" + c.dataset.reason; applyFilter(); }
    });
  }

  // ---- drawing
  const H = L.node_height;
  let colourMode = "groups";
  function nodeFill(i) {
    if (colourMode === "kept" && total[i] > 0) return [[keptColor(nodes[i].kept / total[i]), 1]];
    const runs = nodes[i].chan;
    if (!runs.length) return [[NONE, 1]];
    const t = total[i], segs = [];
    const MAX = 64;
    for (let k = 0; k < runs.length; k++) {
      if (k === MAX - 1 && runs.length > MAX) { // the rest in one neutral piece
        let rest = 0; for (let j = k; j < runs.length; j++) rest += runs[j][1];
        segs.push(["#d6d6de", rest / t]); break;
      }
      segs.push([groupColor(runs[k][0]), runs[k][1] / t]);
    }
    return segs;
  }
  function nodeSvg(i) {
    const n = nodes[i], w = L.w[i], x = L.x[i] - w / 2, y = L.y[i];
    const cls = ["n"];
    if (n.op === "call_module" && leafSet.has(n.target)) cls.push("leaf");
    if (unknownSet.has(n.name)) cls.push("unknown");
    const segs = [];
    let off = 0;
    for (const [c, f] of nodeFill(i)) {
      const sw = Math.max(0, f * w);
      segs.push(h`<rect class="seg" x="${off.toFixed(1)}" width="${(sw + 0.4).toFixed(1)}" height="${H}" fill="${c}"/>`);
      off += sw;
    }
    let label = L.text[i], kbar = "";
    if (REPORT && total[i] > 0) {
      const k = Number(n.kept), t = total[i];
      kbar = h`<rect class="kbar" x="3" y="${H - 6}" width="${w - 6}" height="3"/><rect class="kbar-in" x="3" y="${H - 6}" width="${((w - 6) * k / t).toFixed(1)}" height="3"/>`;
      if (k < t) label += `  ${k}/${t}`;
    }
    return cat(h`<g class="${cls.join(" ")}" data-i="${i}" data-name="${n.target}" transform="translate(${x},${y})">${segs}`,
      h`<rect class="box" width="${w}" height="${H}" rx="3" fill="none"/>${kbar}`,
      h`<text x="${w / 2}" y="${REPORT && total[i] > 0 ? 14 : 16.5}" text-anchor="middle">${label}</text>`,
      h`<title>${n.target} (${n.type})${n.shape ? " " + n.shape : ""}</title></g>`);
  }
  function pathOf(pts) {
    let d = `M${pts[0][0]},${pts[0][1]}`;
    for (let k = 1; k < pts.length; k++) {
      const [ax, ay] = pts[k - 1], [bx, by] = pts[k];
      if (ax === bx) { d += `L${bx},${by}`; continue; }
      const m = (ay + by) / 2;
      d += `C${ax},${m} ${bx},${m} ${bx},${by}`;
    }
    return d;
  }
  const srcEdges = Array.from({length: N}, () => []);
  function draw() {
    const svgEdges = [], E = G.edges;
    for (const [s, pts] of L.trunks) svgEdges.push(h`<path class="e trunk" data-s="${Number(s)}" d="${pathOf(pts)}"/>`);
    for (let k = 0; k < E.length; k++) svgEdges.push(h`<path class="e" data-s="${Number(E[k][0])}" marker-end="url(#arrow)" d="${pathOf(L.edges[k])}"/>`);
    setHtml($("edges"), h`${svgEdges}`);
    for (const el of $("edges").children) srcEdges[+el.dataset.s].push(el);
    redrawNodes();
  }
  let nodeEls = [];
  function redrawNodes() {
    const parts = new Array(N);
    for (let i = 0; i < N; i++) parts[i] = nodeSvg(i);
    setHtml($("nodes"), h`${parts}`);
    nodeEls = Array.from($("nodes").children);
    applyFilter();
    if (selected !== null) select(selected, activeGroup, false);
  }

  // ---- zoom and pan
  const svg = $("svg"), vp = $("vp"), canvas = $("canvas");
  let k = 1, tx = 0, ty = 0;
  function apply() {
    vp.setAttribute("transform", `translate(${tx.toFixed(1)},${ty.toFixed(1)}) scale(${k.toFixed(4)})`);
    $("zoomlabel").textContent = `${Math.round(k * 100)}%`;
  }
  function zoomAt(f, cx, cy) {
    const nk = Math.max(0.02, Math.min(4, k * f));
    tx = cx - (cx - tx) * nk / k; ty = cy - (cy - ty) * nk / k; k = nk; apply();
  }
  function fit(all) {
    const r = canvas.getBoundingClientRect();
    k = Math.min(1, (r.width - 10) / L.width);
    if (all) k = Math.min(k, (r.height - 10) / L.height);
    tx = (r.width - L.width * k) / 2; ty = 4; apply();
  }
  function centerOn(i) {
    const r = canvas.getBoundingClientRect();
    if (k < 0.8) k = 1;
    tx = r.width / 2 - L.x[i] * k; ty = r.height / 3 - (L.y[i] + H / 2) * k; apply();
  }
  canvas.addEventListener("wheel", (ev) => { // scroll pans (the graph is tall); Ctrl/Cmd + wheel and pinch zoom
    ev.preventDefault();
    const r = canvas.getBoundingClientRect(), step = ev.deltaMode === 1 ? 16 : 1;
    if (ev.ctrlKey || ev.metaKey) zoomAt(Math.exp(-ev.deltaY * step * 0.002), ev.clientX - r.left, ev.clientY - r.top);
    else if (ev.shiftKey) { tx -= ev.deltaY * step; apply(); }
    else { tx -= ev.deltaX * step; ty -= ev.deltaY * step; apply(); }
  }, {passive: false});
  let drag = null;
  canvas.addEventListener("pointerdown", (ev) => {
    drag = {x: ev.clientX, y: ev.clientY, tx, ty, moved: false};
  });
  window.addEventListener("pointermove", (ev) => {
    if (!drag) return;
    const dx = ev.clientX - drag.x, dy = ev.clientY - drag.y;
    if (!drag.moved && Math.abs(dx) + Math.abs(dy) < 4) return;
    if (!drag.moved) { drag.moved = true; canvas.classList.add("dragging"); }
    tx = drag.tx + dx; ty = drag.ty + dy; apply();
  });
  window.addEventListener("pointerup", () => { canvas.classList.remove("dragging"); setTimeout(() => { drag = null; }, 0); });
  svg.addEventListener("click", (ev) => {
    if (drag && drag.moved) return;
    const g = ev.target.closest("g.n");
    if (g) select(+g.dataset.i); else clearSelection();
  });

  // ---- selection
  let selected = null, activeGroup = null;
  function clearClasses() {
    for (const el of nodeEls) el.classList.remove("sel", "mem", "car");
    for (const el of $("edges").children) el.classList.remove("car");
  }
  function clearSelection() {
    selected = null; activeGroup = null; clearClasses(); svg.classList.remove("focus"); overview();
  }
  function highlight(gid) {
    clearClasses();
    activeGroup = gid;
    if (selected !== null) nodeEls[selected].classList.add("sel");
    if (gid === null || gid === undefined) { svg.classList.toggle("focus", selected !== null); return; }
    for (const i of carriers.get(gid) || []) { nodeEls[i].classList.add("car"); for (const e of srcEdges[i]) e.classList.add("car"); }
    for (const i of byId.get(gid).nodes) nodeEls[i].classList.add("mem");
    svg.classList.add("focus");
    for (const el of document.querySelectorAll("#panel .group")) el.classList.toggle("active", +el.dataset.groupId === gid);
  }
  function groupCard(gid, role) {
    const g = byId.get(gid), parts = [];
    parts.push(h`<div class="group" data-group-id="${Number(g.id)}" data-edge="${groupColor(gid)}">`);
    parts.push(h`<div class="gh">group <span class="gid">${Number(g.id)}</span> · <span class="gch">${Number(g.channels)}</span> channels`);
    parts.push(g.prunable ? h`<span class="state prunable">prunable</span>` : h`<span class="state frozen">frozen</span>`);
    if (role) parts.push(h` <span class="note">(${role})</span>`);
    parts.push(h`</div>`);
    for (const r of g.reasons) parts.push(h`<div class="reason">frozen: ${r}</div>`);
    if (g.prunable && !g.exact) for (const r of g.inexact_reasons) parts.push(h`<div class="note">not exactly verifiable: ${r}</div>`);
    // An equal-count constraint is stated by the tie line below, with the group it is tied to.
    for (const r of g.constraints) if (!r.startsWith("keeps as many channels as group")) parts.push(h`<div class="note">constraint: ${r}</div>`);
    for (const t of G.ties) if (t.groups.includes(g.id)) {
      const others = t.groups.filter((x) => x !== g.id).map(Number).join(", ");
      parts.push(h`<div class="note tie">tied: keeps as many channels as group ${others} (${t.why})</div>`);
    }
    if (g.plan) {
      const after = Number(g.plan.after), before = Number(g.plan.before);
      parts.push(h`<div class="decision">kept ${after} of ${before}${after < before ? "" : " (unchanged)"}: ${g.plan.why}</div>`);
    } else if (g.skipped) {
      parts.push(h`<div class="decision">left alone: ${g.skipped}</div>`);
    }
    // Parameter slices of a member module say the same as the module's row: listed apart, folded.
    const owners = new Set(g.members.filter((m) => m.kind === "module").map((m) => m.name));
    const owned = (m) => m.kind === "param" && owners.has(m.name.slice(0, m.name.lastIndexOf(".")));
    const memberRow = (m) => cat(h`<tr class="member" data-member="${m.name}" data-node="${m.node.length ? Number(m.node[0]) : ""}">`,
      h`<td class="m-name mono">${wrapDots(m.name)}</td><td class="mono">${m.slices}</td><td class="m-type">${m.type || m.kind}</td></tr>`);
    const main = g.members.filter((m) => !owned(m)), rest = g.members.filter(owned);
    parts.push(h`<table class="members">${main.map(memberRow)}</table>`);
    if (rest.length) parts.push(h`<details><summary class="note">+ ${rest.length} parameter slices of these modules</summary><table class="members">${rest.map(memberRow)}</table></details>`);
    parts.push(h`</div>`);
    return cat(...parts);
  }
  function select(i, gid, recenter) {
    selected = i;
    const n = nodes[i], parts = [];
    parts.push(h`<h2 class="node-name">${wrapDots(n.target)}</h2>`);
    parts.push(h`<div class="kv">${n.type} · ${n.op}${n.shape ? " · " + n.shape : ""}${n.name !== n.target ? " · node " + n.name : ""}</div>`);
    if (n.src) {
      const short = n.src.replace(/^.*(site-packages|dist-packages)\//, "");
      parts.push(h`<div class="src" title="${n.src}"><span class="mono">${short}</span>${n.code ? h`<code>${n.code}</code>` : ""}</div>`);
    }
    if (leafSet.has(n.target)) parts.push(h`<div class="reason">traced as a leaf: ${G.auto_leaves[n.target]}</div>`);
    if (unknownSet.has(n.name)) parts.push(h`<div class="reason">no rule for ${G.unknown_ops[n.name]}: its channels are frozen</div>`);
    if (total[i] > 0) {
      const fixed = n.chan.filter(([g]) => g < 0).reduce((a, [, c]) => a + Number(c), 0);
      parts.push(h`<div class="kv">channels: <b>${total[i]}</b>${fixed ? ` (${fixed} fixed)` : ""}`);
      if (REPORT) parts.push(h` · kept <b class="kept">${Number(n.kept)}</b> of ${total[i]}`);
      parts.push(h`</div>`);
    }
    // Output channels: the groups its result carries. Input side: the groups it is a member of otherwise (a
    // conv's input columns, with the role), then those its inputs carry (what an op without a rule froze).
    const out = carries[i], inputs = new Map();
    for (const m of memberOf[i]) if (!out.includes(m.g) && !inputs.has(m.g)) inputs.set(m.g, m.role + " " + m.slices);
    for (const p of preds[i]) for (const g of carries[p]) if (!out.includes(g) && !inputs.has(g)) inputs.set(g, "");
    parts.push(h`<h3>Output channels</h3>`);
    parts.push(out.length ? out.map((g) => groupCard(g, "")) : h`<div class="empty">none that belong to a group</div>`);
    if (inputs.size) parts.push(h`<h3>Input channels</h3>${[...inputs].map(([g, role]) => groupCard(g, role))}`);
    setHtml($("panel"), cat(...parts));
    const first = gid !== undefined && gid !== null ? gid : out.length ? out[0] : inputs.size ? inputs.keys().next().value : null;
    highlight(first);
    if (recenter) centerOn(i);
  }
  $("panel").addEventListener("click", (ev) => {
    const row = ev.target.closest("tr[data-node]");
    if (row && row.dataset.node !== "") {
      const gcard = row.closest(".group");
      select(+row.dataset.node, gcard ? +gcard.dataset.groupId : undefined, true); return;
    }
    const grow = ev.target.closest("tr[data-group]");
    if (grow) { const g = byId.get(+grow.dataset.group); if (g.nodes.length) select(g.nodes[0], g.id, true); return; }
    const card = ev.target.closest(".group");
    if (card) highlight(+card.dataset.groupId);
  });

  // ---- overview panel (nothing selected): the groups, or the plan's decisions in a report
  function overview() {
    const parts = [h`<h2>${G.model}</h2><div class="empty">Click a node to see its groups. Drag or scroll to pan, Ctrl + wheel (or the buttons) to zoom.</div>`];
    if (G.plan) parts.push(h`<div class="kv plan-summary">${G.plan.summary}</div>`);
    const leaves = Object.entries(G.auto_leaves), unknown = Object.entries(G.unknown_ops);
    if (leaves.length) parts.push(h`<h3>Traced as leaves</h3>${leaves.map(([m, r]) => h`<div class="reason"><span class="mono">${m}</span>: ${r}</div>`)}`);
    if (unknown.length) parts.push(h`<h3>Ops without a rule</h3>${unknown.map(([m, r]) => h`<div class="reason"><span class="mono">${m}</span>: ${r}</div>`)}`);
    const cols = REPORT ? [28, 150, 98, 0] : [28, 0, 44, 110];  // px; 0: the rest
    parts.push(h`<h3>${REPORT ? "Plan: per-group decisions" : "Groups"}</h3><table class="list"><colgroup>`,
      cols.map((w) => w ? h`<col data-w="${w}px">` : h`<col>`), h`</colgroup><tr><th>id</th><th>group</th>`,
      REPORT ? h`<th>kept</th><th>why</th></tr>` : h`<th>ch</th><th>state</th></tr>`);
    for (const g of groups) {
      const id = Number(g.id), channels = Number(g.channels);
      parts.push(h`<tr class="row" data-group="${id}"><td class="num">${id}</td><td class="mono"><i class="swatch" data-bg="${groupColor(g.id)}"></i>${wrapDots(g.label)}</td>`);
      if (REPORT) {
        const p = g.plan;
        const kept = p ? h`${Number(p.after)}/${Number(p.before)} <span class="bar"><span data-w="${(100 * p.after / Math.max(1, p.before)).toFixed(0)}%"></span></span>` : h`${channels}/${channels}`;
        const why = p ? p.why : g.skipped ? "left alone: " + g.skipped : g.prunable ? "" : "frozen: " + (g.reasons[0] || "");
        parts.push(h`<td class="num">${kept}</td><td>${why}</td></tr>`);
      } else {
        parts.push(h`<td class="num">${channels}</td><td>${g.prunable ? "prunable" : h`<b>frozen</b>: ${reasonsOf(g.id)[0] || ""}`}</td></tr>`);
      }
    }
    parts.push(h`</table>`);
    setHtml($("panel"), cat(...parts));
  }

  // ---- search
  const labels = nodes.map((n) => (n.target + " " + n.name + " " + n.type).toLowerCase());
  let hits = [];
  function search() {
    const q = $("search").value.trim().toLowerCase();
    hits = [];
    if (q) {
      const exact = [], prefix = [], sub = [];
      for (let i = 0; i < N; i++) {
        const t = nodes[i].target.toLowerCase();
        if (t === q || nodes[i].name.toLowerCase() === q) exact.push(i);
        else if (t.startsWith(q)) prefix.push(i);
        else if (labels[i].includes(q)) sub.push(i);
      }
      hits = exact.concat(prefix, sub).slice(0, 30);
    }
    setHtml($("results"), h`${hits.map((i, j) => h`<li data-i="${i}" class="${j === 0 ? "active" : ""}">${nodes[i].target}<small>${nodes[i].type}</small></li>`)}`);
  }
  $("search").addEventListener("input", search);
  $("search").addEventListener("keydown", (ev) => {
    if (ev.key === "Enter" && hits.length) { select(hits[0], undefined, true); $("results").replaceChildren(); }
    if (ev.key === "Escape") { $("search").value = ""; $("results").replaceChildren(); }
  });
  document.addEventListener("click", (ev) => { if (!ev.target.closest(".searchbox")) $("results").replaceChildren(); });
  document.addEventListener("keydown", (ev) => {
    if (ev.key === "Escape" && ev.target === document.body) clearSelection();
  });
  $("results").addEventListener("click", (ev) => {
    const li = ev.target.closest("li");
    if (li) { select(+li.dataset.i, undefined, true); $("results").replaceChildren(); }
  });

  // ---- filter
  function buildFilter() {
    const opts = [["all", "show: all nodes"], ["prunable", "prunable channels"], ["frozen", "frozen channels"]];
    for (const r of Object.keys(G.summary.frozen_reasons)) opts.push(["reason:" + r, "frozen: " + r]);
    if (leafSet.size) opts.push(["leaves", "auto-leaves"]);
    if (unknownSet.size) opts.push(["unknown", "ops without a rule"]);
    setHtml($("filter"), h`${opts.map(([v, t]) => h`<option value="${v}">${t}</option>`)}`);
    $("filter").addEventListener("change", applyFilter);
  }
  function matches(i, f) {
    const gs = carries[i].concat(memberOf[i].map((m) => m.g));
    if (f === "prunable") return gs.some((g) => byId.get(g).prunable);
    if (f === "frozen") return gs.some((g) => !byId.get(g).prunable);
    if (f === "leaves") return nodes[i].op === "call_module" && leafSet.has(nodes[i].target);
    if (f === "unknown") return unknownSet.has(nodes[i].name);
    if (f.startsWith("reason:")) { const r = f.slice(7); return gs.some((g) => reasonsOf(g).includes(r)); }
    return true;
  }
  function applyFilter() {
    const f = $("filter").value || "all";
    let shown = 0;
    for (let i = 0; i < N; i++) {
      const ok = f === "all" || matches(i, f);
      nodeEls[i].classList.toggle("dim", !ok);
      shown += ok;
    }
    $("filtercount").textContent = f === "all" ? "" : `${shown} of ${N} nodes`;
  }

  // ---- start
  renderSummary();
  buildFilter();
  if (REPORT) {
    const groupsLegend = [...$("legend").childNodes];  // the template's own legend, put back as it was
    $("colour").addEventListener("change", () => {
      colourMode = $("colour").value;
      if (colourMode === "kept") setHtml($("legend"), h`${[0, 0.5, 1].map((f) => h`<span><i data-bg="${keptColor(f)}"></i>${f * 100}% kept</span>`)}`);
      else $("legend").replaceChildren(...groupsLegend);
      redrawNodes();
    });
  }
  $("fit").addEventListener("click", () => fit(true));
  $("fitw").addEventListener("click", () => fit(false));
  $("zin").addEventListener("click", () => { const r = canvas.getBoundingClientRect(); zoomAt(1.25, r.width / 2, r.height / 2); });
  $("zout").addEventListener("click", () => { const r = canvas.getBoundingClientRect(); zoomAt(0.8, r.width / 2, r.height / 2); });
  svg.setAttribute("data-nodes", N);
  draw();
  overview();
  fit(false);
  // For scripts and tests: find a node by module name (or fx node name), select it or only bring it into view.
  const find = (name) => nodes.findIndex((n) => n.target === name || n.name === name);
  window.prunefxView = {
    select: (name) => { const i = find(name); if (i >= 0) select(i, undefined, true); return i; },
    reveal: (name) => { const i = find(name); if (i >= 0) centerOn(i); return i; },
    groupColor,
  };
  requestAnimationFrame(() => requestAnimationFrame(() => {
    window.prunefxRenderMs = performance.now() - t0;
    document.body.dataset.ready = "1";
  }));
})();
