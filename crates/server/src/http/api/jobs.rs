use axum::Json;
use axum::extract::State;
use axum::http::StatusCode;
use serde::Deserialize;
use trainyard_core::api::{ErrorBody, Job, JobAttempt, JobEvent, JobPage, RerunRequest};
use trainyard_core::job::{JobState, JobSubmission};
use trainyard_core::{Error, Result};
use trainyard_store::jobs::{JobFilter, Submitted};
use utoipa::IntoParams;

use crate::app::templates::RerunOutcome;
use crate::http::AppState;
use crate::http::error::ApiResult;
use crate::http::extract::{ApiJson, ApiQuery, Auth, JobId};

/// Submit a job. With an `idempotency_key` used before, returns the earlier job (200).
#[utoipa::path(post, path = "/api/v1/jobs", tag = "jobs", request_body = JobSubmission,
    security(("bearer" = [])),
    responses(
        (status = 201, description = "Queued", body = Job),
        (status = 200, description = "Same idempotency key and request as before: the earlier job", body = Job),
        (status = 400, description = "The body is not JSON", body = ErrorBody),
        (status = 401, description = "No valid token", body = ErrorBody),
        (status = 403, description = "Your role may not submit", body = ErrorBody),
        (status = 409, description = "Idempotency key reused for a different request", body = ErrorBody),
        (status = 413, description = "Body over 2 MiB", body = ErrorBody),
        (status = 422, description = "A field is wrong; `field` names it", body = ErrorBody),
    ))]
pub async fn job_submit(
    State(state): State<AppState>,
    Auth(caller): Auth,
    ApiJson(submission): ApiJson<JobSubmission>,
) -> ApiResult<(StatusCode, Json<Job>)> {
    Ok(match state.app.job_submit(&caller, submission).await? {
        Submitted::Created(job) => (StatusCode::CREATED, Json(job)),
        Submitted::Replayed(job) => (StatusCode::OK, Json(job)),
    })
}

#[derive(Debug, Default, Clone, Deserialize, IntoParams)]
#[serde(deny_unknown_fields)]
#[into_params(parameter_in = Query)]
pub struct ListParams {
    /// Only jobs in this state.
    #[param(value_type = Option<String>)]
    pub state: Option<String>,
    /// Only jobs with exactly this name.
    pub name: Option<String>,
    /// Only jobs from this template.
    pub template: Option<String>,
    /// Only jobs submitted by this user.
    pub user: Option<String>,
    /// Only jobs whose name contains this text (ignoring case).
    pub search: Option<String>,
    /// The `next_cursor` of the previous page.
    pub cursor: Option<String>,
    /// Page size, 1 to 500 (default 50).
    pub limit: Option<u32>,
    /// Only jobs whose id starts with these hex digits (at least 6; dashes ignored): what a
    /// short id such as `01a20b11` stands for.
    pub id_prefix: Option<String>,
    /// Only the jobs that run this job again (`yard rerun`).
    pub rerun_of: Option<String>,
    /// Every tenant's jobs, not only the caller's tenant's (platform admins; 403 for others).
    pub all_tenants: Option<bool>,
    /// Only this tenant's jobs, by name (platform admins; implies `all_tenants`; 404 for no such tenant).
    pub tenant: Option<String>,
}

/// List the tenant's jobs, newest first; with `all_tenants` or `tenant`, every tenant's or one
/// tenant's (platform admins), each job naming its tenant.
#[utoipa::path(get, path = "/api/v1/jobs", tag = "jobs", params(ListParams), security(("bearer" = [])),
    responses(
        (status = 200, body = JobPage),
        (status = 401, body = ErrorBody),
        (status = 403, description = "`all_tenants` or `tenant` from someone not a platform admin", body = ErrorBody),
        (status = 404, description = "No tenant of that name", body = ErrorBody),
        (status = 422, description = "A bad filter or cursor", body = ErrorBody),
    ))]
