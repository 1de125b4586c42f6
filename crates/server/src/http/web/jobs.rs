//! The job list and a job's page. The list's rows and the live part of a job's page are also
//! served alone, for htmx to poll; a log is streamed as server-sent events, one per line.

use std::convert::Infallible;

use askama::Template;
use axum::extract::{Path, Query, State};
use axum::http::{StatusCode, header};
use axum::response::sse::{Event, KeepAlive, Sse};
use axum::response::{IntoResponse, Redirect, Response};
use futures::{Stream, StreamExt};
use serde::Deserialize;
use tokio_util::codec::{FramedRead, LinesCodec};
use tokio_util::io::StreamReader;
use trainyard_core::api::{Job, JobAttempt, JobEvent, Schedule};
use trainyard_core::error::ObjectKind;
use trainyard_core::job::JobState;
use trainyard_core::resources::{human_cpus, human_gpus, human_memory};
use uuid::Uuid;

use super::{CsrfForm, Nav, WebAuth, WebResult, can_write, render, when, when_opt};
use crate::app::logs::LogRequest;
use crate::http::AppState;
use crate::http::api::jobs::{ListParams, list_filter};
use crate::http::extract::parse_id;

/// How many jobs a page lists.
const PAGE_SIZE: u32 = 50;
/// The longest log line sent to a browser; longer ones are cut.
const MAX_LOG_LINE: usize = 16 * 1024;
/// What htmx takes as "stop polling".
const STOP_POLLING: u16 = 286;

/// One row of the job list.
pub struct JobRow {
    pub id: Uuid,
    pub name: String,
    pub state: &'static str,
    pub template: String,
    pub gpus: String,
    pub created: String,
    pub reason: String,
}

impl JobRow {
    /// The first 13 characters of its id, as `yard` prints it and every id argument takes.
    pub fn short_id(&self) -> String {
        self.id.to_string()[..13].to_string()
    }
}

impl JobRow {
    fn of(job: &Job) -> JobRow {
        let resources = &job.spec.resources;
        let gpus = if resources.gpus == 0 {
            "—".to_string()
        } else {
            let kind = resources.gpu_type.as_deref().unwrap_or("any");
            format!("{} × {} {kind}", job.spec.replicas, resources.gpus)
        };
        JobRow {
            id: job.id,
            name: job.name.clone(),
            state: job.state.as_str(),
            template: job.spec.template.as_ref().map(|t| format!("{}@{}", t.name, t.version)).unwrap_or_default(),
            gpus,
            created: when(&job.created_at),
            reason: job.reason.clone().unwrap_or_default(),
        }
    }
}

/// The list's filters as the form shows them; empty means "any".
#[derive(Debug, Default, Clone, Deserialize)]
pub struct Filter {
    #[serde(default)]
    pub state: String,
    #[serde(default)]
    pub name: String,
    #[serde(default)]
    pub template: String,
    #[serde(default)]
    pub cursor: String,
}

impl Filter {
    fn params(&self) -> ListParams {
        let some = |s: &str| (!s.trim().is_empty()).then(|| s.trim().to_string());
        ListParams {
            state: some(&self.state),
            // The page's name box searches: any job whose name contains the text.
            name: None,
            search: some(&self.name),
            user: None,
            template: some(&self.template),
            cursor: some(&self.cursor),
            limit: Some(PAGE_SIZE),
            id_prefix: None,
            rerun_of: None,
            all_tenants: None,
            tenant: None,
        }
    }

    /// What htmx polls to refresh this page's rows.
    fn rows_url(&self) -> String {
        format!("/jobs/rows?{}", self.query((!self.cursor.is_empty()).then_some(&self.cursor)))
    }

    /// The query string of this filter, with another cursor.
    fn query(&self, cursor: Option<&str>) -> String {
        let mut query = form_urlencoded::Serializer::new(String::new());
        for (key, value) in [("state", &self.state), ("name", &self.name), ("template", &self.template)] {
            if !value.is_empty() {
                query.append_pair(key, value);
            }
        }
        if let Some(cursor) = cursor {
            query.append_pair("cursor", cursor);
        }
        query.finish()
    }
}

