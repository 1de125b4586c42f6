use axum::Json;
use axum::extract::{Path, State};
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use serde::Deserialize;
use trainyard_core::api::{DryRun, ErrorBody, Job, TemplateDetail, TemplateRun, TemplateSummary, TemplateUpload};
use trainyard_store::jobs::Submitted;
use trainyard_store::templates::Published;
use utoipa::IntoParams;

use crate::app::{RunMode, TemplateRunOutcome};
use crate::http::AppState;
use crate::http::error::ApiResult;
use crate::http::extract::{ApiJson, ApiQuery, Auth};

/// Built-in templates and the tenant's own, with their versions.
#[utoipa::path(get, path = "/api/v1/templates", tag = "templates", security(("bearer" = [])),
    responses((status = 200, body = Vec<TemplateSummary>), (status = 401, body = ErrorBody)))]
pub async fn templates_list(
    State(state): State<AppState>,
    Auth(caller): Auth,
) -> ApiResult<Json<Vec<TemplateSummary>>> {
    Ok(Json(state.app.templates_list(&caller).await?))
}

#[derive(Debug, Deserialize, IntoParams)]
#[serde(deny_unknown_fields)]
#[into_params(parameter_in = Query)]
pub struct VersionParam {
    /// A version; the newest when absent.
    version: Option<String>,
}

/// One template version: manifest, parameters, files, digest.
#[utoipa::path(get, path = "/api/v1/templates/{name}", tag = "templates",
    params(("name" = String, Path, description = "Template name"), VersionParam), security(("bearer" = [])),
    responses((status = 200, body = TemplateDetail), (status = 404, body = ErrorBody), (status = 422, body = ErrorBody)))]
pub async fn template_show(
    State(state): State<AppState>,
    Auth(caller): Auth,
    Path(name): Path<String>,
    ApiQuery(query): ApiQuery<VersionParam>,
) -> ApiResult<Json<TemplateDetail>> {
    Ok(Json(state.app.template_show(&caller, &name, query.version.as_deref()).await?))
}

/// Publish a template version for your tenant. The bundle is checked completely first; a
/// published (name, version) never changes: the same content again is a no-op (200), other
/// content is refused (409).
#[utoipa::path(post, path = "/api/v1/templates", tag = "templates", request_body = TemplateUpload, security(("bearer" = [])),
    responses(
        (status = 201, description = "Published", body = TemplateDetail),
        (status = 200, description = "This exact version was published before", body = TemplateDetail),
        (status = 409, description = "The version exists with other content, or the name is a built-in's", body = ErrorBody),
        (status = 422, description = "The bundle breaks a rule; `field` names it, the message names the file", body = ErrorBody),
    ))]
pub async fn template_publish(
    State(state): State<AppState>,
    Auth(caller): Auth,
    ApiJson(upload): ApiJson<TemplateUpload>,
) -> ApiResult<(StatusCode, Json<TemplateDetail>)> {
    let (detail, published) = state.app.template_publish(&caller, upload).await?;
    let status = if published == Published::Created { StatusCode::CREATED } else { StatusCode::OK };
    Ok((status, Json(detail)))
}

#[derive(Debug, Deserialize, IntoParams)]
#[serde(deny_unknown_fields)]
#[into_params(parameter_in = Query)]
pub struct DryRunParam {
    /// Render and check everything, return the exact spec, queue nothing.
    dry_run: Option<bool>,
    /// Render and check everything, say whether it would start now or when; queue nothing.
    what_if: Option<bool>,
}

/// Submit a job from a template (or, with `dry_run=true`, see exactly what would run).
#[utoipa::path(post, path = "/api/v1/templates/{name}/jobs", tag = "templates",
    params(("name" = String, Path, description = "Template name"), DryRunParam),
    request_body = TemplateRun, security(("bearer" = [])),
    responses(
        (status = 201, description = "Queued", body = Job),
        (status = 200, description = "Dry run: the resolved spec; or a replayed idempotency key: the earlier job", body = DryRun),
        (status = 404, body = ErrorBody),
        (status = 422, description = "A parameter is unknown, missing, of the wrong type or out of bounds; `field` is `params.<name>`", body = ErrorBody),
    ))]
pub async fn template_run(
    State(state): State<AppState>,
    Auth(caller): Auth,
    Path(name): Path<String>,
    ApiQuery(query): ApiQuery<DryRunParam>,
    ApiJson(run): ApiJson<TemplateRun>,
) -> ApiResult<Response> {
    let mode = match (query.dry_run.unwrap_or(false), query.what_if.unwrap_or(false)) {
        (true, true) => {
            return Err(trainyard_core::Error::invalid("what_if", "ask for dry_run or what_if, not both").into());
        }
        (true, false) => RunMode::DryRun,
        (false, true) => RunMode::WhatIf,
        (false, false) => RunMode::Submit,
    };
    Ok(match state.app.template_run(&caller, &name, run, mode).await? {
        TemplateRunOutcome::DryRun(dry) => (StatusCode::OK, Json(*dry)).into_response(),
        TemplateRunOutcome::WhatIf(schedule) => (StatusCode::OK, Json(schedule)).into_response(),
        TemplateRunOutcome::Submitted(submitted) => match *submitted {
            Submitted::Created(job) => (StatusCode::CREATED, Json(job)).into_response(),
            Submitted::Replayed(job) => (StatusCode::OK, Json(job)).into_response(),
        },
    })
}
