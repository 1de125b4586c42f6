//! MLflow's tracking REST API under `/api/2.0/mlflow/` (issue 42), so that the unmodified
//! `mlflow` client logs into Trainyard (`MLFLOW_TRACKING_URI=<server>`,
//! `MLFLOW_TRACKING_TOKEN=<API token>`). The messages are those of MLflow's
//! `mlflow/protos/service.proto` in its JSON form (snake_case names, int64 as numbers, ids as
//! strings, unknown fields ignored as protobuf does); errors are MLflow's
//! `{"error_code", "message"}` with its codes, never Trainyard's shape, so that the client raises
//! `MlflowException` with the right `error_code`. Handlers are thin: decode, call one `App`
//! operation in `app/tracking.rs`, shape the answer. These routes are MLflow's API, defined by
//! its proto, and so are not in Trainyard's OpenAPI document (docs/tracking.md).

use axum::Json;
use axum::body::Body;
use axum::extract::{DefaultBodyLimit, FromRequest, FromRequestParts, Path, Request, State};
use axum::http::request::Parts;
use axum::http::{HeaderValue, StatusCode, header};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use serde::{Deserialize, Deserializer, Serialize, Serializer};
use serde_json::{Value, json};
use trainyard_core::Error;
use trainyard_core::error::ObjectKind;
use trainyard_core::tracking::{Experiment, KeyValue, LogBatch, Metric, Run, RunInfo};
use trainyard_store::metrics::JOB_TOKEN_PREFIX;
use uuid::Uuid;

use crate::app::tracking::{ArtifactEntry, ExperimentsSearch, RunCreate, RunsSearch, Tracker};
use crate::http::AppState;
use crate::http::error::ApiError;
use crate::http::extract::{ApiJson, ApiQuery, Auth, client_ip};
use crate::http::routes::RouteTable;

/// Where MLflow's routes are (the edge answers them in MLflow's error shape): its tracking API
/// and its artefact proxy.
pub const MLFLOW_PREFIX: &str = "/api/2.0/mlflow/";
pub const MLFLOW_ARTIFACTS_PREFIX: &str = "/api/2.0/mlflow-artifacts/";

/// Whether a route is one of MLflow's, answered in MLflow's error shape.
pub fn is_mlflow_route(route: &str) -> bool {
    route.starts_with(MLFLOW_PREFIX) || route.starts_with(MLFLOW_ARTIFACTS_PREFIX)
}

pub fn routes() -> RouteTable {
    RouteTable::new()
        .route("/api/2.0/mlflow/experiments/get-by-name", get(experiment_get_by_name))
        .route("/api/2.0/mlflow/experiments/create", post(experiment_create))
        .route("/api/2.0/mlflow/experiments/get", get(experiment_get))
        .route("/api/2.0/mlflow/experiments/search", post(experiments_search).get(experiments_search_get))
        .route("/api/2.0/mlflow/experiments/delete", post(experiment_delete))
        .route("/api/2.0/mlflow/experiments/restore", post(experiment_restore))
        .route("/api/2.0/mlflow/experiments/update", post(experiment_update))
        .route("/api/2.0/mlflow/experiments/set-experiment-tag", post(experiment_tag_set))
        .route("/api/2.0/mlflow/experiments/delete-experiment-tag", post(experiment_tag_delete))
        .route("/api/2.0/mlflow/runs/create", post(run_create))
        .route("/api/2.0/mlflow/runs/get", get(run_get))
        .route("/api/2.0/mlflow/runs/update", post(run_update))
        .route("/api/2.0/mlflow/runs/search", post(runs_search))
        .route("/api/2.0/mlflow/runs/delete", post(run_delete))
        .route("/api/2.0/mlflow/runs/restore", post(run_restore))
        .route("/api/2.0/mlflow/runs/delete-tag", post(tag_delete))
        .route("/api/2.0/mlflow/runs/log-metric", post(log_metric))
        .route("/api/2.0/mlflow/runs/log-parameter", post(log_parameter))
        .route("/api/2.0/mlflow/runs/log-batch", post(log_batch))
        .route("/api/2.0/mlflow/runs/set-tag", post(set_tag))
        .route("/api/2.0/mlflow/metrics/get-history", get(metric_history))
        .route("/api/2.0/mlflow/artifacts/list", get(artifacts_list))
        .route("/api/2.0/mlflow/logged-models/search", post(logged_models_search))
        .route("/api/2.0/mlflow-artifacts/artifacts", get(proxy_list))
        .route(
            "/api/2.0/mlflow-artifacts/artifacts/{*path}",
            get(proxy_get).put(proxy_put).layer(DefaultBodyLimit::disable()),
        )
}

// ---- errors: MLflow's shape and codes ----

/// An error on its way to an MLflow client.
#[derive(Debug)]
pub struct MlflowError(ApiError);