#[derive(Template)]
#[template(path = "jobs.html")]
struct JobsPage {
    nav: Nav,
    filter: Filter,
    states: Vec<&'static str>,
    templates: Vec<String>,
    rows: Vec<JobRow>,
    rows_url: String,
    next_url: Option<String>,
    error: Option<String>,
}

#[derive(Template)]
#[template(path = "jobs_rows.html")]
struct JobsRows {
    rows: Vec<JobRow>,
    rows_url: String,
}

/// The rows of one page of the list, and the link to the next page.
async fn page_rows(state: &AppState, auth: &WebAuth, filter: &Filter) -> WebResult<(Vec<JobRow>, Option<String>)> {
    let store_filter = list_filter(filter.params())?;
    let page = state.app.jobs_list(&auth.caller, &store_filter).await?;
    let rows = page.items.iter().map(JobRow::of).collect();
    let next = page.next_cursor.map(|cursor| format!("/jobs?{}", filter.query(Some(&cursor))));
    Ok((rows, next))
}

pub async fn list(State(state): State<AppState>, auth: WebAuth, Query(filter): Query<Filter>) -> WebResult<Response> {
    let templates = state.app.templates_list(&auth.caller).await?.into_iter().map(|t| t.name).collect();
    let states = JobState::ALL.iter().map(|s| s.as_str()).collect();
    let rows_url = filter.rows_url();
    // A bad filter is shown on the page, next to the form, rather than as an error page.
    let (rows, next_url, error) = match page_rows(&state, &auth, &filter).await {
        Ok((rows, next)) => (rows, next, None),
        Err(super::WebError(
            err @ (trainyard_core::Error::InvalidInput { .. } | trainyard_core::Error::InvalidFields(_)),
        )) => (vec![], None, Some(err.to_string())),
        Err(err) => return Err(err),
    };
    let nav = Nav::new(&auth, "jobs");
    let mut response =
        render(&JobsPage { nav, filter, states, templates, rows, rows_url, next_url, error: error.clone() });
    if error.is_some() {
        *response.status_mut() = StatusCode::UNPROCESSABLE_ENTITY;
    }
    Ok(response)
}

pub async fn rows(State(state): State<AppState>, auth: WebAuth, Query(filter): Query<Filter>) -> WebResult<Response> {
    let (rows, _) = page_rows(&state, &auth, &filter).await?;
    let rows_url = filter.rows_url();
    Ok(render(&JobsRows { rows, rows_url }))
}

/// The parts of a job's page that change while it runs.
pub struct LiveView {
    pub url: String,
    pub state: &'static str,
    pub finished: bool,
    pub reason: String,
    pub cancel_requested: bool,
    /// Where the cancel form posts; only for people who may cancel a job still running.
    pub cancel_url: Option<String>,
    pub csrf: String,
    pub started: String,
    pub finished_at: String,
    pub events: Vec<EventRow>,
    pub attempts: Vec<AttemptRow>,
    pub schedule: Option<ScheduleView>,
}

pub struct EventRow {
    pub at: String,
    pub to: &'static str,
    pub actor: String,
    pub reason: String,
}

pub struct AttemptRow {
    pub attempt: i32,
    pub started: String,
    pub ended: String,
    pub exit_codes: String,
    pub reason: String,
    /// The image digests the replicas ran (cluster executors), one per line.
    pub images: Vec<String>,
}

pub struct ScheduleView {
    pub admitted_now: bool,
    pub reason: String,
    pub tenant_position: String,
    pub cluster_position: String,
    pub behind_higher_priority: usize,
    pub estimated_start: String,
    /// "cached on N of M nodes" for a job reading registered datasets; empty otherwise.
    pub cached_on: String,
    /// The jobs its estimate waits for, each as text and a link (its own tenant's jobs).
    pub waits_for: Vec<(String, Option<String>)>,
    /// What the estimates assume this job's run time is; empty when not known.
    pub runtime_assumed: String,
    /// A what-if's preemptions: "It would preempt 2 running jobs ..."; empty otherwise.
    pub preempts: String,
}

