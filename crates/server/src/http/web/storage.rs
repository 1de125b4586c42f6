//! Storage pages: a job's artefacts (on the job's page, downloaded through a fresh signed
//! link) and checkpoints (streamed), the tenant's datasets, and its volumes (list, create, delete).

use askama::Template;
use axum::extract::{Path, State};
use axum::http::StatusCode;
use axum::response::{IntoResponse, Redirect, Response};
use trainyard_core::api::{AccessMode, VolumeCreate};
use trainyard_core::error::ObjectKind;
use trainyard_core::resources::{Memory, human_memory};
use trainyard_core::{Error, Result};
use uuid::Uuid;

use super::{CsrfForm, Nav, WebAuth, WebResult, can_write, render, when};
use crate::app::App;
use crate::http::AppState;
use crate::http::extract::parse_id;

/// How long the link behind a download button lives: just long enough to follow it.
const PAGE_LINK_SECONDS: u64 = 60;

/// One artefact row on a job's page.
pub struct ArtifactRow {
    pub path: String,
    /// `/jobs/<id>/artifacts/<path>`, segments percent-encoded.
    pub href: String,
    pub size: String,
    pub sha256: String,
    pub modified: String,
}

/// A job's artefacts for its page.
pub async fn artifact_rows(app: &App, auth: &WebAuth, job_id: Uuid) -> Result<Vec<ArtifactRow>> {
    let list = app.artifacts_list(&auth.caller, job_id).await?;
    Ok(list
        .into_iter()
        .map(|a| {
            let mut href = url::Url::parse("http://host/jobs").expect("a valid base URL");
            if let Ok(mut segments) = href.path_segments_mut() {
                segments.push(&job_id.to_string()).push("artifacts").extend(a.path.split('/'));
            }
            ArtifactRow {
                href: href.path().to_string(),
                size: human_memory(a.size_bytes),
                sha256: a.sha256.unwrap_or_else(|| "—".into()),
                modified: when(&a.modified_at),
                path: a.path,
            }
        })
        .collect())
}

/// A download button: a fresh short-lived signed link, followed at once.
pub async fn artifact_download(
    State(state): State<AppState>,
    auth: WebAuth,
    Path((id, path)): Path<(String, String)>,
) -> WebResult<Response> {
    let job_id = parse_id(&id, ObjectKind::Job)?;
    let link = state.app.artifact_link(&auth.caller, job_id, &path, Some(PAGE_LINK_SECONDS)).await?;
    Ok(Redirect::to(&link.url).into_response())
}

/// One checkpoint row on a job's page.
pub struct CheckpointRow {
    pub step: u64,
    /// `/jobs/<id>/checkpoints/<step>`: the file, streamed.
    pub href: String,
    pub size: String,
    pub saved: String,
    pub path: String,
}

/// A job's checkpoints for its page: the folder (as the job sees it), the rows, and why there
/// are none when there is a reason to say.
pub async fn checkpoint_rows(
    app: &App,
    auth: &WebAuth,
    job_id: Uuid,
) -> Result<(Option<String>, Vec<CheckpointRow>, Option<String>)> {
    let listed = match app.job_checkpoints(&auth.caller, job_id).await {
        Ok(listed) => listed,
        // A folder the server will not read is said on the page, not a failed page.
        Err(Error::Conflict(note)) => return Ok((None, Vec::new(), Some(note))),
        Err(other) => return Err(other),
    };
    let rows = listed
        .checkpoints
        .into_iter()
        .map(|c| CheckpointRow {
            step: c.step,
            href: format!("/jobs/{job_id}/checkpoints/{}", c.step),
            size: human_memory(c.size_bytes),
            saved: when(&c.saved_at),
            path: c.path,
        })
        .collect();
    Ok((listed.folder, rows, listed.note))
}

/// A checkpoint's download button: the file, streamed as the API streams it.
pub async fn checkpoint_download(
    State(state): State<AppState>,
    auth: WebAuth,
    Path((id, step)): Path<(String, String)>,
) -> WebResult<Response> {
    let job_id = parse_id(&id, ObjectKind::Job)?;
    let step: u64 = step.parse().map_err(|_| Error::not_found(ObjectKind::Checkpoint))?;
    let open = state.app.checkpoint_open(&auth.caller, job_id, step).await?;
    let name = open.checkpoint.path.rsplit('/').next().unwrap_or("checkpoint.pt").to_string();
    let stream = tokio_util::io::ReaderStream::with_capacity(tokio::fs::File::from_std(open.file), 1 << 20);
    let file = axum_extra::response::Attachment::new(axum::body::Body::from_stream(stream))
        .filename(name)
        .content_type("application/octet-stream");
    Ok(([(axum::http::header::CONTENT_LENGTH, open.checkpoint.size_bytes.to_string())], file).into_response())
}

