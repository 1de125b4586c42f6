//! Templates, and the submit form generated from a template's typed parameters. The browser
//! checks what HTML can (required, bounds, patterns); the server checks everything again through
//! the same operation as `POST /api/v1/templates/{name}/run` and puts its message next to the
//! field it names. A what-if preview says whether the job would start now.

use std::collections::BTreeMap;

use askama::Template;
use axum::extract::{Path, Query, State};
use axum::http::StatusCode;
use axum::response::{IntoResponse, Redirect, Response};
use serde::Deserialize;
use trainyard_core::Error;
use trainyard_core::api::{TemplateRun, TemplateSummary};
use trainyard_core::auth::Action;
use trainyard_core::error::ObjectKind;
use trainyard_store::jobs::Submitted;
use trainyard_templates::{ParamKind, ParamSpec};

use super::jobs::ScheduleView;
use super::{CsrfForm, Nav, WebAuth, WebResult, render};
use crate::app::{RunMode, TemplateRunOutcome};
use crate::http::AppState;
use crate::http::extract::parse_id;

/// Form fields of parameters are named `p.<parameter>`, apart from the job's own fields.
const PARAM_PREFIX: &str = "p.";

/// One input of the form.
pub struct Field {
    pub name: String,
    pub input: &'static str,
    pub kind: &'static str,
    pub value: String,
    pub required: bool,
    pub min: String,
    pub max: String,
    pub step: &'static str,
    pub pattern: String,
    pub choices: Vec<String>,
    pub help: String,
    pub error: Option<String>,
}

impl Field {
    fn of(name: &str, spec: &ParamSpec, value: Option<&serde_json::Value>) -> Field {
        let input = match spec.kind {
            ParamKind::Int | ParamKind::Float => "number",
            ParamKind::Bool => "checkbox",
            ParamKind::Enum => "select",
            ParamKind::List => "textarea",
            _ => "text",
        };
        let bound = |b: Option<f64>| match spec.kind {
            ParamKind::Int | ParamKind::Float => b.map(|b| b.to_string()).unwrap_or_default(),
            _ => String::new(),
        };
        Field {
            name: name.to_string(),
            input,
            kind: spec.kind.as_str(),
            value: value.or(spec.default.as_ref()).map(display_value).unwrap_or_default(),
            required: spec.required,
            min: bound(spec.min),
            max: bound(spec.max),
            step: if spec.kind == ParamKind::Int { "1" } else { "any" },
            // HTML patterns match the whole value, as ours do.
            pattern: if matches!(spec.kind, ParamKind::String | ParamKind::Path) {
                spec.pattern.clone().unwrap_or_default()
            } else {
                String::new()
            },
            choices: spec.choices.clone().unwrap_or_default(),
            help: spec.help.clone(),
            error: None,
        }
    }

    pub fn checked(&self) -> bool {
        self.value == "true"
    }
}

/// A value as a form shows it: a list one item per line.
fn display_value(value: &serde_json::Value) -> String {
    match value {
        serde_json::Value::Null => String::new(),
        serde_json::Value::String(s) => s.clone(),
        serde_json::Value::Array(items) => items
            .iter()
            .map(|item| item.as_str().map(str::to_string).unwrap_or_else(|| item.to_string()))
            .collect::<Vec<_>>()
            .join("\n"),
        other => other.to_string(),
    }
}

#[derive(Template)]
#[template(path = "submit.html")]
struct SubmitPage {
    nav: Nav,
    template: String,
    version: String,
    description: String,
    name: String,
    priority: String,
    max_restarts: String,
    idempotency_key: String,
    fields: Vec<Field>,
    datasets: Vec<String>,
    /// An error that names no field of the form (the template itself).
    error: Option<String>,
    /// Errors of the job-level fields, shown next to each.
    name_error: Option<String>,
    priority_error: Option<String>,
    max_restarts_error: Option<String>,
}

#[derive(Template)]
#[template(path = "submit_preview.html")]
struct PreviewFragment {
    schedule: Option<ScheduleView>,
    error: Option<String>,
}

#[derive(Debug, Default, Deserialize)]
pub struct FormQuery {
    /// Fill the form with this job's parameters (submit again).
    from: Option<String>,
}

async fn form_page(
    state: &AppState,
    auth: &WebAuth,
    template_name: &str,
    values: &serde_json::Map<String, serde_json::Value>,
) -> WebResult<SubmitPage> {
    auth.caller.authorize(Action::WriteJobs)?;
    let template = state.app.template_resolve(&auth.caller, template_name, None).await?;
    let fields =
        template.manifest.parameters.iter().map(|(name, spec)| Field::of(name, spec, values.get(name))).collect();
    let datasets =
        state.app.datasets_list(&auth.caller).await?.into_iter().map(|d| format!("{}@{}", d.name, d.version)).collect();
    Ok(SubmitPage {
        nav: Nav::new(auth, "submit"),
        template: template.name().to_string(),
        version: template.version().to_string(),
        description: template.manifest.description.clone(),
        name: String::new(),
        priority: "0".into(),
        max_restarts: "0".into(),
        idempotency_key: format!("web-{}", trainyard_store::sessions::random_hex()),
        fields,
        datasets,
        error: None,
        name_error: None,
        priority_error: None,
        max_restarts_error: None,
    })
}

