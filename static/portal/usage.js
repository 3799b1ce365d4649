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
