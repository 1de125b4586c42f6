//! Experiments on the dashboard: the list, and an experiment's page (its trials table, the best
//! trial, the rung ladder, and the searched metric of every trial over steps on one chart).

use std::collections::{BTreeMap, BTreeSet};

use askama::Template;
use axum::extract::{Path, State};
use axum::response::{IntoResponse, Redirect, Response};
use serde::Serialize;
use trainyard_core::Error;
use trainyard_core::error::ObjectKind;
use trainyard_core::experiments::{Experiment, ExperimentDetail};
use uuid::Uuid;

use super::{CsrfForm, LineChart, LineSeries, Nav, WebAuth, WebResult, can_write, render, when};
use crate::http::AppState;
use crate::http::extract::parse_id;

/// The most x values a chart carries (points beyond are thinned evenly).
const MAX_CHART_STEPS: usize = 2_000;

pub struct ExperimentRow {
    pub id: Uuid,
    pub name: String,
    pub template: String,
    pub method: String,
    pub state: &'static str,
    pub best: String,
    pub created: String,
}

/// A rung as the pages show it: rung, the step it stops at, trials typically, at most.
type RungRow = (u32, u64, u64, u64);

/// A search's preview on the list page: its rungs and a summary line.
type Preview = (Vec<RungRow>, String);

#[derive(Template)]
#[template(path = "experiments.html")]
struct ExperimentsPage {
    nav: Nav,
    experiments: Vec<ExperimentRow>,
    /// The search in the form: what the user wrote (kept when it is refused), or an example.
    search: String,
    /// Every problem of a refused search, `field: message`.
    problems: Vec<String>,
    /// A preview's rungs (rung, stops at step, trials typically, at most) and its summary.
    preview: Option<Preview>,
}

/// A search to start from, in the form the first time.
const EXAMPLE_SEARCH: &str = "name: lr-search
template: pytorch-ddp
params: {data: images@1, epochs: 100}
space:
  lr: {type: float, min: 0.0001, max: 0.1, log: true}
searcher: {method: asha, metric: loss, max_length: 64, max_trials: 8, divisor: 2, max_rungs: 3}
";

pub async fn list(State(state): State<AppState>, auth: WebAuth) -> WebResult<Response> {
    list_page(&state, &auth, EXAMPLE_SEARCH.to_string(), Vec::new(), None).await
}

async fn list_page(
    state: &AppState,
    auth: &WebAuth,
    search: String,
    problems: Vec<String>,
    preview: Option<Preview>,
) -> WebResult<Response> {
    let experiments = state.app.experiments_list(&auth.caller).await?.iter().map(row_of).collect();
    Ok(render(&ExperimentsPage { nav: Nav::new(auth, "experiments"), experiments, search, problems, preview }))
}

/// The form's search, previewed (`action=preview`) or started: the same checks as the API, a
/// refusal shown with every problem and the text as the user wrote it.
pub async fn create(State(state): State<AppState>, auth: WebAuth, CsrfForm(form): CsrfForm) -> WebResult<Response> {
    // A viewer is refused before anything in the form is read, as the API refuses them.
    auth.caller.authorize(trainyard_core::auth::Action::WriteJobs)?;
    let text = form.get("search").cloned().unwrap_or_default();
    let search: Result<trainyard_core::experiments::ExperimentCreate, Error> =
        serde_yaml_ng::from_str(&text).map_err(|err| Error::invalid("search", format!("not a search: {err}")));
    let previewing = form.get("action").is_some_and(|a| a == "preview");
    let outcome = match search {
        Err(err) => Err(err),
        Ok(search) if previewing => match state.app.experiment_preview(&auth.caller, search).await {
            Ok(p) => {
                let rungs = p.ladder.rungs.iter().map(|r| (r.rung, r.length, r.trials, r.trials_at_most)).collect();
                let hours = p.gpu_hours_at_most.map_or_else(|| "unknown".into(), |h| format!("{h:.2}"));
                let summary = format!(
                    "{} trials, {} training steps typically, {} at most; GPU-hours at most: {hours}. {}",
                    p.ladder.trials,
                    p.ladder.steps,
                    p.ladder.steps_at_most,
                    p.notes.join(" ")
                );
                return list_page(&state, &auth, text, Vec::new(), Some((rungs, summary))).await;
            }
            Err(err) => Err(err),
        },
        Ok(search) => state.app.experiment_create(&auth.caller, search).await.map(|e| e.id),
    };
    match outcome {
        Ok(id) => Ok(Redirect::to(&format!("/experiments/{id}")).into_response()),
        Err(err @ (Error::InvalidInput { .. } | Error::InvalidFields(_) | Error::Conflict(_))) => {
            let problems = match err.field_problems() {
                problems if problems.is_empty() => vec![err.to_string()],
                problems => problems.into_iter().map(|p| format!("{}: {}", p.field, p.message)).collect(),
            };
            list_page(&state, &auth, text, problems, None).await
        }
        Err(err) => Err(err.into()),
    }
}

fn word<T: Serialize>(value: &T) -> String {
    serde_json::to_value(value).ok().and_then(|v| v.as_str().map(String::from)).unwrap_or_default()
}

fn row_of(e: &Experiment) -> ExperimentRow {
    ExperimentRow {
        id: e.id,
        name: e.name.clone(),
        template: format!("{}@{}", e.template, e.template_version),
        method: word(&e.searcher.method),
        state: e.state.as_str(),
        best: e.best.as_ref().map(|b| format!("{:.4} (trial {})", b.value, b.trial)).unwrap_or_else(|| "—".into()),
        created: when(&e.created_at),
    }
}

