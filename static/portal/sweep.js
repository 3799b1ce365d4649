/* A sweep's page: trials table, best trial, metric against each parameter, best so far, the top
 * trials' curves. Drawn from GET /api/v1/jobs/<id>/sweep/ (the same table the API and yoloq show),
 * polled every few seconds while the sweep runs; one last refresh once it has ended. */
(function () {
  "use strict";
  var cfg = JSON.parse(document.getElementById("sweep-config").textContent);
  var data = JSON.parse(document.getElementById("sweep-data").textContent);
  var TERMINAL = new Set(cfg.terminal);
  var COLORS = ["#2563eb", "#dc2626", "#16a34a", "#9333ea", "#ea580c", "#0891b2", "#ca8a04", "#db2777"];
  var charts = {};
  window.sweepPage = { refreshes: 0, charts: charts };

  function fmt(value) {
    if (value === null || value === undefined) return "–";
    if (typeof value === "number") return Number.isInteger(value) ? String(value) : value.toPrecision(4);
    return String(value);
  }

  function el(tag, attrs, text) {
    var node = document.createElement(tag);
    Object.keys(attrs || {}).forEach(function (k) { node.setAttribute(k, attrs[k]); });
    if (text !== undefined) node.textContent = text;
    return node;
  }

  function renderTable() {
    var body = document.querySelector("#trials tbody");
    body.textContent = "";
    var names = Object.keys(data.parameters);
    if (!data.rows.length) {
      var empty = el("tr", { "class": "empty" });
      empty.appendChild(el("td", { colspan: String(names.length + 5), "class": "muted" }, "no trial submitted yet"));
      body.appendChild(empty);
    }
    data.rows.forEach(function (row) {
      var tr = el("tr", { "data-number": String(row.number), "data-state": row.state });
      if (data.best && data.best.number === row.number) tr.className = "best";
      var first = el("td");
      if (row.job) { first.appendChild(el("a", { href: "/jobs/" + row.job + "/" }, String(row.number))); }
      else { first.textContent = String(row.number); }
      tr.appendChild(first);
      names.forEach(function (name) { tr.appendChild(el("td", {}, fmt(row.params[name]))); });
      var state = el("td");
      state.appendChild(el("span", { "class": "pill state-" + row.state }, row.state));
      tr.appendChild(state);
      var metric = el("td");
      if (row.value !== null) { metric.textContent = row.value.toFixed(4); }
      else if (row.last !== null) { metric.appendChild(el("span", { "class": "muted" }, row.last.toFixed(4))); }
      else { metric.textContent = "–"; }
      tr.appendChild(metric);
      tr.appendChild(el("td", {}, row.epochs_done + (row.epochs ? " / " + row.epochs : "")));
      tr.appendChild(el("td", { title: row.note }, row.pruned ? "at epoch " + row.pruned_epoch : (row.note ? row.note.slice(0, 60) : "–")));
      body.appendChild(tr);
    });
  }

  function renderFacts() {
    var pill = document.getElementById("state");
    pill.textContent = data.state;
    pill.dataset.state = data.state;
    pill.className = "pill big state-" + data.state;
    var c = data.counts;
    document.getElementById("submitted").textContent = String(c.submitted);
    document.getElementById("counts").textContent = c.succeeded + " succeeded · " + c.pruned + " pruned · " +
      c.failed + " failed · " + c.cancelled + " cancelled · " + c.active + " queued or running";
    var best = document.getElementById("best-body");
    if (!data.best) return;
    best.textContent = "";
    var value = el("p", { "class": "big-number" });
    value.appendChild(el("span", { id: "best-value" }, data.best.value.toFixed(4)));
    value.appendChild(document.createTextNode(" "));
    value.appendChild(el("span", { "class": "muted" }, data.metric));
    best.appendChild(value);
    var line = el("p", {}, "trial ");
    line.appendChild(el("a", { id: "best-trial", href: "/jobs/" + data.best.job + "/" }, "#" + data.best.number));
    line.appendChild(document.createTextNode(": "));
    Object.keys(data.best.params).forEach(function (name) {
      line.appendChild(el("code", {}, name + "=" + fmt(data.best.params[name])));
      line.appendChild(document.createTextNode(" "));
    });
    best.appendChild(line);
    if (data.best.tie_note) {
      var tie = data.best.tie_note;
      best.appendChild(el("p", { id: "best-tie" }, tie.charAt(0).toUpperCase() + tie.slice(1) + "."));
    }
    if (data.best.model_reference) {
      var model = el("p", {}, "registered as ");
      model.appendChild(el("a", { href: "/models/" + data.best.model_version + "/" }, data.best.model_reference));
      best.appendChild(model);
      var link = document.getElementById("model-link");
      link.href = "/models/" + data.best.model_version + "/";
      link.textContent = "Model " + data.best.model_reference;
      link.classList.remove("hidden");
    }
  }

  function chart(canvas, config) {
    var key = canvas.id || canvas.dataset.param;
    if (charts[key]) charts[key].destroy();
    config.options = Object.assign({ animation: false, responsive: true, maintainAspectRatio: false,
                                     plugins: { legend: { position: "bottom" } } }, config.options || {});
    charts[key] = new Chart(canvas, config);
    return charts[key];
  }

  // Every sweep metric is a score of 0 to 1 (mAP, precision, recall, fitness). Without a floor,
  // trials that all scored 0 (a short demo run) drew the axis from -1 to 1 (a new-user trial);
  // the top follows the data (0 to 1 when every value is 0).
  function metricAxis() {
    return { min: 0, title: { display: true, text: data.metric } };
  }

  function renderScatters() {
    document.querySelectorAll("canvas.scatter").forEach(function (canvas) {
      var name = canvas.dataset.param;
      var p = data.parameters[name];
      var done = data.rows.filter(function (r) { return r.value !== null; });
      var pruned = data.rows.filter(function (r) { return r.pruned && r.curve.length; });
      // Choices that are all numbers go on a numeric axis (logarithmic when they span two decades).
      var numbers = p.type === "categorical" && p.choices.every(function (c) { return typeof c === "number"; });
      var categories = p.type === "categorical" && !numbers;
      var lows = numbers ? p.choices : [p.low, p.high];
      var spread = Math.min.apply(null, lows) > 0 && Math.max.apply(null, lows) / Math.min.apply(null, lows) >= 100;
      var point = function (r, y) { return { x: categories ? String(r.params[name]) : r.params[name], y: y, trial: r.number }; };
      var xScale = { title: { display: true, text: name } };
      if (categories) { xScale.type = "category"; xScale.labels = p.choices.map(String); }
      else if (p.log || (numbers && spread)) { xScale.type = "logarithmic"; }
      else { xScale.type = "linear"; }
      chart(canvas, {
        type: "scatter",
        data: { datasets: [
          { label: "finished trials", data: done.map(function (r) { return point(r, r.value); }), backgroundColor: COLORS[0], pointRadius: 4 },
          { label: "pruned (best epoch)", data: pruned.map(function (r) { return point(r, Math.max.apply(null, r.curve.map(function (c) { return c.value; }))); }), backgroundColor: "#9ca3af", pointRadius: 4 },
        ] },
        options: { scales: { x: xScale, y: metricAxis() } },
      });
      canvas.dataset.points = String(done.length + pruned.length);
    });
  }

  function renderBestSoFar() {
    var canvas = document.getElementById("best-so-far");
    chart(canvas, {
      type: "line",
      data: { datasets: [
        { label: "best so far", data: data.best_so_far.map(function (b) { return { x: b.number, y: b.best }; }),
          borderColor: COLORS[2], backgroundColor: COLORS[2], stepped: true, pointRadius: 0 },
        { label: "trial", type: "scatter", data: data.best_so_far.map(function (b) { return { x: b.number, y: b.value }; }),
          backgroundColor: COLORS[0], pointRadius: 3 },
      ] },
      options: { scales: { x: { type: "linear", title: { display: true, text: "trial" }, ticks: { precision: 0 } },
                           y: metricAxis() } },
    });
    canvas.dataset.points = String(data.best_so_far.length);
  }

  function renderCurves() {
    var canvas = document.getElementById("top-curves");
    var byNumber = {};
    data.rows.forEach(function (r) { byNumber[r.number] = r; });
    var lines = data.top_curves.map(function (n, i) {
      var r = byNumber[n];
      return { label: "trial " + n + (r.pruned ? " (pruned)" : ""), borderColor: COLORS[i % COLORS.length],
               backgroundColor: COLORS[i % COLORS.length], pointRadius: 2, tension: 0.15, borderDash: r.pruned ? [4, 3] : [],
               data: r.curve.map(function (c) { return { x: c.epoch, y: c.value }; }) };
    });
    chart(canvas, { type: "line", data: { datasets: lines },
      options: { scales: { x: { type: "linear", title: { display: true, text: "epoch" }, ticks: { precision: 0 } },
                           y: metricAxis() } } });
    canvas.dataset.lines = String(lines.length);
  }

  function render() {
    renderFacts();
    renderTable();
    renderScatters();
    renderBestSoFar();
    renderCurves();
    document.body.dataset.sweepRendered = String(window.sweepPage.refreshes);
  }

  function poll() {
    fetch(cfg.api, { credentials: "same-origin", headers: { Accept: "application/json" } })
      .then(function (response) { return response.ok ? response.json() : Promise.reject(response.status); })
      .then(function (fresh) {
        data = fresh;
        window.sweepPage.refreshes += 1;
        render();
        if (!TERMINAL.has(data.state)) setTimeout(poll, cfg.interval_ms);
      })
      .catch(function () { setTimeout(poll, cfg.interval_ms * 2); });
  }

  render();
  if (!TERMINAL.has(data.state)) setTimeout(poll, cfg.interval_ms);
})();
