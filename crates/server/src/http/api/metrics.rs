use axum::Json;
use axum::extract::State;
use serde::Deserialize;
use trainyard_core::api::{ErrorBody, JobMetrics, JobOutput, MetricBatch, MetricsAccepted};
use utoipa::IntoParams;

use crate::http::AppState;
use crate::http::error::ApiResult;
use crate::http::extract::{ApiJson, ApiQuery, Auth, JobAuth, JobId};

/// Report metric points. Only for a job's engine, with the job token it finds in
/// `TRAINYARD_TOKEN`; up to 50,000 points per request.
#[utoipa::path(post, path = "/api/v1/jobs/{id}/metrics", tag = "metrics",
    params(("id" = String, Path, description = "Job id")), request_body = MetricBatch, security(("job_token" = [])),
    responses(
        (status = 200, body = MetricsAccepted),
        (status = 401, description = "Not a live job token", body = ErrorBody),
        (status = 404, description = "Not this token's job", body = ErrorBody),
        (status = 422, body = ErrorBody),
    ))]
pub async fn metrics_post(
    State(state): State<AppState>,
    JobAuth(caller): JobAuth,
    JobId(job_id): JobId,
    ApiJson(batch): ApiJson<MetricBatch>,
) -> ApiResult<Json<MetricsAccepted>> {
    let accepted = state.app.metrics_post(&caller, job_id, batch).await?;
    Ok(Json(MetricsAccepted { accepted }))
}

#[derive(Debug, Deserialize, IntoParams)]
#[serde(deny_unknown_fields)]
#[into_params(parameter_in = Query)]
pub struct MetricsQuery {
    /// Only this series.
    name: Option<String>,
}

/// A job's metric series, columnar and ordered by step.
#[utoipa::path(get, path = "/api/v1/jobs/{id}/metrics", tag = "metrics",
    params(("id" = String, Path, description = "Job id"), MetricsQuery), security(("bearer" = [])),
    responses((status = 200, body = JobMetrics), (status = 404, body = ErrorBody)))]
pub async fn metrics_get(
    State(state): State<AppState>,
    Auth(caller): Auth,
    JobId(job_id): JobId,
    ApiQuery(query): ApiQuery<MetricsQuery>,
) -> ApiResult<Json<JobMetrics>> {
    Ok(Json(state.app.metrics_get(&caller, job_id, query.name.as_deref()).await?))
}

/// Record a named output of the job (replacing an earlier value). Only for the job's engine,
/// with its job token.
#[utoipa::path(post, path = "/api/v1/jobs/{id}/outputs", tag = "metrics",
    params(("id" = String, Path, description = "Job id")), request_body = JobOutput, security(("job_token" = [])),
    responses(
        (status = 204, description = "Recorded"),
        (status = 401, body = ErrorBody),
        (status = 404, body = ErrorBody),
        (status = 422, body = ErrorBody),
    ))]
pub async fn output_post(
    State(state): State<AppState>,
    JobAuth(caller): JobAuth,
    JobId(job_id): JobId,
    ApiJson(output): ApiJson<JobOutput>,
) -> ApiResult<axum::http::StatusCode> {
    state.app.job_output_set(&caller, job_id, output).await?;
    Ok(axum::http::StatusCode::NO_CONTENT)
}

/// What the job reported having produced, by name.
#[utoipa::path(get, path = "/api/v1/jobs/{id}/outputs", tag = "metrics",
    params(("id" = String, Path, description = "Job id")), security(("bearer" = [])),
    responses((status = 200, body = Object), (status = 404, body = ErrorBody)))]
pub async fn outputs_get(
    State(state): State<AppState>,
    Auth(caller): Auth,
    JobId(job_id): JobId,
) -> ApiResult<Json<std::collections::BTreeMap<String, serde_json::Value>>> {
    Ok(Json(state.app.job_outputs(&caller, job_id).await?))
}
