use axum::Json;
use axum::extract::State;
use axum::http::StatusCode;
use trainyard_core::api::ErrorBody;
use trainyard_core::record::{EngineRecord, JobRunRecords};

use crate::http::AppState;
use crate::http::error::ApiResult;
use crate::http::extract::{ApiJson, Auth, JobAuth, JobId};

/// Complete the run record of the token's attempt with what only the engine knows: its
/// environment (every installed package), hardware and drivers, seeds, data and shard
/// assignment. Only for a job's engine, with its job token; once per attempt (a record never
/// changes: a second post is 409). At most 1 MiB of JSON.
#[utoipa::path(post, path = "/api/v1/jobs/{id}/record", tag = "jobs",
    params(("id" = String, Path, description = "Job id")), request_body = EngineRecord, security(("job_token" = [])),
    responses(
        (status = 204, description = "Recorded"),
        (status = 401, description = "Not a live job token", body = ErrorBody),
        (status = 404, description = "Not this token's job", body = ErrorBody),
        (status = 409, description = "This attempt's record is complete already", body = ErrorBody),
        (status = 422, body = ErrorBody),
    ))]
pub async fn record_post(
    State(state): State<AppState>,
    JobAuth(caller): JobAuth,
    JobId(job_id): JobId,
    ApiJson(engine): ApiJson<EngineRecord>,
) -> ApiResult<StatusCode> {
    state.app.run_record_post(&caller, job_id, engine).await?;
    Ok(StatusCode::NO_CONTENT)
}

/// A job's run records, one per attempt: template and its files, parameters, spec and its hash,
/// code, datasets, image, Trainyard's version (written when the attempt began) and, once its
/// engine posted them, environment, hardware, seeds and data; each with a `record_hash` to
/// compare two runs at a glance.
#[utoipa::path(get, path = "/api/v1/jobs/{id}/record", tag = "jobs", params(("id" = String, Path, description = "Job id")),
    security(("bearer" = [])),
    responses((status = 200, body = JobRunRecords), (status = 404, body = ErrorBody)))]
pub async fn record_get(
    State(state): State<AppState>,
    Auth(caller): Auth,
    JobId(job_id): JobId,
) -> ApiResult<Json<JobRunRecords>> {
    Ok(Json(state.app.run_records(&caller, job_id).await?))
}
