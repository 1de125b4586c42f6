//! The edge where domain errors become HTTP responses: a status code and the JSON body
//! `{ "error": { "code", "message", "field"?, "errors"? } }`. Internal causes are logged here and never sent.

use axum::Json;
use axum::http::{HeaderValue, StatusCode, header};
use axum::response::{IntoResponse, Response};
use trainyard_core::Error;
use trainyard_core::api::{ErrorBody, ErrorDetail};

/// An error on its way to the caller.
#[derive(Debug)]
pub enum ApiError {
    Domain(Error),
    /// The body is not JSON at all (a syntax error), as opposed to JSON with bad values.
    MalformedJson(String),
    PayloadTooLarge(String),
    UnsupportedMediaType,
}

impl From<Error> for ApiError {
    fn from(err: Error) -> Self {
        ApiError::Domain(err)
    }
}

impl ApiError {
    /// The HTTP status this error is answered with.
    pub fn status(&self) -> StatusCode {
        self.parts().0
    }

    fn parts(&self) -> (StatusCode, &'static str, String, Option<String>) {
        match self {
            ApiError::Domain(err) => match err {
                Error::InvalidInput { field, message } => (
                    StatusCode::UNPROCESSABLE_ENTITY,
                    "invalid_input",
                    format!("{field}: {message}"),
                    Some(field.clone()),
                ),
                Error::InvalidFields(problems) => (
                    StatusCode::UNPROCESSABLE_ENTITY,
                    "invalid_input",
                    format!("{} problems: {err}", problems.len()),
                    problems.first().map(|p| p.field.clone()),
                ),
                Error::NotFound { .. } => (StatusCode::NOT_FOUND, "not_found", err.to_string(), None),
                Error::Unauthenticated(msg) => (StatusCode::UNAUTHORIZED, "unauthenticated", msg.clone(), None),
                Error::Forbidden(msg) => (StatusCode::FORBIDDEN, "forbidden", msg.clone(), None),
                Error::Conflict(msg) | Error::AlreadyExists(msg) => {
                    (StatusCode::CONFLICT, "conflict", msg.clone(), None)
                }
                Error::Unavailable(msg) => (StatusCode::SERVICE_UNAVAILABLE, "unavailable", msg.clone(), None),
                Error::TooManyRequests { message, .. } => {
                    (StatusCode::TOO_MANY_REQUESTS, "too_many_requests", message.clone(), None)
                }
                Error::Fenced(msg) => (StatusCode::SERVICE_UNAVAILABLE, "unavailable", msg.clone(), None),
                Error::Internal(_) => (
                    StatusCode::INTERNAL_SERVER_ERROR,
                    "internal",
                    "something went wrong on our side; it has been logged".into(),
                    None,
                ),
            },
            ApiError::MalformedJson(msg) => (StatusCode::BAD_REQUEST, "malformed_json", msg.clone(), None),
            ApiError::PayloadTooLarge(msg) => (StatusCode::PAYLOAD_TOO_LARGE, "payload_too_large", msg.clone(), None),
            ApiError::UnsupportedMediaType => (
                StatusCode::UNSUPPORTED_MEDIA_TYPE,
                "unsupported_media_type",
                "send the body as JSON with `Content-Type: application/json`".into(),
                None,
            ),
        }
    }
}

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        if let ApiError::Domain(Error::Internal(cause)) = &self {
            tracing::error!(%cause, "internal error");
        }
        let (status, code, message, field) = self.parts();
        let errors = match &self {
            ApiError::Domain(err) => err.field_problems(),
            _ => Vec::new(),
        };
        let body = ErrorBody { error: ErrorDetail { code: code.to_string(), message, field, errors } };
        let mut response = (status, Json(body)).into_response();
        if status == StatusCode::UNAUTHORIZED {
            response.headers_mut().insert(header::WWW_AUTHENTICATE, HeaderValue::from_static("Bearer"));
        }
        if let ApiError::Domain(Error::TooManyRequests { retry_after_secs, .. }) = &self {
            response.headers_mut().insert(header::RETRY_AFTER, HeaderValue::from(*retry_after_secs));
        }
        if status == StatusCode::SERVICE_UNAVAILABLE {
            // The database away or the pool exhausted: soon over, and clients may say so.
            response.headers_mut().insert(header::RETRY_AFTER, HeaderValue::from_static("1"));
        }
        response
    }
}

pub type ApiResult<T> = Result<T, ApiError>;
