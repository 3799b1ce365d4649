/* Usage page: GPU-hours per day, mine and my teams', against my daily quota. */
(function () {
  "use strict";
  var data = JSON.parse(document.getElementById("usage-data").textContent);
  var colors = ["#2563eb", "#16a34a", "#9333ea", "#ea580c", "#0891b2"];
  var datasets = [{ type: "bar", label: "me", data: data.me, backgroundColor: "#1d4ed8", order: 2 }];
  Object.keys(data.teams).forEach(function (slug, i) {
    var color = colors[(i + 1) % colors.length];
    datasets.push({ type: "bar", label: "team " + slug, data: data.teams[slug], backgroundColor: color + "99", order: 3 });
  });
  if (data.quota) {
    datasets.push({ type: "line", label: "my daily quota", data: data.labels.map(function () { return data.quota; }),
                    borderColor: "#dc2626", borderDash: [6, 4], pointRadius: 0, borderWidth: 2, order: 1 });
  }
  new Chart(document.getElementById("usage-chart"), {
    data: { labels: data.labels, datasets: datasets },
    options: {
      animation: false, responsive: true, maintainAspectRatio: false,
      interaction: { mode: "index", intersect: false },
      plugins: { legend: { position: "bottom" } },
      scales: { y: { beginAtZero: true, title: { display: true, text: "GPU-hours" } } },
    },
  });
})();

/* The period report (per team or user) and, for admins, the cluster's daily history. */
(function () {
  "use strict";
  var data = JSON.parse(document.getElementById("usage-data").textContent);
  var base = { animation: false, responsive: true, maintainAspectRatio: false,
               plugins: { legend: { position: "bottom" } } };
  var report = data.report;
  if (report && document.getElementById("report-hours")) {
    new Chart(document.getElementById("report-hours"), {
      type: "bar",
      data: { labels: report.labels, datasets: [{ label: "GPU-hours", data: report.gpu_hours, backgroundColor: "#2563eb" }] },
      options: Object.assign({}, base, { indexAxis: "y", scales: { x: { beginAtZero: true } } }),
    });
    new Chart(document.getElementById("report-wait"), {
      data: { labels: report.labels, datasets: [
        { type: "bar", label: "p95 wait (min)", data: report.wait_p95_min, backgroundColor: "#9333ea99", yAxisID: "y" },
        { type: "bar", label: "failed attempts", data: report.failures, backgroundColor: "#dc2626", yAxisID: "y1" },
        { type: "bar", label: "preemptions", data: report.preemptions, backgroundColor: "#ea580c", yAxisID: "y1" },
      ] },
      options: Object.assign({}, base, { scales: {
        y: { beginAtZero: true, position: "left", title: { display: true, text: "minutes" } },
        y1: { beginAtZero: true, position: "right", grid: { drawOnChartArea: false }, ticks: { precision: 0 } } } }),
    });
  }
  var cluster = data.cluster;
  if (cluster && document.getElementById("cluster-chart")) {
    var pct = function (xs) { return xs.map(function (x) { return Math.round(x * 1000) / 10; }); };
    new Chart(document.getElementById("cluster-chart"), {
      data: { labels: cluster.labels, datasets: [
        { type: "line", label: "allocation %", data: pct(cluster.allocation), borderColor: "#2563eb", yAxisID: "y" },
        { type: "line", label: "GPU utilisation %", data: pct(cluster.utilisation), borderColor: "#16a34a", yAxisID: "y" },
        { type: "bar", label: "queued jobs (mean)", data: cluster.queued, backgroundColor: "#ea580c66", yAxisID: "y1" },
      ] },
      options: Object.assign({}, base, { scales: {
        y: { min: 0, max: 100, title: { display: true, text: "%" } },
        y1: { beginAtZero: true, position: "right", grid: { drawOnChartArea: false } } } }),
    });
  }
})();
