//! Artefacts, volumes and the storage policy.

use axum::Json;
use axum::body::Body;
use axum::extract::{Path, State};
use axum::http::{StatusCode, header};
use axum::response::{IntoResponse, Response};
use serde::Deserialize;
use trainyard_core::api::{
    Artifact, ArtifactLink, ArtifactUploaded, ErrorBody, StoragePolicy, StorageReport, Volume, VolumeCreate,
};
use utoipa::IntoParams;

use crate::http::AppState;
use crate::http::error::ApiResult;
use crate::http::extract::{ApiJson, ApiQuery, Auth, JobId, UploadAuth};

/// A job's artefacts: path, size, SHA-256 (when uploaded through the API) and time.
#[utoipa::path(get, path = "/api/v1/jobs/{id}/artifacts", tag = "storage",
    params(("id" = String, Path, description = "Job id")), security(("bearer" = [])),
    responses((status = 200, body = Vec<Artifact>), (status = 404, body = ErrorBody)))]
pub async fn artifacts_list(
    State(state): State<AppState>,
    Auth(caller): Auth,
    JobId(job_id): JobId,
) -> ApiResult<Json<Vec<Artifact>>> {
    Ok(Json(state.app.artifacts_list(&caller, job_id).await?))
}

/// Upload an artefact (any size: streamed, in parts when large). For the job's engine with its
/// job token, or a member with an API token. The path is relative: no `..`, no leading `/`,
/// no empty segments, no backslashes, no percent-escapes.
#[utoipa::path(put, path = "/api/v1/jobs/{id}/artifacts/{path}", tag = "storage",
    params(("id" = String, Path, description = "Job id"), ("path" = String, Path, description = "Relative path")),
    request_body(content = Vec<u8>, content_type = "application/octet-stream"),
    security(("bearer" = []), ("job_token" = [])),
    responses(
        (status = 201, body = ArtifactUploaded),
        (status = 401, body = ErrorBody),
        (status = 404, body = ErrorBody),
        (status = 422, description = "A path that could leave the job's folder, or a body over the limit", body = ErrorBody),
        (status = 409, description = "Retention removed this job's artefacts", body = ErrorBody),
    ))]
pub async fn artifact_upload(
    State(state): State<AppState>,
    UploadAuth(uploader): UploadAuth,
    JobId(job_id): JobId,
    Path((_, path)): Path<(String, String)>,
    body: Body,
) -> ApiResult<(StatusCode, Json<ArtifactUploaded>)> {
    let uploaded = state.app.artifact_upload(uploader, job_id, &path, body.into_data_stream()).await?;
    Ok((StatusCode::CREATED, Json(uploaded)))
}

#[derive(Debug, Deserialize, IntoParams)]
#[serde(deny_unknown_fields)]
#[into_params(parameter_in = Query)]
pub struct LinkParams {
    /// Seconds the link is valid (default 300, at most 900).
    #[param(minimum = 1, maximum = 900)]
    expires_in: Option<u64>,
}

/// A short-lived download link for one artefact: S3's own pre-signed URL, or (local store) a
/// URL of this server signed with HMAC. Fetch it without credentials.
#[utoipa::path(get, path = "/api/v1/jobs/{id}/artifacts/{path}", tag = "storage",
    params(("id" = String, Path, description = "Job id"), ("path" = String, Path, description = "Relative path"), LinkParams),
    security(("bearer" = [])),
    responses((status = 200, body = ArtifactLink), (status = 404, body = ErrorBody), (status = 422, body = ErrorBody)))]
pub async fn artifact_link(
    State(state): State<AppState>,
    Auth(caller): Auth,
    JobId(job_id): JobId,
    Path((_, path)): Path<(String, String)>,
    ApiQuery(params): ApiQuery<LinkParams>,
) -> ApiResult<Json<ArtifactLink>> {
    Ok(Json(state.app.artifact_link(&caller, job_id, &path, params.expires_in).await?))
}

#[derive(Debug, Deserialize, IntoParams)]
#[serde(deny_unknown_fields)]
#[into_params(parameter_in = Query)]
pub struct DownloadParams {
    /// The object key.
    key: String,
    /// Unix seconds after which the link is refused.
    expires: i64,
    /// Hex HMAC-SHA256 of the key and expiry.
    sig: String,
}

