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
  const inferred = G.inferred_ops || {};  // absent in graphs written before inferred rules
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

  // ---- layout: prunefx.view.layout's layered scheme (see its docstring), run on what is shown: the blocks
  // and nodes of the current expansion. Layers by longest path (a node with readers sinks to just above the
  // first), one trunk of virtual points per source for its layer-skipping edges, barycentre ordering, then x
  // by sweeps that pull each box towards its neighbours under the spacing (isotonic regression).
  const W_TRUNK = 8, W_MIXED = 2, W_PLAIN = 1, W_CENTRE = 0.05;
  function isotonic(desired, weight, sep) {
    const offset = [0];
    for (const s of sep) offset.push(offset[offset.length - 1] + s);
    const blocks = [];
    for (let i = 0; i < desired.length; i++) {
      blocks.push([desired[i] - offset[i], weight[i], 1]);
      while (blocks.length > 1 && blocks[blocks.length - 2][0] > blocks[blocks.length - 1][0]) {
        const [v2, w2, c2] = blocks.pop(), [v1, w1, c1] = blocks[blocks.length - 1];
        blocks[blocks.length - 1] = [(v1 * w1 + v2 * w2) / (w1 + w2), w1 + w2, c1 + c2];
      }
    }
    const out = [];
    for (const [v, , c] of blocks) for (let j = 0; j < c; j++) out.push(v);
    return out.map((v, i) => v + offset[i]);
  }
  function layoutDag(widths, edges, inputs) {  // edges: [source, target] with source before target (a DAG)
    const n = widths.length, NH = H, GAP_L = 30, GAP_N = 16, GAP_T = 8, MARGIN = 24;
    const preds = Array.from({length: n}, () => []), succs = Array.from({length: n}, () => []);
    for (const [s, t] of edges) if (!succs[s].includes(t)) { succs[s].push(t); preds[t].push(s); }
    const indeg = preds.map((p) => p.length), topo = [];
    for (let v = 0; v < n; v++) if (!indeg[v]) topo.push(v);
    for (let q = 0; q < topo.length; q++) for (const s of succs[topo[q]]) if (--indeg[s] === 0) topo.push(s);
    const layer = new Array(n).fill(0), data = new Array(n).fill(false);
    for (const v of topo) for (const u of preds[v]) layer[v] = Math.max(layer[v], layer[u] + 1);
    const isInput = new Set(inputs.length ? inputs.filter((v) => !preds[v].length) : topo.filter((v) => !preds[v].length));
    for (const v of topo) data[v] = isInput.has(v) || preds[v].some((u) => data[u]);
    for (let q = topo.length - 1; q >= 0; q--) {
      const v = topo[q];
      if (isInput.has(v) || !succs[v].length) continue;
      const below = Math.min(...succs[v].map((s) => layer[s])) - 1;
      if (below > layer[v] && (!data[v] || succs[v].length >= preds[v].length)) layer[v] = below;
    }
    const lay = layer.slice(), wid = widths.slice(), up = Array.from({length: n}, () => []), down = Array.from({length: n}, () => []);
    const trunk = new Map();
    const addVertex = (l) => { lay.push(l); wid.push(0); up.push([]); down.push([]); return lay.length - 1; };
    const link = (a, b) => {
      const w = a >= n && b >= n ? W_TRUNK : a >= n || b >= n ? W_MIXED : W_PLAIN;
      down[a].push([b, w]); up[b].push([a, w]);
    };
    for (let s = 0; s < n; s++) {
      const far = succs[s].filter((t) => layer[t] > layer[s] + 1);
      if (far.length) {
        const chain = []; let prev = s;
        const end = Math.max(...far.map((t) => layer[t]));
        for (let l = layer[s] + 1; l < end; l++) { const v = addVertex(l); link(prev, v); chain.push(v); prev = v; }
        trunk.set(s, chain);
      }
      for (const t of succs[s]) link(layer[t] === layer[s] + 1 ? s : trunk.get(s)[layer[t] - layer[s] - 2], t);
    }
    const m = lay.length, depth = n ? Math.max(...lay) + 1 : 0;
    const rows = Array.from({length: depth}, () => []), pos = new Float64Array(m);
    for (let v = 0; v < m; v++) rows[lay[v]].push(v);
    for (const row of rows) row.forEach((v, i) => { pos[v] = i; });
    const sortRows = (from, to, stepL, side) => {
      for (let l = from; l !== to; l += stepL) {
        const row = rows[l], key = new Map();
        for (const v of row) {
          const nb = side[v];
          let a = 0, b = 0; for (const [u, w] of nb) { a += pos[u] * w; b += w; }
          key.set(v, nb.length ? a / b : pos[v]);
        }
        row.sort((p, q) => key.get(p) - key.get(q));
        row.forEach((v, i) => { pos[v] = i; });
      }
    };
    for (let sw = 0; sw < 6; sw++) { if (sw % 2 === 0) sortRows(1, depth, 1, up); else sortRows(depth - 2, -1, -1, down); }
    const gap = (a, b) => a >= n && b >= n ? GAP_T : (wid[a] + wid[b]) / 2 + (a < n && b < n ? GAP_N : GAP_N / 2);
    const seps = rows.map((row) => row.slice(1).map((v, i) => gap(row[i], v)));
    const x = new Float64Array(m);
    rows.forEach((row, l) => {
      let acc = 0;
      row.forEach((v, i) => { x[v] = acc; acc += i < seps[l].length ? seps[l][i] : 0; });
      for (const v of row) x[v] -= acc / 2;
    });
    const place = (from, to, stepL, sides) => {
      for (let l = from; l !== to; l += stepL) {
        const row = rows[l], desired = [], weight = [];
        for (const v of row) {
          let total = 0, wsum = W_CENTRE;
          for (const side of sides) for (const [u, w] of side[v]) { total += x[u] * w; wsum += w; }
          desired.push(total / wsum); weight.push(wsum);
        }
        isotonic(desired, weight, seps[l]).forEach((xv, i) => { x[row[i]] = xv; });
      }
    };
    for (let sw = 0; sw < 24; sw++) {
      const sides = sw < 12 ? (sw % 2 === 0 ? [up] : [down]) : [up, down];
      if (sw % 2 === 0) place(1, depth, 1, sides); else place(depth - 2, -1, -1, sides);
    }
    for (let l = 1; l < depth; l++) rows[l].forEach((v, i, row) => {  // a plain chain's link drawn vertical where there is room
      if (up[v].length !== 1 || down[up[v][0][0]].length !== 1) return;
      const want = x[up[v][0][0]];
      if ((i === 0 || want - x[row[i - 1]] >= seps[l][i - 1]) && (i === row.length - 1 || x[row[i + 1]] - want >= seps[l][i])) x[v] = want;
    });
    let left = Infinity, right = -Infinity;
    for (let v = 0; v < m; v++) { left = Math.min(left, x[v] - wid[v] / 2); right = Math.max(right, x[v] + wid[v] / 2); }
    if (!m) left = right = 0;
    const shift = MARGIN - left, step = NH + GAP_L, r = (p) => Math.round(p * 10) / 10;
    for (let v = 0; v < m; v++) x[v] += shift;
    const top = (v) => MARGIN + lay[v] * step;
    const trunks = [];
    for (const [s, chain] of trunk) {
      const pts = [[r(x[s]), r(top(s) + NH)]];
      for (const v of chain) pts.push([r(x[v]), r(top(v))], [r(x[v]), r(top(v) + NH)]);
      trunks.push([s, pts]);
    }
    const lines = edges.map(([s, t]) => {
      const v = layer[t] === layer[s] + 1 ? s : trunk.get(s)[layer[t] - layer[s] - 2];
      return [[r(x[v]), r(top(v) + NH)], [r(x[t]), r(top(t))]];
    });
    return {x: Array.from(x.subarray(0, n), r), y: Array.from({length: n}, (_, v) => r(top(v))),
      width: r(right - left + 2 * MARGIN), height: r(2 * MARGIN + depth * step - GAP_L), edges: lines, trunks};
  }

  // ---- blocks: one per module call (graph.modules), collapsed into one box or expanded into its children.
  const M = (G.modules || []).slice();
  const blockIndex = new Map(M.map((b, k) => [b.path, k]));
  const blockOf = nodes.map((n) => n.module && blockIndex.has(n.module) ? blockIndex.get(n.module) : -1);
  // Ops of a module that run before any of its sub-modules feeds them (an exported LLM's mask and position
  // arithmetic, dozens of ATen ops) fold into one box of their own, so that its sub-modules are seen at once.
  const FOLD = 8;
  {
    const hasSub = new Set(M.map((b) => Number(b.parent)));
    const tainted = new Uint8Array(N), loose = new Map();
    const below = (k, b) => { for (; k >= 0; k = Number(M[k].parent)) if (Number(M[k].parent) === b) return true; return false; };
    for (let i = 0; i < N; i++) {
      const b = blockOf[i];
      tainted[i] = preds[i].some((p) => blockOf[p] === b ? tainted[p] : below(blockOf[p], b)) ? 1 : 0;
      if (!tainted[i] && hasSub.has(b) && nodes[i].op !== "placeholder" && nodes[i].op !== "output") {
        if (!loose.has(b)) loose.set(b, []); loose.get(b).push(i);
      }
    }
    for (const [b, list] of loose) if (list.length > FOLD) {
      const path = (b >= 0 ? M[b].path + " " : "") + "(ops before its sub-modules)";
      if (blockIndex.has(path)) continue;
      blockIndex.set(path, M.length);
      for (const i of list) blockOf[i] = M.length;
      M.push({path, type: "ops", parent: b});
    }
  }
  const NB = M.length;
  const chainOf = (b) => { const c = []; for (; b >= 0; b = Number(M[b].parent)) c.unshift(b); return c; };  // outermost first
  const chains = blockOf.map(chainOf);
  const inBlock = Array.from({length: NB}, () => []);  // every node inside a block, nested ones too
  chains.forEach((c, i) => { for (const b of c) inBlock[b].push(i); });
  const children = Array.from({length: NB + 1}, () => 0);  // units a block opens into (index NB: the top level)
  for (let b = 0; b < NB; b++) children[Number(M[b].parent) >= 0 ? Number(M[b].parent) : NB]++;
  for (let i = 0; i < N; i++) children[blockOf[i] >= 0 ? blockOf[i] : NB]++;
  const expanded = new Uint8Array(NB);
  const BUDGET = 30;  // boxes at load: expand the biggest block while the view stays this small
  function collapseToBudget() {
    expanded.fill(0);
    let count = children[NB];
    for (;;) {
      let best = -1;
      for (let b = 0; b < NB; b++) {
        const p = Number(M[b].parent);
        if (!expanded[b] && (p < 0 || expanded[p]) && (best < 0 || inBlock[b].length > inBlock[best].length)) best = b;
      }
      // A view of a few boxes says nothing: open its biggest block even past the budget (not past twice it).
      const after = count + children[best] - 1;
      if (best < 0 || (after > BUDGET && (count >= 8 || after > 2 * BUDGET))) return;
      expanded[best] = 1; count += children[best] - 1;
    }
  }
  let units = [], unitOf = new Int32Array(N), P = null;  // shown boxes: {b} a collapsed block or {i} a node
  function buildUnits() {
    units = []; const blockUnit = new Map();
    for (let i = 0; i < N; i++) {
      const b = chains[i].find((c) => !expanded[c]);
      if (b === undefined) { unitOf[i] = units.length; units.push({i}); continue; }
      if (!blockUnit.has(b)) { blockUnit.set(b, units.length); units.push({b}); }
      unitOf[i] = blockUnit.get(b);
    }
  }
  const blockText = (b) => { const s = String(M[b].path); return "\u229e " + (s.length <= L.max_label ? s : "\u2026" + s.slice(-(L.max_label - 1))); };
  const unitWidth = (u) => u.b === undefined ? L.w[u.i] : Math.max(60, (blockText(u.b).length + String(M[u.b].type).length + String(inBlock[u.b].length).length + 4) * L.char_px + 16);
  let unitEdges = [], backEdges = [];
  function relayout() {
    buildUnits();
    const U = units.length, seen = new Set(), raw = [];
    for (const [s, t] of G.edges) {
      const a = unitOf[s], b = unitOf[t], key = a * U + b;
      if (a !== b && !seen.has(key)) { seen.add(key); raw.push([a, b]); }
    }
    // Collapsing can close a cycle (out of a block and back in): rank the boxes topologically, breaking a cycle
    // at the earliest box left; an edge against the rank is drawn apart, not laid out.
    const out = Array.from({length: U}, () => []), indeg = new Int32Array(U), rank = new Int32Array(U).fill(-1);
    for (const [a, b] of raw) { out[a].push(b); indeg[b]++; }
    let next = 0, cursor = 0; const queue = [];
    for (let u = 0; u < U; u++) if (!indeg[u]) queue.push(u);
    while (next < U) {
      if (!queue.length) { while (rank[cursor] >= 0) cursor++; queue.push(cursor); }
      const u = queue.shift();
      if (rank[u] >= 0) continue;
      rank[u] = next++;
      for (const v of out[u]) if (--indeg[v] === 0 && rank[v] < 0) queue.push(v);
    }
    unitEdges = raw.filter(([a, b]) => rank[a] < rank[b]);
    backEdges = raw.filter(([a, b]) => rank[a] >= rank[b]);
    if (units.every((u) => u.b === undefined)) {  // every block open: the whole graph, laid out in Python, one line per input edge
      unitEdges = G.edges; backEdges = [];
      P = {x: L.x, y: L.y, width: L.width, height: L.height, edges: L.edges, trunks: L.trunks};
      return;
    }
    const inputs = units.map((u, k) => u.i !== undefined && nodes[u.i].op === "placeholder" ? k : -1).filter((k) => k >= 0);
    P = layoutDag(units.map(unitWidth), unitEdges, inputs);
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
  function nodeSvg(i, u) {
    const n = nodes[i], w = L.w[i], x = P.x[u] - w / 2, y = P.y[u];
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
      h`<title>${n.target} (${n.type})${n.shape ? " " + n.shape : ""}${n.module ? " in " + n.module : ""}</title></g>`);
  }
  function blockSvg(b, u) {
    const w = unitWidth(units[u]), x = P.x[u] - w / 2, y = P.y[u], count = inBlock[b].length;
    return cat(h`<g class="n blk" data-b="${b}" data-u="${u}" data-name="${M[b].path}" transform="translate(${x},${y})">`,
      h`<rect class="box" width="${w}" height="${H}" rx="6"/>`,
      h`<text x="${w / 2}" y="16.5" text-anchor="middle">${blockText(b)}<tspan class="btype"> ${M[b].type}</tspan><tspan class="count"> ${count}</tspan></text>`,
      h`<title>${M[b].path} (${M[b].type}): ${count} nodes, click to expand</title></g>`);
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
  let srcEdges = [];  // per shown box: the edges leaving it
  function draw() {
    relayout();
    const svgEdges = [];
    for (const [s, pts] of P.trunks) svgEdges.push(h`<path class="e trunk" data-s="${s}" d="${pathOf(pts)}"/>`);
    unitEdges.forEach(([s], k) => svgEdges.push(h`<path class="e" data-s="${s}" marker-end="url(#arrow)" d="${pathOf(P.edges[k])}"/>`));
    for (const [s, t] of backEdges) {  // against the layout's order: straight from the source's side to the target's
      const ws = unitWidth(units[s]) / 2, wt = unitWidth(units[t]) / 2;
      svgEdges.push(h`<path class="e back" data-s="${s}" marker-end="url(#arrow)" d="M${P.x[s] + ws},${P.y[s] + H / 2}L${P.x[t] + wt},${P.y[t] + H / 2}"/>`);
    }
    setHtml($("edges"), h`${svgEdges}`);
    srcEdges = units.map(() => []);
    for (const el of $("edges").children) srcEdges[+el.dataset.s].push(el);
    svg.setAttribute("data-units", units.length);
    svg.setAttribute("data-blocks", units.filter((u) => u.b !== undefined).length);
    redrawNodes();
  }
  let unitEls = [];
  const elOf = (i) => unitEls[unitOf[i]];
  function redrawNodes() {
    const parts = units.map((u, k) => u.b === undefined ? nodeSvg(u.i, k) : blockSvg(u.b, k));
    setHtml($("nodes"), h`${parts}`);
    unitEls = Array.from($("nodes").children);
    applyFilter();
    markHits();
    if (selected !== null) select(selected, activeGroup, false);
  }
  // Expanding or collapsing keeps the box clicked (or the node asked for) where it was on screen.
  function reshow(anchorNode, before) {
    draw();
    if (anchorNode !== null && before) {
      const u = unitOf[anchorNode];
      tx += (before[0] - P.x[u]) * k; ty += (before[1] - P.y[u]) * k; apply();
    }
  }
  function expandTo(i) {  // open every block around node i; true when that changed the view
    let changed = false;
    for (const b of chains[i]) if (!expanded[b]) { expanded[b] = 1; changed = true; }
    if (changed) { const u = unitOf[i]; reshow(i, [P.x[u], P.y[u]]); }
    return changed;
  }
  function toggleBlock(b, open) {
    const first = inBlock[b][0], u = unitOf[first], before = [P.x[u], P.y[u]];
    expanded[b] = open ? 1 : 0;
    if (!open) for (const c of inBlock[b]) if (selected === c) { selected = null; activeGroup = null; }
    reshow(first, before);
    if (selected === null) { svg.classList.remove("focus"); overview(); }
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
    k = Math.min(1, (r.width - 10) / P.width);
    if (all) k = Math.min(k, (r.height - 10) / P.height);
    tx = (r.width - P.width * k) / 2; ty = 4; apply();
  }
  function centerOn(i) {
    expandTo(i);
    const r = canvas.getBoundingClientRect(), u = unitOf[i];
    if (k < 0.8) k = 1;
    tx = r.width / 2 - P.x[u] * k; ty = r.height / 3 - (P.y[u] + H / 2) * k; apply();
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
    if (g && g.dataset.b !== undefined) toggleBlock(+g.dataset.b, true);
    else if (g) select(+g.dataset.i); else clearSelection();
  });

  // ---- selection
  let selected = null, activeGroup = null;
  function clearClasses() {
    for (const el of unitEls) el.classList.remove("sel", "mem", "car");
    for (const el of $("edges").children) el.classList.remove("car");
  }
  function clearSelection() {
    selected = null; activeGroup = null; clearClasses(); svg.classList.remove("focus"); overview();
  }
  function highlight(gid) {
    clearClasses();
    activeGroup = gid;
    if (selected !== null) elOf(selected).classList.add("sel");
    if (gid === null || gid === undefined) { svg.classList.toggle("focus", selected !== null); return; }
    for (const i of carriers.get(gid) || []) { elOf(i).classList.add("car"); for (const e of srcEdges[unitOf[i]]) e.classList.add("car"); }
    for (const i of byId.get(gid).nodes) elOf(i).classList.add("mem");  // a collapsed block lights for its members
    svg.classList.add("focus");
    for (const el of document.querySelectorAll("#panel .group")) el.classList.toggle("active", +el.dataset.groupId === gid);
  }
  // A member's slice (prunefx.analysis.groups.Member.describe) in words: which positions of which dim hold the group.
  const SLICES = "role[a:b]: the group's channels sit at positions a to b-1 of the member's dim (out: its output channels, "
    + "in: its input channels); [a:b:s]: every s-th position from a, below b; [p,q,...]: these positions; "
    + "+[c:d]: each channel also sits at c to d-1 (the same tensor concatenated twice); "
    + "[a:b:s]xN: each channel fills N positions (a flatten into a Linear, a repeat), the span saying where each "
    + "channel's first one is; {n positions}: an irregular placement.";
  function sliceHelp(text) {
    const t = String(text), m = /^(\w+)\[(\d+):(\d+)(?::(\d+))?\]x(\d+)$/.exec(t);
    if (m) {
      const [, role, a, b, st, reps] = m, step = Number(st || 1), count = Math.ceil((Number(b) - Number(a)) / step);
      return `${t}: ${count} channels of ${role}, each filling ${reps} positions; their first positions are ${a}, ${Number(a) + step}, ... below ${b}`;
    }
    return `${t}: ${SLICES}`;
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
      h`<td class="m-name mono">${wrapDots(m.name)}</td><td class="mono slices" title="${sliceHelp(m.slices)}">${m.slices}</td><td class="m-type">${m.type || m.kind}</td></tr>`);
    const main = g.members.filter((m) => !owned(m)), rest = g.members.filter(owned);
    parts.push(h`<table class="members">${main.map(memberRow)}</table>`);
    if (rest.length) parts.push(h`<details><summary class="note">+ ${rest.length} parameter slices of these modules</summary><table class="members">${rest.map(memberRow)}</table></details>`);
    parts.push(h`</div>`);
    return cat(...parts);
  }
  function select(i, gid, recenter) {
    if (recenter) expandTo(i);
    selected = i;
    const n = nodes[i], parts = [];
    parts.push(h`<h2 class="node-name">${wrapDots(n.target)}</h2>`);
    if (chains[i].length) {  // the blocks it sits in, outermost first: click one to fold it back into a box
      parts.push(h`<div class="crumbs">in ${chains[i].map((b, j) => h`${j ? " \u203a " : ""}<a class="crumb" data-collapse="${b}" title="collapse ${M[b].path} (${M[b].type})">${M[b].path}</a>`)}</div>`);
    }
    parts.push(h`<div class="kv">${n.type} · ${n.op}${n.shape ? " · " + n.shape : ""}${n.name !== n.target ? " · node " + n.name : ""}</div>`);
    if (n.src) {
      const short = n.src.replace(/^.*(site-packages|dist-packages)\//, "");
      parts.push(h`<div class="src" title="${n.src}"><span class="mono">${short}</span>${n.code ? h`<code>${n.code}</code>` : ""}</div>`);
    }
    if (leafSet.has(n.target)) parts.push(h`<div class="reason">traced as a leaf: ${G.auto_leaves[n.target]}</div>`);
    if (unknownSet.has(n.name)) parts.push(h`<div class="reason">no rule for ${G.unknown_ops[n.name]}: its channels are frozen</div>`);
    if (inferred[n.name]) parts.push(h`<div class="reason">inferred rule (probed, checked by the oracle): ${inferred[n.name]}</div>`);
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
    const crumb = ev.target.closest("[data-collapse]");
    if (crumb) { toggleBlock(+crumb.dataset.collapse, false); return; }
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
    const probed = Object.entries(inferred);
    if (probed.length) parts.push(h`<h3>Inferred rules (probed, checked by the oracle)</h3>${probed.map(([m, r]) => h`<div class="reason"><span class="mono">${m}</span>: ${r}</div>`)}`);
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
    parts.push(h`<h3>Reading the view</h3><div class="note help-blocks">A box marked \u229e is a module call with its node count: click it to expand it into its children; click a name under a node's title to fold that module back. A module's ops that run before its sub-modules (an exported model's mask arithmetic) share one box. \u201cexpand all\u201d shows every node.</div>`,
      h`<div class="note help-slices">Slices of a group's members: ${SLICES}</div>`);
    setHtml($("panel"), cat(...parts));
  }

  // ---- search
  const labels = nodes.map((n) => (n.target + " " + n.name + " " + n.type + " " + (n.module || "") + " " + n.label).toLowerCase());
  let matched = [];  // every node the query finds: their boxes (or the blocks holding them) are marked .hit
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
      matched = exact.concat(prefix, sub);
      hits = matched.slice(0, 30);
    } else matched = [];
    setHtml($("results"), h`${hits.map((i, j) => h`<li data-i="${i}" class="${j === 0 ? "active" : ""}">${nodes[i].target}<small>${nodes[i].type}${nodes[i].module ? " in " + nodes[i].module : ""}</small></li>`)}`);
    markHits();
  }
  function markHits() {
    for (const el of unitEls) el.classList.remove("hit");
    for (const i of matched) elOf(i).classList.add("hit");
    svg.classList.toggle("searching", matched.length > 0);
  }
  $("search").addEventListener("input", search);
  $("search").addEventListener("keydown", (ev) => {
    if (ev.key === "Enter" && hits.length) { select(hits[0], undefined, true); $("results").replaceChildren(); }
    if (ev.key === "Escape") { $("search").value = ""; $("results").replaceChildren(); matched = []; markHits(); }
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
    const lit = new Uint8Array(units.length);  // a block stays bright when any node inside it matches
    for (let i = 0; i < N; i++) {
      const ok = f === "all" || matches(i, f);
      if (ok) lit[unitOf[i]] = 1;
      shown += ok;
    }
    unitEls.forEach((el, u) => el.classList.toggle("dim", !lit[u]));
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
  $("expand").addEventListener("click", () => { expanded.fill(1); draw(); fit(false); });
  $("collapse").addEventListener("click", () => { collapseToBudget(); draw(); fit(false); });
  $("fitw").addEventListener("click", () => fit(false));
  $("zin").addEventListener("click", () => { const r = canvas.getBoundingClientRect(); zoomAt(1.25, r.width / 2, r.height / 2); });
  $("zout").addEventListener("click", () => { const r = canvas.getBoundingClientRect(); zoomAt(0.8, r.width / 2, r.height / 2); });
  svg.setAttribute("data-nodes", N);
  collapseToBudget();
  draw();
  overview();
  fit(false);
  // For scripts and tests: find a node by module name (or fx node name), select it or only bring it into view.
  const find = (name) => nodes.findIndex((n) => n.target === name || n.name === name);
  window.prunefxView = {
    select: (name) => { const i = find(name); if (i >= 0) select(i, undefined, true); return i; },
    reveal: (name) => { const i = find(name); if (i >= 0) centerOn(i); return i; },
    expandAll: () => { expanded.fill(1); draw(); fit(false); return N; },
    collapseAll: () => { collapseToBudget(); draw(); fit(false); return units.length; },
    showBlock: (path) => {  // bring a block's box (collapsed) into view, as a user would scroll to it
      const b = blockIndex.get(path), u = b === undefined ? -1 : units.findIndex((x) => x.b === b);
      if (u >= 0) { const r = canvas.getBoundingClientRect(); tx = r.width / 2 - P.x[u] * k; ty = r.height / 3 - P.y[u] * k; apply(); }
      return u;
    },
    expand: (path) => { const b = blockIndex.get(path); if (b !== undefined) toggleBlock(b, true); return b === undefined ? -1 : b; },
    groupColor,
  };
  requestAnimationFrame(() => requestAnimationFrame(() => {
    window.prunefxRenderMs = performance.now() - t0;
    document.body.dataset.ready = "1";
  }));
})();
