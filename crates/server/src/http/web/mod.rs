//! The browser dashboard: server-rendered pages (askama views under the workspace's `web/views`),
//! made live with htmx polling and server-sent events, charts drawn by uPlot. Both libraries are
//! vendored under `web/static/vendor` and served from the binary.
//!
//! Every page goes through the same operations as the REST API ([`crate::app::App`]) with the
//! caller of the browser session, so tenancy and roles are checked in exactly one place.
//!
//! - [`session`]: sign in with an API token, session cookies, CSRF checks, sign out.
//! - [`jobs`]: the job list, a job's page, its live parts, logs and metrics.
//! - [`records`]: the run record on a job's page, and as JSON.
//! - [`submit`]: templates and the submit form generated from their parameters.
//! - [`experiments`]: hyperparameter searches: the list, an experiment's trials and chart.
//! - [`storage`]: a job's artefacts (download buttons), datasets, volumes.
//! - [`admin`]: quota and usage, tokens, and the platform admin's pages.
//! - [`accounting`]: GPU-hours over time (usage) and the audit log.
//! - [`assets`]: the stylesheet, the script and the vendored libraries.

mod accounting;
mod admin;
mod assets;
mod compare;
mod experiments;
mod jobs;
mod lineage;
mod records;
mod session;
mod storage;
mod submit;

use crate::http::api::jobs::{ListParams, list_filter};
use crate::http::routes::RouteTable;
use askama::Template;
use axum::http::StatusCode;
use axum::response::{Html, IntoResponse, Redirect, Response};
use axum::routing::{get, post};
use trainyard_core::Error;
use trainyard_core::auth::{Action, Caller};

use crate::http::error::ApiError;
pub use session::{CsrfForm, WebAuth};

pub fn routes() -> RouteTable {
    RouteTable::new()
        .route("/", get(|| async { Redirect::to("/jobs") }))
        .route("/login", get(session::login_page).post(session::login))
        .route("/logout", post(session::logout))
        .route("/sso/login", get(session::sso_start))
        .route("/sso/callback", get(session::sso_callback))
        .route("/jobs", get(jobs::list))
        .route("/jobs/rows", get(jobs::rows))
        .route("/jobs/{id}", get(jobs::detail))
        .route("/jobs/{id}/live", get(jobs::live))
        .route("/jobs/{id}/metrics.json", get(jobs::metrics))
        .route("/jobs/{id}/record.json", get(records::record_json))
        .route("/jobs/{id}/log.txt", get(jobs::log_text))
        .route("/jobs/{id}/log/stream", get(jobs::log_stream))
        .route("/jobs/{id}/cancel", post(jobs::cancel))
        .route("/jobs/{id}/rerun", post(jobs::rerun))
        .route("/jobs/{id}/notebook", post(jobs::notebook_open))
        .route("/jobs/{id}/artifacts/{*path}", get(storage::artifact_download))
        .route("/jobs/{id}/checkpoints/{step}", get(storage::checkpoint_download))
        .route("/compare", get(compare::compare))
        .route("/jobs/{id}/lineage", get(lineage::job))
        .route("/datasets/{name}/{version}/lineage", get(lineage::dataset))
        .route("/datasets", get(storage::datasets))
        .route("/experiments", get(experiments::list).post(experiments::create))
        .route("/experiments/{id}", get(experiments::detail))
        .route("/experiments/{id}/pause", post(experiments::pause))
        .route("/experiments/{id}/resume", post(experiments::resume))
        .route("/experiments/{id}/cancel", post(experiments::cancel))
        .route("/volumes", get(storage::volumes).post(storage::volume_create))
        .route("/volumes/{name}/delete", post(storage::volume_delete))
        .route("/submit", get(submit::choose))
        .route("/submit/{template}", get(submit::form).post(submit::submit))
        .route("/submit/{template}/preview", post(submit::preview))
        .route("/templates", get(submit::templates))
        .route("/templates/{name}", get(submit::template))
        .route("/quota", get(admin::quota))
        .route("/queue", get(admin::queue))
        .route("/usage", get(accounting::usage))
        .route("/audit", get(accounting::audit))
        .route("/tokens", get(admin::tokens).post(admin::token_create))
        .route("/tokens/{id}/revoke", post(admin::token_revoke))
        .route("/admin", get(admin::admin))
        .route("/admin/quota", post(admin::quota_set))
        .route("/admin/members", post(admin::member_add))
        .route("/admin/tenants", post(admin::tenant_create))
        .route("/admin/tenants/remove", post(admin::tenant_remove))
        .route("/static/{*path}", get(assets::serve))
}

