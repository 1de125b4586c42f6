// Trainyard dashboard: live log tails (server-sent events), and line charts (uPlot) of a job's
// metrics, of compared runs' metrics and of the usage page's GPU-hours.
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

// Line charts (uPlot): named series over one shared x axis, steps or times (Unix seconds), each
// series in its own colour. A chart is sized to its card and follows it when the page is resized;
// its legend names the series and shows the values under the cursor; drag to zoom (double-click
// to reset). Used by a job's metrics, the compare page and the usage page.
const CHART_HEIGHT = 220;

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

function chartWidth(box) {
  return Math.max(200, box.clientWidth - 16);
}

// The card's width follows the page; the chart follows the card.
function followCardWidth(box) {
  if (box.followsWidth) return;
  box.followsWidth = true;
  new ResizeObserver(() => {
    if (box.plot && box.plot.width !== chartWidth(box)) box.plot.setSize({ width: chartWidth(box), height: CHART_HEIGHT });
  }).observe(box);
}

// (Re)draws the chart of a card from `chart`: { x, xLabel, time, yLabel, yLog, steps, series:
// [{ label, values, stroke, width, value, spanGaps }] } (`value` formats a series' legend value,
// when given; `spanGaps` draws across the x values a series has no point at; `steps` holds each
// value until the next x, for amounts per interval).
function lineChart(box, chart) {
  const series = chart.series.map((s) => {
    const line = { label: s.label, stroke: s.stroke, width: s.width || 2 };
    if (s.value) line.value = s.value;
    if (s.spanGaps) line.spanGaps = true;
    if (chart.steps) line.paths = uPlot.paths.stepped({ align: 1 });
    return line;
  });
  const xAxis = chart.time ? {} : { values: tickLabels };
  if (chart.xLabel) xAxis.label = chart.xLabel;
  const yAxis = { values: tickLabels, size: axisWidth };
  if (chart.yLabel) yAxis.label = chart.yLabel;
  const options = {
    width: chartWidth(box),
    height: CHART_HEIGHT,
    scales: { x: { time: Boolean(chart.time) }, y: chart.yLog ? { distr: 3 } : {} },
    series: [{ label: chart.xLabel || (chart.time ? "time" : "x") }, ...series],
    axes: [xAxis, yAxis],
    cursor: { drag: { x: true, y: false } },
  };
  if (box.plot) box.plot.destroy();
  box.plot = new uPlot(options, [chart.x, ...chart.series.map((s) => s.values)], box.querySelector(".plot"));
  followCardWidth(box);
  return box.plot;
}

// Metrics: one chart per metric, refreshed every few seconds while the job runs; per chart, a
// log scale and smoothing (an exponential moving average, as TensorBoard and W&B draw it, the
// raw series kept faint).
const METRICS_REFRESH_MS = 3000;
const STROKE = "#0a58ca";

function smoothed(values, weight) {
  let last = null;
  return values.map((v) => {
    if (v == null || !Number.isFinite(v)) return v;
    last = last == null ? v : last * weight + v * (1 - weight);
    return last;
  });
}

// (Re)draws a metric's chart from its data and its controls.
function plotChart(box) {
  const { name, steps, values } = box.series;
  const log = box.querySelector("input[name=log]").checked;
  const weight = Number(box.querySelector("input[name=smoothing]").value);
  const positive = values.every((v) => v > 0);
  box.querySelector("input[name=log]").disabled = !positive;
  const series =
    weight > 0
      ? [
          { label: name + " (raw)", values, stroke: STROKE + "40", width: 1 },
          { label: name + " (smoothed)", values: smoothed(values, weight), stroke: STROKE },
        ]
      : [{ label: name, values, stroke: STROKE }];
  lineChart(box, { x: steps, xLabel: "step", series, yLog: log && positive });
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

// One colour per line where a chart has several (tenants, compared runs).
const SERIES_COLOURS = ["#0a58ca", "#bc4c00", "#116329", "#8250df", "#a40e26", "#1b7c83", "#7d4e00", "#57606a"];

// Compared runs: one metric, one line per run over the steps (or the seconds since each run's
// first point) any of them reported, from the JSON the page carries in `data-compare`:
// { metric, x_label, x, series: [{ id, label, values }] }.
function drawComparison(box) {
  const data = JSON.parse(box.dataset.compare);
  const series = data.series.map((s, i) => ({
    label: s.label,
    values: s.values,
    stroke: SERIES_COLOURS[i % SERIES_COLOURS.length],
    spanGaps: true,
  }));
  const plot = lineChart(box, { x: data.x, xLabel: data.x_label, yLabel: data.metric, series });
  // Each line's legend entry names its run (the first entry is the x under the cursor).
  const entries = plot.root.querySelectorAll(".u-legend .u-series");
  data.series.forEach((s, i) => {
    if (entries[i + 1]) entries[i + 1].dataset.run = s.id;
  });
  box.dataset.series = String(data.series.length);
}

// Usage: GPU-hours per bucket, one line per tenant, from the JSON the page carries in
// `data-usage`: { from, bucket_seconds, series: [{ tenant, gpu_hours }] }.

function drawUsage(box) {
  const usage = JSON.parse(box.dataset.usage);
  const buckets = usage.series.length ? usage.series[0].gpu_hours.length : 0;
  // Each bucket's amount is drawn across the bucket: from its start to the next one's, the last
  // to the end of the window.
  const x = Array.from({ length: buckets + 1 }, (_, i) => usage.from + i * usage.bucket_seconds);
  const series = usage.series.map((s, i) => ({
    label: s.tenant,
    values: [...s.gpu_hours, s.gpu_hours.at(-1)],
    stroke: SERIES_COLOURS[i % SERIES_COLOURS.length],
    value: (u, v) => (v == null ? "—" : v.toLocaleString("en-US", { maximumFractionDigits: 4 }) + " GPU-h"),
  }));
  const plot = lineChart(box, { x, time: true, steps: true, yLabel: "GPU-hours", series });
  // Each line's legend entry names its tenant (the first entry is the time under the cursor).
  const entries = plot.root.querySelectorAll(".u-legend .u-series");
  usage.series.forEach((s, i) => {
    if (entries[i + 1]) entries[i + 1].dataset.tenant = s.tenant;
  });
  box.dataset.series = String(usage.series.length);
}

document.addEventListener("DOMContentLoaded", () => {
  startLogs();
  const charts = document.querySelector("[data-metrics]");
  if (charts && window.uPlot) refreshMetrics(charts);
  const usage = document.getElementById("usage-chart");
  if (usage && window.uPlot) drawUsage(usage);
  const compared = document.getElementById("compare-chart");
  if (compared && window.uPlot) drawComparison(compared);
  // An experiment's trials: the same chart, one line per trial.
  const trials = document.getElementById("experiment-chart");
  if (trials && window.uPlot) drawComparison(trials);
});
