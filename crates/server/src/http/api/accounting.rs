//! What operators read: Prometheus metrics, the audit log and usage.

use axum::Json;
use axum::extract::State;
use axum::http::{HeaderMap, header};
use axum::response::IntoResponse;
use trainyard_core::api::{AuditPage, ErrorBody, UsageReport};

use crate::app::accounting::{AuditQuery, UsageQuery};
use crate::http::AppState;
use crate::http::error::ApiResult;
use crate::http::extract::{ApiQuery, Auth, ClientIp};

/// The server's metrics in Prometheus' text format, for a scraper with the metrics token
/// (`--metrics-token-file`) or a platform admin's API token. Every metric is described in
/// `docs/operations.md`.
#[utoipa::path(get, path = "/metrics", tag = "operations", security(("bearer" = [])),
    responses(
        (status = 200, description = "Prometheus text exposition format 0.0.4", content_type = "text/plain"),
        (status = 401, body = ErrorBody),
        (status = 403, body = ErrorBody),
    ))]
pub async fn metrics(
    State(state): State<AppState>,
    ClientIp(client): ClientIp,
    headers: HeaderMap,
) -> ApiResult<impl IntoResponse> {
    let bearer = headers
        .get(header::AUTHORIZATION)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.strip_prefix("Bearer ").or_else(|| v.strip_prefix("bearer ")))
        .map(str::trim);
    let text = state.app.metrics_exposition(bearer, client).await?;
    Ok(([(header::CONTENT_TYPE, "text/plain; version=0.0.4; charset=utf-8")], text))
}

/// The audit log, newest first: every tenant's for platform admins, the tenant's own for its
/// admins (403 for other roles).
#[utoipa::path(get, path = "/api/v1/audit", tag = "operations", params(AuditQuery), security(("bearer" = [])),
    responses((status = 200, body = AuditPage), (status = 403, body = ErrorBody), (status = 422, body = ErrorBody)))]
pub async fn audit_get(
    State(state): State<AppState>,
    Auth(caller): Auth,
    ApiQuery(query): ApiQuery<AuditQuery>,
) -> ApiResult<Json<AuditPage>> {
    Ok(Json(state.app.audit_list(&caller, &query).await?))
}

/// GPU- and CPU-hours per group in a window, from the allocation ledger: every tenant's for
/// platform admins, the caller's tenant's for everyone else. Running attempts count up to now.
#[utoipa::path(get, path = "/api/v1/usage", tag = "operations", params(UsageQuery), security(("bearer" = [])),
    responses((status = 200, body = UsageReport), (status = 404, body = ErrorBody), (status = 422, body = ErrorBody)))]
pub async fn usage_get(
    State(state): State<AppState>,
    Auth(caller): Auth,
    ApiQuery(query): ApiQuery<UsageQuery>,
) -> ApiResult<Json<UsageReport>> {
    Ok(Json(state.app.usage_report(&caller, &query).await?))
}
