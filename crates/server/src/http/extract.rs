//! Request extractors that turn every kind of bad input into a typed [`ApiError`] naming the
//! field, instead of axum's plain-text rejections.

use axum::body::Bytes;
use axum::extract::{FromRequest, FromRequestParts, Request};
use axum::http::header;
use axum::http::request::Parts;
use serde::de::DeserializeOwned;
use trainyard_core::Error;
use trainyard_core::auth::Caller;
use trainyard_core::error::ObjectKind;
use trainyard_store::metrics::{JOB_TOKEN_PREFIX, JobCaller};
use uuid::Uuid;

use crate::http::AppState;
use crate::http::error::ApiError;
use crate::storage::Uploader;

/// The largest request body the API reads.
pub const MAX_BODY_BYTES: usize = 2 * 1024 * 1024;

/// A JSON body. Syntax errors are 400; well-formed JSON with a wrong, missing or unknown field is
/// 422 with the field's path (`resources.gpus`, `env.RANK`).
pub struct ApiJson<T>(pub T);

impl<S: Send + Sync, T: DeserializeOwned> FromRequest<S> for ApiJson<T> {
    type Rejection = ApiError;

    async fn from_request(req: Request, state: &S) -> Result<Self, ApiError> {
        let is_json =
            req.headers().get(header::CONTENT_TYPE).and_then(|v| v.to_str().ok()).is_some_and(|v| {
                v.split(';').next().is_some_and(|m| m.trim().eq_ignore_ascii_case("application/json"))
            });
        if !is_json {
            return Err(ApiError::UnsupportedMediaType);
        }
        let bytes = Bytes::from_request(req, state).await.map_err(|rejection| {
            if rejection.status() == axum::http::StatusCode::PAYLOAD_TOO_LARGE {
                ApiError::PayloadTooLarge(format!("the request body is over the limit of {MAX_BODY_BYTES} bytes"))
            } else {
                ApiError::MalformedJson(rejection.body_text())
            }
        })?;
        json_decode(&bytes).map(ApiJson)
    }
}

/// Decodes JSON, naming the path of the first bad value. Anything after the value but
/// whitespace is a syntax error: `{...}xyz` is not JSON.
pub fn json_decode<T: DeserializeOwned>(bytes: &[u8]) -> Result<T, ApiError> {
    let mut deserializer = serde_json::Deserializer::from_slice(bytes);
    let value = json_decode_value(&mut deserializer)?;
    deserializer
        .end()
        .map_err(|err| ApiError::MalformedJson(format!("the body is not valid JSON: {err} (after the JSON value)")))?;
    Ok(value)
}

fn json_decode_value<'de, T: DeserializeOwned>(
    deserializer: &mut serde_json::Deserializer<serde_json::de::SliceRead<'de>>,
) -> Result<T, ApiError> {
    serde_path_to_error::deserialize(deserializer).map_err(|err| {
        let path = err.path().to_string();
        let inner = err.into_inner();
        if inner.is_syntax() || inner.is_eof() {
            return ApiError::MalformedJson(format!("the body is not valid JSON: {inner}"));
        }
        let message = inner.to_string();
        let field = field_of(path, &message, "body");
        // serde appends " at line 1 column 42"; the field path says more.
        let message = message.split(" at line ").next().unwrap_or(&message).to_string();
        ApiError::Domain(Error::invalid(field, message))
    })
}

/// The path of the bad value. serde_path_to_error includes an unknown field's own name in the
/// path; at the top level the message may still name it.
fn field_of(path: String, message: &str, whole: &str) -> String {
    if path != "." {
        return path;
    }
    named_field(message).unwrap_or(whole).to_string()
}

/// The name in serde's "unknown field `x`, expected ..." or "missing field `x`" message.
fn named_field(message: &str) -> Option<&str> {
    let rest = message.strip_prefix("unknown field `").or_else(|| message.strip_prefix("missing field `"))?;
    rest.split('`').next()
}

/// Query parameters, with a 422 naming the parameter when one is wrong.
pub struct ApiQuery<T>(pub T);

impl<S: Send + Sync, T: DeserializeOwned> FromRequestParts<S> for ApiQuery<T> {
    type Rejection = ApiError;

    async fn from_request_parts(parts: &mut Parts, _state: &S) -> Result<Self, ApiError> {
        let query = parts.uri.query().unwrap_or_default();
        let deserializer = serde_urlencoded::Deserializer::new(form_urlencoded::parse(query.as_bytes()));
        serde_path_to_error::deserialize(deserializer).map(ApiQuery).map_err(|err| {
            let path = err.path().to_string();
            let message = err.into_inner().to_string();
            let field = field_of(path, &message, "query");
            ApiError::Domain(Error::invalid(field, message))
        })
    }
}

/// The authenticated caller, from `Authorization: Bearer <token>` with a user's API token.
pub struct Auth(pub Caller);

impl FromRequestParts<AppState> for Auth {
    type Rejection = ApiError;

    async fn from_request_parts(parts: &mut Parts, state: &AppState) -> Result<Self, ApiError> {
        let token = bearer_token(parts)?;
        if token.starts_with(JOB_TOKEN_PREFIX) {
            return Err(Error::Unauthenticated(
                "a job token can only post metrics, outputs, artefacts and the run record of its own job, and read the datasets it uses".into(),
            )
            .into());
        }
        Ok(Auth(state.app.token_authenticate(token, client_ip(parts)).await?))
    }
}

/// The job an engine reports for, from its job token (`TRAINYARD_TOKEN` in its environment).
pub struct JobAuth(pub JobCaller);

impl FromRequestParts<AppState> for JobAuth {
    type Rejection = ApiError;

