//! The compare page: two or more runs side by side, a table per section (a column per run,
//! the values that differ highlighted), only the differences unless `all=true`, and one metric of
//! every run drawn on one chart, aligned by step. The same operation as `GET /api/v1/compare`.

use std::collections::{BTreeMap, BTreeSet};

use askama::Template;
use axum::extract::{Query, State};
use axum::response::Response;
use serde::Deserialize;
use trainyard_core::Error;
use trainyard_core::compare::{ComparedRun, Comparison};
use uuid::Uuid;

use super::{LineChart, LineSeries, Nav, WebAuth, WebResult, render};
use crate::app::compare::compared_ids;
use crate::http::AppState;

/// The most steps a chart carries; longer series are thinned evenly (every k-th step kept).
const MAX_CHART_STEPS: usize = 4000;

/// The page's query: `jobs` (ids, comma-separated), `with` (more ids or short ids, from the job
/// page's form), `all`, and the chart's `metric`.
#[derive(Debug, Default, Deserialize)]
pub struct CompareParams {
    #[serde(default)]
    jobs: String,
    #[serde(default)]
    with: String,
    #[serde(default)]
    all: bool,
    #[serde(default)]
    metric: String,
    /// How the chart lines runs up: by `step` (the default) or by wall `time` since each run's
    /// first point.
    #[serde(default)]
    x: Align,
}

/// What the chart's x axis is.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Align {
    #[default]
    Step,
    Time,
}

pub struct SectionView {
    name: String,
    differ: usize,
    same: usize,
    rows: Vec<RowView>,
}

pub struct RowView {
    field: String,
    differs: bool,
    values: Vec<String>,
}

#[derive(Template)]
#[template(path = "compare.html")]
struct ComparePage {
    nav: Nav,
    runs: Vec<ComparedRun>,
    all: bool,
    differ: usize,
    same: usize,
    sections: Vec<SectionView>,
    /// This page with the other choice of `all`.
    toggle_url: String,
    jobs: String,
    metrics: Vec<String>,
    metric: String,
    /// Whether the chart lines runs up by wall time (else by step).
    by_time: bool,
    /// The chart's data as JSON, for the page's script; none when no run has the metric.
    chart: Option<String>,
}

fn shown(value: &Option<serde_json::Value>) -> String {
    match value {
        None => "(absent)".into(),
        Some(serde_json::Value::String(s)) => s.clone(),
        Some(other) => other.to_string(),
    }
}

pub async fn compare(
    State(state): State<AppState>,
    auth: WebAuth,
    Query(params): Query<CompareParams>,
) -> WebResult<Response> {
    let mut ids = compared_ids(&params.jobs)?;
    for text in params.with.split([',', ' ']).map(str::trim).filter(|t| !t.is_empty()) {
        let named = super::job_named(&state, &auth, text, "with").await?;
        ids.push(
            named.ok_or_else(|| {
                Error::invalid("with", format!("no job of your tenant has an id starting with {text}"))
            })?,
        );
    }
    let comparison = state.app.runs_compare(&auth.caller, &ids, params.all).await?;
    let metric = [params.metric.as_str(), "loss"]
        .into_iter()
        .find(|m| comparison.metrics.iter().any(|name| name == m))
        .or(comparison.metrics.first().map(String::as_str))
        .map(str::to_string)
        .unwrap_or_default();
    let chart = if metric.is_empty() {
        None
    } else {
        Some(chart_of(&state, &auth, &comparison, &ids, &metric, params.x).await?)
    };
    let jobs = ids.iter().map(Uuid::to_string).collect::<Vec<_>>().join(",");
    let mut toggle = form_urlencoded::Serializer::new(String::new());
    toggle.append_pair("jobs", &jobs);
    if !params.all {
        toggle.append_pair("all", "true");
    }
    if !metric.is_empty() {
        toggle.append_pair("metric", &metric);
    }
    if params.x == Align::Time {
        toggle.append_pair("x", "time");
    }
    let Comparison { runs, all, sections, differ, same, metrics } = comparison;
    let sections = sections
        .into_iter()
        .filter(|s| !s.fields.is_empty())
        .map(|s| SectionView {
            name: s.name,
            differ: s.differ,
            same: s.same,
            rows: s
                .fields
                .iter()
                .map(|f| RowView {
                    field: f.field.clone(),
                    differs: f.differs,
                    values: f.values.iter().map(shown).collect(),
                })
                .collect(),
        })
        .collect();
    Ok(render(&ComparePage {
        nav: Nav::new(&auth, "jobs"),
        runs,
        all,
        differ,
        same,
        sections,
        toggle_url: format!("/compare?{}", toggle.finish()),
        jobs,
        metrics,
        metric,
        by_time: params.x == Align::Time,
        chart,
    }))
}

/// The chart's JSON: the metric of every run, aligned on the union of their steps, or of their
/// times since each run's first point (to the millisecond).
async fn chart_of(
    state: &AppState,
    auth: &WebAuth,
    comparison: &Comparison,
    ids: &[Uuid],
    metric: &str,
    align: Align,
) -> WebResult<String> {
    // Each run's points by x key: the step, or milliseconds since its first point.
    let (by_key, per_unit, x_label): (Vec<BTreeMap<i64, f64>>, f64, &'static str) = match align {
        Align::Step => {
            let read = state.app.runs_metric(&auth.caller, ids, metric).await?;
            let points = read
                .iter()
                .map(|m| m.series.iter().flat_map(|s| s.steps.iter().copied().zip(s.values.iter().copied())).collect())
                .collect();
            (points, 1.0, "step")
        }
        Align::Time => {
            let read = state.app.runs_metric_timeline(&auth.caller, ids, metric).await?;
            let points = read
                .iter()
                .map(|timeline| {
                    timeline.iter().map(|&(seconds, value)| ((seconds * 1000.0).round() as i64, value)).collect()
                })
                .collect();
            (points, 1000.0, "seconds since the run's first point")
        }
    };
    let all_keys: BTreeSet<i64> = by_key.iter().flat_map(|s| s.keys().copied()).collect();
    let stride = all_keys.len().div_ceil(MAX_CHART_STEPS).max(1);
    let keys: Vec<i64> = all_keys.into_iter().step_by(stride).collect();
    let series = comparison
        .runs
        .iter()
        .zip(&by_key)
        .map(|(run, points)| LineSeries {
            id: run.id.to_string(),
            label: run.label.clone(),
            values: keys.iter().map(|key| points.get(key).copied()).collect(),
        })
        .collect();
    let x = keys.iter().map(|&key| key as f64 / per_unit).collect();
    Ok(serde_json::to_string(&LineChart { metric, x_label, x, series }).expect("numbers and names serialise"))
}
