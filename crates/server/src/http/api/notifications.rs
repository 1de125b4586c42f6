use axum::Json;
use axum::extract::State;
use axum::http::StatusCode;
use trainyard_core::api::ErrorBody;
use trainyard_core::notifications::{Delivery, Subscription, SubscriptionCreate, SubscriptionCreated};

use crate::http::AppState;
use crate::http::error::ApiResult;
use crate::http::extract::{ApiJson, Auth, SubscriptionId};

/// Subscribe a webhook to job events: your own jobs, or (tenant admins, `scope: tenant`) every
/// job of the tenant. The signing secret is in this response only.
#[utoipa::path(post, path = "/api/v1/notifications/subscriptions", tag = "notifications",
    request_body = SubscriptionCreate, security(("bearer" = [])),
    responses((status = 201, body = SubscriptionCreated), (status = 403, body = ErrorBody), (status = 422, body = ErrorBody)))]
pub async fn subscription_create(
    State(state): State<AppState>,
    Auth(caller): Auth,
    ApiJson(body): ApiJson<SubscriptionCreate>,
) -> ApiResult<(StatusCode, Json<SubscriptionCreated>)> {
    Ok((StatusCode::CREATED, Json(state.app.subscription_create(&caller, &body).await?)))
}

/// Your subscriptions in this tenant (all of the tenant's for its admins); never their secrets.
#[utoipa::path(get, path = "/api/v1/notifications/subscriptions", tag = "notifications", security(("bearer" = [])),
    responses((status = 200, body = Vec<Subscription>), (status = 403, body = ErrorBody)))]
pub async fn subscriptions_list(
    State(state): State<AppState>,
    Auth(caller): Auth,
) -> ApiResult<Json<Vec<Subscription>>> {
    Ok(Json(state.app.subscriptions_list(&caller).await?))
}

/// Remove a subscription (yours, or any of the tenant's for its admins) and its delivery log.
#[utoipa::path(delete, path = "/api/v1/notifications/subscriptions/{id}", tag = "notifications",
    params(("id" = String, Path, description = "Subscription id")), security(("bearer" = [])),
    responses((status = 204, description = "Removed"), (status = 404, body = ErrorBody)))]
pub async fn subscription_delete(
    State(state): State<AppState>,
    Auth(caller): Auth,
    SubscriptionId(id): SubscriptionId,
) -> ApiResult<StatusCode> {
    state.app.subscription_delete(&caller, id).await?;
    Ok(StatusCode::NO_CONTENT)
}

/// A subscription's latest 200 notices, newest first, each with every try (time, duration,
/// the receiver's status code or the error).
#[utoipa::path(get, path = "/api/v1/notifications/subscriptions/{id}/deliveries", tag = "notifications",
    params(("id" = String, Path, description = "Subscription id")), security(("bearer" = [])),
    responses((status = 200, body = Vec<Delivery>), (status = 404, body = ErrorBody)))]
pub async fn subscription_deliveries(
    State(state): State<AppState>,
    Auth(caller): Auth,
    SubscriptionId(id): SubscriptionId,
) -> ApiResult<Json<Vec<Delivery>>> {
    Ok(Json(state.app.subscription_deliveries(&caller, id).await?))
}
