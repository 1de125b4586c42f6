//! Experiments' API types: a hyperparameter search over a template's parameters, its trials
//! (each a job per rung it ran to) and its preview. The searcher itself is
//! `trainyard_searcher`; these are what the REST API, the CLI and the dashboard exchange.

use chrono::{DateTime, Utc};
use serde::{Deserialize, Serialize};
use trainyard_searcher::{Ladder, SearcherSpec, Space};
use utoipa::ToSchema;
use uuid::Uuid;

/// A search to start (`POST /api/v1/experiments`) or to preview (`.../preview`): the template,
/// the parameters every trial shares, the searched space and the searcher. `yard experiment
/// create -f search.yaml` sends this shape.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct ExperimentCreate {
    /// A name for people: letters, digits, `.`, `_`, `-`.
    pub name: String,
    pub template: String,
    /// The template's version; the newest when absent (fixed for every trial at creation).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub version: Option<String>,
    /// Template parameters every trial shares.
    #[serde(default)]
    #[schema(value_type = Object)]
    pub params: serde_json::Map<String, serde_json::Value>,
    /// The searched parameters, by template parameter name.
    #[serde(default)]
    #[schema(value_type = Object)]
    pub space: Space,
    pub searcher: SearcherSpec,
    /// GPU-hours the trials may take together; no new run starts once they are spent.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub budget_gpu_hours: Option<f64>,
    /// Trials run on spare room (the default): GPUs no job within its quota waits for, counted
    /// in no quota, stopped first when such a job needs the room, and resumed from their
    /// checkpoint later (the searcher is told "preempted", never "failed"). `false`: trials
    /// count in the tenant's quota as any job does.
    #[serde(default = "yes")]
    pub spare: bool,
    /// A retried create with the same key returns the first experiment.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub idempotency_key: Option<String>,
}

fn yes() -> bool {
    true
}

/// Where an experiment stands.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
#[serde(rename_all = "lowercase")]
pub enum ExperimentState {
    Searching,
    Paused,
    Completed,
    Failed,
    Cancelled,
}

impl ExperimentState {
    pub fn as_str(self) -> &'static str {
        match self {
            ExperimentState::Searching => "searching",
            ExperimentState::Paused => "paused",
            ExperimentState::Completed => "completed",
            ExperimentState::Failed => "failed",
            ExperimentState::Cancelled => "cancelled",
        }
    }

    pub fn parse(text: &str) -> Option<ExperimentState> {
        [Self::Searching, Self::Paused, Self::Completed, Self::Failed, Self::Cancelled]
            .into_iter()
            .find(|s| s.as_str() == text)
    }

    pub fn is_over(self) -> bool {
        matches!(self, ExperimentState::Completed | ExperimentState::Failed | ExperimentState::Cancelled)
    }
}

/// The best trial so far: the best value at the highest rung any trial reached.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, ToSchema)]
pub struct BestTrial {
    pub trial: u32,
    pub rung: u32,
    pub value: f64,
    #[schema(value_type = Object)]
    pub params: serde_json::Map<String, serde_json::Value>,
    /// The job of its run to that rung.
    pub job_id: Option<Uuid>,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, ToSchema)]
pub struct Experiment {
    pub id: Uuid,
    pub name: String,
    pub template: String,
    pub template_version: String,
    pub state: ExperimentState,
    /// Why it failed, when it did.
    pub reason: Option<String>,
    pub best: Option<BestTrial>,
    #[schema(value_type = Object)]
    pub params: serde_json::Map<String, serde_json::Value>,
    #[schema(value_type = Object)]
    pub space: Space,
    pub searcher: SearcherSpec,
    pub budget_gpu_hours: Option<f64>,
    /// Its trials run on spare room.
    #[serde(default)]
    pub spare: bool,
    pub created_by: Uuid,
    pub created_at: DateTime<Utc>,
    pub ended_at: Option<DateTime<Utc>>,
}

/// One trial's run to one rung: a job.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, ToSchema)]
pub struct TrialRun {
    pub rung: u32,
    /// The step it stops at.
    pub length: u64,
    /// Absent while the driver has not yet submitted it.
    pub job_id: Option<Uuid>,
    pub job_state: Option<String>,
    /// The searched metric at `length`, once the run reported it.
    pub value: Option<f64>,
}

/// Where a trial stands.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
#[serde(rename_all = "lowercase")]
pub enum TrialStatus {
    /// A run of it is queued or training.
    Running,
    /// Stopped at a rung below the top with a checkpoint; resumed if it is promoted.
    Paused,
    /// Trained to the top rung.
    Completed,
    Failed,
    /// Its run was stopped by the experiment's cancel or failure.
    Stopped,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, ToSchema)]
pub struct Trial {
    pub trial: u32,
    #[schema(value_type = Object)]
    pub params: serde_json::Map<String, serde_json::Value>,
    pub status: TrialStatus,
    /// The rung of its latest run.
    pub rung: u32,
    pub runs: Vec<TrialRun>,
    pub failure: Option<String>,
    /// How often its runs were preempted (each resumed from its checkpoint): never a failure.
    #[serde(default)]
    pub preemptions: u32,
}

/// `GET /api/v1/experiments/{id}`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, ToSchema)]
pub struct ExperimentDetail {
    pub experiment: Experiment,
    pub trials: Vec<Trial>,
    pub ladder: Ladder,
    /// GPU-hours the trials took so far.
    pub gpu_hours: f64,
    /// Events the searcher has taken in (its log's length).
    pub events: u32,
}

/// What a search will cost at most, before it starts (`POST /api/v1/experiments/preview`).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, ToSchema)]
pub struct ExperimentPreview {
    pub ladder: Ladder,
    /// GPUs one trial's job takes (replicas x GPUs per replica).
    pub gpus_per_trial: u32,
    /// Seconds per step measured in the tenant's latest finished job of the template; absent
    /// without one (then the costs below are absent too).
    pub seconds_per_step: Option<f64>,
    /// GPU-hours every run together takes at most.
    pub gpu_hours_at_most: Option<f64>,
    /// Wall time at the most trials the tenant can run at once now (its GPU share and
    /// `max_concurrent_trials`), every rung's runs side by side.
    pub wall_seconds_at_most: Option<f64>,
    /// Trials side by side that the wall time assumes.
    pub concurrent_trials: u32,
    /// What the figures assume or leave out, in words.
    pub notes: Vec<String>,
}

/// An outside searcher's trial (`POST /api/v1/experiments/{id}/ask`, `custom` searchers): the
/// parameters to run it with, beside the experiment's shared ones. Trainyard runs it as a job to
/// `max_length`; its value appears on the trial (`GET /api/v1/experiments/{id}`) when it ends.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct ExperimentAsk {
    #[serde(default)]
    #[schema(value_type = Object)]
    pub params: serde_json::Map<String, serde_json::Value>,
}

/// The trial an ask made.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, ToSchema)]
pub struct ExperimentAsked {
    pub trial: u32,
    /// Its job, once submitted (at once, unless the database was away).
    pub job_id: Option<Uuid>,
}

/// What an outside searcher tells the experiment (`POST /api/v1/experiments/{id}/tell`).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct ExperimentTell {
    /// It asks for no more trials: the experiment completes when the runs under way end.
    pub finished: bool,
}
