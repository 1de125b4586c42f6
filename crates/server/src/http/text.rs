//! The one place that refuses text Postgres cannot store. Postgres' `text` and `jsonb` refuse
//! the NUL character (U+0000); any string that reached a query with one inside failed there as a
//! 500. Every request passes this check after routing and before its handler: path segments,
//! query parameters, form fields (the dashboard) and JSON bodies (the API). A NUL anywhere is a
//! 422 that names the field, and nothing runs. (Invalid UTF-8 cannot get this far: extractors
//! decode into `String`.) On MLflow's routes the refusal is in MLflow's shape and code
//! (`INVALID_PARAMETER_VALUE`, a 400), as the MLflow client expects.

use axum::body::{Body, Bytes};
use axum::extract::{MatchedPath, Request};
use axum::http::{Method, header};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use serde_json::Value;
use trainyard_core::Error;

use crate::http::error::ApiError;
use crate::http::extract::MAX_BODY_BYTES;
use crate::http::mlflow::{MlflowError, is_mlflow_route};

/// The middleware: passes the request on unchanged unless it carries a NUL.
pub async fn refuse_unstorable(matched: Option<MatchedPath>, request: Request, next: Next) -> Response {
    let mlflow = matched.as_ref().is_some_and(|m| is_mlflow_route(m.as_str()));
    let refusal = |field: String| refusal(field, mlflow);
    if let Some(field) = path_field(matched.as_ref().map(MatchedPath::as_str), request.uri().path()) {
        return refusal(field);
    }
    if let Some(field) = request.uri().query().and_then(query_field) {
        return refusal(field);
    }
    // A body sent with a method that takes none is never read by a handler: not read here either.
    if matches!(request.method(), &Method::GET | &Method::HEAD | &Method::DELETE | &Method::OPTIONS) {
        return next.run(request).await;
    }
    let body_kind = match request.headers().get(header::CONTENT_TYPE).and_then(|v| v.to_str().ok()) {
        Some(v) if media_type_is(v, "application/json") => BodyKind::Json,
        Some(v) if media_type_is(v, "application/x-www-form-urlencoded") => BodyKind::Form,
        _ => return next.run(request).await,
    };
    // A body declared larger than any decoded body may be goes on unread: the route's own limit
    // answers 413, and the one route without a limit (artefact upload) stores bytes, not text.
    let declared = request.headers().get(header::CONTENT_LENGTH).and_then(|v| v.to_str().ok()?.parse::<usize>().ok());
    if declared.is_some_and(|length| length > MAX_BODY_BYTES) {
        return next.run(request).await;
    }
    let (parts, body) = request.into_parts();
    let bytes = match axum::body::to_bytes(body, MAX_BODY_BYTES).await {
        Ok(bytes) => bytes,
        Err(_) => {
            let error =
                ApiError::PayloadTooLarge(format!("the request body is over the limit of {MAX_BODY_BYTES} bytes"));
            return if mlflow { MlflowError::from(error).into_response() } else { error.into_response() };
        }
    };
    let field = match body_kind {
        BodyKind::Json => json_field(&bytes),
        BodyKind::Form => query_field_bytes(&bytes),
    };
    match field {
        Some(field) => refusal(field),
        None => next.run(Request::from_parts(parts, Body::from(Bytes::clone(&bytes)))).await,
    }
}

enum BodyKind {
    Json,
    Form,
}

fn media_type_is(content_type: &str, wanted: &str) -> bool {
    content_type.split(';').next().is_some_and(|m| m.trim().eq_ignore_ascii_case(wanted))
}

fn refusal(field: String, mlflow: bool) -> Response {
    let error = ApiError::Domain(Error::invalid(field, "must not contain the NUL character (U+0000)"));
    if mlflow { MlflowError::from(error).into_response() } else { error.into_response() }
}

/// The route parameter (`{flavor}`) whose segment of `path` decodes to text with a NUL. A URI
/// cannot carry a raw NUL, so only `%00` can make one.
fn path_field(route: Option<&str>, path: &str) -> Option<String> {
    if !path.contains("%00") {
        return None;
    }
    let Some(route) = route else { return Some("path".into()) };
    let mut template = route.split('/');
    for segment in path.split('/') {
        let name = template.next();
        if segment.contains("%00") {
            return Some(match name {
                Some(name) if name.starts_with('{') => {
                    name.trim_matches(|c| c == '{' || c == '}').trim_start_matches('*').to_string()
                }
                _ => "path".into(),
            });
        }
        // A `{*rest}` parameter takes every segment after it.
        if name.is_some_and(|n| n.starts_with("{*")) {
            return Some(name.unwrap_or_default().trim_matches(|c| c == '{' || c == '}' || c == '*').to_string());
        }
    }
    Some("path".into())
}

