/* prunefx graph view: draws the layout computed in Python, then handles selection, search, filter, zoom, pan.
   Data: <script id="data" type="application/json"> {graph: prunefx.graph/1, layout: {...}, mode: "groups"|"report"}. */
(function () {
  "use strict";
  const t0 = performance.now();
  const D = JSON.parse(document.getElementById("data").textContent);
  const G = D.graph, L = D.layout, REPORT = D.mode === "report";
  const nodes = G.nodes, groups = G.groups, N = nodes.length;
  const $ = (id) => document.getElementById(id);
  const esc = (s) => String(s).replace(/[&<>"']/g, (c) => ({"&": "&amp;", "<": "&lt;", ">": "&gt;", '"': "&quot;", "'": "&#39;"}[c]));
  const byId = new Map(groups.map((g) => [g.id, g]));
  const wrapDots = (s) => esc(s).replace(/\./g, ".<wbr>");  // long qualified names break at their dots

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
    const chip = (key, value, text, cls = "") => chips.push(`<span class="chip ${cls}" title="${esc(text)}"><b data-summary="${key}">${value}</b> ${esc(text)}</span>`);
    chip("nodes", s.nodes, "nodes");
    chip("groups", s.groups, "groups");
    chip("prunable_groups", s.prunable_groups, "prunable groups");
    chips.push(`<span class="chip"><b data-summary="prunable_channels">${s.prunable_channels}</b> of <b data-summary="channels">${s.channels}</b> channels prunable</span>`);
    chip("frozen_groups", s.frozen_groups, "frozen groups");
    chip("auto_leaves", s.auto_leaves, "auto-leaves", s.auto_leaves ? "warn" : "");
    chip("unknown_ops", s.unknown_ops, "ops without a rule", s.unknown_ops ? "warn" : "");
    for (const [r, c] of Object.entries(s.frozen_reasons)) {
      chips.push(`<span class="chip reason" data-reason="${esc(r)}" title="frozen because: ${esc(r)} (click to filter)"><b data-summary-reason="${esc(r)}">${c}</b> frozen: ${esc(r)}</span>`);
    }
    $("summary").innerHTML = chips.join("");
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
    let s = `<g class="${cls.join(" ")}" data-i="${i}" data-name="${esc(n.target)}" transform="translate(${x},${y})">`;
    let off = 0;
    for (const [c, f] of nodeFill(i)) {
      const sw = Math.max(0, f * w);
      s += `<rect class="seg" x="${off.toFixed(1)}" width="${(sw + 0.4).toFixed(1)}" height="${H}" fill="${c}"/>`;
      off += sw;
    }
    s += `<rect class="box" width="${w}" height="${H}" rx="3" fill="none"/>`;
    let label = L.text[i];
    if (REPORT && total[i] > 0) {
      const k = n.kept, t = total[i];
      s += `<rect class="kbar" x="3" y="${H - 6}" width="${w - 6}" height="3"/><rect class="kbar-in" x="3" y="${H - 6}" width="${((w - 6) * k / t).toFixed(1)}" height="3"/>`;
      if (k < t) label += `  ${k}/${t}`;
    }
    s += `<text x="${w / 2}" y="${REPORT && total[i] > 0 ? 14 : 16.5}" text-anchor="middle">${esc(label)}</text>`;
    s += `<title>${esc(n.target)} (${esc(n.type)})${n.shape ? " " + esc(n.shape) : ""}</title></g>`;
    return s;
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
    for (const [s, pts] of L.trunks) svgEdges.push(`<path class="e trunk" data-s="${s}" d="${pathOf(pts)}"/>`);
    for (let k = 0; k < E.length; k++) svgEdges.push(`<path class="e" data-s="${E[k][0]}" marker-end="url(#arrow)" d="${pathOf(L.edges[k])}"/>`);
    $("edges").innerHTML = svgEdges.join("");
    for (const el of $("edges").children) srcEdges[+el.dataset.s].push(el);
    redrawNodes();
  }
  let nodeEls = [];
  function redrawNodes() {
    const parts = new Array(N);
    for (let i = 0; i < N; i++) parts[i] = nodeSvg(i);
    $("nodes").innerHTML = parts.join("");
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
    const g = byId.get(gid);
    const c = groupColor(gid);
    let s = `<div class="group" data-group-id="${g.id}" style="border-left-color:${c}">`;
    s += `<div class="gh">group <span class="gid">${g.id}</span> · <span class="gch">${g.channels}</span> channels`;
    s += g.prunable ? `<span class="state prunable">prunable</span>` : `<span class="state frozen">frozen</span>`;
    if (role) s += ` <span class="note">(${esc(role)})</span>`;
    s += `</div>`;
    for (const r of g.reasons) s += `<div class="reason">frozen: ${esc(r)}</div>`;
    if (g.prunable && !g.exact) for (const r of g.inexact_reasons) s += `<div class="note">not exactly verifiable: ${esc(r)}</div>`;
    // An equal-count constraint is stated by the tie line below, with the group it is tied to.
    for (const r of g.constraints) if (!r.startsWith("keeps as many channels as group")) s += `<div class="note">constraint: ${esc(r)}</div>`;
    for (const t of G.ties) if (t.groups.includes(g.id)) {
      s += `<div class="note tie">tied: keeps as many channels as group ${t.groups.filter((x) => x !== g.id).join(", ")} (${esc(t.why)})</div>`;
    }
    if (g.plan) {
      s += `<div class="decision">kept ${g.plan.after} of ${g.plan.before}${g.plan.after < g.plan.before ? "" : " (unchanged)"}: ${esc(g.plan.why)}</div>`;
    } else if (g.skipped) {
      s += `<div class="decision">left alone: ${esc(g.skipped)}</div>`;
    }
    // Parameter slices of a member module say the same as the module's row: listed apart, folded.
    const owners = new Set(g.members.filter((m) => m.kind === "module").map((m) => m.name));
    const owned = (m) => m.kind === "param" && owners.has(m.name.slice(0, m.name.lastIndexOf(".")));
    const row = (m) => `<tr class="member" data-member="${esc(m.name)}" data-node="${m.node.length ? m.node[0] : ""}">` +
      `<td class="m-name mono">${wrapDots(m.name)}</td><td class="mono">${esc(m.slices)}</td><td class="m-type">${esc(m.type || m.kind)}</td></tr>`;
    const main = g.members.filter((m) => !owned(m)), rest = g.members.filter(owned);
    s += `<table class="members">${main.map(row).join("")}</table>`;
    if (rest.length) s += `<details><summary class="note">+ ${rest.length} parameter slices of these modules</summary><table class="members">${rest.map(row).join("")}</table></details>`;
    return s + `</div>`;
  }
  function select(i, gid, recenter) {
    selected = i;
    const n = nodes[i];
    let h = `<h2 class="node-name">${wrapDots(n.target)}</h2>`;
    h += `<div class="kv">${esc(n.type)} · ${esc(n.op)}${n.shape ? " · " + esc(n.shape) : ""}${n.name !== n.target ? " · node " + esc(n.name) : ""}</div>`;
    if (n.src) {
      const short = n.src.replace(/^.*(site-packages|dist-packages)\//, "");
      h += `<div class="src" title="${esc(n.src)}"><span class="mono">${esc(short)}</span>${n.code ? `<code>${esc(n.code)}</code>` : ""}</div>`;
    }
    if (leafSet.has(n.target)) h += `<div class="reason">traced as a leaf: ${esc(G.auto_leaves[n.target])}</div>`;
    if (unknownSet.has(n.name)) h += `<div class="reason">no rule for ${esc(G.unknown_ops[n.name])}: its channels are frozen</div>`;
    if (total[i] > 0) {
      const fixed = n.chan.filter(([g]) => g < 0).reduce((a, [, c]) => a + c, 0);
      h += `<div class="kv">channels: <b>${total[i]}</b>${fixed ? ` (${fixed} fixed)` : ""}`;
      if (REPORT) h += ` · kept <b class="kept">${n.kept}</b> of ${total[i]}`;
      h += `</div>`;
    }
    // Output channels: the groups its result carries. Input side: the groups it is a member of otherwise (a
    // conv's input columns, with the role), then those its inputs carry (what an op without a rule froze).
    const out = carries[i], inputs = new Map();
    for (const m of memberOf[i]) if (!out.includes(m.g) && !inputs.has(m.g)) inputs.set(m.g, m.role + " " + m.slices);
    for (const p of preds[i]) for (const g of carries[p]) if (!out.includes(g) && !inputs.has(g)) inputs.set(g, "");
    h += `<h3>Output channels</h3>`;
    h += out.length ? out.map((g) => groupCard(g, "")).join("") : `<div class="empty">none that belong to a group</div>`;
    if (inputs.size) h += `<h3>Input channels</h3>` + [...inputs].map(([g, role]) => groupCard(g, role)).join("");
    $("panel").innerHTML = h;
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
    let h = `<h2>${esc(G.model)}</h2><div class="empty">Click a node to see its groups. Drag or scroll to pan, Ctrl + wheel (or the buttons) to zoom.</div>`;
    if (G.plan) h += `<div class="kv plan-summary">${esc(G.plan.summary)}</div>`;
    const leaves = Object.entries(G.auto_leaves), unknown = Object.entries(G.unknown_ops);
    if (leaves.length) h += `<h3>Traced as leaves</h3>` + leaves.map(([m, r]) => `<div class="reason"><span class="mono">${esc(m)}</span>: ${esc(r)}</div>`).join("");
    if (unknown.length) h += `<h3>Ops without a rule</h3>` + unknown.map(([m, r]) => `<div class="reason"><span class="mono">${esc(m)}</span>: ${esc(r)}</div>`).join("");
    const cols = REPORT ? [28, 150, 98, 0] : [28, 0, 44, 110];  // px; 0: the rest
    h += `<h3>${REPORT ? "Plan: per-group decisions" : "Groups"}</h3><table class="list"><colgroup>` +
      cols.map((w) => w ? `<col style="width:${w}px">` : "<col>").join("") + `</colgroup><tr><th>id</th><th>group</th>`;
    h += REPORT ? `<th>kept</th><th>why</th></tr>` : `<th>ch</th><th>state</th></tr>`;
    for (const g of groups) {
      const sw = `<i style="display:inline-block;width:9px;height:9px;background:${groupColor(g.id)};border:1px solid #777;margin-right:4px"></i>`;
      h += `<tr class="row" data-group="${g.id}"><td class="num">${g.id}</td><td class="mono">${sw}${wrapDots(g.label)}</td>`;
      if (REPORT) {
        const p = g.plan;
        const kept = p ? `${p.after}/${p.before} <span class="bar"><span style="width:${(100 * p.after / Math.max(1, p.before)).toFixed(0)}%"></span></span>` : `${g.channels}/${g.channels}`;
        const why = p ? p.why : g.skipped ? "left alone: " + g.skipped : g.prunable ? "" : "frozen: " + (g.reasons[0] || "");
        h += `<td class="num">${kept}</td><td>${esc(why)}</td></tr>`;
      } else {
        h += `<td class="num">${g.channels}</td><td>${g.prunable ? "prunable" : "<b>frozen</b>: " + esc(reasonsOf(g.id)[0] || "")}</td></tr>`;
      }
    }
    $("panel").innerHTML = h + `</table>`;
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
    $("results").innerHTML = hits.map((i, j) => `<li data-i="${i}" class="${j === 0 ? "active" : ""}">${esc(nodes[i].target)}<small>${esc(nodes[i].type)}</small></li>`).join("");
  }
  $("search").addEventListener("input", search);
  $("search").addEventListener("keydown", (ev) => {
    if (ev.key === "Enter" && hits.length) { select(hits[0], undefined, true); $("results").innerHTML = ""; }
    if (ev.key === "Escape") { $("search").value = ""; $("results").innerHTML = ""; }
  });
  document.addEventListener("click", (ev) => { if (!ev.target.closest(".searchbox")) $("results").innerHTML = ""; });
  document.addEventListener("keydown", (ev) => {
    if (ev.key === "Escape" && ev.target === document.body) clearSelection();
  });
  $("results").addEventListener("click", (ev) => {
    const li = ev.target.closest("li");
    if (li) { select(+li.dataset.i, undefined, true); $("results").innerHTML = ""; }
  });

  // ---- filter
  function buildFilter() {
    const opts = [["all", "show: all nodes"], ["prunable", "prunable channels"], ["frozen", "frozen channels"]];
    for (const r of Object.keys(G.summary.frozen_reasons)) opts.push(["reason:" + r, "frozen: " + r]);
    if (leafSet.size) opts.push(["leaves", "auto-leaves"]);
    if (unknownSet.size) opts.push(["unknown", "ops without a rule"]);
    $("filter").innerHTML = opts.map(([v, t]) => `<option value="${esc(v)}">${esc(t)}</option>`).join("");
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
    const groupsLegend = $("legend").innerHTML;
    $("colour").addEventListener("change", () => {
      colourMode = $("colour").value;
      $("legend").innerHTML = colourMode === "kept" ? [0, 0.5, 1].map((f) =>
        `<span><i style="background:${keptColor(f)}"></i>${f * 100}% kept</span>`).join("") : groupsLegend;
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
