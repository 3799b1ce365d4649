/* The job page: live curves, progress, timeline and log over /ws/jobs/<id>/.
 *
 * The socket sends the stored history, a `history_end` snapshot, then live messages;
 * every message but `progress` carries the job's `seq` (one counter for metrics, logs
 * and events). Channel-layer delivery is at-most-once, so this page:
 *   1. drops any seq it has already seen (history and live overlap on reconnect);
 *   2. after history, notices gaps in the live seq numbers and refetches what is missing
 *      over REST (`…/metrics/?after=`, `…/events/?after=`, `…/logs/?after=`), retrying a
 *      few times because a number can be allocated a moment before its row is written;
 *   3. reconnects with backoff and catches up over REST from the last seq it had;
 *   4. once the job is finished, reloads all metrics and events from the database, so
 *      the chart ends equal to the database whatever the socket dropped.
 *
 * A val, predict or export job's page has no curves and no epoch progress (only a training
 * has them): its `#outcome` section is fetched again from `cfg.outcome` when the job ends,
 * and a predict job's `progress` messages ({done, total}) fill its image count.
 */
(function () {
  "use strict";

  var cfg = JSON.parse(document.getElementById("job-config").textContent);
  var TERMINAL = new Set(cfg.terminal);
  var MAX_LOG_CHUNKS = 400;
  var COLORS = ["#2563eb", "#dc2626", "#16a34a", "#9333ea", "#ea580c", "#0891b2", "#ca8a04", "#db2777"];

  var seen = new Set();          // every seq applied
  var metrics = new Map();       // epoch -> {seq, values}
  var events = new Map();        // seq -> event
  var logs = new Map();          // seq -> text
  var missing = new Set();       // live gaps not yet filled
  var highest = 0;               // highest seq known after history
  var inHistory = true;
  var everConnected = false;
  var lastSeqBeforeDrop = 0;
  var jobState = cfg.state;
  var finalSynced = false;
  var socket = null;
  var backoffMs = 500;
  var catchUpTimer = null;
  var catchUpTries = 0;
  var stats = { messages: 0, duplicates: 0, gaps: 0, refetched: 0, reconnects: 0 };

  // --- charts ------------------------------------------------------------------------------

  function makeChart(id, yLabel, opts) {
    var canvas = document.getElementById(id);
    return new Chart(canvas, {
      type: "line",
      data: { labels: [], datasets: [] },
      options: Object.assign({
        animation: false,
        responsive: true,
        maintainAspectRatio: false,
        interaction: { mode: "index", intersect: false },
        elements: { point: { radius: 2 }, line: { tension: 0.15, borderWidth: 2 } },
        plugins: { legend: { position: "bottom", labels: { boxWidth: 12, font: { size: 11 } } } },
        scales: {
          x: { title: { display: true, text: "epoch" }, ticks: { precision: 0 } },
          y: { title: { display: true, text: yLabel } },
        },
      }, opts || {}),
    });
  }

  var charts = !document.getElementById("loss-chart") ? {} : {
    loss: { chart: makeChart("loss-chart", "loss"), match: function (k) { return /_loss$/.test(k); } },
    map: { chart: makeChart("map-chart", "score", { scales: { x: { title: { display: true, text: "epoch" } }, y: { min: 0, max: 1 } } }),
           match: function (k) { return k.indexOf("metrics/") === 0; } },
    lr: { chart: makeChart("lr-chart", "lr"), match: function (k) { return k.indexOf("lr/") === 0; } },
  };

  var redrawPending = false;
  function redraw() {
    if (redrawPending) return;
    redrawPending = true;
    requestAnimationFrame(function () {
      redrawPending = false;
      var epochs = Array.from(metrics.keys()).sort(function (a, b) { return a - b; });
      Object.keys(charts).forEach(function (name) {
        var entry = charts[name];
        var keys = new Set();
        epochs.forEach(function (e) {
          Object.keys(metrics.get(e).values || {}).forEach(function (k) { if (entry.match(k)) keys.add(k); });
        });
        var sorted = Array.from(keys).sort();
        entry.chart.data.labels = epochs;
        entry.chart.data.datasets = sorted.map(function (key, i) {
          var color = COLORS[i % COLORS.length];
          return {
            label: key.replace(/^metrics\//, "").replace(/^lr\//, ""),
            data: epochs.map(function (e) { var v = metrics.get(e).values[key]; return v == null ? null : v; }),
            borderColor: color, backgroundColor: color, borderDash: key.indexOf("val/") === 0 ? [5, 3] : [],
          };
        });
        entry.chart.update("none");
        entry.chart.canvas.dataset.points = String(epochs.length);
      });
      document.querySelectorAll(".chart-empty").forEach(function (el) { el.classList.toggle("hidden", epochs.length > 0); });
      var done = epochs.length ? epochs[epochs.length - 1] : 0;
      setEpochsDone(Math.max(done, epochsDoneFloor));
    });
  }

  // --- applying messages ----------------------------------------------------------------------

  function applyMetric(seq, data) {
    var current = metrics.get(data.epoch);
    if (!current || current.seq < seq) metrics.set(data.epoch, { seq: seq, values: data.values || {}, attempt: data.attempt });
    redraw();
    var progress = document.getElementById("batch-progress");
    if (progress && progress.dataset.epoch && Number(progress.dataset.epoch) <= data.epoch) progress.classList.add("hidden");
  }

  function applyEvent(seq, data) {
    events.set(seq, data);
    renderTimeline();
    if (data.state) setState(data.state);
    if (data.state) setClasses(data);
  }

  // "runs as high: beyond the team's urgent allowance": an urgent job the scheduler placed as high
  // (apps.scheduling.loop). Each live status message carries both classes; the page said it only
  // after a reload (trial31). Hidden while queued: a requeued job keeps its last attempt's run_class.
  function setClasses(data) {
    var pill = document.getElementById("priority-class");
    if (pill && data.priority_class) {
      pill.textContent = data.priority_class;
      pill.className = "cls cls-" + data.priority_class;
    }
    var note = document.getElementById("run-class");
    if (!note || !data.priority_class) return;
    var demoted = data.run_class && data.run_class !== data.priority_class && data.state !== "queued";
    note.textContent = demoted ? " · " + (TERMINAL.has(data.state) ? "ran" : "runs") + " as " + data.run_class +
                                 ": beyond the team's urgent allowance" : "";
    note.classList.toggle("hidden", !demoted);
  }

  function applyLog(seq, text) {
    logs.set(seq, text);
    if (logs.size > MAX_LOG_CHUNKS) {
      var keys = Array.from(logs.keys()).sort(function (a, b) { return a - b; });
      keys.slice(0, logs.size - MAX_LOG_CHUNKS).forEach(function (k) { logs.delete(k); });
    }
    renderLog();
  }

  function handle(message) {
    stats.messages += 1;
    if (message.type === "progress") { showProgress(message.data || {}); return; }
    if (message.history_end) { endOfHistory(message); return; }
    var seq = message.seq;
    if (seq == null) return;
    if (seen.has(seq)) { stats.duplicates += 1; return; }
    seen.add(seq);
    missing.delete(seq);
    var data = message.data || {};
    if (message.type === "metrics") applyMetric(seq, data);
    else if (message.type === "status") applyEvent(seq, { kind: data.kind, message: data.message, attempt: data.attempt,
                                                         state: data.state, time: data.time || new Date().toISOString(),
                                                         priority_class: data.priority_class, run_class: data.run_class });
    else if (message.type === "log") applyLog(seq, data.text || "");
    if (!inHistory) {
      if (seq > highest + 1) {
        for (var s = highest + 1; s < seq; s++) if (!seen.has(s)) missing.add(s);
        stats.gaps += 1;
        scheduleCatchUp(300);
      }
      highest = Math.max(highest, seq);
    }
  }

  function endOfHistory(message) {
    inHistory = false;
    var data = message.data || {};
    if (data.state) setState(data.state);
    if (data.state) setClasses(data);
    if (data.epochs_done) epochsDoneFloor = Math.max(epochsDoneFloor, data.epochs_done);
    var reconnecting = everConnected;
    everConnected = true;
    highest = Math.max(highest, message.seq || 0);
    // History holds every metric and event but only the newest log chunks: after a
    // reconnect, fetch whatever was written while we were away.
    if (reconnecting) catchUp(lastSeqBeforeDrop);
    if (TERMINAL.has(jobState)) finalSync();
  }

  // --- REST catch-up ------------------------------------------------------------------------

  function getJSON(url) {
    return fetch(url, { credentials: "same-origin", headers: { Accept: "application/json" } }).then(function (r) {
      if (!r.ok) throw new Error(url + " → " + r.status);
      return r.json();
    });
  }

  function fetchAll(kind, after, limit, pages) {
    var rows = [];
    function page(cursor, left) {
      return getJSON(cfg.api + kind + "/?after=" + cursor).then(function (body) {
        rows = rows.concat(body.results);
        if (body.results.length >= limit && left > 1) return page(body.results[body.results.length - 1].seq, left - 1);
        return rows;
      });
    }
    return page(after, pages);
  }

  function applyRows(kind, rows) {
    rows.forEach(function (row) {
      if (seen.has(row.seq)) return;
      stats.refetched += 1;
      var message = kind === "metrics"
        ? { type: "metrics", seq: row.seq, data: { epoch: row.epoch, attempt: row.attempt, values: row.values } }
        : kind === "events"
          ? { type: "status", seq: row.seq, data: { kind: row.kind, message: row.message, attempt: row.attempt, time: row.created_at } }
          : { type: "log", seq: row.seq, data: { text: row.text } };
      var wasInHistory = inHistory;
      inHistory = true;  // rows from the database are not live: no gap bookkeeping
      handle(message);
      inHistory = wasInHistory;
      highest = Math.max(highest, row.seq);
    });
  }

  function catchUp(after) {
    after = Math.max(0, after);
    return Promise.all([
      fetchAll("metrics", after, 1000, 20).then(function (rows) { applyRows("metrics", rows); }),
      fetchAll("events", after, 1000, 20).then(function (rows) { applyRows("events", rows); }),
      fetchAll("logs", after, 500, 4).then(function (rows) { applyRows("logs", rows); }),
    ]).catch(function (err) { console.warn("catch-up failed", err); });
  }

  function scheduleCatchUp(delay) {
    if (catchUpTimer) return;
    catchUpTimer = setTimeout(function () {
      catchUpTimer = null;
      if (!missing.size) { catchUpTries = 0; return; }
      var from = Math.min.apply(null, Array.from(missing)) - 1;
      catchUp(from).then(function () {
        if (missing.size && catchUpTries < 4) {
          catchUpTries += 1;  // allocated but not written yet, or written by a writer that died
          scheduleCatchUp(500 * catchUpTries);
        } else {
          missing.clear();
          catchUpTries = 0;
        }
      });
    }, delay);
  }

  function finalSync() {
    if (finalSynced) return;
    finalSynced = true;
    // Metrics are upserted per epoch: rebuild the curves from exactly what the database holds.
    Promise.all([fetchAll("metrics", 0, 1000, 50), fetchAll("events", 0, 1000, 50)]).then(function (results) {
      metrics.clear();
      results[0].forEach(function (row) {
        seen.add(row.seq);
        metrics.set(row.epoch, { seq: row.seq, values: row.values, attempt: row.attempt });
      });
      applyRows("events", results[1]);
      redraw();
      document.body.dataset.synced = "true";
    }).catch(function (err) { finalSynced = false; console.warn("final sync failed", err); });
  }

  // --- the socket ----------------------------------------------------------------------------

  function setConn(text, cls) {
    var el = document.getElementById("conn");
    el.textContent = text;
    el.className = "conn " + (cls || "");
  }

  function connect() {
    var proto = location.protocol === "https:" ? "wss://" : "ws://";
    socket = new WebSocket(proto + location.host + cfg.socket);
    inHistory = true;
    socket.onopen = function () { backoffMs = 500; setConn("live", "on"); };
    socket.onmessage = function (event) { handle(JSON.parse(event.data)); };
    socket.onclose = function (event) {
      lastSeqBeforeDrop = highest;
      if (event.code === 4401 || event.code === 4404) { setConn("not allowed", "off"); return; }
      if (TERMINAL.has(jobState) && finalSynced) { setConn("finished", "done"); return; }
      // 1013 "try again later": the server's live channel (Redis) is away; it sent the stored
      // history and closed. Keep what is shown and retry slowly (onopen reset the backoff).
      var paused = event.code === 1013;
      setConn(paused ? "live updates paused, retrying…" : "reconnecting…", "off");
      if (paused) backoffMs = Math.max(backoffMs, 5000);
      stats.reconnects += 1;
      setTimeout(connect, backoffMs);
      backoffMs = Math.min(backoffMs * 2, 15000);
    };
  }

  // --- the rest of the page --------------------------------------------------------------------

  function setState(state) {
    if (!state) return;
    jobState = state;
    var pill = document.getElementById("state");
    pill.textContent = state;
    pill.dataset.state = state;
    pill.className = "pill big state-" + state;
    document.querySelectorAll('[data-field="state"]').forEach(function (el) { el.textContent = state; });
    document.querySelectorAll(".queued-only").forEach(function (el) { el.classList.toggle("hidden", state !== "queued"); });
    Object.keys(cfg.actions || {}).forEach(function (id) {
      var form = document.getElementById(id);
      if (form) form.classList.toggle("hidden", cfg.actions[id].indexOf(state) < 0);
    });
    if (TERMINAL.has(state)) {
      var batches = document.getElementById("batch-progress");
      if (batches) batches.classList.add("hidden");
      setTimeout(finalSync, 500);
      setTimeout(refreshJob, 700);
      if (cfg.outcome) setTimeout(refreshOutcome, 700);
    }
  }

  // A val, predict or export job's results: written with its success, shown once it ends.
  var outcomeLoaded = TERMINAL.has(cfg.state);  // rendered finished: the section already holds them
  function refreshOutcome() {
    var section = document.getElementById("outcome");
    if (!section || outcomeLoaded) return;
    fetch(cfg.outcome, { credentials: "same-origin" }).then(function (r) {
      if (!r.ok) throw new Error(cfg.outcome + " → " + r.status);
      return r.text();
    }).then(function (html) {
      section.innerHTML = html;
      outcomeLoaded = true;
      section.dataset.loaded = "true";
    }).catch(function (err) { console.warn("results not loaded", err); setTimeout(refreshOutcome, 3000); });
  }

  // The server's epochs_done never goes down, and a continued job starts at its checkpoint's epoch
  // with no metric points of its own: the curves' last epoch alone read "epoch 0 of 150 done" on a
  // continuation that ended before its first new epoch (a trial).
  var epochsDoneFloor = Number((document.getElementById("epochs-done") || {}).textContent) || 0;

  function setEpochsDone(done) {
    var shown = document.getElementById("epochs-done");
    if (!shown) return;  // no epochs: not a training
    shown.textContent = done;
    if (cfg.epochs) document.getElementById("epochs-bar").style.width = Math.min(100, 100 * done / cfg.epochs) + "%";
  }

  function showPredictProgress(p) {
    var box = document.getElementById("predict-progress");
    if (!box) return;
    box.classList.remove("hidden");
    document.getElementById("predict-done").textContent = p.done;
    document.getElementById("predict-total").textContent = p.total;
    document.getElementById("predict-bar").style.width = (p.total ? 100 * p.done / p.total : 0) + "%";
  }

  function showProgress(p) {
    if (TERMINAL.has(jobState)) return;
    if (p.done != null) { showPredictProgress(p); return; }
    var box = document.getElementById("batch-progress");
    if (!box) return;
    box.classList.remove("hidden");
    box.dataset.epoch = p.epoch;
    document.getElementById("batch-epoch").textContent = p.epoch;
    document.getElementById("batch-n").textContent = p.batch;
    document.getElementById("batch-total").textContent = p.batches;
    document.getElementById("batch-bar").style.width = (p.batches ? 100 * p.batch / p.batches : 0) + "%";
    var losses = p.losses || {};
    document.getElementById("batch-losses").textContent = Object.keys(losses).map(function (k) {
      return k.replace("_loss", "") + " " + (losses[k] == null ? "–" : Number(losses[k]).toFixed(3));
    }).join(" · ");
  }

  // The server's clock ("2026-12-04 14:01 UTC", yoloportal/formats), not the browser's locale: a
  // live update turned it into "12/4/2026, 2:01:34 PM" beside "expected 14:01 UTC" (trial 20).
  var CLOCK = new Intl.DateTimeFormat("en-GB", { timeZone: cfg.time_zone || "UTC", year: "numeric", month: "2-digit",
    day: "2-digit", hour: "2-digit", minute: "2-digit", hourCycle: "h23", timeZoneName: "short" });
  function fmtTime(iso) {
    if (!iso) return "";
    var d = new Date(iso);
    if (isNaN(d)) return iso;
    var p = {};
    CLOCK.formatToParts(d).forEach(function (part) { p[part.type] = part.value; });
    return p.year + "-" + p.month + "-" + p.day + " " + p.hour + ":" + p.minute + " " + p.timeZoneName;
  }

  function renderTimeline() {
    var list = document.getElementById("timeline");
    var seqs = Array.from(events.keys()).sort(function (a, b) { return a - b; });
    list.innerHTML = "";
    seqs.forEach(function (seq) {
      var e = events.get(seq);
      var li = document.createElement("li");
      li.dataset.seq = seq;
      li.dataset.kind = e.kind;
      var kind = document.createElement("span");
      kind.className = "kind kind-" + e.kind;
      kind.textContent = e.kind.replace(/_/g, " ");
      var time = document.createElement("time");
      time.textContent = fmtTime(e.time);
      var msg = document.createElement("div");
      msg.className = "msg-text";
      msg.textContent = e.message || "";
      li.append(kind, time, msg);
      list.appendChild(li);
    });
  }

  var logPending = false;
  function renderLog() {
    if (logPending) return;
    logPending = true;
    requestAnimationFrame(function () {
      logPending = false;
      var pre = document.getElementById("log");
      var seqs = Array.from(logs.keys()).sort(function (a, b) { return a - b; });
      // Ultralytics draws progress bars with terminal escapes; the page shows plain text.
      pre.textContent = seqs.map(function (s) { return logs.get(s); }).join("").replace(/\x1b\[[0-9;?]*[A-Za-z]/g, "");
      if (document.getElementById("follow").checked) pre.scrollTop = pre.scrollHeight;
    });
  }

  function setField(name, value) {
    document.querySelectorAll('[data-field="' + name + '"]').forEach(function (el) {
      if (name === "simulated") { el.classList.toggle("hidden", !value); return; }
      if (name === "error") { el.classList.toggle("hidden", !value); el.textContent = value || ""; return; }
      if (/_at$/.test(name)) { el.textContent = value ? fmtTime(value) : "–"; return; }
      if (Array.isArray(value)) { el.textContent = value.length ? value.join(", ") : "–"; return; }
      // The score only orders the queue: whole points ("23,985", was "23985.333"; a new-user trial).
      el.textContent = value == null || value === "" ? "–" : (typeof value === "number" && name === "priority" ? Math.round(value).toLocaleString("en-US") : value);
    });
  }

  var FACTOR_NAMES = { fairshare: "fair-share", age: "age", size: "size", "class": "class" };

  // The tooltip of the priority score: what it is (from the page) and this job's factors now
  // (the same text as the priority_help filter).
  function setPriorityHelp(factors) {
    var el = document.getElementById("priority");
    // In the documented order, not the stored one (PostgreSQL's jsonb orders keys by length).
    var keys = Object.keys(FACTOR_NAMES).filter(function (k) { return factors && k in factors; })
      .concat(Object.keys(factors || {}).filter(function (k) { return !(k in FACTOR_NAMES); }));
    var parts = keys.map(function (k) { return (FACTOR_NAMES[k] || k) + " " + Number(factors[k]).toFixed(2); });
    el.title = el.dataset.help + (parts.length ? " This job: " + parts.join(" · ") + "." : "");
  }

  function refreshJob() {
    return getJSON(cfg.api).then(function (job) {
      ["queue_position", "estimated_start_at", "estimated_start_low_at", "estimated_start_high_at", "reason", "node", "simulated", "gpus", "attempt", "priority",
       "started_at", "finished_at", "error"].forEach(function (k) { setField(k, job[k]); });
      setPriorityHelp(job.priority_factors);
      if (job.state !== jobState) setState(job.state);
      if (job.model_version) {
        var link = document.getElementById("model-link");
        link.classList.remove("hidden");
        link.href = "/models/#model-" + job.model_version;
        link.textContent = "Model";
      }
      if (job.cancel_requested && !TERMINAL.has(job.state)) setConn("stopping…", "off");
    }).catch(function () { /* next poll */ });
  }

  function poll() {
    refreshJob().then(function () {
      if (!TERMINAL.has(jobState)) setTimeout(poll, 4000);
    });
  }

  // For tests and the curious: what the page holds.
  window.jobPage = {
    stats: stats,
    epochs: function () { return Array.from(metrics.keys()).sort(function (a, b) { return a - b; }); },
    metric: function (epoch) { var m = metrics.get(epoch); return m ? m.values : null; },
    seqs: function () { return Array.from(seen).sort(function (a, b) { return a - b; }); },
    state: function () { return jobState; },
    live: function () { return !inHistory && socket !== null && socket.readyState === WebSocket.OPEN; },
    drop: function () { if (socket) socket.close(); },  // simulate a lost connection
  };

  setState(jobState);
  connect();
  poll();
})();