impl From<Error> for MlflowError {
    fn from(err: Error) -> Self {
        MlflowError(ApiError::Domain(err))
    }
}

impl From<ApiError> for MlflowError {
    fn from(err: ApiError) -> Self {
        MlflowError(err)
    }
}

impl MlflowError {
    /// The status, MLflow's error code (`databricks.proto:ErrorCode`) and the message.
    fn parts(&self) -> (StatusCode, &'static str, String) {
        match &self.0 {
            ApiError::Domain(err) => match err {
                Error::InvalidInput { .. } | Error::InvalidFields(_) => {
                    (StatusCode::BAD_REQUEST, "INVALID_PARAMETER_VALUE", err.to_string())
                }
                Error::NotFound { .. } => (StatusCode::NOT_FOUND, "RESOURCE_DOES_NOT_EXIST", err.to_string()),
                Error::AlreadyExists(msg) => (StatusCode::BAD_REQUEST, "RESOURCE_ALREADY_EXISTS", msg.clone()),
                Error::Conflict(msg) => (StatusCode::BAD_REQUEST, "INVALID_STATE", msg.clone()),
                Error::Unauthenticated(msg) => (StatusCode::UNAUTHORIZED, "UNAUTHENTICATED", msg.clone()),
                Error::Forbidden(msg) => (StatusCode::FORBIDDEN, "PERMISSION_DENIED", msg.clone()),
                Error::TooManyRequests { message, .. } => {
                    (StatusCode::TOO_MANY_REQUESTS, "REQUEST_LIMIT_EXCEEDED", message.clone())
                }
                Error::Unavailable(msg) | Error::Fenced(msg) => {
                    (StatusCode::SERVICE_UNAVAILABLE, "TEMPORARILY_UNAVAILABLE", msg.clone())
                }
                Error::Internal(_) => (
                    StatusCode::INTERNAL_SERVER_ERROR,
                    "INTERNAL_ERROR",
                    "something went wrong on our side; it has been logged".into(),
                ),
            },
            ApiError::MalformedJson(msg) => (StatusCode::BAD_REQUEST, "MALFORMED_REQUEST", msg.clone()),
            ApiError::PayloadTooLarge(msg) => (StatusCode::PAYLOAD_TOO_LARGE, "INVALID_PARAMETER_VALUE", msg.clone()),
            ApiError::UnsupportedMediaType => (
                StatusCode::UNSUPPORTED_MEDIA_TYPE,
                "BAD_REQUEST",
                "send the body as JSON with `Content-Type: application/json`".into(),
            ),
        }
    }
}

impl IntoResponse for MlflowError {
    fn into_response(self) -> Response {
        if let ApiError::Domain(Error::Internal(cause)) = &self.0 {
            tracing::error!(%cause, "internal error");
        }
        let (status, code, message) = self.parts();
        let mut response = (status, Json(json!({"error_code": code, "message": message}))).into_response();
        match &self.0 {
            ApiError::Domain(Error::Unauthenticated(_)) => {
                response.headers_mut().insert(header::WWW_AUTHENTICATE, HeaderValue::from_static("Bearer"));
            }
            ApiError::Domain(Error::TooManyRequests { retry_after_secs, .. }) => {
                response.headers_mut().insert(header::RETRY_AFTER, HeaderValue::from(*retry_after_secs));
            }
            _ if status == StatusCode::SERVICE_UNAVAILABLE => {
                response.headers_mut().insert(header::RETRY_AFTER, HeaderValue::from_static("1"));
            }
            _ => {}
        }
        response
    }
}

type MlflowResult<T> = Result<T, MlflowError>;

// ---- extractors: Trainyard's, answering in MLflow's shape ----

/// The caller, from `MLFLOW_TRACKING_TOKEN`: a user's API token, as [`Auth`] finds it, or a job's
/// token or a replica's (what its replicas get), as [`App::mlflow_job_authenticate`] finds it.
///
/// [`App::mlflow_job_authenticate`]: crate::app::App::mlflow_job_authenticate
pub struct MlflowAuth(pub Tracker);

impl FromRequestParts<AppState> for MlflowAuth {
    type Rejection = MlflowError;

    async fn from_request_parts(parts: &mut Parts, state: &AppState) -> Result<Self, MlflowError> {
        let job_token = parts
            .headers
            .get(header::AUTHORIZATION)
            .and_then(|v| v.to_str().ok())
            .and_then(|v| v.strip_prefix("Bearer ").or_else(|| v.strip_prefix("bearer ")))
            .map(str::trim)
            .filter(|token| token.starts_with(JOB_TOKEN_PREFIX));
        Ok(MlflowAuth(if let Some(token) = job_token {
            state.app.mlflow_job_authenticate(token, client_ip(parts)).await?
        } else {
            Tracker::User(Auth::from_request_parts(parts, state).await?.0)
        }))
    }
}

