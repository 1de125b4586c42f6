use axum::body::Body;
use axum::extract::State;
use axum::http::header;
use axum::response::{IntoResponse, Response};
use serde::Deserialize;
use trainyard_core::api::ErrorBody;
use utoipa::IntoParams;

use crate::app::logs::LogRequest;
use crate::http::AppState;
use crate::http::error::ApiResult;
use crate::http::extract::{ApiQuery, Auth, JobId};

#[derive(Debug, Deserialize, IntoParams)]
#[serde(deny_unknown_fields)]
#[into_params(parameter_in = Query)]
pub struct LogParams {
    /// Replica rank (default 0).
    replica: Option<u32>,
    /// Attempt number (default: the latest; with `follow`, each new attempt in turn).
    attempt: Option<i32>,
    /// Keep the response open and stream new output until the job ends.
    follow: Option<bool>,
}

/// A replica's stdout and stderr, as plain text. With `follow=true` the response streams new
/// output as it is written and ends when the job ends.
#[utoipa::path(get, path = "/api/v1/jobs/{id}/logs", tag = "jobs",
    params(("id" = String, Path, description = "Job id"), LogParams), security(("bearer" = [])),
    responses(
        (status = 200, description = "The log", content_type = "text/plain", body = String),
        (status = 404, body = ErrorBody),
        (status = 422, description = "No such replica or attempt", body = ErrorBody),
    ))]
pub async fn job_logs(
    State(state): State<AppState>,
    Auth(caller): Auth,
    JobId(job_id): JobId,
    ApiQuery(params): ApiQuery<LogParams>,
) -> ApiResult<Response> {
    let request = LogRequest {
        job_id,
        replica: params.replica.unwrap_or(0),
        attempt: params.attempt,
        follow: params.follow.unwrap_or(false),
    };
    let stream = crate::app::logs::job_logs(&state.app, &caller, request, state.shutdown.clone()).await?;
    Ok((
        [(header::CONTENT_TYPE, "text/plain; charset=utf-8"), (header::CACHE_CONTROL, "no-cache")],
        Body::from_stream(stream),
    )
        .into_response())
}
