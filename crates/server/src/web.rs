//! The browser entry point. The full dashboard is its own piece of work; this page tells a person
//! where they are and where the API and its document live.

use askama::Template;
use axum::Router;
use axum::http::StatusCode;
use axum::response::{Html, IntoResponse};
use axum::routing::get;

use crate::AppState;

#[derive(Template)]
#[template(path = "index.html")]
struct Index {
    version: &'static str,
}

async fn index() -> impl IntoResponse {
    match (Index { version: env!("CARGO_PKG_VERSION") }).render() {
        Ok(html) => Html(html).into_response(),
        Err(err) => {
            tracing::error!(%err, "rendering the index page");
            StatusCode::INTERNAL_SERVER_ERROR.into_response()
        }
    }
}

pub fn routes() -> Router<AppState> {
    Router::new().route("/", get(index))
}
