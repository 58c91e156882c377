"""The interactive page's script: plain JavaScript, inlined into the page, no library, no network.

It reads the page's data (a <script type="application/json" id="mh-data"> block written by render/page.py)
and draws the model view (layers x heads, one small heatmap per head), the head view (tokens on both
sides, lines weighted by attention, hover and a from/to switch) and the step view (one query token's
numbers through every step, with the walkthrough's checks). Every token of the head view can be reached
with Tab (focus shows its lines, Enter or Space picks it), and the lines between the two token columns
narrow to what the screen leaves, so both columns stay in view at 400 px. The EN/ZH switch redraws them in the
other language; the story below switches by CSS. When everything is drawn and wired it sets
`window.mhReady = performance.now()` and `<html data-ready="true">` (load-to-interactive).
"""

SCRIPT = r"""
(function () {
  "use strict";
  var DATA = JSON.parse(document.getElementById("mh-data").textContent);
  var root = document.documentElement;
  var lang = DATA.lang;
  var S = {ex: 0, row: 0, head: 0, query: 0, mode: "from", focus: null, keyed: null};
  var ROW_PX = 22;

  function say(key, values) {
    return DATA.ui[lang][key].replace(/\{(\w+)\}/g, function (whole, name) {
      return values && Object.prototype.hasOwnProperty.call(values, name) ? values[name] : whole;
    });
  }
  function el(tag, cls, text) {
    var node = document.createElement(tag);
    if (cls) node.className = cls;
    if (text !== undefined) node.textContent = text;
    return node;
  }
  function range(n) { var out = []; for (var i = 0; i < n; i++) out.push(i); return out; }
  function fmt(x) { return x === null ? say("blocked") : x.toFixed(4); }
  function explorer() { return DATA.explorers[S.ex]; }
  function row() { return explorer().rows[S.row]; }
  function weight(w, h, i, j) { return w.data[(h * w.shape[1] + i) * w.shape[2] + j]; }
  function names(count) {
    var tokens = explorer().tokens;
    return tokens && tokens.length === count ? tokens : range(count).map(String);
  }
  function rowLabel(index) {
    var ex = explorer();
    if (ex.kind === "layer") return say("row_layer", {n: index});
    if (ex.kind === "call") return say("row_call", {n: index, name: ex.rows[index].name});
    return "";   // a topic's figure: the panel's title already says what it is
  }
  function shade(v) {  // weight 0..1 -> white..blue; sqrt so that small weights still show
    var s = Math.sqrt(Math.max(0, Math.min(1, v)));
    return [255 - s * 213, 255 - s * 144, 255 - s * 104];
  }

  // ---- model view: a grid of rows (layers) x heads, one heatmap per head ------------------------
  function drawHeatmap(canvas, w, h) {
    var Lq = w.shape[1], Lk = w.shape[2];
    canvas.width = Lk; canvas.height = Lq;
    var context = canvas.getContext("2d"), image = context.createImageData(Lk, Lq);
    for (var i = 0; i < Lq; i++) {
      for (var j = 0; j < Lk; j++) {
        var rgb = shade(weight(w, h, i, j)), at = 4 * (i * Lk + j);
        image.data[at] = rgb[0]; image.data[at + 1] = rgb[1]; image.data[at + 2] = rgb[2]; image.data[at + 3] = 255;
      }
    }
    context.putImageData(image, 0, 0);
  }
  function renderModel(panel) {
    var ex = explorer(), heads = Math.max.apply(null, ex.rows.map(function (r) { return r.weights.shape[0]; }));
    panel.appendChild(el("h3", null, say("model_view") + " · " + ex.title[lang]));
    panel.appendChild(el("p", "hint", say("model_hint")));
    var grid = el("div", "grid");
    grid.style.gridTemplateColumns = "auto repeat(" + heads + ", auto)";
    grid.appendChild(el("span"));
    range(heads).forEach(function (h) { grid.appendChild(el("span", "collabel", say("head", {n: h}))); });
    ex.rows.forEach(function (r, index) {
      grid.appendChild(el("span", "rowlabel", rowLabel(index)));
      range(heads).forEach(function (h) {
        if (h >= r.weights.shape[0]) { grid.appendChild(el("span")); return; }
        var cell = el("button", "cell" + (index === S.row && h === S.head ? " selected" : ""));
        cell.type = "button";
        cell.dataset.row = index; cell.dataset.head = h;
        cell.title = rowLabel(index) + " · " + say("head", {n: h});
        var canvas = el("canvas");
        drawHeatmap(canvas, r.weights, h);
        cell.appendChild(canvas);
        cell.addEventListener("click", function () { choose(index, h); });
        grid.appendChild(cell);
      });
    });
    panel.appendChild(grid);
  }

  // ---- head view: tokens on both sides, lines weighted by attention ------------------------------
  function drawLines(canvas, w, focus) {
    var Lq = w.shape[1], Lk = w.shape[2], context = canvas.getContext("2d");
    context.clearRect(0, 0, canvas.width, canvas.height);
    for (var i = 0; i < Lq; i++) {
      for (var j = 0; j < Lk; j++) {
        var v = weight(w, S.head, i, j);
        var lit = focus === null || (S.mode === "from" ? i === focus : j === focus);
        var alpha = focus === null ? 0.7 * v : (lit ? Math.max(v, 0.04) : 0.05 * v);
        if (alpha < 0.005) continue;
        context.strokeStyle = lit && focus !== null ? "rgba(224,122,31," + alpha + ")" : "rgba(42,111,151," + alpha + ")";
        context.lineWidth = 1 + 3 * v;
        context.beginPath();
        context.moveTo(0, (i + 0.5) * ROW_PX);
        context.lineTo(canvas.width, (j + 0.5) * ROW_PX);
        context.stroke();
      }
    }
  }
  function renderHead(panel) {
    var r = row(), w = r.weights, Lq = w.shape[1], Lk = w.shape[2];
    panel.appendChild(el("h3", null, say("head_view", {row: rowLabel(S.row) || explorer().title[lang],
                                                       head: say("head", {n: S.head})})));
    var modes = el("div", "modes");
    ["from", "to"].forEach(function (mode) {
      var button = el("button", "mode" + (S.mode === mode ? " on" : ""), say("mode_" + mode));
      button.type = "button"; button.dataset.mode = mode;
      button.addEventListener("click", function () { S.mode = mode; S.focus = null; S.keyed = null; renderAll(); });
      modes.appendChild(button);
    });
    panel.appendChild(modes);
    panel.appendChild(el("p", "hint", say("hint_" + S.mode) + (r.trace && S.mode === "from" ? " " + say("hint_follow") : "")));
    var view = el("div", "headview"), left = el("div", "tokens left"), right = el("div", "tokens right");
    left.appendChild(el("div", "side", say("queries")));
    right.appendChild(el("div", "side", say("keys")));
    var canvas = el("canvas", "lines");
    canvas.width = 40; canvas.height = Math.max(Lq, Lk) * ROW_PX;   // narrow until measured below
    var sides = {left: names(Lq).map(token), right: names(Lk).map(token)};
    function token(name, index) { var node = el("div", "token"); node.appendChild(el("span", "name", name)); node.dataset.index = index; return node; }
    function keyboard(node, side, index, active, pick) {  // Tab reaches the token; focus = hover, Enter/Space = click
      if (!active) return;
      node.tabIndex = 0;
      node.setAttribute("role", "button");
      node.addEventListener("focus", function () { S.keyed = {side: side, index: index}; focus(index); });
      node.addEventListener("keydown", function (event) {
        if ((event.key === "Enter" || event.key === " ") && pick) { event.preventDefault(); pick(); }
      });
    }
    sides.left.forEach(function (node, i) {
      var pick = r.trace ? function () { S.query = i; renderAll(); } : null;
      if (i === S.query && r.trace) node.classList.add("chosen");
      node.addEventListener("mouseenter", function () { if (S.mode === "from") focus(i); });
      node.addEventListener("click", function () { if (pick) pick(); });
      keyboard(node, "left", i, S.mode === "from", pick);
      left.appendChild(node);
    });
    sides.right.forEach(function (node, j) {
      node.addEventListener("mouseenter", function () { if (S.mode === "to") focus(j); });
      keyboard(node, "right", j, S.mode === "to", null);
      right.appendChild(node);
    });
    view.addEventListener("mouseleave", function () { focus(null); });
    function focus(index) {
      S.focus = index;
      var mine = S.mode === "from" ? sides.left : sides.right, other = S.mode === "from" ? sides.right : sides.left;
      mine.forEach(function (node, k) { node.classList.toggle("focus", k === index); });
      other.forEach(function (node, k) {
        var old = node.querySelector(".w");
        if (old) node.removeChild(old);
        if (index === null) { node.style.backgroundColor = ""; delete node.dataset.weight; return; }
        var v = S.mode === "from" ? weight(w, S.head, index, k) : weight(w, S.head, k, index);
        node.style.backgroundColor = "rgba(224,122,31," + (0.85 * Math.sqrt(v)).toFixed(3) + ")";
        node.dataset.weight = v;
        node.appendChild(el("span", "w", v.toFixed(2)));
      });
      drawLines(canvas, w, index);
    }
    view.appendChild(left); view.appendChild(canvas); view.appendChild(right);
    panel.appendChild(view);
    // the lines take what the two token columns leave: the key column stays in view on a narrow screen
    canvas.width = Math.max(40, Math.min(260, view.clientWidth - left.offsetWidth - right.offsetWidth - 8));
    drawLines(canvas, w, null);
    var keyed = S.keyed, again = keyed && sides[keyed.side][keyed.index];
    if (again && again.tabIndex === 0) again.focus();   // a redraw (Enter on a token) keeps the keyboard's place
  }

  // ---- step view: one query token through every step, with the walkthrough's checks -------------
  function checksList(tr, steps) {
    var list = el("ul", "checks"), count = 0;
    steps.forEach(function (step) {
      (tr.checks[step] || []).forEach(function (check) {
        var item = el("li", check.ok ? "ok" : "failed", (check.ok ? "✓ " : "✗ " + say("failed") + " ") + check[lang]);
        if (check.detail) item.appendChild(el("span", "detail", check.detail));
        list.appendChild(item); count++;
      });
    });
    if (!count) list.appendChild(el("li", "none", say("no_checks")));
    return list;
  }
  function keyTable(keys, values, cls) {
    var table = el("table", "keyrow"), head = el("tr"), body = el("tr");
    keys.forEach(function (name, j) {
      head.appendChild(el("th", null, name));
      var cell = el("td", values[j] === null ? "blocked" : cls, fmt(values[j]));
      if (cls === "weight" && values[j] !== null) cell.style.backgroundColor = "rgba(42,111,151," + (0.8 * Math.sqrt(values[j])).toFixed(3) + ")";
      body.appendChild(cell);
    });
    table.appendChild(head); table.appendChild(body);
    return table;
  }
  function vector(name, a, index, length, tokenName) {  // the stored first numbers of vector `index` of a
    var stored = a.shape[a.shape.length - 1], shown = Math.min(stored, length), box = el("div", "vec");
    box.appendChild(el("div", "vecname", say("numbers_of", {name: name, token: tokenName, shown: shown, total: length})));
    var values = range(shown).map(function (d) { return fmt(a.data[index * stored + d]); });
    box.appendChild(el("code", null, "[" + values.join(", ") + (shown < length ? ", …" : "") + "]"));
    return box;
  }
  function renderStep(panel) {
    var r = row(), tr = r.trace;
    if (!tr) { panel.hidden = true; return; }
    panel.hidden = false;
    var H = r.weights.shape[0], L = r.weights.shape[2], D = tr.D, h = S.head, i = Math.min(S.query, r.weights.shape[1] - 1);
    var tokens = names(L), at = function (a, j) { return a.data[(h * L + i) * L + j]; };
    panel.appendChild(el("h3", null, say("step_view", {row: rowLabel(S.row), head: say("head", {n: h}), token: tokens[i]})));
    panel.appendChild(el("p", "hint", say("step_hint")));
    var qkv = h * L + i, scores = range(L).map(function (j) { return at(tr.scores, j); });
    var scaled = range(L).map(function (j) { return at(tr.scaled, j); });
    var masked = scaled.map(function (v, j) { return tr.blocked && tr.blocked[i * L + j] ? null : v; });
    var weights = range(L).map(function (j) { return weight(r.weights, h, i, j); });
    var sum = weights.reduce(function (a, b) { return a + b; }, 0);
    var top = range(L).sort(function (a, b) { return weights[b] - weights[a]; }).slice(0, 3);
    var O = tr.O;
    var cards = [
      [[2, 3], [vector("q", tr.q, qkv, D, tokens[i]), vector("k", tr.k, qkv, D, tokens[i]), vector("v", tr.v, qkv, D, tokens[i])]],
      [[4], [keyTable(tokens, scores, "num")]],
      [[5], [keyTable(tokens, scaled, "num")]],
      [[6], [tr.blocked ? keyTable(tokens, masked, "num") : el("p", "note", say("no_mask"))]],
      [[7], [keyTable(tokens, weights, "weight"), el("p", "note", say("row_sum", {sum: sum.toFixed(3)}))]],
      [[8], [vector("ctx", tr.ctx, qkv, D, tokens[i]),
             el("p", "note", say("top_keys", {keys: top.map(function (j) { return tokens[j] + " " + weights[j].toFixed(2); }).join(", ")}))]],
      [[9], [el("p", "note", say("merge_cols", {head: h, start: h * D, stop: (h + 1) * D - 1, width: H * D})),
             vector("merged[" + h * D + ":" + (h + 1) * D + "]", tr.ctx, qkv, D, tokens[i])]],
      [[10], [vector("out", tr.out, i, O, tokens[i])]],
      [[11], [el("p", "note", say("fused_note"))]]
    ];
    var steps = el("div", "steps");
    cards.forEach(function (card) {
      var box = el("div", "step"), numbers = el("div", "nums");
      box.dataset.step = card[0].join(",");
      box.appendChild(el("h4", null, card[0].map(function (n) { return DATA.steps[n][lang]; }).join(" · ")));
      card[1].forEach(function (part) { numbers.appendChild(part); });
      box.appendChild(numbers);
      box.appendChild(checksList(tr, card[0]));
      steps.appendChild(box);
    });
    panel.appendChild(steps);
  }

  // ---- the whole explorer, the language switch, and the ready flag ------------------------------
  function renderAll() {
    var host = document.getElementById("explorer");
    if (!host) return;
    host.textContent = "";
    if (DATA.explorers.length > 1) {
      var tabs = el("div", "tabs");
      DATA.explorers.forEach(function (ex, k) {
        var tab = el("button", "tab" + (k === S.ex ? " on" : ""), ex.title[lang]);
        tab.type = "button"; tab.dataset.explorer = k;
        tab.addEventListener("click", function () { start(k); renderAll(); });
        tabs.appendChild(tab);
      });
      host.appendChild(tabs);
    }
    [["model", renderModel], ["head", renderHead], ["step", renderStep]].forEach(function (part) {
      var panel = el("section", "panel " + part[0]);
      panel.id = part[0] + "-view";
      host.appendChild(panel);
      part[1](panel);
    });
  }
  function start(k) {
    var begin = DATA.explorers[k].start;
    S.ex = k; S.row = begin.row; S.head = begin.head; S.query = begin.query; S.focus = null;
  }
  function choose(r, h) { S.row = r; S.head = h; S.focus = null; S.keyed = null; renderAll(); }
  function setLang(next) {
    lang = next;
    root.dataset.lang = next;
    root.lang = next === "zh" ? "zh-CN" : "en";
    document.title = DATA.title[next];
    Array.prototype.forEach.call(document.querySelectorAll(".lang-switch button"), function (button) {
      button.classList.toggle("on", button.dataset.setLang === next);
      button.setAttribute("aria-pressed", button.dataset.setLang === next);
    });
    renderAll();
  }
  Array.prototype.forEach.call(document.querySelectorAll(".lang-switch button"), function (button) {
    button.addEventListener("click", function () { setLang(button.dataset.setLang); });
  });
  if (DATA.explorers.length) start(0);
  setLang(lang);
  window.mhReady = performance.now();
  root.dataset.ready = "true";
})();
"""