/// A JSON body, decoded as [`ApiJson`] does (unknown fields are ignored: protobuf's rule).
pub struct MlflowJson<T>(pub T);

impl<S: Send + Sync, T: serde::de::DeserializeOwned> FromRequest<S> for MlflowJson<T> {
    type Rejection = MlflowError;

    async fn from_request(req: Request, state: &S) -> Result<Self, MlflowError> {
        Ok(MlflowJson(ApiJson::<T>::from_request(req, state).await?.0))
    }
}

/// The query of a GET call (the client sends a GET's message as query parameters).
pub struct MlflowQuery<T>(pub T);

impl<S: Send + Sync, T: serde::de::DeserializeOwned> FromRequestParts<S> for MlflowQuery<T> {
    type Rejection = MlflowError;

    async fn from_request_parts(parts: &mut Parts, state: &S) -> Result<Self, MlflowError> {
        Ok(MlflowQuery(ApiQuery::<T>::from_request_parts(parts, state).await?.0))
    }
}

// ---- the wire format ----

/// An int64 as protobuf's JSON gives it: a number or a decimal string.
fn proto_i64<'de, D: Deserializer<'de>>(deserializer: D) -> Result<Option<i64>, D::Error> {
    #[derive(Deserialize)]
    #[serde(untagged)]
    enum Int {
        Number(i64),
        Text(String),
    }
    match Option::<Int>::deserialize(deserializer)? {
        None => Ok(None),
        Some(Int::Number(n)) => Ok(Some(n)),
        Some(Int::Text(text)) => text.parse().map(Some).map_err(serde::de::Error::custom),
    }
}

/// A double as protobuf's JSON gives it: a number, or "NaN", "Infinity", "-Infinity".
fn proto_f64<'de, D: Deserializer<'de>>(deserializer: D) -> Result<Option<f64>, D::Error> {
    #[derive(Deserialize)]
    #[serde(untagged)]
    enum Double {
        Number(f64),
        Text(String),
    }
    match Option::<Double>::deserialize(deserializer)? {
        None => Ok(None),
        Some(Double::Number(n)) => Ok(Some(n)),
        Some(Double::Text(text)) => match text.as_str() {
            "NaN" => Ok(Some(f64::NAN)),
            "Infinity" => Ok(Some(f64::INFINITY)),
            "-Infinity" => Ok(Some(f64::NEG_INFINITY)),
            other => other.parse().map(Some).map_err(serde::de::Error::custom),
        },
    }
}

/// A double for protobuf's JSON: JSON has no NaN or infinities, protobuf spells them as strings.
fn proto_f64_out<S: Serializer>(value: &f64, serializer: S) -> Result<S::Ok, S::Error> {
    match *value {
        v if v.is_nan() => serializer.serialize_str("NaN"),
        v if v == f64::INFINITY => serializer.serialize_str("Infinity"),
        v if v == f64::NEG_INFINITY => serializer.serialize_str("-Infinity"),
        v => serializer.serialize_f64(v),
    }
}

#[derive(Debug, Deserialize, Serialize)]
struct WireKeyValue {
    #[serde(default)]
    key: String,
    #[serde(default)]
    value: String,
}

impl From<WireKeyValue> for KeyValue {
    fn from(kv: WireKeyValue) -> Self {
        KeyValue { key: kv.key, value: kv.value }
    }
}

impl From<&KeyValue> for WireKeyValue {
    fn from(kv: &KeyValue) -> Self {
        WireKeyValue { key: kv.key.clone(), value: kv.value.clone() }
    }
}

#[derive(Debug, Deserialize, Serialize)]
struct WireMetric {
    #[serde(default)]
    key: String,
    #[serde(default, deserialize_with = "proto_f64", serialize_with = "proto_f64_out_some")]
    value: Option<f64>,
    #[serde(default, deserialize_with = "proto_i64")]
    timestamp: Option<i64>,
    #[serde(default, deserialize_with = "proto_i64")]
    step: Option<i64>,
}

fn proto_f64_out_some<S: Serializer>(value: &Option<f64>, serializer: S) -> Result<S::Ok, S::Error> {
    proto_f64_out(&value.unwrap_or_default(), serializer)
}

impl WireMetric {
    fn into_metric(self, field: &str) -> Result<Metric, Error> {
        let value = self.value.ok_or_else(|| Error::invalid(format!("{field}.value"), "a metric needs a value"))?;
        let timestamp =
            self.timestamp.ok_or_else(|| Error::invalid(format!("{field}.timestamp"), "a metric needs a timestamp"))?;
        Ok(Metric { key: self.key, value, timestamp, step: self.step.unwrap_or(0) })
    }
}

impl From<&Metric> for WireMetric {
    fn from(m: &Metric) -> Self {
        WireMetric { key: m.key.clone(), value: Some(m.value), timestamp: Some(m.timestamp), step: Some(m.step) }
    }
}