pub struct TrialRow {
    pub trial: u32,
    pub status: String,
    pub rung: u32,
    /// Each rung's value and job: (rung, value text, job id).
    pub runs: Vec<(u32, String, Option<Uuid>)>,
    pub params: String,
    pub best: bool,
    pub failure: String,
    pub preemptions: u32,
}

#[derive(Template)]
#[template(path = "experiment.html")]
struct ExperimentPage {
    nav: Nav,
    experiment: ExperimentRow,
    metric: String,
    goal: String,
    reason: Option<String>,
    best: Option<String>,
    best_job: Option<Uuid>,
    rungs: Vec<RungRow>,
    gpu_hours: String,
    trials: Vec<TrialRow>,
    chart: String,
    over: bool,
    paused: bool,
    can_write: bool,
    spare: bool,
}

pub async fn detail(State(state): State<AppState>, auth: WebAuth, Path(id): Path<String>) -> WebResult<Response> {
    let id = parse_id(&id, ObjectKind::Experiment)?;
    let detail = state.app.experiment_show(&auth.caller, id).await?;
    let chart = chart_of(&state, &auth, &detail).await?;
    let ExperimentDetail { experiment: e, trials, ladder, gpu_hours, .. } = &detail;
    let best_trial = e.best.as_ref().map(|b| b.trial);
    let page = ExperimentPage {
        nav: Nav::new(&auth, "experiments"),
        experiment: row_of(e),
        metric: e.searcher.metric.clone(),
        goal: word(&e.searcher.goal),
        reason: e.reason.clone(),
        best: e.best.as_ref().map(|b| {
            let params: Vec<String> = b.params.iter().map(|(k, v)| format!("{k}={v}")).collect();
            format!("trial {} at rung {}: {} {} — {}", b.trial, b.rung, e.searcher.metric, b.value, params.join(" "))
        }),
        best_job: e.best.as_ref().and_then(|b| b.job_id),
        rungs: ladder.rungs.iter().map(|r| (r.rung, r.length, r.trials, r.trials_at_most)).collect(),
        gpu_hours: format!("{gpu_hours:.2}"),
        trials: trials
            .iter()
            .map(|t| TrialRow {
                trial: t.trial,
                status: word(&t.status),
                rung: t.rung,
                runs: t
                    .runs
                    .iter()
                    .map(|r| (r.rung, r.value.map_or_else(|| "—".into(), |v| format!("{v:.4}")), r.job_id))
                    .collect(),
                params: t.params.iter().map(|(k, v)| format!("{k}={v}")).collect::<Vec<_>>().join(" "),
                best: best_trial == Some(t.trial),
                failure: t.failure.clone().unwrap_or_default(),
                preemptions: t.preemptions,
            })
            .collect(),
        chart,
        over: e.state.is_over(),
        paused: e.state == trainyard_core::experiments::ExperimentState::Paused,
        can_write: can_write(&auth.caller),
        spare: e.spare,
    };
    Ok(render(&page))
}

/// The searched metric of each trial over steps: its runs' points together (a resumed run goes
/// on from the step its trial paused at), one line per trial.
async fn chart_of(state: &AppState, auth: &WebAuth, detail: &ExperimentDetail) -> WebResult<String> {
    let metric = &detail.experiment.searcher.metric;
    let mut per_trial: Vec<(u32, BTreeMap<i64, f64>)> = Vec::new();
    for trial in &detail.trials {
        let jobs: Vec<Uuid> = trial.runs.iter().filter_map(|r| r.job_id).collect();
        let read = state.app.runs_metric(&auth.caller, &jobs, metric).await?;
        let points = read
            .iter()
            .flat_map(|m| m.series.iter().flat_map(|s| s.steps.iter().copied().zip(s.values.iter().copied())))
            .collect();
        per_trial.push((trial.trial, points));
    }
    let all: BTreeSet<i64> = per_trial.iter().flat_map(|(_, p)| p.keys().copied()).collect();
    let stride = all.len().div_ceil(MAX_CHART_STEPS).max(1);
    let keys: Vec<i64> = all.into_iter().step_by(stride).collect();
    let series = per_trial
        .iter()
        .map(|(trial, points)| LineSeries {
            id: trial.to_string(),
            label: format!("trial {trial}"),
            values: keys.iter().map(|k| points.get(k).copied()).collect(),
        })
        .collect();
    let x = keys.iter().map(|&k| k as f64).collect();
    Ok(serde_json::to_string(&LineChart { metric, x_label: "step", x, series }).expect("numbers and names serialise"))
}

pub async fn pause(state: State<AppState>, auth: WebAuth, id: Path<String>, form: CsrfForm) -> WebResult<Response> {
    command(state, auth, id, form, "pause").await
}

pub async fn resume(state: State<AppState>, auth: WebAuth, id: Path<String>, form: CsrfForm) -> WebResult<Response> {
    command(state, auth, id, form, "resume").await
}

pub async fn cancel(state: State<AppState>, auth: WebAuth, id: Path<String>, form: CsrfForm) -> WebResult<Response> {
    command(state, auth, id, form, "cancel").await
}

async fn command(
    State(state): State<AppState>,
    auth: WebAuth,
    Path(id): Path<String>,
    CsrfForm(_form): CsrfForm,
    verb: &str,
) -> WebResult<Response> {
    let id = parse_id(&id, ObjectKind::Experiment)?;
    match verb {
        "pause" => state.app.experiment_pause(&auth.caller, id).await?,
        "resume" => state.app.experiment_resume(&auth.caller, id).await?,
        _ => state.app.experiment_cancel(&auth.caller, id).await?,
    };
    Ok(Redirect::to(&format!("/experiments/{id}")).into_response())
}
