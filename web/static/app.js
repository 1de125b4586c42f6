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

// Metrics: one chart per series, refreshed every few seconds while the job runs. Each chart is
// sized to its own card and follows it when the page is resized; its legend shows the values
// under the cursor; drag to zoom (double-click to reset); per chart, a log scale and smoothing
// (an exponential moving average, as TensorBoard and W&B draw it, the raw series kept faint).
const METRICS_REFRESH_MS = 3000;
const CHART_HEIGHT = 220;
const STROKE = "#0a58ca";

// Tick labels with as many decimals as the tick spacing needs (0.001, 0.0015, ... not 0.001 x5),
// thousands separated, very large or small values in exponent form.
function tickLabels(u, splits, axisIdx, space, increment) {
  const decimals = Math.max(0, Math.min(8, -Math.floor(Math.log10(increment || 1))));
  return splits.map((v) => {
    if (v == null) return "";
    const magnitude = Math.abs(v);
    if (magnitude >= 1e6 || (magnitude > 0 && magnitude < 1e-5)) return v.toExponential(1);
    return v.toLocaleString("en-US", { minimumFractionDigits: decimals, maximumFractionDigits: decimals });
  });
}

// An axis wide enough for its longest tick label, so no label is cut.
function axisWidth(u, values) {
  if (!values) return 40;
  const longest = values.reduce((most, v) => Math.max(most, String(v).length), 0);
  return Math.ceil(longest * 7.5 + 16);
}

function smoothed(values, weight) {
  let last = null;
  return values.map((v) => {
    if (v == null || !Number.isFinite(v)) return v;
    last = last == null ? v : last * weight + v * (1 - weight);
    return last;
  });
}

function chartWidth(box) {
  return Math.max(200, box.clientWidth - 16);
}

// (Re)draws a card's chart from its data and its controls.
function plotChart(box) {
  const { name, values } = box.series;
  const log = box.querySelector("input[name=log]").checked;
  const weight = Number(box.querySelector("input[name=smoothing]").value);
  const positive = values.every((v) => v > 0);
  box.querySelector("input[name=log]").disabled = !positive;
  const series = [{ label: "step" }, { label: name, stroke: STROKE, width: 2 }];
  if (weight > 0) {
    series[1] = { label: name + " (raw)", stroke: STROKE + "40", width: 1 };
    series.push({ label: name + " (smoothed)", stroke: STROKE, width: 2 });
  }
  const options = {
    width: chartWidth(box),
    height: CHART_HEIGHT,
    scales: { x: { time: false }, y: log && positive ? { distr: 3 } : {} },
    series,
    axes: [{ label: "step", values: tickLabels }, { values: tickLabels, size: axisWidth }],
    cursor: { drag: { x: true, y: false } },
  };
  if (box.plot) box.plot.destroy();
  box.plot = new uPlot(options, chartData(box), box.querySelector(".plot"));
}

// The chart's columns: steps, values, and the smoothed values when smoothing is on.
function chartData(box) {
  const { steps, values } = box.series;
  const weight = Number(box.querySelector("input[name=smoothing]").value);
  return weight > 0 ? [steps, values, smoothed(values, weight)] : [steps, values];
}

function chartCard(container, s, id) {
  const box = document.createElement("figure");
  box.className = "chart";
  box.id = id;
  box.dataset.metric = s.name;
  const title = document.createElement("h3");
  title.textContent = s.name;
  const controls = document.createElement("div");
  controls.className = "chart-controls";
  controls.innerHTML =
    '<label><input type="checkbox" name="log"> log scale</label>' +
    '<label>smoothing <input type="range" name="smoothing" min="0" max="0.99" step="0.01" value="0"></label>';
  const plot = document.createElement("div");
  plot.className = "plot";
  box.append(title, controls, plot);
  container.append(box);
  for (const input of controls.querySelectorAll("input")) input.addEventListener("input", () => plotChart(box));
  // The card's width follows the grid; the chart follows the card.
  new ResizeObserver(() => {
    if (box.plot && box.plot.width !== chartWidth(box)) box.plot.setSize({ width: chartWidth(box), height: CHART_HEIGHT });
  }).observe(box);
  return box;
}

function drawCharts(container, series) {
  const empty = document.getElementById("no-metrics");
  if (series.length && empty) empty.remove();
  for (const s of series) {
    const id = "chart-" + s.name.replace(/[^a-zA-Z0-9_-]/g, "_");
    const box = document.getElementById(id) || chartCard(container, s, id);
    const grew = !box.series || box.series.steps.length !== s.steps.length;
    box.series = s;
    if (!box.plot) plotChart(box);
    else if (grew) box.plot.setData(chartData(box));
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