pub async fn form(
    State(state): State<AppState>,
    auth: WebAuth,
    Path(template): Path<String>,
    Query(query): Query<FormQuery>,
) -> WebResult<Response> {
    let mut values = serde_json::Map::new();
    let mut name = None;
    if let Some(from) = query.from.as_deref() {
        let job = state.app.job_get(&auth.caller, parse_id(from, ObjectKind::Job)?).await?;
        if let Some(serde_json::Value::Object(params)) = job.params {
            values = params;
        }
        name = Some(job.name);
    }
    let mut page = form_page(&state, &auth, &template, &values).await?;
    if let Some(name) = name {
        page.name = name;
    }
    Ok(render(&page))
}

/// The run a posted form asks for. Values stay strings (the server coerces and checks them);
/// a list is one item per line; an empty optional field takes the template's default.
fn run_of(form: &BTreeMap<String, String>, kinds: &BTreeMap<String, ParamKind>) -> TemplateRun {
    let mut params = serde_json::Map::new();
    for (key, value) in form {
        let Some(param) = key.strip_prefix(PARAM_PREFIX) else { continue };
        let value = value.trim();
        let json = match kinds.get(param) {
            Some(ParamKind::List) => serde_json::Value::Array(
                value.lines().map(str::trim).filter(|l| !l.is_empty()).map(|l| l.to_string().into()).collect(),
            ),
            _ if value.is_empty() => continue,
            _ => serde_json::Value::String(value.to_string()),
        };
        params.insert(param.to_string(), json);
    }
    let text = |key: &str| form.get(key).map(|v| v.trim().to_string()).filter(|v| !v.is_empty());
    TemplateRun {
        version: text("version"),
        params,
        name: text("name"),
        priority: 0,
        max_restarts: 0,
        idempotency_key: text("idempotency_key"),
        cache_wait_seconds: None,
        spare: false,
    }
}

/// Runs a posted form (its CSRF value checked by [`CsrfForm`]) as far as `mode` says. The outer error is for an
/// error page; the inner one (bad input) goes back to the form.
async fn run_posted(
    state: &AppState,
    auth: &WebAuth,
    template: &str,
    form: &BTreeMap<String, String>,
    mode: RunMode,
) -> WebResult<Result<TemplateRunOutcome, Error>> {
    Ok(match posted_run(state, auth, template, form).await? {
        Ok(run) => state.app.template_run(&auth.caller, template, run, mode).await,
        Err(err) => Err(err),
    })
}

/// Parses the posted form against the template's parameters; a bad priority names its field.
async fn posted_run(
    state: &AppState,
    auth: &WebAuth,
    template: &str,
    form: &BTreeMap<String, String>,
) -> WebResult<Result<TemplateRun, Error>> {
    let resolved = state.app.template_resolve(&auth.caller, template, None).await?;
    let kinds = resolved.manifest.parameters.iter().map(|(name, spec)| (name.clone(), spec.kind)).collect();
    let mut run = run_of(form, &kinds);
    let priority = form.get("priority").map(|p| p.trim()).unwrap_or("0");
    match priority.parse::<i32>() {
        Ok(priority) => run.priority = priority,
        Err(_) => return Ok(Err(Error::invalid("priority", "must be a whole number"))),
    }
    let restarts = form.get("max_restarts").map(|p| p.trim()).filter(|p| !p.is_empty()).unwrap_or("0");
    match restarts.parse::<u32>() {
        Ok(restarts) => run.max_restarts = restarts,
        Err(_) => return Ok(Err(Error::invalid("max_restarts", "must be a whole number, 0 or more"))),
    }
    Ok(Ok(run))
}

