use axum::extract::State;
use axum::http::{StatusCode, header};
use axum::response::IntoResponse;

use crate::AppState;

/// Alive: the process answers.
#[utoipa::path(get, path = "/healthz", tag = "health", responses((status = 200, description = "The server is up")))]
pub async fn healthz() -> &'static str {
    "ok\n"
}

/// Ready: the database answers too.
#[utoipa::path(get, path = "/readyz", tag = "health", responses(
    (status = 200, description = "Ready to serve"),
    (status = 503, description = "The database does not answer"),
))]
pub async fn readyz(State(state): State<AppState>) -> impl IntoResponse {
    if state.app.store.ping().await {
        (StatusCode::OK, "ready\n")
    } else {
        (StatusCode::SERVICE_UNAVAILABLE, "the database does not answer\n")
    }
}

pub async fn openapi_json() -> impl IntoResponse {
    ([(header::CONTENT_TYPE, "application/json")], super::openapi_document())
}
