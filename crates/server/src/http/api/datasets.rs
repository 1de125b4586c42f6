use axum::Json;
use axum::body::Body;
use axum::extract::{Path, State};
use axum::http::{HeaderName, HeaderValue, StatusCode, header};
use axum::response::{IntoResponse, Response};
pub use trainyard_core::api::dataset_headers::{CONTENT_HEADER, KIND_HEADER, SHA256_HEADER, TENANT_HEADER};
use trainyard_core::api::{Dataset, DatasetFileUploaded, DatasetRegister, ErrorBody, NodeCacheReport};

use crate::http::AppState;
use crate::http::error::ApiResult;
use crate::http::extract::{ApiJson, Auth, DatasetReaderAuth, JobAuth, JobId};

/// Register a dataset version (immutable): described in full, from a data-pack job's output, or
/// from files pushed to the object store (`from_store`: refused, naming the file, unless every
/// file its manifest names is there with its size).
#[utoipa::path(post, path = "/api/v1/datasets", tag = "datasets", request_body = DatasetRegister, security(("bearer" = [])),
    responses(
        (status = 201, body = Dataset),
        (status = 200, description = "This exact version was registered before", body = Dataset),
        (status = 409, description = "The version exists with other content", body = ErrorBody),
        (status = 422, body = ErrorBody),
    ))]
pub async fn dataset_register(
    State(state): State<AppState>,
    Auth(caller): Auth,
    ApiJson(request): ApiJson<DatasetRegister>,
) -> ApiResult<(StatusCode, Json<Dataset>)> {
    let (dataset, created) = state.app.dataset_register(&caller, request).await?;
    Ok((if created { StatusCode::CREATED } else { StatusCode::OK }, Json(dataset)))
}

/// The tenant's datasets, every version.
#[utoipa::path(get, path = "/api/v1/datasets", tag = "datasets", security(("bearer" = [])),
    responses((status = 200, body = Vec<Dataset>)))]
pub async fn datasets_list(State(state): State<AppState>, Auth(caller): Auth) -> ApiResult<Json<Vec<Dataset>>> {
    Ok(Json(state.app.datasets_list(&caller).await?))
}

/// One dataset version.
#[utoipa::path(get, path = "/api/v1/datasets/{name}/{version}", tag = "datasets",
    params(("name" = String, Path, description = "Dataset name"), ("version" = String, Path, description = "Version")),
    security(("bearer" = [])), responses((status = 200, body = Dataset), (status = 404, body = ErrorBody)))]
pub async fn dataset_get(
    State(state): State<AppState>,
    Auth(caller): Auth,
    Path((name, version)): Path<(String, String)>,
) -> ApiResult<Json<Dataset>> {
    Ok(Json(state.app.dataset_get(&caller, &name, &version).await?))
}

/// Upload one file of a dataset being pushed (`yard datasets push`), under the manifest's
/// content hash: the manifest (`dataset.json`) first, then each shard and index it names. A
/// shard streams to the tenant's object store and is kept only when its bytes have the SHA-256
/// and size the manifest gives (422 naming the file otherwise, and nothing is stored).
#[utoipa::path(put, path = "/api/v1/dataset-content/{hash}/{file}", tag = "datasets",
    params(
        ("hash" = String, Path, description = "The manifest's content hash: its 64 hex digits"),
        ("file" = String, Path, description = "dataset.json, or a shard or index name the manifest gives"),
    ),
    request_body(content = Vec<u8>, content_type = "application/octet-stream"),
    security(("bearer" = [])),
    responses(
        (status = 201, body = DatasetFileUploaded),
        (status = 409, description = "A manifest naming other files was pushed under this hash", body = ErrorBody),
        (status = 422, description = "A file the manifest does not name, a shard whose bytes do not match it, a manifest whose content hash is not the path's", body = ErrorBody),
    ))]
pub async fn dataset_file_upload(
    State(state): State<AppState>,
    Auth(caller): Auth,
    Path((hash, file)): Path<(String, String)>,
    body: Body,
) -> ApiResult<(StatusCode, Json<DatasetFileUploaded>)> {
    let uploaded = state.app.dataset_file_upload(&caller, &hash, &file, body.into_data_stream()).await?;
    Ok((StatusCode::CREATED, Json(uploaded)))
}

/// One file of a dataset version pushed to the object store, streamed: `dataset.json` or a
/// shard or index its manifest names. For members of its tenant, and for the engine of a job
/// that records reading this version (its job token). Anything else is 404.
#[utoipa::path(get, path = "/api/v1/datasets/{name}/{version}/files/{file}", tag = "datasets",
    params(
        ("name" = String, Path, description = "Dataset name"),
        ("version" = String, Path, description = "Version"),
        ("file" = String, Path, description = "dataset.json, or a shard or index name the manifest gives"),
    ),
    security(("bearer" = []), ("job_token" = [])),
    responses(
        (status = 200, description = "The file", content_type = "application/octet-stream", body = Vec<u8>),
        (status = 404, body = ErrorBody),
    ))]
