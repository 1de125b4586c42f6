//! Experiments: hyperparameter searches whose trials are jobs (see `app/experiments.rs`).

use axum::Json;
use axum::extract::State;
use axum::http::StatusCode;
use trainyard_core::api::ErrorBody;
use trainyard_core::experiments::{
    Experiment, ExperimentAsk, ExperimentAsked, ExperimentCreate, ExperimentDetail, ExperimentPreview, ExperimentTell,
};

use crate::http::AppState;
use crate::http::error::ApiResult;
use crate::http::extract::{ApiJson, Auth, ExperimentId};

/// Start a search: the template, the parameters every trial shares, the space and the
/// searcher. Everything is checked first (every bad field named at once); nothing runs before.
#[utoipa::path(post, path = "/api/v1/experiments", tag = "experiments", request_body = ExperimentCreate,
    security(("bearer" = [])),
    responses((status = 201, body = Experiment), (status = 409, body = ErrorBody), (status = 422, body = ErrorBody)))]
pub async fn experiment_create(
    State(state): State<AppState>,
    Auth(caller): Auth,
    ApiJson(create): ApiJson<ExperimentCreate>,
) -> ApiResult<(StatusCode, Json<Experiment>)> {
    Ok((StatusCode::CREATED, Json(state.app.experiment_create(&caller, create).await?)))
}

/// What a search would cost at most: its rungs, the trials reaching each, the steps, GPU-hours
/// and wall time (from the tenant's latest run of the template). Nothing is stored.
#[utoipa::path(post, path = "/api/v1/experiments/preview", tag = "experiments", request_body = ExperimentCreate,
    security(("bearer" = [])),
    responses((status = 200, body = ExperimentPreview), (status = 422, body = ErrorBody)))]
pub async fn experiment_preview(
    State(state): State<AppState>,
    Auth(caller): Auth,
    ApiJson(create): ApiJson<ExperimentCreate>,
) -> ApiResult<Json<ExperimentPreview>> {
    Ok(Json(state.app.experiment_preview(&caller, create).await?))
}

/// The tenant's experiments, newest first.
#[utoipa::path(get, path = "/api/v1/experiments", tag = "experiments", security(("bearer" = [])),
    responses((status = 200, body = Vec<Experiment>)))]
pub async fn experiments_list(State(state): State<AppState>, Auth(caller): Auth) -> ApiResult<Json<Vec<Experiment>>> {
    Ok(Json(state.app.experiments_list(&caller).await?))
}

/// An experiment with every trial: its parameters, runs per rung (each a job), metric values.
#[utoipa::path(get, path = "/api/v1/experiments/{id}", tag = "experiments",
    params(("id" = String, Path, description = "Experiment id")), security(("bearer" = [])),
    responses((status = 200, body = ExperimentDetail), (status = 404, body = ErrorBody)))]
pub async fn experiment_get(
    State(state): State<AppState>,
    Auth(caller): Auth,
    ExperimentId(id): ExperimentId,
) -> ApiResult<Json<ExperimentDetail>> {
    Ok(Json(state.app.experiment_show(&caller, id).await?))
}

/// No new runs until resumed; runs under way finish their rung.
#[utoipa::path(post, path = "/api/v1/experiments/{id}/pause", tag = "experiments",
    params(("id" = String, Path, description = "Experiment id")), security(("bearer" = [])),
    responses((status = 200, body = Experiment), (status = 404, body = ErrorBody), (status = 409, body = ErrorBody)))]
pub async fn experiment_pause(
    State(state): State<AppState>,
    Auth(caller): Auth,
    ExperimentId(id): ExperimentId,
) -> ApiResult<Json<Experiment>> {
    Ok(Json(state.app.experiment_pause(&caller, id).await?))
}

#[utoipa::path(post, path = "/api/v1/experiments/{id}/resume", tag = "experiments",
    params(("id" = String, Path, description = "Experiment id")), security(("bearer" = [])),
    responses((status = 200, body = Experiment), (status = 404, body = ErrorBody), (status = 409, body = ErrorBody)))]
pub async fn experiment_resume(
    State(state): State<AppState>,
    Auth(caller): Auth,
    ExperimentId(id): ExperimentId,
) -> ApiResult<Json<Experiment>> {
    Ok(Json(state.app.experiment_resume(&caller, id).await?))
}

/// End the search: every trial's job still queued or running is cancelled.
#[utoipa::path(post, path = "/api/v1/experiments/{id}/cancel", tag = "experiments",
    params(("id" = String, Path, description = "Experiment id")), security(("bearer" = [])),
    responses((status = 200, body = Experiment), (status = 404, body = ErrorBody), (status = 409, body = ErrorBody)))]
pub async fn experiment_cancel(
    State(state): State<AppState>,
    Auth(caller): Auth,
    ExperimentId(id): ExperimentId,
) -> ApiResult<Json<Experiment>> {
    Ok(Json(state.app.experiment_cancel(&caller, id).await?))
}

/// An outside searcher (Optuna, a team's own; searcher method `custom`) asks for a trial with
/// these parameters: it runs as a job to `max_length`, and its value appears on the trial.
#[utoipa::path(post, path = "/api/v1/experiments/{id}/ask", tag = "experiments", request_body = ExperimentAsk,
    params(("id" = String, Path, description = "Experiment id")), security(("bearer" = [])),
    responses((status = 201, body = ExperimentAsked), (status = 404, body = ErrorBody), (status = 409, body = ErrorBody),
        (status = 422, body = ErrorBody)))]
pub async fn experiment_ask(
    State(state): State<AppState>,
    Auth(caller): Auth,
    ExperimentId(id): ExperimentId,
    ApiJson(ask): ApiJson<ExperimentAsk>,
) -> ApiResult<(StatusCode, Json<ExperimentAsked>)> {
    Ok((StatusCode::CREATED, Json(state.app.experiment_ask(&caller, id, ask).await?)))
}

/// The outside searcher tells the experiment it asks for no more trials (`finished`): it
/// completes when the runs under way end.
#[utoipa::path(post, path = "/api/v1/experiments/{id}/tell", tag = "experiments", request_body = ExperimentTell,
    params(("id" = String, Path, description = "Experiment id")), security(("bearer" = [])),
    responses((status = 200, body = Experiment), (status = 404, body = ErrorBody), (status = 409, body = ErrorBody)))]
pub async fn experiment_tell(
    State(state): State<AppState>,
    Auth(caller): Auth,
    ExperimentId(id): ExperimentId,
    ApiJson(tell): ApiJson<ExperimentTell>,
) -> ApiResult<Json<Experiment>> {
    Ok(Json(state.app.experiment_tell(&caller, id, tell).await?))
}