fn experiment_json(e: &Experiment) -> Value {
    json!({
        "experiment_id": e.experiment_id.to_string(),
        "name": e.name,
        "artifact_location": "",
        "lifecycle_stage": e.lifecycle_stage,
        "creation_time": e.creation_time,
        "last_update_time": e.last_update_time,
        "tags": e.tags.iter().map(WireKeyValue::from).collect::<Vec<_>>(),
    })
}

fn run_info_json(info: &RunInfo) -> Value {
    let id = info.run_id.simple().to_string();
    let mut value = json!({
        "run_id": id,
        "run_uuid": id,
        "run_name": info.run_name,
        "experiment_id": info.experiment_id.to_string(),
        "user_id": info.user_id,
        "status": info.status,
        "start_time": info.start_time,
        "artifact_uri": artifact_root(info.run_id),
        "lifecycle_stage": info.lifecycle_stage,
    });
    if let Some(end) = info.end_time {
        value["end_time"] = json!(end);
    }
    value
}

/// A run's artefact root: the client sends what it logs there to this server's artefact proxy.
fn artifact_root(run_id: Uuid) -> String {
    format!("mlflow-artifacts:/{}", run_id.simple())
}

fn run_json(run: &Run) -> Value {
    json!({
        "info": run_info_json(&run.info),
        "data": {
            "metrics": run.metrics.iter().map(WireMetric::from).collect::<Vec<_>>(),
            "params": run.params.iter().map(WireKeyValue::from).collect::<Vec<_>>(),
            "tags": run.tags.iter().map(WireKeyValue::from).collect::<Vec<_>>(),
        },
        "inputs": {},
    })
}

/// MLflow's ids as strings: an experiment's is a number; a run's a UUID (32 hex digits). A
/// malformed id names nothing: 404, as an unknown one.
fn experiment_id_parse(text: Option<&str>) -> Result<i64, Error> {
    let text = text.filter(|t| !t.is_empty()).ok_or_else(|| Error::invalid("experiment_id", "required"))?;
    text.parse().map_err(|_| Error::not_found(ObjectKind::Experiment))
}

fn run_id_parse(run_id: Option<&str>, run_uuid: Option<&str>) -> Result<Uuid, Error> {
    let text = run_id
        .filter(|t| !t.is_empty())
        .or(run_uuid.filter(|t| !t.is_empty()))
        .ok_or_else(|| Error::invalid("run_id", "required"))?;
    Uuid::parse_str(text).map_err(|_| Error::not_found(ObjectKind::Run))
}

fn required<'a>(field: &str, value: &'a Option<String>) -> Result<&'a str, Error> {
    value.as_deref().filter(|v| !v.is_empty()).ok_or_else(|| Error::invalid(field, "required"))
}

// ---- experiments ----

#[derive(Debug, Deserialize)]
struct ExperimentByNameQuery {
    experiment_name: Option<String>,
}

async fn experiment_get_by_name(
    State(state): State<AppState>,
    MlflowAuth(caller): MlflowAuth,
    MlflowQuery(query): MlflowQuery<ExperimentByNameQuery>,
) -> MlflowResult<Json<Value>> {
    let name = required("experiment_name", &query.experiment_name)?;
    let experiment = state.app.mlflow_experiment_by_name(&caller, name).await?;
    Ok(Json(json!({"experiment": experiment_json(&experiment)})))
}

#[derive(Debug, Deserialize)]
struct ExperimentCreateBody {
    name: Option<String>,
    #[serde(default)]
    tags: Vec<WireKeyValue>,
}

async fn experiment_create(
    State(state): State<AppState>,
    MlflowAuth(caller): MlflowAuth,
    MlflowJson(body): MlflowJson<ExperimentCreateBody>,
) -> MlflowResult<Json<Value>> {
    let name = required("name", &body.name)?;
    let tags = body.tags.into_iter().map(KeyValue::from).collect();
    let id = state.app.mlflow_experiment_create(&caller, name, tags).await?;
    Ok(Json(json!({"experiment_id": id.to_string()})))
}

#[derive(Debug, Deserialize)]
struct ExperimentIdBody {
    experiment_id: Option<String>,
}

async fn experiment_delete(
    State(state): State<AppState>,
    MlflowAuth(caller): MlflowAuth,
    MlflowJson(body): MlflowJson<ExperimentIdBody>,
) -> MlflowResult<Json<Value>> {
    let id = experiment_id_parse(body.experiment_id.as_deref())?;
    state.app.mlflow_experiment_delete(&caller, id, true).await?;
    Ok(Json(json!({})))
}

async fn experiment_restore(
    State(state): State<AppState>,
    MlflowAuth(caller): MlflowAuth,
    MlflowJson(body): MlflowJson<ExperimentIdBody>,
) -> MlflowResult<Json<Value>> {
    let id = experiment_id_parse(body.experiment_id.as_deref())?;
    state.app.mlflow_experiment_delete(&caller, id, false).await?;
    Ok(Json(json!({})))
}