impl ScheduleView {
    pub fn of(schedule: &Schedule) -> ScheduleView {
        let position = |p: Option<usize>| p.map(|p| p.to_string()).unwrap_or_else(|| "—".into());
        ScheduleView {
            admitted_now: schedule.admitted_now,
            reason: schedule.reason.clone().unwrap_or_default(),
            tenant_position: position(schedule.tenant_position),
            cluster_position: position(schedule.cluster_position),
            behind_higher_priority: schedule.behind_higher_priority,
            estimated_start: schedule.estimated_start.as_ref().map(when).unwrap_or_else(|| "unknown".into()),
            cached_on: schedule.cached_on.map(|c| format!("Its data is {c}.")).unwrap_or_default(),
            waits_for: schedule
                .waits_for
                .iter()
                .map(|b| (b.to_string(), b.job.map(|id| format!("/jobs/{id}"))))
                .chain((schedule.waits_for_more > 0).then(|| (format!("and {} more", schedule.waits_for_more), None)))
                .collect(),
            runtime_assumed: schedule.runtime_assumed.clone().unwrap_or_default(),
            preempts: match schedule.would_preempt {
                0 => String::new(),
                1 => "It would preempt 1 running job and start once it has stopped.".into(),
                n => format!("It would preempt {n} running jobs and start once they have stopped."),
            },
        }
    }
}

fn event_row(event: &JobEvent) -> EventRow {
    EventRow {
        at: when(&event.at),
        to: event.to_state.as_str(),
        actor: event.actor.clone(),
        reason: event.reason.clone().unwrap_or_default(),
    }
}

fn attempt_row(attempt: &JobAttempt) -> AttemptRow {
    let codes: Vec<String> =
        attempt.exit_codes.iter().map(|c| c.map(|c| c.to_string()).unwrap_or_else(|| "—".into())).collect();
    AttemptRow {
        attempt: attempt.attempt,
        started: when(&attempt.started_at),
        ended: when_opt(attempt.ended_at.as_ref()),
        exit_codes: codes.join(", "),
        reason: attempt.reason.clone().unwrap_or_default(),
        images: attempt.image_digests.clone(),
    }
}

async fn live_view(state: &AppState, auth: &WebAuth, job: &Job) -> WebResult<LiveView> {
    let app = &state.app;
    let events = app.job_events(&auth.caller, job.id).await?;
    let attempts = app.job_attempts(&auth.caller, job.id).await?;
    let schedule = app.job_schedule(&auth.caller, job.id).await?;
    Ok(LiveView {
        url: format!("/jobs/{}/live", job.id),
        state: job.state.as_str(),
        finished: job.state.is_terminal(),
        reason: job.reason.clone().unwrap_or_default(),
        cancel_requested: job.cancel_requested_at.is_some() && !job.state.is_terminal(),
        cancel_url: (can_write(&auth.caller) && !job.state.is_terminal() && job.cancel_requested_at.is_none())
            .then(|| format!("/jobs/{}/cancel", job.id)),
        csrf: auth.csrf.clone(),
        started: when_opt(job.started_at.as_ref()),
        finished_at: when_opt(job.finished_at.as_ref()),
        events: events.iter().map(event_row).collect(),
        attempts: attempts.iter().rev().map(attempt_row).collect(),
        schedule: schedule.as_ref().map(ScheduleView::of),
    })
}

