use axum::Json;
use axum::extract::{Path, State};
use axum::http::StatusCode;
use trainyard_core::api::{Dataset, DatasetRegister, ErrorBody};

use crate::AppState;
use crate::error::ApiResult;
use crate::extract::{ApiJson, Auth};

/// Register a dataset version (immutable): described in full, or from a data-pack job's output.
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