    async fn from_request_parts(parts: &mut Parts, state: &AppState) -> Result<Self, ApiError> {
        let token = bearer_token(parts)?;
        if !token.starts_with(JOB_TOKEN_PREFIX) {
            return Err(Error::Unauthenticated(
                "metrics, outputs and run records are posted by a job's engine with its job token".into(),
            )
            .into());
        }
        Ok(JobAuth(state.app.job_token_authenticate(token, client_ip(parts)).await?))
    }
}

/// Who uploads an artefact: the job's engine with its job token, or a member with an API token.
pub struct UploadAuth(pub Uploader);

impl FromRequestParts<AppState> for UploadAuth {
    type Rejection = ApiError;

    async fn from_request_parts(parts: &mut Parts, state: &AppState) -> Result<Self, ApiError> {
        let token = bearer_token(parts)?;
        Ok(UploadAuth(if token.starts_with(JOB_TOKEN_PREFIX) {
            Uploader::Job(state.app.job_token_authenticate(token, client_ip(parts)).await?)
        } else {
            Uploader::User(state.app.token_authenticate(token, client_ip(parts)).await?)
        }))
    }
}

/// Who reads a pushed dataset's files: a job's engine with its job token, or a member with an
/// API token (the operation decides what each may read).
pub struct DatasetReaderAuth(pub crate::app::datasets::DatasetReader);

impl FromRequestParts<AppState> for DatasetReaderAuth {
    type Rejection = ApiError;

    async fn from_request_parts(parts: &mut Parts, state: &AppState) -> Result<Self, ApiError> {
        use crate::app::datasets::DatasetReader;
        let token = bearer_token(parts)?;
        Ok(DatasetReaderAuth(if token.starts_with(JOB_TOKEN_PREFIX) {
            DatasetReader::Job(state.app.job_token_authenticate(token, client_ip(parts)).await?)
        } else {
            DatasetReader::Member(state.app.token_authenticate(token, client_ip(parts)).await?)
        }))
    }
}

/// The address of the client that sent the request, when the server knows it (for throttling
/// failed authentication).
pub struct ClientIp(pub Option<std::net::IpAddr>);

impl<S: Send + Sync> FromRequestParts<S> for ClientIp {
    type Rejection = std::convert::Infallible;

    async fn from_request_parts(parts: &mut Parts, _state: &S) -> Result<Self, Self::Rejection> {
        Ok(ClientIp(client_ip(parts)))
    }
}

pub(crate) fn client_ip(parts: &Parts) -> Option<std::net::IpAddr> {
    parts.extensions.get::<axum::extract::ConnectInfo<std::net::SocketAddr>>().map(|info| info.0.ip())
}

fn bearer_token(parts: &Parts) -> Result<&str, ApiError> {
    let header = parts
        .headers
        .get(header::AUTHORIZATION)
        .ok_or_else(|| Error::Unauthenticated("send your API token as `Authorization: Bearer <token>`".into()))?;
    Ok(header
        .to_str()
        .ok()
        .and_then(|v| v.strip_prefix("Bearer ").or_else(|| v.strip_prefix("bearer ")))
        .map(str::trim)
        .ok_or_else(|| Error::Unauthenticated("the Authorization header must be `Bearer <token>`".into()))?)
}

/// The `{id}` of a job route, parsed. A malformed id names no job: 404, like an unknown one.
pub struct JobId(pub Uuid);

/// The `{id}` of a token route, parsed (404 when malformed).
pub struct TokenId(pub Uuid);

/// The `{id}` of a notification subscription's route, parsed (404 when malformed).
pub struct SubscriptionId(pub Uuid);

impl<S: Send + Sync> FromRequestParts<S> for SubscriptionId {
    type Rejection = ApiError;

    async fn from_request_parts(parts: &mut Parts, state: &S) -> Result<Self, ApiError> {
        id_param(parts, state, ObjectKind::Subscription).await.map(SubscriptionId)
    }
}

/// The `{id}` of an experiment route, parsed (404 when malformed).
pub struct ExperimentId(pub Uuid);

impl<S: Send + Sync> FromRequestParts<S> for ExperimentId {
    type Rejection = ApiError;

    async fn from_request_parts(parts: &mut Parts, state: &S) -> Result<Self, ApiError> {
        id_param(parts, state, ObjectKind::Experiment).await.map(ExperimentId)
    }
}

/// The path parameter `id`, parsed as the id of a `kind` object.
async fn id_param<S: Send + Sync>(parts: &mut Parts, state: &S, kind: ObjectKind) -> Result<Uuid, ApiError> {
    let axum::extract::Path(params) =
        axum::extract::Path::<std::collections::HashMap<String, String>>::from_request_parts(parts, state)
            .await
            .map_err(|_| ApiError::Domain(Error::not_found(kind)))?;
    parse_id(params.get("id").map(String::as_str).unwrap_or_default(), kind)
}

impl<S: Send + Sync> FromRequestParts<S> for JobId {
    type Rejection = ApiError;

    async fn from_request_parts(parts: &mut Parts, state: &S) -> Result<Self, ApiError> {
        id_param(parts, state, ObjectKind::Job).await.map(JobId)
    }
}

impl<S: Send + Sync> FromRequestParts<S> for TokenId {
    type Rejection = ApiError;

    async fn from_request_parts(parts: &mut Parts, state: &S) -> Result<Self, ApiError> {
        id_param(parts, state, ObjectKind::Token).await.map(TokenId)
    }
}

/// An object id from the path. A malformed id names no object: 404, like an unknown one.
pub fn parse_id(text: &str, kind: ObjectKind) -> Result<Uuid, ApiError> {
    Uuid::parse_str(text).map_err(|_| ApiError::Domain(Error::not_found(kind)))
}