#[derive(Debug, Deserialize)]
struct ExperimentUpdateBody {
    experiment_id: Option<String>,
    new_name: Option<String>,
}

async fn experiment_update(
    State(state): State<AppState>,
    MlflowAuth(caller): MlflowAuth,
    MlflowJson(body): MlflowJson<ExperimentUpdateBody>,
) -> MlflowResult<Json<Value>> {
    let id = experiment_id_parse(body.experiment_id.as_deref())?;
    let name = required("new_name", &body.new_name)?;
    state.app.mlflow_experiment_rename(&caller, id, name).await?;
    Ok(Json(json!({})))
}

#[derive(Debug, Deserialize)]
struct ExperimentTagBody {
    experiment_id: Option<String>,
    key: Option<String>,
    #[serde(default)]
    value: String,
}

async fn experiment_tag_set(
    State(state): State<AppState>,
    MlflowAuth(caller): MlflowAuth,
    MlflowJson(body): MlflowJson<ExperimentTagBody>,
) -> MlflowResult<Json<Value>> {
    let id = experiment_id_parse(body.experiment_id.as_deref())?;
    let key = required("key", &body.key)?;
    state.app.mlflow_experiment_tag_set(&caller, id, key, Some(&body.value)).await?;
    Ok(Json(json!({})))
}

async fn experiment_tag_delete(
    State(state): State<AppState>,
    MlflowAuth(caller): MlflowAuth,
    MlflowJson(body): MlflowJson<ExperimentTagBody>,
) -> MlflowResult<Json<Value>> {
    let id = experiment_id_parse(body.experiment_id.as_deref())?;
    let key = required("key", &body.key)?;
    state.app.mlflow_experiment_tag_set(&caller, id, key, None).await?;
    Ok(Json(json!({})))
}

#[derive(Debug, Deserialize)]
struct ExperimentGetQuery {
    experiment_id: Option<String>,
}

async fn experiment_get(
    State(state): State<AppState>,
    MlflowAuth(caller): MlflowAuth,
    MlflowQuery(query): MlflowQuery<ExperimentGetQuery>,
) -> MlflowResult<Json<Value>> {
    let id = experiment_id_parse(query.experiment_id.as_deref())?;
    let experiment = state.app.mlflow_experiment_get(&caller, id).await?;
    Ok(Json(json!({"experiment": experiment_json(&experiment)})))
}

#[derive(Debug, Deserialize)]
struct ExperimentsSearchBody {
    #[serde(default, deserialize_with = "proto_i64")]
    max_results: Option<i64>,
    page_token: Option<String>,
    filter: Option<String>,
    #[serde(default)]
    order_by: Vec<String>,
    /// `ACTIVE_ONLY` (the default), `DELETED_ONLY`, `ALL`.
    view_type: Option<String>,
}

async fn experiments_search(
    State(state): State<AppState>,
    MlflowAuth(caller): MlflowAuth,
    MlflowJson(body): MlflowJson<ExperimentsSearchBody>,
) -> MlflowResult<Json<Value>> {
    experiments_answer(&state, &caller, body).await
}

#[derive(Debug, Deserialize)]
struct ExperimentsSearchQuery {
    max_results: Option<String>,
    page_token: Option<String>,
    filter: Option<String>,
    view_type: Option<String>,
}

async fn experiments_search_get(
    State(state): State<AppState>,
    MlflowAuth(caller): MlflowAuth,
    MlflowQuery(query): MlflowQuery<ExperimentsSearchQuery>,
) -> MlflowResult<Json<Value>> {
    let max_results = query
        .max_results
        .map(|m| m.parse::<i64>().map_err(|_| Error::invalid("max_results", "a whole number")))
        .transpose()?;
    let body = ExperimentsSearchBody {
        max_results,
        page_token: query.page_token,
        filter: query.filter,
        order_by: vec![],
        view_type: query.view_type,
    };
    experiments_answer(&state, &caller, body).await
}

async fn experiments_answer(
    state: &AppState,
    caller: &Tracker,
    body: ExperimentsSearchBody,
) -> MlflowResult<Json<Value>> {
    let search = ExperimentsSearch {
        filter: body.filter.as_deref().unwrap_or_default(),
        order_by: &body.order_by,
        view: body.view_type.as_deref(),
        max_results: body.max_results,
        page_token: body.page_token.as_deref(),
    };
    let page = state.app.mlflow_experiments_search(caller, search).await?;
    let mut answer = json!({"experiments": page.items.iter().map(experiment_json).collect::<Vec<_>>()});
    if let Some(token) = page.next_page_token {
        answer["next_page_token"] = json!(token);
    }
    Ok(Json(answer))
}

// ---- runs ----