#[derive(Template)]
#[template(path = "job.html")]
struct JobPage {
    nav: Nav,
    id: Uuid,
    name: String,
    created: String,
    created_by: String,
    template: Option<trainyard_core::job::TemplateRef>,
    /// The code archive shipped with the job: its digest and its size in human units.
    code: Option<(String, String)>,
    params: Vec<(String, String)>,
    /// What the job's code logged through MLflow (`mlflow.log_param`), beside its parameters.
    logged_params: Vec<(String, String)>,
    datasets: Vec<String>,
    outputs: Vec<(String, String)>,
    artifacts: Vec<super::storage::ArtifactRow>,
    /// Its checkpoints: the folder as the job sees it, the files, why none can be listed.
    checkpoint_folder: Option<String>,
    checkpoints: Vec<super::storage::CheckpointRow>,
    checkpoint_note: Option<String>,
    /// The checkpoint it was fine-tuned from (`init_from`).
    init_from: Option<trainyard_core::api::CheckpointSource>,
    argv: String,
    resources: String,
    replicas: Vec<u32>,
    spec_json: String,
    can_write: bool,
    /// A notebook session not ended yet: the page offers to open it.
    notebook: bool,
    /// The submit form filled in with this job's parameters (a job from a template).
    rerun_url: Option<String>,
    /// What running it again exactly cannot pin (asked only of those who may run it again).
    unpinned: Vec<trainyard_core::rerun::UnpinnedInput>,
    /// The job this one runs again, to compare with, and what it accepted unpinned.
    rerun_of: Option<Uuid>,
    rerun_unpinned: Vec<String>,
    /// The latest attempt's run record, in brief.
    record: Option<super::records::RecordSummary>,
    live: LiveView,
}

#[derive(Template)]
#[template(path = "job_live.html")]
struct JobLive {
    live: LiveView,
}

async fn job_of(state: &AppState, auth: &WebAuth, id: &str) -> WebResult<Job> {
    let job_id = parse_id(id, ObjectKind::Job)?;
    Ok(state.app.job_get(&auth.caller, job_id).await?)
}

fn compact(value: &serde_json::Value) -> String {
    match value {
        serde_json::Value::String(s) => s.clone(),
        other => other.to_string(),
    }
}

pub async fn detail(
    State(state): State<AppState>,
    auth: WebAuth,
    Path(id): Path<String>,
    headers: axum::http::HeaderMap,
) -> WebResult<Response> {
    // A short id, as `yard` prints it: the page of the one job it names, at its whole id.
    if Uuid::parse_str(&id).is_err() && id.len() >= 6 && id.len() < 36 {
        let job = super::job_named(&state, &auth, &id, "id")
            .await?
            .ok_or(trainyard_core::Error::not_found(ObjectKind::Job))?;
        return Ok(axum::response::Redirect::to(&format!("/jobs/{job}")).into_response());
    }
    let job = job_of(&state, &auth, &id).await?;
    let live = live_view(&state, &auth, &job).await?;
    let outputs = state.app.job_outputs(&auth.caller, job.id).await?;
    let params = match &job.params {
        Some(serde_json::Value::Object(map)) => map.iter().map(|(k, v)| (k.clone(), compact(v))).collect(),
        _ => vec![],
    };
    let resources = &job.spec.resources;
    let can_write = can_write(&auth.caller);
    let unpinned = if can_write { rerun_unpinned(&state, &auth, job.id).await? } else { Vec::new() };
    let record = state.app.run_record_latest(&auth.caller, job.id).await?;
    let (checkpoint_folder, checkpoints, checkpoint_note) =
        super::storage::checkpoint_rows(&state.app, &auth, job.id).await?;
    let page = JobPage {
        nav: Nav::new(&auth, "jobs"),
        id: job.id,
        name: job.name.clone(),
        created: when(&job.created_at),
        created_by: job.created_by.clone(),
        template: job.spec.template.clone(),
        code: job.spec.code.as_ref().map(|c| (c.digest.clone(), human_memory(c.size_bytes))),
        params,
        logged_params: state.app.job_logged_params(&auth.caller, job.id).await?,
        datasets: job.datasets.iter().map(|d| format!("{}@{} ({})", d.name, d.version, d.content_hash)).collect(),
        outputs: outputs.iter().map(|(k, v)| (k.clone(), compact(v))).collect(),
        artifacts: super::storage::artifact_rows(&state.app, &auth, job.id).await?,
        checkpoint_folder,
        checkpoints,
        checkpoint_note,
        init_from: job.init_from,
        argv: job.spec.argv().join(" "),
        resources: format!(
            "{} × ({}, {} of memory, {})",
            job.spec.replicas,
            human_cpus(resources.cpu.millis()),
            human_memory(resources.memory.bytes()),
            human_gpus(u64::from(resources.gpus), resources.gpu_type.as_deref())
        ),
        replicas: (0..job.spec.replicas.min(64)).collect(),
        spec_json: serde_json::to_string_pretty(&job.spec).unwrap_or_default(),
        can_write,
        notebook: job.spec.template.as_ref().is_some_and(|t| t.name == crate::templates::NOTEBOOK_TEMPLATE)
            && !job.state.is_terminal(),
        rerun_url: job.spec.template.as_ref().map(|t| format!("/submit/{}?from={}", t.name, job.id)),
        unpinned,
        rerun_of: job.rerun_of,
        rerun_unpinned: job.rerun_unpinned.iter().map(ToString::to_string).collect(),
        record: record.as_ref().map(super::records::RecordSummary::of),
        live,
    };
    let mut response = render(&page);
    if page.notebook {
        // "Open notebook" posts here and is sent on to the session's own origin, which the
        // form-action of every other page refuses.
        let origin = crate::http::proxy::session_origin(&headers, job.id);
        let policy =
            crate::http::CONTENT_SECURITY_POLICY.replace("form-action 'self'", &format!("form-action 'self' {origin}"));
        if let Ok(value) = axum::http::HeaderValue::from_str(&policy) {
            response.headers_mut().insert(axum::http::header::CONTENT_SECURITY_POLICY, value);
        }
    }
    Ok(response)
}