pub struct DatasetRow {
    pub reference: String,
    /// Its lineage page.
    pub lineage: String,
    pub format: String,
    pub samples: String,
    pub size: String,
    pub content_hash: String,
    pub uri: String,
    pub created: String,
}

#[derive(Template)]
#[template(path = "datasets.html")]
struct DatasetsPage {
    nav: Nav,
    datasets: Vec<DatasetRow>,
}

pub async fn datasets(State(state): State<AppState>, auth: WebAuth) -> WebResult<Response> {
    let datasets = state
        .app
        .datasets_list(&auth.caller)
        .await?
        .into_iter()
        .map(|d| DatasetRow {
            reference: format!("{}@{}", d.name, d.version),
            // Names and versions are letters, digits, '.', '_' and '-': nothing to encode.
            lineage: format!("/datasets/{}/{}/lineage", d.name, d.version),
            format: d.format,
            samples: d.samples.map(|s| s.to_string()).unwrap_or_else(|| "—".into()),
            size: d.size_bytes.map(|b| human_memory(b.max(0) as u64)).unwrap_or_else(|| "—".into()),
            content_hash: d.content_hash,
            uri: d.uri,
            created: when(&d.created_at),
        })
        .collect();
    Ok(render(&DatasetsPage { nav: Nav::new(&auth, "datasets"), datasets }))
}

pub struct VolumeRow {
    pub name: String,
    pub size: String,
    pub access_mode: &'static str,
    pub storage_class: String,
    pub path: String,
    pub created: String,
    pub pending_reason: Option<String>,
}

#[derive(Template)]
#[template(path = "volumes.html")]
struct VolumesPage {
    nav: Nav,
    volumes: Vec<VolumeRow>,
    used: String,
    dataset_bytes: String,
    quota: String,
    can_write: bool,
    access_modes: Vec<&'static str>,
    error: Option<String>,
}

async fn volumes_page(state: &AppState, auth: &WebAuth, error: Option<String>) -> WebResult<Response> {
    let report = state.app.storage_report(&auth.caller).await?;
    let volumes = state
        .app
        .volumes_list(&auth.caller)
        .await?
        .into_iter()
        .map(|v| VolumeRow {
            size: human_memory(v.size_bytes),
            access_mode: v.access_mode.as_str(),
            storage_class: v.storage_class.unwrap_or_else(|| "(cluster default)".into()),
            path: v.path,
            created: when(&v.created_at),
            pending_reason: v.pending_reason,
            name: v.name,
        })
        .collect();
    let failed = error.is_some();
    let mut response = render(&VolumesPage {
        nav: Nav::new(auth, "volumes"),
        volumes,
        used: human_memory(report.volume_bytes),
        dataset_bytes: human_memory(report.dataset_bytes),
        quota: report.policy.storage_quota_bytes.map_or_else(|| "no limit".into(), human_memory),
        can_write: can_write(&auth.caller),
        access_modes: vec!["ReadWriteOnce", "ReadOnlyMany", "ReadWriteMany"],
        error,
    });
    if failed {
        *response.status_mut() = StatusCode::UNPROCESSABLE_ENTITY;
    }
    Ok(response)
}

pub async fn volumes(State(state): State<AppState>, auth: WebAuth) -> WebResult<Response> {
    volumes_page(&state, &auth, None).await
}

pub async fn volume_create(
    State(state): State<AppState>,
    auth: WebAuth,
    CsrfForm(form): CsrfForm,
) -> WebResult<Response> {
    let field = |name: &str| form.get(name).map(|v| v.trim()).unwrap_or_default();
    let request = Memory::parse(field("size")).map_err(|e| Error::invalid("size", e)).and_then(|size| {
        Ok(VolumeCreate {
            name: field("name").to_string(),
            size,
            access_mode: AccessMode::parse(field("access_mode"))
                .ok_or_else(|| Error::invalid("access_mode", "one of ReadWriteOnce, ReadOnlyMany, ReadWriteMany"))?,
            storage_class: Some(field("storage_class")).filter(|c| !c.is_empty()).map(str::to_string),
        })
    });
    let result = match request {
        Ok(request) => state.app.volume_create(&auth.caller, request).await.map(|_| ()),
        Err(err) => Err(err),
    };
    match result {
        Ok(()) => Ok(Redirect::to("/volumes").into_response()),
        Err(err @ (Error::InvalidInput { .. } | Error::InvalidFields(_) | Error::Conflict(_))) => {
            volumes_page(&state, &auth, Some(err.to_string())).await
        }
        Err(err) => Err(err.into()),
    }
}

pub async fn volume_delete(
    State(state): State<AppState>,
    auth: WebAuth,
    Path(name): Path<String>,
    CsrfForm(_form): CsrfForm,
) -> WebResult<Response> {
    state.app.volume_delete(&auth.caller, &name).await?;
    Ok(Redirect::to("/volumes").into_response())
}