#[derive(Debug, Deserialize)]
struct RunCreateBody {
    experiment_id: Option<String>,
    user_id: Option<String>,
    run_name: Option<String>,
    #[serde(default, deserialize_with = "proto_i64")]
    start_time: Option<i64>,
    #[serde(default)]
    tags: Vec<WireKeyValue>,
}

async fn run_create(
    State(state): State<AppState>,
    MlflowAuth(caller): MlflowAuth,
    MlflowJson(body): MlflowJson<RunCreateBody>,
) -> MlflowResult<Json<Value>> {
    // MLflow's client sends no experiment for its Default experiment, 0.
    let experiment_id = match body.experiment_id.as_deref() {
        None | Some("") => 0,
        Some(text) => experiment_id_parse(Some(text))?,
    };
    let run = RunCreate {
        experiment_id,
        run_name: body.run_name,
        user_id: body.user_id,
        start_time: body.start_time,
        tags: body.tags.into_iter().map(KeyValue::from).collect(),
    };
    let run = state.app.mlflow_run_create(&caller, run).await?;
    Ok(Json(json!({"run": run_json(&run)})))
}

#[derive(Debug, Deserialize)]
struct RunGetQuery {
    run_id: Option<String>,
    run_uuid: Option<String>,
}

async fn run_get(
    State(state): State<AppState>,
    MlflowAuth(caller): MlflowAuth,
    MlflowQuery(query): MlflowQuery<RunGetQuery>,
) -> MlflowResult<Json<Value>> {
    let run_id = run_id_parse(query.run_id.as_deref(), query.run_uuid.as_deref())?;
    let run = state.app.mlflow_run_get(&caller, run_id).await?;
    Ok(Json(json!({"run": run_json(&run)})))
}

#[derive(Debug, Deserialize)]
struct RunUpdateBody {
    run_id: Option<String>,
    run_uuid: Option<String>,
    status: Option<String>,
    #[serde(default, deserialize_with = "proto_i64")]
    end_time: Option<i64>,
    run_name: Option<String>,
}

async fn run_update(
    State(state): State<AppState>,
    MlflowAuth(caller): MlflowAuth,
    MlflowJson(body): MlflowJson<RunUpdateBody>,
) -> MlflowResult<Json<Value>> {
    let run_id = run_id_parse(body.run_id.as_deref(), body.run_uuid.as_deref())?;
    let info = state
        .app
        .mlflow_run_update(&caller, run_id, body.status.as_deref(), body.end_time, body.run_name.as_deref())
        .await?;
    Ok(Json(json!({"run_info": run_info_json(&info)})))
}

#[derive(Debug, Deserialize)]
struct RunsSearchBody {
    #[serde(default)]
    experiment_ids: Vec<String>,
    filter: Option<String>,
    run_view_type: Option<String>,
    #[serde(default, deserialize_with = "proto_i64")]
    max_results: Option<i64>,
    #[serde(default)]
    order_by: Vec<String>,
    page_token: Option<String>,
}

async fn runs_search(
    State(state): State<AppState>,
    MlflowAuth(caller): MlflowAuth,
    MlflowJson(body): MlflowJson<RunsSearchBody>,
) -> MlflowResult<Json<Value>> {
    let experiment_ids = body
        .experiment_ids
        .iter()
        .map(|id| {
            id.parse::<i64>().map_err(|_| Error::invalid("experiment_ids", format!("'{id}' is not an experiment id")))
        })
        .collect::<Result<Vec<_>, _>>()?;
    let search = RunsSearch {
        experiment_ids: &experiment_ids,
        filter: body.filter.as_deref().unwrap_or_default(),
        order_by: &body.order_by,
        view: body.run_view_type.as_deref(),
        max_results: body.max_results,
        page_token: body.page_token.as_deref(),
    };
    let page = state.app.mlflow_runs_search(&caller, search).await?;
    let mut answer = json!({"runs": page.items.iter().map(run_json).collect::<Vec<_>>()});
    if let Some(token) = page.next_page_token {
        answer["next_page_token"] = json!(token);
    }
    Ok(Json(answer))
}

#[derive(Debug, Deserialize)]
struct RunIdBody {
    run_id: Option<String>,
}

async fn run_delete(
    State(state): State<AppState>,
    MlflowAuth(caller): MlflowAuth,
    MlflowJson(body): MlflowJson<RunIdBody>,
) -> MlflowResult<Json<Value>> {
    let run_id = run_id_parse(body.run_id.as_deref(), None)?;
    state.app.mlflow_run_delete(&caller, run_id, true).await?;
    Ok(Json(json!({})))
}

async fn run_restore(
    State(state): State<AppState>,
    MlflowAuth(caller): MlflowAuth,
    MlflowJson(body): MlflowJson<RunIdBody>,
) -> MlflowResult<Json<Value>> {
    let run_id = run_id_parse(body.run_id.as_deref(), None)?;
    state.app.mlflow_run_delete(&caller, run_id, false).await?;
    Ok(Json(json!({})))
}