/// What every signed-in page shows in its header.
pub struct Nav {
    pub user: String,
    pub tenant: String,
    pub role: &'static str,
    pub platform_admin: bool,
    pub can_write: bool,
    /// Whether the audit log is theirs to read: platform admins and tenant admins.
    pub can_audit: bool,
    /// The session's CSRF value, for the forms on the page.
    pub csrf: String,
    /// Which tab is current: `jobs`, `submit`, `templates`, `experiments`, `datasets`, `volumes`, `queue`,
    /// `quota`, `usage`, `audit`, `tokens`, `admin`.
    pub current: &'static str,
}

impl Nav {
    pub fn new(auth: &WebAuth, current: &'static str) -> Nav {
        let caller = &auth.caller;
        Nav {
            user: caller.user.clone(),
            tenant: caller.tenant.clone(),
            role: caller.role.as_str(),
            platform_admin: caller.platform_admin,
            can_write: can_write(caller),
            can_audit: caller.platform_admin || caller.authorize(Action::ManageTenant).is_ok(),
            csrf: auth.csrf.clone(),
            current,
        }
    }
}

pub fn can_write(caller: &Caller) -> bool {
    caller.authorize(Action::WriteJobs).is_ok()
}

/// A failed page request: the error page, or back to sign-in when the session is gone.
#[derive(Debug)]
pub struct WebError(pub Error);

impl From<Error> for WebError {
    fn from(err: Error) -> Self {
        WebError(err)
    }
}

impl From<ApiError> for WebError {
    fn from(err: ApiError) -> Self {
        match err {
            ApiError::Domain(err) => WebError(err),
            ApiError::MalformedJson(message) | ApiError::PayloadTooLarge(message) => {
                WebError(Error::invalid("request", message))
            }
            ApiError::UnsupportedMediaType => WebError(Error::invalid("request", "unsupported media type")),
        }
    }
}

#[derive(Template)]
#[template(path = "error.html")]
struct ErrorPage {
    status: u16,
    title: &'static str,
    message: String,
}

impl IntoResponse for WebError {
    fn into_response(self) -> Response {
        if matches!(self.0, Error::Unauthenticated(_)) {
            return Redirect::to("/login").into_response();
        }
        // The API's mapping of errors to statuses, so both front doors agree.
        let status = ApiError::Domain(self.0.clone()).status();
        if status.is_server_error() {
            tracing::error!(err = %self.0, "dashboard request failed");
        }
        let title = status.canonical_reason().unwrap_or("Error");
        let message = if status.is_server_error() {
            "Something went wrong on our side; it has been logged.".to_string()
        } else {
            self.0.to_string()
        };
        let mut response = render(&ErrorPage { status: status.as_u16(), title, message });
        *response.status_mut() = status;
        response
    }
}

pub type WebResult<T> = Result<T, WebError>;

/// Renders a view; a view that fails to render is a bug, logged and shown as a 500.
/// A line chart's data as the dashboard's script draws it (`drawComparison` in `app.js`): one
/// metric, lines over one shared x (null where a line has no point there).
#[derive(serde::Serialize)]
pub struct LineChart<'a> {
    pub metric: &'a str,
    pub x_label: &'static str,
    pub x: Vec<f64>,
    pub series: Vec<LineSeries>,
}

#[derive(serde::Serialize)]
pub struct LineSeries {
    /// What the line is of: a run's id, a trial's number.
    pub id: String,
    pub label: String,
    pub values: Vec<Option<f64>>,
}

pub fn render<T: Template>(view: &T) -> Response {
    match view.render() {
        Ok(html) => Html(html).into_response(),
        Err(err) => {
            tracing::error!(%err, "rendering a dashboard view");
            (StatusCode::INTERNAL_SERVER_ERROR, "the page could not be rendered").into_response()
        }
    }
}

/// Formats a time for people, in UTC.
pub fn when(at: &chrono::DateTime<chrono::Utc>) -> String {
    at.format("%Y-%m-%d %H:%M:%S UTC").to_string()
}

/// Formats an optional time; a dash when absent.
pub fn when_opt(at: Option<&chrono::DateTime<chrono::Utc>>) -> String {
    at.map(when).unwrap_or_else(|| "—".into())
}

/// A job named by its id or the first hex digits of it (at least 6), among the tenant's jobs
/// (`field`: the input that named it, for a refusal); `None` when it names none.
pub(crate) async fn job_named(
    state: &crate::http::AppState,
    auth: &WebAuth,
    text: &str,
    field: &str,
) -> WebResult<Option<uuid::Uuid>> {
    if let Ok(id) = uuid::Uuid::parse_str(text) {
        return Ok(Some(id));
    }
    let params = ListParams { id_prefix: Some(text.to_string()), limit: Some(2), ..ListParams::default() };
    let page = state.app.jobs_list(&auth.caller, &list_filter(params)?).await?;
    match page.items.as_slice() {
        [job] => Ok(Some(job.id)),
        [] => Ok(None),
        _ => Err(Error::invalid(field, format!("{text} names more than one job; give more of the id")).into()),
    }
}