pub async fn jobs_list(
    State(state): State<AppState>,
    Auth(caller): Auth,
    ApiQuery(params): ApiQuery<ListParams>,
) -> ApiResult<Json<JobPage>> {
    let every_tenant = params.all_tenants.unwrap_or(false) || params.tenant.is_some();
    let tenant = params.tenant.clone();
    let filter = list_filter(params)?;
    Ok(Json(if every_tenant {
        state.app.jobs_list_every_tenant(&caller, tenant.as_deref(), &filter).await?
    } else {
        state.app.jobs_list(&caller, &filter).await?
    }))
}

/// The store filter for list parameters, naming the parameter that is wrong.
pub fn list_filter(params: ListParams) -> Result<JobFilter> {
    let state = params
        .state
        .map(|s| {
            JobState::parse(&s).ok_or_else(|| {
                let known: Vec<&str> = JobState::ALL.iter().map(|s| s.as_str()).collect();
                Error::invalid("state", format!("unknown state {s:?}; one of {}", known.join(", ")))
            })
        })
        .transpose()?;
    let before = params
        .cursor
        .map(|c| uuid::Uuid::parse_str(&c).map_err(|_| Error::invalid("cursor", "not a cursor from a previous page")))
        .transpose()?;
    let limit = params.limit.unwrap_or(50);
    if !(1..=trainyard_store::jobs::MAX_PAGE).contains(&limit) {
        return Err(Error::invalid("limit", format!("must be between 1 and {}", trainyard_store::jobs::MAX_PAGE)));
    }
    let id_range = params.id_prefix.as_deref().map(id_range_of).transpose()?;
    let rerun_of = params
        .rerun_of
        .map(|id| uuid::Uuid::parse_str(&id).map_err(|_| Error::invalid("rerun_of", "not a job id")))
        .transpose()?;
    Ok(JobFilter {
        state,
        name: params.name,
        template: params.template,
        before,
        id_range,
        user: params.user,
        name_contains: params.search.filter(|s| !s.is_empty()),
        rerun_of,
        limit,
    })
}

/// The ids a prefix stands for: from the prefix padded with `0` to it padded with `f`, so that the
/// lookup walks the primary key's index rather than every id as text.
pub fn id_range_of(prefix: &str) -> Result<(uuid::Uuid, uuid::Uuid)> {
    trainyard_core::names::job_id_range(prefix)
        .ok_or_else(|| Error::invalid("id_prefix", "6 to 32 hex digits of a job id (dashes allowed)"))
}

/// One job.
#[utoipa::path(get, path = "/api/v1/jobs/{id}", tag = "jobs", params(("id" = String, Path, description = "Job id")),
    security(("bearer" = [])),
    responses((status = 200, body = Job), (status = 404, body = ErrorBody)))]
pub async fn job_get(State(state): State<AppState>, Auth(caller): Auth, JobId(id): JobId) -> ApiResult<Json<Job>> {
    Ok(Json(state.app.job_get(&caller, id).await?))
}

/// Cancel a job. Its processes get SIGTERM, then SIGKILL after a grace period; the job ends
/// `cancelled`. Cancelling a cancelled job is harmless.
#[utoipa::path(post, path = "/api/v1/jobs/{id}/cancel", tag = "jobs", params(("id" = String, Path, description = "Job id")),
    security(("bearer" = [])),
    responses(
        (status = 200, description = "Cancelled, or being stopped (`cancel_requested_at` set)", body = Job),
        (status = 403, body = ErrorBody),
        (status = 404, body = ErrorBody),
        (status = 409, description = "The job had already finished", body = ErrorBody),
    ))]
pub async fn job_cancel(State(state): State<AppState>, Auth(caller): Auth, JobId(id): JobId) -> ApiResult<Json<Job>> {
    Ok(Json(state.app.job_cancel(&caller, id).await?))
}

/// Every state change of a job, oldest first, with who or what caused it and why.
#[utoipa::path(get, path = "/api/v1/jobs/{id}/events", tag = "jobs", params(("id" = String, Path, description = "Job id")),
    security(("bearer" = [])),
    responses((status = 200, body = Vec<JobEvent>), (status = 404, body = ErrorBody)))]
pub async fn job_events(
    State(state): State<AppState>,
    Auth(caller): Auth,
    JobId(id): JobId,
) -> ApiResult<Json<Vec<JobEvent>>> {
    Ok(Json(state.app.job_events(&caller, id).await?))
}