#[derive(Debug, Deserialize)]
struct TagDeleteBody {
    run_id: Option<String>,
    key: Option<String>,
}

async fn tag_delete(
    State(state): State<AppState>,
    MlflowAuth(caller): MlflowAuth,
    MlflowJson(body): MlflowJson<TagDeleteBody>,
) -> MlflowResult<Json<Value>> {
    let run_id = run_id_parse(body.run_id.as_deref(), None)?;
    let key = required("key", &body.key)?;
    state.app.mlflow_tag_delete(&caller, run_id, key).await?;
    Ok(Json(json!({})))
}

// ---- logging ----

#[derive(Debug, Deserialize)]
struct LogMetricBody {
    run_id: Option<String>,
    run_uuid: Option<String>,
    #[serde(flatten)]
    metric: WireMetric,
}

async fn log_metric(
    State(state): State<AppState>,
    MlflowAuth(caller): MlflowAuth,
    MlflowJson(body): MlflowJson<LogMetricBody>,
) -> MlflowResult<Json<Value>> {
    let run_id = run_id_parse(body.run_id.as_deref(), body.run_uuid.as_deref())?;
    let batch = LogBatch { metrics: vec![body.metric.into_metric("metric")?], ..Default::default() };
    state.app.mlflow_log(&caller, run_id, batch).await?;
    Ok(Json(json!({})))
}

#[derive(Debug, Deserialize)]
struct LogKeyValueBody {
    run_id: Option<String>,
    run_uuid: Option<String>,
    key: Option<String>,
    value: Option<String>,
}

impl LogKeyValueBody {
    fn parts(self) -> Result<(Uuid, KeyValue), Error> {
        let run_id = run_id_parse(self.run_id.as_deref(), self.run_uuid.as_deref())?;
        let key = required("key", &self.key)?.to_string();
        Ok((run_id, KeyValue { key, value: self.value.unwrap_or_default() }))
    }
}

async fn log_parameter(
    State(state): State<AppState>,
    MlflowAuth(caller): MlflowAuth,
    MlflowJson(body): MlflowJson<LogKeyValueBody>,
) -> MlflowResult<Json<Value>> {
    let (run_id, param) = body.parts()?;
    state.app.mlflow_log(&caller, run_id, LogBatch { params: vec![param], ..Default::default() }).await?;
    Ok(Json(json!({})))
}

async fn set_tag(
    State(state): State<AppState>,
    MlflowAuth(caller): MlflowAuth,
    MlflowJson(body): MlflowJson<LogKeyValueBody>,
) -> MlflowResult<Json<Value>> {
    let (run_id, tag) = body.parts()?;
    state.app.mlflow_log(&caller, run_id, LogBatch { tags: vec![tag], ..Default::default() }).await?;
    Ok(Json(json!({})))
}

#[derive(Debug, Deserialize)]
struct LogBatchBody {
    run_id: Option<String>,
    #[serde(default)]
    metrics: Vec<WireMetric>,
    #[serde(default)]
    params: Vec<WireKeyValue>,
    #[serde(default)]
    tags: Vec<WireKeyValue>,
}

async fn log_batch(
    State(state): State<AppState>,
    MlflowAuth(caller): MlflowAuth,
    MlflowJson(body): MlflowJson<LogBatchBody>,
) -> MlflowResult<Json<Value>> {
    let run_id = run_id_parse(body.run_id.as_deref(), None)?;
    let metrics = body
        .metrics
        .into_iter()
        .enumerate()
        .map(|(i, m)| m.into_metric(&format!("metrics[{i}]")))
        .collect::<Result<Vec<_>, _>>()?;
    let batch = LogBatch {
        metrics,
        params: body.params.into_iter().map(KeyValue::from).collect(),
        tags: body.tags.into_iter().map(KeyValue::from).collect(),
    };
    state.app.mlflow_log(&caller, run_id, batch).await?;
    Ok(Json(json!({})))
}

#[derive(Debug, Deserialize)]
struct MetricHistoryQuery {
    run_id: Option<String>,
    run_uuid: Option<String>,
    metric_key: Option<String>,
    max_results: Option<String>,
    page_token: Option<String>,
}

