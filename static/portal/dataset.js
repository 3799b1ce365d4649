/* Dataset page: the class histogram per split. */
(function () {
  "use strict";
  var canvas = document.getElementById("histogram");
  if (!canvas) return;
  var data = JSON.parse(document.getElementById("dataset-data").textContent);
  var colors = { train: "#2563eb", val: "#16a34a", test: "#9333ea" };
  var datasets = Object.keys(data.histogram).map(function (split) {
    return { label: split, data: data.histogram[split], backgroundColor: colors[split] || "#64748b" };
  });
  window.datasetChart = new Chart(canvas, {
    type: "bar",
    data: { labels: data.names, datasets: datasets },
    options: { animation: false, responsive: true, maintainAspectRatio: false,
               plugins: { legend: { position: "bottom" } },
               scales: { y: { beginAtZero: true, title: { display: true, text: "boxes" } } } },
  });
  canvas.dataset.bars = String(datasets.reduce(function (n, d) { return n + d.data.length; }, 0));
})();