/// Every launch of a job: placement, exit codes per replica, reason, start and end.
#[utoipa::path(get, path = "/api/v1/jobs/{id}/attempts", tag = "jobs", params(("id" = String, Path, description = "Job id")),
    security(("bearer" = [])),
    responses((status = 200, body = Vec<JobAttempt>), (status = 404, body = ErrorBody)))]
pub async fn job_attempts(
    State(state): State<AppState>,
    Auth(caller): Auth,
    JobId(id): JobId,
) -> ApiResult<Json<Vec<JobAttempt>>> {
    Ok(Json(state.app.job_attempts(&caller, id).await?))
}

/// Upload code to run jobs with: a tar archive (plain files and folders, at most 32 MiB), stored
/// under its SHA-256. Name it in a submit's `code`; `yard submit` packs and uploads the folder it
/// runs in.
#[utoipa::path(put, path = "/api/v1/code/{digest}", tag = "jobs",
    params(("digest" = String, Path, description = "sha256: and the archive's SHA-256 in hex")),
    request_body(content = Vec<u8>, content_type = "application/octet-stream", description = "The tar archive"),
    security(("bearer" = [])),
    responses(
        (status = 201, description = "Stored", body = trainyard_core::api::CodeUploaded),
        (status = 200, description = "The tenant had it already", body = trainyard_core::api::CodeUploaded),
        (status = 401, body = ErrorBody),
        (status = 403, body = ErrorBody),
        (status = 413, description = "Over 32 MiB", body = ErrorBody),
        (status = 422, description = "Not the digest of these bytes, or not an archive of plain files", body = ErrorBody),
    ))]
pub async fn code_upload(
    State(state): State<AppState>,
    Auth(caller): Auth,
    axum::extract::Path(digest): axum::extract::Path<String>,
    body: axum::body::Body,
) -> ApiResult<(StatusCode, Json<trainyard_core::api::CodeUploaded>)> {
    // Read here rather than by an extractor, so that an archive over the limit gets the API's
    // own JSON error.
    let max = crate::code::MAX_CODE_BYTES;
    let body = axum::body::to_bytes(body, max).await.map_err(|_| {
        crate::http::error::ApiError::PayloadTooLarge(format!("the archive is over the limit of {} MiB", max >> 20))
    })?;
    let uploaded = state.app.code_upload(&caller, &digest, body).await?;
    let status = if uploaded.created { StatusCode::CREATED } else { StatusCode::OK };
    Ok((status, Json(uploaded)))
}

/// Run a job again: the template it ran (by digest), its parameters with `set` changed, its
/// dataset versions and code archive. The new job's `rerun_of` names this one. What cannot be
/// pinned (a `path` parameter naming a file or folder on the machine, an image tag) is refused
/// with 409 naming each, unless `accept_unpinned`; the new job's `rerun_unpinned` then lists
/// them. With `what_if`, says when it would start instead.
#[utoipa::path(post, path = "/api/v1/jobs/{id}/rerun", tag = "jobs", params(("id" = String, Path, description = "Job id")),
    request_body = RerunRequest, security(("bearer" = [])),
    responses(
        (status = 201, description = "The new job", body = Job),
        (status = 200, description = "`what_if`: when it would start", body = trainyard_core::api::Schedule),
        (status = 403, body = ErrorBody),
        (status = 404, body = ErrorBody),
        (status = 409, description = "What it ran is no longer available (template version, code archive), or cannot be pinned and `accept_unpinned` was not given (each input named)", body = ErrorBody),
        (status = 422, body = ErrorBody),
    ))]
pub async fn job_rerun(
    State(state): State<AppState>,
    Auth(caller): Auth,
    JobId(id): JobId,
    ApiJson(request): ApiJson<RerunRequest>,
) -> ApiResult<axum::response::Response> {
    use axum::response::IntoResponse;
    Ok(match state.app.job_rerun(&caller, id, request).await? {
        RerunOutcome::Submitted(job) => (StatusCode::CREATED, Json(*job)).into_response(),
        RerunOutcome::WhatIf(schedule) => (StatusCode::OK, Json(schedule)).into_response(),
    })
}