pub async fn submit(
    State(state): State<AppState>,
    auth: WebAuth,
    Path(template): Path<String>,
    CsrfForm(form): CsrfForm,
) -> WebResult<Response> {
    match run_posted(&state, &auth, &template, &form, RunMode::Submit).await? {
        Ok(TemplateRunOutcome::Submitted(submitted)) => {
            let job = match *submitted {
                Submitted::Created(job) | Submitted::Replayed(job) => job,
            };
            Ok(Redirect::to(&format!("/jobs/{}", job.id)).into_response())
        }
        Ok(_) => Err(Error::internal("a submit did not submit").into()),
        Err(err @ (Error::InvalidInput { .. } | Error::InvalidFields(_))) => {
            // The form again, as posted, with the server's message next to each field, and
            // every problem listed at the top when there are several.
            let problems = err.field_problems();
            let posted = run_of(&form, &BTreeMap::new());
            let mut page = form_page(&state, &auth, &template, &posted.params).await?;
            page.name = form.get("name").cloned().unwrap_or_default();
            page.priority = form.get("priority").cloned().unwrap_or_default();
            page.max_restarts = form.get("max_restarts").cloned().unwrap_or_default();
            page.idempotency_key = form.get("idempotency_key").cloned().unwrap_or_default();
            let mut unplaced = Vec::new();
            for trainyard_core::error::FieldProblem { field, message } in &problems {
                let param = field.strip_prefix("params.").map(|p| p.split(['.', '[']).next().unwrap_or(p));
                match (param.and_then(|p| page.fields.iter_mut().find(|f| f.name == p)), field.as_str()) {
                    (Some(input), _) => input.error = Some(message.clone()),
                    (None, "name") => page.name_error = Some(message.clone()),
                    (None, "priority") => page.priority_error = Some(message.clone()),
                    (None, "max_restarts") => page.max_restarts_error = Some(message.clone()),
                    (None, _) => unplaced.push(format!("{field}: {message}")),
                }
            }
            if problems.len() > 1 {
                page.error = Some(format!("{} problems: {err}", problems.len()));
            } else if !unplaced.is_empty() {
                page.error = Some(unplaced.join("; "));
            }
            let mut response = render(&page);
            *response.status_mut() = StatusCode::UNPROCESSABLE_ENTITY;
            Ok(response)
        }
        Err(err) => Err(err.into()),
    }
}

pub async fn preview(
    State(state): State<AppState>,
    auth: WebAuth,
    Path(template): Path<String>,
    CsrfForm(form): CsrfForm,
) -> WebResult<Response> {
    let fragment = match run_posted(&state, &auth, &template, &form, RunMode::WhatIf).await? {
        Ok(TemplateRunOutcome::WhatIf(schedule)) => {
            PreviewFragment { schedule: Some(ScheduleView::of(&schedule)), error: None }
        }
        Ok(_) => return Err(Error::internal("a what-if did not answer with a schedule").into()),
        Err(err @ (Error::InvalidInput { .. } | Error::InvalidFields(_))) => {
            PreviewFragment { schedule: None, error: Some(err.to_string()) }
        }
        Err(err) => return Err(err.into()),
    };
    Ok(render(&fragment))
}

#[derive(Template)]
#[template(path = "templates.html")]
struct TemplatesPage {
    nav: Nav,
    templates: Vec<TemplateSummary>,
    choosing: bool,
}

pub async fn choose(State(state): State<AppState>, auth: WebAuth) -> WebResult<Response> {
    auth.caller.authorize(Action::WriteJobs)?;
    let templates = state.app.templates_list(&auth.caller).await?;
    Ok(render(&TemplatesPage { nav: Nav::new(&auth, "submit"), templates, choosing: true }))
}

pub async fn templates(State(state): State<AppState>, auth: WebAuth) -> WebResult<Response> {
    let templates = state.app.templates_list(&auth.caller).await?;
    Ok(render(&TemplatesPage { nav: Nav::new(&auth, "templates"), templates, choosing: false }))
}

pub struct ParamRow {
    pub name: String,
    pub kind: &'static str,
    pub required: bool,
    pub default: String,
    pub bounds: String,
    pub help: String,
}

#[derive(Template)]
#[template(path = "template.html")]
struct TemplatePage {
    nav: Nav,
    name: String,
    version: String,
    source: String,
    digest: String,
    description: String,
    versions: Vec<String>,
    files: Vec<String>,
    params: Vec<ParamRow>,
}

#[derive(Debug, Default, Deserialize)]
pub struct VersionQuery {
    version: Option<String>,
}

pub async fn template(
    State(state): State<AppState>,
    auth: WebAuth,
    Path(name): Path<String>,
    Query(query): Query<VersionQuery>,
) -> WebResult<Response> {
    let detail = state.app.template_show(&auth.caller, &name, query.version.as_deref()).await?;
    let template = state.app.template_resolve(&auth.caller, &name, Some(detail.version.as_str())).await?;
    let params = template
        .manifest
        .parameters
        .iter()
        .map(|(name, spec)| {
            let mut bounds = Vec::new();
            if let Some(min) = spec.min {
                bounds.push(format!("min {min}"));
            }
            if let Some(max) = spec.max {
                bounds.push(format!("max {max}"));
            }
            if let Some(pattern) = &spec.pattern {
                bounds.push(format!("matches {pattern}"));
            }
            if let Some(choices) = &spec.choices {
                bounds.push(format!("one of {}", choices.join(", ")));
            }
            ParamRow {
                name: name.clone(),
                kind: spec.kind.as_str(),
                required: spec.required,
                default: spec.default.as_ref().map(display_value).unwrap_or_default(),
                bounds: bounds.join("; "),
                help: spec.help.clone(),
            }
        })
        .collect();
    let source =
        serde_json::to_value(detail.source).ok().and_then(|v| v.as_str().map(str::to_string)).unwrap_or_default();
    Ok(render(&TemplatePage {
        nav: Nav::new(&auth, "templates"),
        name: detail.name,
        version: detail.version,
        source,
        digest: detail.digest,
        description: template.manifest.description.clone(),
        versions: detail.versions,
        files: detail.files,
        params,
    }))
}
