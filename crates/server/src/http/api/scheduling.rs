use axum::Json;
use axum::extract::{Path, State};
use axum::http::StatusCode;
use trainyard_core::api::{ErrorBody, QuotaReport, QuotaSet, QuotaSetResult, Schedule, TenantPolicyUpdate};
use trainyard_core::job::JobSubmission;

use crate::http::AppState;
use crate::http::error::ApiResult;
use crate::http::extract::{ApiJson, Auth, JobId};

/// The waiting jobs you may see (your tenant's; all for platform admins), in the order the
/// scheduler considers them, with reasons, positions and estimated starts.
#[utoipa::path(get, path = "/api/v1/queue", tag = "scheduling", security(("bearer" = [])),
    responses((status = 200, body = trainyard_core::api::Queue), (status = 401, body = ErrorBody)))]
pub async fn queue_get(
    State(state): State<AppState>,
    Auth(caller): Auth,
) -> ApiResult<Json<trainyard_core::api::Queue>> {
    Ok(Json(state.app.queue(&caller).await?))
}

/// Every node the scheduler places on: capacity, what unfinished jobs hold of it, what is free.
#[utoipa::path(get, path = "/api/v1/nodes", tag = "scheduling", security(("bearer" = [])),
    responses((status = 200, body = trainyard_core::api::Nodes), (status = 401, body = ErrorBody)))]
pub async fn nodes_get(
    State(state): State<AppState>,
    Auth(caller): Auth,
) -> ApiResult<Json<trainyard_core::api::Nodes>> {
    Ok(Json(state.app.nodes_usage(&caller).await?))
}

/// Your tenant's quotas and usage per GPU type: nominal, used, borrowed, lent.
#[utoipa::path(get, path = "/api/v1/quota", tag = "scheduling", security(("bearer" = [])),
    responses((status = 200, body = QuotaReport), (status = 401, body = ErrorBody)))]
pub async fn quota_get(State(state): State<AppState>, Auth(caller): Auth) -> ApiResult<Json<QuotaReport>> {
    Ok(Json(state.app.quota_report(&caller).await?))
}

/// Set a tenant's quota for one GPU type (platform admins).
#[utoipa::path(put, path = "/api/v1/admin/tenants/{tenant}/quotas/{flavor}", tag = "scheduling",
    params(("tenant" = String, Path, description = "Tenant name"), ("flavor" = String, Path, description = "GPU type")),
    request_body = QuotaSet, security(("bearer" = [])),
    responses((status = 200, description = "Set; warnings name what may not work as meant", body = QuotaSetResult), (status = 403, body = ErrorBody), (status = 404, body = ErrorBody), (status = 422, body = ErrorBody)))]
pub async fn quota_put(
    State(state): State<AppState>,
    Auth(caller): Auth,
    Path((tenant, flavor)): Path<(String, String)>,
    ApiJson(quota): ApiJson<QuotaSet>,
) -> ApiResult<Json<QuotaSetResult>> {
    Ok(Json(state.app.quota_set(&caller, &tenant, &flavor, quota).await?))
}

/// Change a tenant's cohort, fair-share weight or preemption policy (platform admins).
#[utoipa::path(patch, path = "/api/v1/admin/tenants/{tenant}", tag = "scheduling",
    params(("tenant" = String, Path, description = "Tenant name")), request_body = TenantPolicyUpdate, security(("bearer" = [])),
    responses((status = 204, description = "Changed"), (status = 403, body = ErrorBody), (status = 404, body = ErrorBody), (status = 422, body = ErrorBody)))]
pub async fn tenant_patch(
    State(state): State<AppState>,
    Auth(caller): Auth,
    Path(tenant): Path<String>,
    ApiJson(update): ApiJson<TenantPolicyUpdate>,
) -> ApiResult<StatusCode> {
    state.app.tenant_policy_set(&caller, &tenant, update).await?;
    Ok(StatusCode::NO_CONTENT)
}

/// For a queued job: why it waits, its positions in the tenant's queue and the cluster's, and
/// its estimated start. `null` for a job that is not waiting.
#[utoipa::path(get, path = "/api/v1/jobs/{id}/schedule", tag = "scheduling",
    params(("id" = String, Path, description = "Job id")), security(("bearer" = [])),
    responses((status = 200, body = Option<Schedule>), (status = 404, body = ErrorBody)))]
pub async fn job_schedule(
    State(state): State<AppState>,
    Auth(caller): Auth,
    JobId(id): JobId,
) -> ApiResult<Json<Option<Schedule>>> {
    Ok(Json(state.app.job_schedule(&caller, id).await?))
}

/// What if this job were submitted now: admitted at once, or queued at which position, with
/// which estimated start, and why. Checks the job like a submit; queues nothing.
#[utoipa::path(post, path = "/api/v1/jobs/what-if", tag = "scheduling", request_body = JobSubmission, security(("bearer" = [])),
    responses((status = 200, body = Schedule), (status = 422, body = ErrorBody)))]
pub async fn job_what_if(
    State(state): State<AppState>,
    Auth(caller): Auth,
    ApiJson(submission): ApiJson<JobSubmission>,
) -> ApiResult<Json<Schedule>> {
    Ok(Json(state.app.job_what_if(&caller, submission).await?))
}