/// What a rerun of the job could not pin, for the page to offer the choice before it is made.
/// A rerun that cannot be made at all (its template version or code is gone) lists nothing
/// here: the button then says why.
async fn rerun_unpinned(
    state: &AppState,
    auth: &WebAuth,
    job_id: Uuid,
) -> WebResult<Vec<trainyard_core::rerun::UnpinnedInput>> {
    match state.app.job_rerun_unpinned(&auth.caller, job_id).await {
        Ok(unpinned) => Ok(unpinned),
        Err(
            trainyard_core::Error::Conflict(_)
            | trainyard_core::Error::InvalidInput { .. }
            | trainyard_core::Error::InvalidFields(_),
        ) => Ok(Vec::new()),
        Err(other) => Err(other.into()),
    }
}

pub async fn live(State(state): State<AppState>, auth: WebAuth, Path(id): Path<String>) -> WebResult<Response> {
    let job = job_of(&state, &auth, &id).await?;
    let live = live_view(&state, &auth, &job).await?;
    let finished = live.finished;
    let mut response = render(&JobLive { live });
    if finished {
        // The last refresh: htmx stops polling on this status and still swaps the content.
        *response.status_mut() = StatusCode::from_u16(STOP_POLLING).unwrap_or(StatusCode::OK);
    }
    Ok(response)
}

#[derive(serde::Serialize)]
struct MetricsJson {
    finished: bool,
    series: Vec<trainyard_core::api::MetricSeries>,
}

pub async fn metrics(State(state): State<AppState>, auth: WebAuth, Path(id): Path<String>) -> WebResult<Response> {
    let job = job_of(&state, &auth, &id).await?;
    let metrics = state.app.metrics_get(&auth.caller, job.id, None).await?;
    let body = MetricsJson { finished: job.state.is_terminal(), series: metrics.series };
    Ok(([(header::CACHE_CONTROL, "no-store")], axum::Json(body)).into_response())
}

#[derive(Debug, Deserialize)]
pub struct LogQuery {
    #[serde(default)]
    replica: u32,
}

/// The whole log of a replica as text: the page's log without JavaScript.
pub async fn log_text(
    State(state): State<AppState>,
    auth: WebAuth,
    Path(id): Path<String>,
    Query(query): Query<LogQuery>,
) -> WebResult<Response> {
    let job_id = parse_id(&id, ObjectKind::Job)?;
    let request = LogRequest { job_id, replica: query.replica, attempt: None, follow: false };
    let stream = crate::app::logs::job_logs(&state.app, &auth.caller, request, state.shutdown.clone()).await?;
    Ok(([(header::CONTENT_TYPE, "text/plain; charset=utf-8")], axum::body::Body::from_stream(stream)).into_response())
}

