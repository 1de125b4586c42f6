use axum::Json;
use axum::extract::State;
use serde::Deserialize;
use trainyard_core::api::ErrorBody;
use trainyard_core::compare::Comparison;
use utoipa::IntoParams;

use crate::app::compare::compared_ids;
use crate::http::AppState;
use crate::http::error::ApiResult;
use crate::http::extract::{ApiQuery, Auth};

#[derive(Debug, Deserialize, IntoParams)]
#[serde(deny_unknown_fields)]
#[into_params(parameter_in = Query)]
pub struct CompareQuery {
    /// 2 to 8 job ids, separated by commas.
    #[serde(default)]
    jobs: String,
    /// Every field, not only those that differ (ids and times too).
    #[serde(default)]
    all: bool,
}

/// Two to eight runs of the caller's tenant compared field by field, in sections: parameters,
/// spec, template, code, data, environment (every package of the latest attempt's run record),
/// hardware, outcome (state, exit codes, each metric's last value and count, outputs) and link
/// (a rerun's original). Only the fields that differ unless `all`; each field has a value per
/// run, in the order asked. Metric series themselves are at `GET /api/v1/jobs/{id}/metrics`.
#[utoipa::path(get, path = "/api/v1/compare", tag = "jobs", params(CompareQuery), security(("bearer" = [])),
    responses(
        (status = 200, body = Comparison),
        (status = 404, description = "A job that is not the tenant's", body = ErrorBody),
        (status = 422, description = "Fewer than 2 or more than 8 jobs", body = ErrorBody),
    ))]
pub async fn compare_get(
    State(state): State<AppState>,
    Auth(caller): Auth,
    ApiQuery(query): ApiQuery<CompareQuery>,
) -> ApiResult<Json<Comparison>> {
    let ids = compared_ids(&query.jobs)?;
    Ok(Json(state.app.runs_compare(&caller, &ids, query.all).await?))
}
