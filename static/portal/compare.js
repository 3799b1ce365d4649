/* Compare page: each metric's curve over epochs, one line per version. */
(function () {
  "use strict";
  var node = document.getElementById("compare-data");
  if (!node) return;
  var data = JSON.parse(node.textContent);
  var colors = ["#2563eb", "#dc2626", "#16a34a", "#9333ea"];
  window.compareCharts = [];
  Array.prototype.forEach.call(document.querySelectorAll("canvas.curve"), function (canvas) {
    var series = data.series[canvas.dataset.series] || [];
    var lines = series.map(function (points, i) {
      return { label: data.versions[i], data: points, borderColor: colors[i % colors.length],
               backgroundColor: colors[i % colors.length], pointRadius: 2, tension: 0.2 };
    });
    window.compareCharts.push(new Chart(canvas, {
      type: "line", data: { datasets: lines },
      options: { animation: false, responsive: true, maintainAspectRatio: false, parsing: true,
                 plugins: { legend: { position: "bottom" } },
                 scales: { x: { type: "linear", title: { display: true, text: "epoch" }, ticks: { precision: 0 } } } },
    }));
    canvas.dataset.lines = String(lines.length);
    canvas.dataset.points = String(lines.reduce(function (n, l) { return n + l.data.length; }, 0));
  });
})();