/// A replica's log as server-sent events: one `line` event per line, from the start and then
/// as it is written, and an `end` event when the job has ended and everything was sent.
pub async fn log_stream(
    State(state): State<AppState>,
    auth: WebAuth,
    Path(id): Path<String>,
    Query(query): Query<LogQuery>,
) -> WebResult<Sse<impl Stream<Item = Result<Event, Infallible>>>> {
    let job_id = parse_id(&id, ObjectKind::Job)?;
    let request = LogRequest { job_id, replica: query.replica, attempt: None, follow: true };
    let chunks = crate::app::logs::job_logs(&state.app, &auth.caller, request, state.shutdown.clone()).await?;
    let lines = FramedRead::new(StreamReader::new(chunks), LinesCodec::new_with_max_length(MAX_LOG_LINE));
    let events = lines
        .filter_map(|line| async move {
            match line {
                Ok(line) => Some(Event::default().event("line").data(line.trim_end_matches('\r'))),
                // An over-long line is skipped with a note; the stream goes on.
                Err(tokio_util::codec::LinesCodecError::MaxLineLengthExceeded) => {
                    Some(Event::default().event("line").data(format!("[a line over {MAX_LOG_LINE} bytes was cut]")))
                }
                Err(err) => Some(Event::default().event("line").data(format!("[log read failed: {err}]"))),
            }
        })
        .map(Ok)
        .chain(futures::stream::once(async { Ok(Event::default().event("end").data("the job has ended")) }));
    Ok(Sse::new(events).keep_alive(KeepAlive::default()))
}

pub async fn cancel(
    State(state): State<AppState>,
    auth: WebAuth,
    Path(id): Path<String>,
    CsrfForm(_form): CsrfForm,
) -> WebResult<Response> {
    let job_id = parse_id(&id, ObjectKind::Job)?;
    state.app.job_cancel(&auth.caller, job_id).await?;
    Ok(Redirect::to(&format!("/jobs/{job_id}")).into_response())
}

/// "Open notebook": a one-time grant for the session, and on to the session's own host, where
/// the proxy exchanges it for the session's cookie (docs/sessions.md).
pub async fn notebook_open(
    State(state): State<AppState>,
    auth: WebAuth,
    Path(id): Path<String>,
    headers: axum::http::HeaderMap,
    CsrfForm(_form): CsrfForm,
) -> WebResult<Response> {
    let job_id = parse_id(&id, ObjectKind::Job)?;
    let grant = state.app.session_grant(&auth.caller, job_id).await?;
    Ok(Redirect::to(&crate::http::proxy::session_link(&headers, job_id, &grant.grant)).into_response())
}

/// Runs a job again exactly, as `yard rerun`: the template by digest, parameters, data, code.
/// What cannot be pinned is run as it is now only when the form says so (`accept_unpinned`);
/// otherwise the refusal names it.
pub async fn rerun(
    State(state): State<AppState>,
    auth: WebAuth,
    Path(id): Path<String>,
    CsrfForm(form): CsrfForm,
) -> WebResult<Response> {
    let job = job_of(&state, &auth, &id).await?;
    let accept_unpinned = form.get("accept_unpinned").is_some_and(|v| v == "true");
    let request = trainyard_core::api::RerunRequest { accept_unpinned, ..Default::default() };
    match state.app.job_rerun(&auth.caller, job.id, request).await? {
        crate::app::templates::RerunOutcome::Submitted(job) => {
            Ok(Redirect::to(&format!("/jobs/{}", job.id)).into_response())
        }
        crate::app::templates::RerunOutcome::WhatIf(_) => {
            Err(trainyard_core::Error::internal("a rerun from the page is never a what-if").into())
        }
    }
}
