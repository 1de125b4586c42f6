//! The run record on a job's page: the latest attempt's record in brief (its hash, template,
//! spec hash, code, data, packages, hardware, seeds), and the whole of it as JSON for the
//! browser, which has a session rather than the API's token (`GET /api/v1/jobs/{id}/record`
//! answers the same for scripts).

use axum::extract::{Path, State};
use axum::http::header;
use axum::response::{IntoResponse, Response};
use trainyard_core::error::ObjectKind;
use trainyard_core::record::AttemptRunRecord;
use trainyard_core::record::summary;

use super::{WebAuth, WebResult};
use crate::http::AppState;
use crate::http::extract::parse_id;

/// An attempt's record as the job page shows it: one line a fact, every package listed.
pub struct RecordSummary {
    pub attempt: i32,
    pub hash: String,
    /// Whether the engine posted its part (environment, hardware, seeds, the data it read).
    pub engine_part: bool,
    /// `name version` and the digest; none for a direct submit.
    pub template: Option<String>,
    pub template_digest: String,
    pub spec_hash: String,
    pub code: Option<String>,
    pub user_code: Option<String>,
    pub data: Vec<String>,
    pub image: String,
    pub python: Option<String>,
    pub packages: Vec<(String, String)>,
    pub hardware: Option<String>,
    pub seeds: Option<String>,
    /// The decode workers and prefetch the engine trained with (chosen by autotune or pinned).
    pub input_pipeline: Option<String>,
    pub trainyard: String,
    /// A rerun's inputs it could not pin, accepted by whoever ran it.
    pub accepted_unpinned: Vec<String>,
}

impl RecordSummary {
    /// In the words of [`summary`], which `yard jobs show --record` prints too.
    pub fn of(attempt: &AttemptRunRecord) -> RecordSummary {
        let r = &attempt.record;
        let mut data = summary::datasets(r);
        data.extend(summary::data(r));
        RecordSummary {
            attempt: attempt.attempt,
            hash: attempt.record_hash.clone(),
            engine_part: attempt.engine_recorded_at.is_some(),
            template: r.template.as_ref().map(|t| format!("{} {}", t.name, t.version)),
            template_digest: r.template.as_ref().map(|t| t.digest.clone()).unwrap_or_default(),
            spec_hash: r.spec_hash.clone(),
            code: summary::code(r),
            user_code: summary::user_code(r),
            data,
            image: summary::image(r),
            python: summary::python(r),
            packages: r
                .environment
                .as_ref()
                .map(|env| env.packages.iter().map(|(n, v)| (n.clone(), v.clone())).collect())
                .unwrap_or_default(),
            hardware: summary::hardware(r),
            seeds: summary::seeds(r),
            input_pipeline: summary::input_pipeline(r),
            trainyard: summary::trainyard(r),
            accepted_unpinned: r.accepted_unpinned.iter().map(ToString::to_string).collect(),
        }
    }
}

/// Every attempt's record as JSON, as `GET /api/v1/jobs/{id}/record` answers.
pub async fn record_json(State(state): State<AppState>, auth: WebAuth, Path(id): Path<String>) -> WebResult<Response> {
    let job_id = parse_id(&id, ObjectKind::Job)?;
    let records = state.app.run_records(&auth.caller, job_id).await?;
    Ok(([(header::CACHE_CONTROL, "no-store")], axum::Json(records)).into_response())
}
