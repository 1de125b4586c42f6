//! The dashboard's static files, built into the binary from the workspace's `web/static`: the
//! stylesheet, the page script, and the vendored htmx and uPlot (see `web/static/vendor`).

use axum::extract::Path;
use axum::http::{StatusCode, header};
use axum::response::{IntoResponse, Response};
use include_dir::{Dir, include_dir};

static STATIC: Dir<'static> = include_dir!("$CARGO_MANIFEST_DIR/../../web/static");

fn content_type(path: &str) -> &'static str {
    match path.rsplit('.').next() {
        Some("css") => "text/css; charset=utf-8",
        Some("js") => "text/javascript; charset=utf-8",
        Some("svg") => "image/svg+xml",
        Some("png") => "image/png",
        _ => "text/plain; charset=utf-8",
    }
}

pub async fn serve(Path(path): Path<String>) -> Response {
    match STATIC.get_file(&path) {
        Some(file) => (
            [(header::CONTENT_TYPE, content_type(&path)), (header::CACHE_CONTROL, "public, max-age=3600")],
            file.contents(),
        )
            .into_response(),
        None => (StatusCode::NOT_FOUND, "no such file").into_response(),
    }
}
