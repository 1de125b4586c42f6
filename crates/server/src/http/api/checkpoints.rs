//! A job's checkpoints: listed from its checkpoint volume, and each streamed.

use axum::Json;
use axum::body::Body;
use axum::extract::{Path, State};
use axum::http::header;
use axum::response::{IntoResponse, Response};
use trainyard_core::Error;
use trainyard_core::api::{ErrorBody, JobCheckpoints};
use trainyard_core::error::ObjectKind;

use crate::http::AppState;
use crate::http::error::ApiResult;
use crate::http::extract::{Auth, JobId};

/// The checkpoints a job wrote (step, size, time saved, path as the job sees it), oldest step
/// first, read from its checkpoint volume; `note` says why there are none the server can list.
#[utoipa::path(get, path = "/api/v1/jobs/{id}/checkpoints", tag = "jobs",
    params(("id" = String, Path, description = "Job id")), security(("bearer" = [])),
    responses((status = 200, body = JobCheckpoints), (status = 404, body = ErrorBody),
        (status = 409, description = "The checkpoint folder is a link, which the server does not follow", body = ErrorBody)))]
pub async fn checkpoints_list(
    State(state): State<AppState>,
    Auth(caller): Auth,
    JobId(job_id): JobId,
) -> ApiResult<Json<JobCheckpoints>> {
    Ok(Json(state.app.job_checkpoints(&caller, job_id).await?))
}

/// One checkpoint's file, streamed (`ckpt-<step>.pt`, the engine's `torch.save` of the model,
/// optimizer and data position).
#[utoipa::path(get, path = "/api/v1/jobs/{id}/checkpoints/{step}", tag = "jobs",
    params(("id" = String, Path, description = "Job id"), ("step" = u64, Path, description = "The checkpoint's step")),
    security(("bearer" = [])),
    responses(
        (status = 200, description = "The file", content_type = "application/octet-stream", body = Vec<u8>),
        (status = 404, description = "No such job, or no checkpoint at that step", body = ErrorBody),
        (status = 409, description = "On Kubernetes, or the file is a link the server does not follow", body = ErrorBody),
    ))]
pub async fn checkpoint_download(
    State(state): State<AppState>,
    Auth(caller): Auth,
    JobId(job_id): JobId,
    Path((_, step)): Path<(String, String)>,
) -> ApiResult<Response> {
    // A step that is not a number names no checkpoint.
    let step: u64 = step.parse().map_err(|_| Error::not_found(ObjectKind::Checkpoint))?;
    let open = state.app.checkpoint_open(&caller, job_id, step).await?;
    let name = open.checkpoint.path.rsplit('/').next().unwrap_or("checkpoint.pt").to_string();
    let stream = tokio_util::io::ReaderStream::with_capacity(tokio::fs::File::from_std(open.file), 1 << 20);
    let file = axum_extra::response::Attachment::new(Body::from_stream(stream))
        .filename(name)
        .content_type("application/octet-stream");
    Ok((
        [
            (header::CONTENT_LENGTH, open.checkpoint.size_bytes.to_string()),
            (header::CACHE_CONTROL, "private, no-store".to_string()),
        ],
        file,
    )
        .into_response())
}