/// The first query or form parameter whose name or value decodes to text with a NUL.
fn query_field(query: &str) -> Option<String> {
    query_field_bytes(query.as_bytes())
}

fn query_field_bytes(encoded: &[u8]) -> Option<String> {
    // `%00` is the only way to spell a NUL there; most requests stop at this scan.
    memchr::memmem::find(encoded, b"%00")?;
    form_urlencoded::parse(encoded)
        .find(|(name, value)| name.contains('\0') || value.contains('\0'))
        .map(|(name, _)| if name.contains('\0') { "query".to_string() } else { name.into_owned() })
}

/// The path (as the JSON decoder names fields: `env.FOO`, `command[1]`) of the first string or
/// key in a JSON body that holds a NUL.
fn json_field(bytes: &[u8]) -> Option<String> {
    // JSON can spell a NUL only as the escape `\u0000`; most bodies stop at this scan. A hit may
    // still be an escaped backslash followed by "u0000", so the parse decides.
    memchr::memmem::find(bytes, b"\\u0000")?;
    let value: Value = serde_json::from_slice(bytes).ok()?;
    let mut path = String::new();
    nul_path(&value, &mut path).then(|| if path.is_empty() { "body".to_string() } else { path })
}

fn nul_path(value: &Value, path: &mut String) -> bool {
    match value {
        Value::String(s) => s.contains('\0'),
        Value::Array(items) => items.iter().enumerate().any(|(i, item)| {
            let len = path.len();
            path.push_str(&format!("[{i}]"));
            let found = nul_path(item, path);
            if !found {
                path.truncate(len);
            }
            found
        }),
        Value::Object(map) => map.iter().any(|(key, item)| {
            if key.contains('\0') {
                return true;
            }
            let len = path.len();
            if !path.is_empty() {
                path.push('.');
            }
            path.push_str(key);
            let found = nul_path(item, path);
            if !found {
                path.truncate(len);
            }
            found
        }),
        _ => false,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn json_names_the_field_that_holds_a_nul() {
        let cases = [
            (r#"{"name": "\u0000{"}"#, Some("name")),
            (r#"{"command": ["true", "a\u0000b"]}"#, Some("command[1]")),
            (r#"{"env": {"FOO": "x\u0000"}}"#, Some("env.FOO")),
            (r#"{"env": {"F\u0000": "x"}}"#, Some("env")),
            (r#""\u0000""#, Some("body")),
            // An escaped backslash followed by u0000 is six printable characters.
            (r#"{"name": "\\u0000"}"#, None),
            (r#"{"name": "plain"}"#, None),
        ];
        for (body, field) in cases {
            assert_eq!(json_field(body.as_bytes()).as_deref(), field, "{body}");
        }
    }

    #[test]
    fn query_and_form_name_the_parameter() {
        assert_eq!(query_field("state=queued&name=a%00b").as_deref(), Some("name"));
        assert_eq!(query_field("state=queued&name=a%2500b"), None, "an escaped percent sign is no NUL");
        assert_eq!(query_field("x%00=1").as_deref(), Some("query"));
        assert_eq!(query_field("name=ok"), None);
    }

    #[test]
    fn path_names_the_route_parameter() {
        let route = Some("/api/v1/admin/quotas/{tenant}/{flavor}");
        assert_eq!(path_field(route, "/api/v1/admin/quotas/team-a/h100%00").as_deref(), Some("flavor"));
        assert_eq!(path_field(route, "/api/v1/admin/quotas/team-a/h100"), None);
        let rest = Some("/api/v1/jobs/{id}/artifacts/{*path}");
        assert_eq!(path_field(rest, "/api/v1/jobs/1/artifacts/a/b%00").as_deref(), Some("path"));
        assert_eq!(path_field(None, "/nowhere%00").as_deref(), Some("path"));
    }
}
