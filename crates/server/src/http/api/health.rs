use axum::Json;
use axum::extract::State;
use axum::http::{StatusCode, header};
use axum::response::IntoResponse;

use crate::http::AppState;
use crate::scheduling::health::Readiness;

/// Alive: the process answers.
#[utoipa::path(get, path = "/healthz", tag = "health", responses((status = 200, description = "The server is up")))]
pub async fn healthz() -> &'static str {
    "ok\n"
}

/// Ready: the database answers, and on the leader, the control loop completed a pass recently
/// (`--ready-max-pass-age-seconds`). The body says how the loop is doing either way.
#[utoipa::path(get, path = "/readyz", tag = "health", responses(
    (status = 200, description = "Ready to serve", body = Readiness),
    (status = 503, description = "The database does not answer, or the leader's loop is stuck", body = Readiness),
))]
pub async fn readyz(State(state): State<AppState>) -> impl IntoResponse {
    let readiness = state.app.readiness().await;
    let status = if readiness.ready { StatusCode::OK } else { StatusCode::SERVICE_UNAVAILABLE };
    (status, Json(readiness))
}

pub async fn openapi_json() -> impl IntoResponse {
    ([(header::CONTENT_TYPE, "application/json")], super::openapi_document())
}