pub async fn dataset_file_get(
    State(state): State<AppState>,
    DatasetReaderAuth(reader): DatasetReaderAuth,
    Path((name, version, file)): Path<(String, String, String)>,
) -> ApiResult<Response> {
    let found = state.app.dataset_file_read(&reader, &name, &version, &file).await?;
    Ok((
        [
            (header::CONTENT_TYPE, "application/octet-stream".to_string()),
            (header::CONTENT_LENGTH, found.size.to_string()),
            (header::CACHE_CONTROL, "private, no-store".to_string()),
        ],
        Body::from_stream(found.stream),
    )
        .into_response())
}

/// What a reader may know of one file of a pushed dataset version without its bytes, with the
/// same authorization as `GET` (404 for anything the caller may not read). A node's cache agent
/// asks this for every request a job makes of it, with the job's own token: the answer says
/// whether the job may read the file, and names the cached copy (`X-Trainyard-Tenant`, whose
/// copies are kept apart; `X-Trainyard-Content`, the version's content hash; the file's kind in
/// `X-Trainyard-File-Kind`; a shard's SHA-256 in `X-Trainyard-Sha256` and its size in
/// `Content-Length`). Reads nothing from the object store.
#[utoipa::path(head, path = "/api/v1/datasets/{name}/{version}/files/{file}", tag = "datasets",
    params(
        ("name" = String, Path, description = "Dataset name"),
        ("version" = String, Path, description = "Version"),
        ("file" = String, Path, description = "dataset.json, or a shard or index name the manifest gives"),
    ),
    security(("bearer" = []), ("job_token" = [])),
    responses(
        (status = 200, description = "The caller may read the file", headers(
            ("X-Trainyard-Tenant" = String, description = "The version's tenant id"),
            ("X-Trainyard-Content" = String, description = "The version's content hash, 64 hex digits"),
            ("X-Trainyard-File-Kind" = String, description = "manifest, shard or index"),
            ("X-Trainyard-Sha256" = String, description = "A shard's SHA-256, 64 hex digits"),
        )),
        (status = 404, description = "Unknown, or not the caller's to read"),
    ))]
pub async fn dataset_file_head(
    State(state): State<AppState>,
    DatasetReaderAuth(reader): DatasetReaderAuth,
    Path((name, version, file)): Path<(String, String, String)>,
) -> ApiResult<Response> {
    let facts = state.app.dataset_file_describe(&reader, &name, &version, &file).await?;
    let mut headers = vec![
        (HeaderName::from_static(TENANT_HEADER), facts.tenant_id.to_string()),
        (HeaderName::from_static(CONTENT_HEADER), facts.content_hex),
        (HeaderName::from_static(KIND_HEADER), facts.kind.as_str().to_string()),
        (header::CACHE_CONTROL, "private, no-store".to_string()),
    ];
    if let (Some(size), Some(sha256)) = (facts.size, facts.sha256) {
        headers.push((header::CONTENT_LENGTH, size.to_string()));
        headers.push((HeaderName::from_static(SHA256_HEADER), sha256));
    }
    let mut response = StatusCode::OK.into_response();
    for (name, value) in headers {
        // Digits, letters and a UUID's dashes: always a valid header value.
        if let Ok(value) = HeaderValue::from_str(&value) {
            response.headers_mut().insert(name, value);
        }
    }
    Ok(response)
}

/// The job's engine reports that its node's shard cache holds every shard of a dataset version
/// the job reads; the scheduler prefers that node for the tenant's jobs reading the same
/// content (`cached_on` of the version). Only with the job's own token.
#[utoipa::path(post, path = "/api/v1/jobs/{id}/cached-datasets", tag = "datasets",
    params(("id" = String, Path, description = "Job id")), request_body = NodeCacheReport, security(("job_token" = [])),
    responses(
        (status = 204, description = "Recorded"),
        (status = 401, description = "Not a live job token", body = ErrorBody),
        (status = 404, description = "Not this token's job, or a version it does not read", body = ErrorBody),
        (status = 422, description = "A node the job does not run on, negative bytes", body = ErrorBody),
    ))]
pub async fn node_cache_report(
    State(state): State<AppState>,
    JobAuth(caller): JobAuth,
    JobId(job_id): JobId,
    ApiJson(report): ApiJson<NodeCacheReport>,
) -> ApiResult<StatusCode> {
    state.app.node_cache_report(&caller, job_id, report).await?;
    Ok(StatusCode::NO_CONTENT)
}
