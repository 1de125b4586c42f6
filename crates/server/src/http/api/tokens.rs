use axum::Json;
use axum::extract::State;
use axum::http::StatusCode;
use trainyard_core::api::{ErrorBody, Me, TokenCreate, TokenCreated, TokenInfo};

use crate::http::AppState;
use crate::http::error::ApiResult;
use crate::http::extract::{ApiJson, Auth, TokenId};

/// Who the token belongs to: user, tenant, role.
#[utoipa::path(get, path = "/api/v1/me", tag = "tokens", security(("bearer" = [])),
    responses((status = 200, body = Me), (status = 401, body = ErrorBody)))]
pub async fn me(Auth(caller): Auth) -> Json<Me> {
    Json(Me { user: caller.user, tenant: caller.tenant, role: caller.role, platform_admin: caller.platform_admin })
}

/// Your tokens in this tenant (never their secrets).
#[utoipa::path(get, path = "/api/v1/tokens", tag = "tokens", security(("bearer" = [])),
    responses((status = 200, body = Vec<TokenInfo>), (status = 401, body = ErrorBody)))]
pub async fn tokens_list(State(state): State<AppState>, Auth(caller): Auth) -> ApiResult<Json<Vec<TokenInfo>>> {
    Ok(Json(state.app.tokens_list(&caller).await?))
}

/// A new token for you, in this tenant or (with `tenant`) another tenant you are a member of.
/// Its secret is in this response only.
#[utoipa::path(post, path = "/api/v1/tokens", tag = "tokens", request_body = TokenCreate, security(("bearer" = [])),
    responses((status = 201, body = TokenCreated), (status = 422, body = ErrorBody)))]
pub async fn token_create(
    State(state): State<AppState>,
    Auth(caller): Auth,
    ApiJson(body): ApiJson<TokenCreate>,
) -> ApiResult<(StatusCode, Json<TokenCreated>)> {
    let token = state.app.token_create(&caller, &body.name, body.expires_in_days, body.tenant.as_deref()).await?;
    Ok((StatusCode::CREATED, Json(token)))
}

/// Revoke a token: yours, or any of the tenant's if you are its admin.
#[utoipa::path(delete, path = "/api/v1/tokens/{id}", tag = "tokens", params(("id" = String, Path, description = "Token id")),
    security(("bearer" = [])),
    responses((status = 204, description = "Revoked"), (status = 404, body = ErrorBody)))]
pub async fn token_revoke(
    State(state): State<AppState>,
    Auth(caller): Auth,
    TokenId(id): TokenId,
) -> ApiResult<StatusCode> {
    state.app.token_revoke(&caller, id).await?;
    Ok(StatusCode::NO_CONTENT)
}