/// Every point of the series, or a page of `max_results` of them from `page_token`.
async fn metric_history(
    State(state): State<AppState>,
    MlflowAuth(caller): MlflowAuth,
    MlflowQuery(query): MlflowQuery<MetricHistoryQuery>,
) -> MlflowResult<Json<Value>> {
    let run_id = run_id_parse(query.run_id.as_deref(), query.run_uuid.as_deref())?;
    let key = required("metric_key", &query.metric_key)?;
    let max_results = query
        .max_results
        .filter(|m| !m.is_empty())
        .map(|m| m.parse::<i64>().map_err(|_| Error::invalid("max_results", "a whole number")))
        .transpose()?;
    let page = state.app.mlflow_metric_history(&caller, run_id, key, max_results, query.page_token.as_deref()).await?;
    let mut answer = json!({"metrics": page.items.iter().map(WireMetric::from).collect::<Vec<_>>()});
    if let Some(token) = page.next_page_token {
        answer["next_page_token"] = json!(token);
    }
    Ok(Json(answer))
}

// ---- artefacts ----

#[derive(Debug, Deserialize)]
struct ArtifactsListQuery {
    run_id: Option<String>,
    run_uuid: Option<String>,
    path: Option<String>,
    #[allow(dead_code)]
    page_token: Option<String>,
}

fn file_json(entry: &ArtifactEntry, path: String) -> Value {
    let mut file = json!({"path": path, "is_dir": entry.is_dir});
    if let Some(size) = entry.size {
        file["file_size"] = json!(size);
    }
    file
}

/// The tracking API's listing: paths from the run's root, in one page.
async fn artifacts_list(
    State(state): State<AppState>,
    MlflowAuth(caller): MlflowAuth,
    MlflowQuery(query): MlflowQuery<ArtifactsListQuery>,
) -> MlflowResult<Json<Value>> {
    let run_id = run_id_parse(query.run_id.as_deref(), query.run_uuid.as_deref())?;
    let dir = query.path.unwrap_or_default();
    let dir = dir.trim_matches('/');
    let entries = state.app.mlflow_artifacts_list(&caller, run_id, dir).await?;
    let files: Vec<Value> = entries
        .iter()
        .map(|e| file_json(e, if dir.is_empty() { e.path.clone() } else { format!("{dir}/{}", e.path) }))
        .collect();
    Ok(Json(json!({"root_uri": artifact_root(run_id), "files": files})))
}

/// The run and the path under its artefact root, from a proxy path `<run id>/<path>`. A
/// malformed run id names no run: 404.
fn proxy_path(path: &str) -> Result<(Uuid, &str), Error> {
    let path = path.trim_start_matches('/');
    let (run, rest) = path.split_once('/').unwrap_or((path, ""));
    let run_id = Uuid::parse_str(run).map_err(|_| Error::not_found(ObjectKind::Run))?;
    Ok((run_id, rest.trim_matches('/')))
}

#[derive(Debug, Deserialize)]
struct ProxyListQuery {
    path: Option<String>,
}

/// The artefact proxy's listing (what `mlflow-artifacts:` clients call): names under the folder.
async fn proxy_list(
    State(state): State<AppState>,
    MlflowAuth(caller): MlflowAuth,
    MlflowQuery(query): MlflowQuery<ProxyListQuery>,
) -> MlflowResult<Json<Value>> {
    let path = query.path.unwrap_or_default();
    if path.trim_matches('/').is_empty() {
        return Err(Error::invalid("path", "name a run's artefacts: <run id>/<folder>").into());
    }
    let (run_id, dir) = proxy_path(&path)?;
    let entries = state.app.mlflow_artifacts_list(&caller, run_id, dir).await?;
    Ok(Json(json!({"files": entries.iter().map(|e| file_json(e, e.path.clone())).collect::<Vec<_>>()})))
}

/// One artefact, streamed (`mlflow.artifacts.download_artifacts`).
async fn proxy_get(
    State(state): State<AppState>,
    MlflowAuth(caller): MlflowAuth,
    Path(path): Path<String>,
) -> MlflowResult<Response> {
    let (run_id, path) = proxy_path(&path)?;
    let (size, stream) = state.app.mlflow_artifact_get(&caller, run_id, path).await?;
    Ok((
        [(header::CONTENT_TYPE, "application/octet-stream".to_string()), (header::CONTENT_LENGTH, size.to_string())],
        Body::from_stream(stream),
    )
        .into_response())
}

/// An artefact logged to a run (`mlflow.log_artifact`): the body is the file, streamed.
async fn proxy_put(
    State(state): State<AppState>,
    MlflowAuth(caller): MlflowAuth,
    Path(path): Path<String>,
    body: Body,
) -> MlflowResult<Json<Value>> {
    let (run_id, path) = proxy_path(&path)?;
    state.app.mlflow_artifact_put(caller, run_id, path, body.into_data_stream()).await?;
    Ok(Json(json!({})))
}

/// Logged models (MLflow 3's): none are kept yet, so a search finds none. The client asks when it
/// lists a folder of a run's artefacts (a folder may be a model's).
async fn logged_models_search(
    State(state): State<AppState>,
    MlflowAuth(caller): MlflowAuth,
) -> MlflowResult<Json<Value>> {
    state.app.mlflow_logged_models_search(&caller)?;
    Ok(Json(json!({"models": []})))
}
