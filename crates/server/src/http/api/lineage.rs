use axum::Json;
use axum::extract::{Path, State};
use serde::Deserialize;
use trainyard_core::api::ErrorBody;
use trainyard_core::lineage::Lineage;
use utoipa::IntoParams;

use crate::app::lineage::LineageRoot;
use crate::http::AppState;
use crate::http::error::ApiResult;
use crate::http::extract::{ApiQuery, Auth, JobId};

#[derive(Debug, Deserialize, IntoParams)]
#[serde(deny_unknown_fields)]
#[into_params(parameter_in = Query)]
pub struct LineageQuery {
    /// Levels to walk each way (1 to 50; 5 when not given).
    depth: Option<u32>,
}

/// Where a job came from and what came of it: upstream the dataset versions it read (and the
/// jobs they were registered from, and so on) and the job it reran; downstream the dataset
/// versions registered from its output, the artefacts it uploaded and its reruns, and the jobs
/// that read those datasets. Nodes carry their depth (negative upstream) and the node they were
/// reached from; edges point the way data flowed.
#[utoipa::path(get, path = "/api/v1/jobs/{id}/lineage", tag = "jobs",
    params(("id" = String, Path, description = "Job id"), LineageQuery), security(("bearer" = [])),
    responses((status = 200, body = Lineage), (status = 404, body = ErrorBody), (status = 422, body = ErrorBody)))]
pub async fn job_lineage(
    State(state): State<AppState>,
    Auth(caller): Auth,
    JobId(job_id): JobId,
    ApiQuery(query): ApiQuery<LineageQuery>,
) -> ApiResult<Json<Lineage>> {
    Ok(Json(state.app.lineage(&caller, LineageRoot::Job(job_id), query.depth).await?))
}

/// Where a dataset version came from (the job whose output it was registered from, and what
/// that job read) and which jobs read it, with what came of them.
#[utoipa::path(get, path = "/api/v1/datasets/{name}/{version}/lineage", tag = "datasets",
    params(("name" = String, Path, description = "Dataset name"), ("version" = String, Path, description = "Version"),
        LineageQuery),
    security(("bearer" = [])),
    responses((status = 200, body = Lineage), (status = 404, body = ErrorBody), (status = 422, body = ErrorBody)))]
pub async fn dataset_lineage(
    State(state): State<AppState>,
    Auth(caller): Auth,
    Path((name, version)): Path<(String, String)>,
    ApiQuery(query): ApiQuery<LineageQuery>,
) -> ApiResult<Json<Lineage>> {
    Ok(Json(state.app.lineage(&caller, LineageRoot::Dataset { name, version }, query.depth).await?))
}