/// Download through a signed link made by `GET /api/v1/jobs/{id}/artifacts/{path}` (local
/// store). No credentials: the signature is one. Expired or altered links are refused.
#[utoipa::path(get, path = "/api/v1/artifacts/download", tag = "storage", params(DownloadParams),
    responses(
        (status = 200, description = "The file", content_type = "application/octet-stream", body = Vec<u8>),
        (status = 403, description = "Expired or altered link", body = ErrorBody),
        (status = 404, body = ErrorBody),
    ))]
pub async fn artifact_download(
    State(state): State<AppState>,
    ApiQuery(params): ApiQuery<DownloadParams>,
) -> ApiResult<Response> {
    let (size, name, stream) = state.app.artifact_download(&params.key, params.expires, &params.sig).await?;
    // Saved under the artefact's own name (a header carries ASCII only: others become `_`).
    let ascii: String = name.chars().map(|c| if c.is_ascii_graphic() || c == ' ' { c } else { '_' }).collect();
    let file = axum_extra::response::Attachment::new(Body::from_stream(stream))
        .filename(ascii)
        .content_type("application/octet-stream");
    Ok(([(header::CONTENT_LENGTH, size.to_string()), (header::CACHE_CONTROL, "private, no-store".to_string())], file)
        .into_response())
}

/// The tenant's volumes.
#[utoipa::path(get, path = "/api/v1/volumes", tag = "storage", security(("bearer" = [])),
    responses((status = 200, body = Vec<Volume>)))]
pub async fn volumes_list(State(state): State<AppState>, Auth(caller): Auth) -> ApiResult<Json<Vec<Volume>>> {
    Ok(Json(state.app.volumes_list(&caller).await?))
}

/// Create a named volume, within the tenant's storage quota.
#[utoipa::path(post, path = "/api/v1/volumes", tag = "storage", request_body = VolumeCreate, security(("bearer" = [])),
    responses(
        (status = 201, body = Volume),
        (status = 409, description = "The name is taken", body = ErrorBody),
        (status = 422, description = "Bad input, or over the storage quota (field `size`)", body = ErrorBody),
    ))]
pub async fn volume_create(
    State(state): State<AppState>,
    Auth(caller): Auth,
    ApiJson(request): ApiJson<VolumeCreate>,
) -> ApiResult<(StatusCode, Json<Volume>)> {
    Ok((StatusCode::CREATED, Json(state.app.volume_create(&caller, request).await?)))
}

/// Delete a volume and its content.
#[utoipa::path(delete, path = "/api/v1/volumes/{name}", tag = "storage",
    params(("name" = String, Path, description = "Volume name")), security(("bearer" = [])),
    responses((status = 204, description = "Deleted"), (status = 404, body = ErrorBody),
        (status = 409, description = "Mounted by an unfinished job (named in the message)", body = ErrorBody)))]
pub async fn volume_delete(
    State(state): State<AppState>,
    Auth(caller): Auth,
    Path(name): Path<String>,
) -> ApiResult<StatusCode> {
    state.app.volume_delete(&caller, &name).await?;
    Ok(StatusCode::NO_CONTENT)
}

/// The tenant's storage policy (retention, quota) and what its volumes use.
#[utoipa::path(get, path = "/api/v1/storage", tag = "storage", security(("bearer" = [])),
    responses((status = 200, body = StorageReport)))]
pub async fn storage_get(State(state): State<AppState>, Auth(caller): Auth) -> ApiResult<Json<StorageReport>> {
    Ok(Json(state.app.storage_report(&caller).await?))
}

/// Set a tenant's storage policy (platform admins): log and artefact retention in days after
/// a job ends, and the storage quota for volumes. `null` keeps forever / sets no limit.
#[utoipa::path(put, path = "/api/v1/admin/tenants/{tenant}/storage", tag = "admin", request_body = StoragePolicy,
    params(("tenant" = String, Path, description = "Tenant name")), security(("bearer" = [])),
    responses(
        (status = 204, description = "Set"),
        (status = 403, body = ErrorBody),
        (status = 404, body = ErrorBody),
        (status = 422, body = ErrorBody),
    ))]
pub async fn storage_policy_put(
    State(state): State<AppState>,
    Auth(caller): Auth,
    Path(tenant): Path<String>,
    ApiJson(policy): ApiJson<StoragePolicy>,
) -> ApiResult<StatusCode> {
    state.app.storage_policy_set(&caller, &tenant, &policy).await?;
    Ok(StatusCode::NO_CONTENT)
}
