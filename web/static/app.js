// Trainyard dashboard: live log tails (server-sent events) and metrics charts (uPlot).
// Everything else is server-rendered and refreshed with htmx attributes in the views.
"use strict";

// Log tails: each <pre data-log-stream> follows its replica's log while its <details> is open.
const MAX_LOG_LINES = 5000;

function followLog(pre) {
  if (pre.dataset.following) return;
  pre.dataset.following = "yes";
  const status = document.getElementById(pre.id.replace("log-", "log-status-"));
  const source = new EventSource(pre.dataset.logStream);
  source.addEventListener("line", (event) => {
    const atBottom = pre.scrollTop + pre.clientHeight >= pre.scrollHeight - 4;
    pre.append(event.data + "\n");
    while (pre.childNodes.length > MAX_LOG_LINES) pre.removeChild(pre.firstChild);
    if (atBottom) pre.scrollTop = pre.scrollHeight;
  });
  source.addEventListener("end", () => {
    source.close();
    pre.dataset.ended = "yes";
    if (status) status.textContent = "The job has ended; this is the whole log.";
  });
  source.onerror = () => {
    // The server ended the stream (it sends `end` first) or the network dropped; the browser
    // reconnects on its own unless the log is complete.
    if (pre.dataset.ended) source.close();
  };
}

function startLogs() {
  for (const pre of document.querySelectorAll("pre[data-log-stream]")) {
    const details = pre.closest("details");
    if (!details || details.open) followLog(pre);
    if (details) details.addEventListener("toggle", () => details.open && followLog(pre));
  }
}

// Metrics: one chart per series, refreshed every few seconds while the job runs.
const METRICS_REFRESH_MS = 3000;

function drawCharts(container, series) {
  const empty = document.getElementById("no-metrics");
  if (series.length && empty) empty.remove();
  const width = Math.max(280, Math.min(560, container.clientWidth - 16));
  for (const s of series) {
    const id = "chart-" + s.name.replace(/[^a-zA-Z0-9_-]/g, "_");
    let box = document.getElementById(id);
    const data = [s.steps, s.values];
    if (!box) {
      box = document.createElement("figure");
      box.className = "chart";
      box.id = id;
      box.dataset.metric = s.name;
      const title = document.createElement("h3");
      title.textContent = s.name;
      box.append(title);
      container.append(box);
      box.plot = new uPlot({
        width, height: 220,
        scales: { x: { time: false } },
        series: [{ label: "step" }, { label: s.name, stroke: "#0a58ca", width: 2 }],
        axes: [{ label: "step" }, {}],
      }, data, box);
    } else {
      box.plot.setData(data);
    }
    box.dataset.points = String(s.steps.length);
    box.setAttribute("aria-label", `${s.name}: ${s.steps.length} points, last ${s.values.at(-1)}`);
  }
}

async function refreshMetrics(container) {
  try {
    const response = await fetch(container.dataset.metrics, { credentials: "same-origin" });
    if (!response.ok) return;
    const body = await response.json();
    drawCharts(container, body.series);
    if (!body.finished) setTimeout(() => refreshMetrics(container), METRICS_REFRESH_MS);
  } catch (err) {
    setTimeout(() => refreshMetrics(container), METRICS_REFRESH_MS * 2);
  }
}

document.addEventListener("DOMContentLoaded", () => {
  startLogs();
  const charts = document.querySelector("[data-metrics]");
  if (charts && window.uPlot) refreshMetrics(charts);
});
