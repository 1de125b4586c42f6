use axum::Json;
use axum::extract::State;
use axum::http::{HeaderMap, StatusCode};
use trainyard_core::api::{ErrorBody, Session, SessionCreate, SessionLink};

use crate::http::AppState;
use crate::http::error::ApiResult;
use crate::http::extract::{ApiJson, Auth, JobId};
use crate::http::proxy::session_link;

/// Open an interactive session (a JupyterLab notebook): a job of your tenant from the built-in
/// `notebook` template, queued under the quota like any job (its id is the session's). Ask for
/// a link to open it in a browser once it runs.
#[utoipa::path(post, path = "/api/v1/sessions", tag = "sessions", request_body = SessionCreate,
    security(("bearer" = [])),
    responses(
        (status = 201, description = "Queued", body = Session),
        (status = 403, description = "Your role may not open sessions", body = ErrorBody),
        (status = 422, description = "Fields are wrong; `errors` names each", body = ErrorBody),
    ))]
pub async fn session_create(
    State(state): State<AppState>,
    Auth(caller): Auth,
    ApiJson(create): ApiJson<SessionCreate>,
) -> ApiResult<(StatusCode, Json<Session>)> {
    Ok((StatusCode::CREATED, Json(state.app.session_create(&caller, create).await?)))
}

/// A session of your tenant: its kind, its job's state, who opened it, its last activity.
#[utoipa::path(get, path = "/api/v1/sessions/{id}", tag = "sessions",
    params(("id" = String, Path, description = "Session id (its job's id)")), security(("bearer" = [])),
    responses((status = 200, body = Session), (status = 404, body = ErrorBody)))]
pub async fn session_get(
    State(state): State<AppState>,
    Auth(caller): Auth,
    JobId(id): JobId,
) -> ApiResult<Json<Session>> {
    Ok(Json(state.app.session_get(&caller, id).await?))
}

/// A link that opens the session in a browser: once, within a minute. It carries a one-time
/// grant, never your token; following it sets the session's own cookie on the session's own
/// host. Only for the session's user and the tenant's admins.
#[utoipa::path(post, path = "/api/v1/sessions/{id}/link", tag = "sessions",
    params(("id" = String, Path, description = "Session id (its job's id)")), security(("bearer" = [])),
    responses(
        (status = 200, body = SessionLink),
        (status = 403, description = "Not your session, and you are not an admin of the tenant", body = ErrorBody),
        (status = 404, body = ErrorBody),
    ))]
pub async fn session_link_create(
    State(state): State<AppState>,
    Auth(caller): Auth,
    JobId(id): JobId,
    headers: HeaderMap,
) -> ApiResult<Json<SessionLink>> {
    let grant = state.app.session_grant(&caller, id).await?;
    Ok(Json(SessionLink { url: session_link(&headers, id, &grant.grant), expires_at: grant.expires_at }))
}
