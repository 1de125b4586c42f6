//! Bodies of the REST API (`/api/v1`), shared by the server (which documents them in OpenAPI)
//! and the `yard` CLI (which decodes them). Requests reject unknown fields.

use chrono::{DateTime, Utc};
use serde::{Deserialize, Serialize};
use utoipa::ToSchema;
use uuid::Uuid;

use crate::auth::Role;
use crate::job::{JobSpec, JobState};

/// A job as the API shows it.
#[derive(Debug, Clone, Serialize, Deserialize, ToSchema)]
pub struct Job {
    pub id: Uuid,
    pub tenant: String,
    pub name: String,
    pub state: JobState,
    /// Why the job is in its state: the pending reason while queued, the failure cause after.
    pub reason: Option<String>,
    pub priority: i32,
    pub max_restarts: i32,
    /// Attempts relaunched after a failure so far.
    pub restart_count: i32,
    pub spec: JobSpec,
    pub idempotency_key: Option<String>,
    pub created_by: String,
    pub created_at: DateTime<Utc>,
    pub updated_at: DateTime<Utc>,
    pub started_at: Option<DateTime<Utc>>,
    pub finished_at: Option<DateTime<Utc>>,
    /// Set when someone asked to cancel and the processes are still being stopped.
    pub cancel_requested_at: Option<DateTime<Utc>>,
}

/// One page of jobs, newest first.
#[derive(Debug, Clone, Serialize, Deserialize, ToSchema)]
pub struct JobPage {
    pub items: Vec<Job>,
    /// Pass as `cursor` to get the next page; absent on the last page.
    pub next_cursor: Option<String>,
}

/// One state change of a job.
#[derive(Debug, Clone, Serialize, Deserialize, ToSchema)]
pub struct JobEvent {
    /// Position in the job's history, from 1.
    pub seq: i64,
    pub from_state: Option<JobState>,
    pub to_state: JobState,
    /// Who or what caused it: `user:<name>`, `scheduler`, `executor`, `reconciler`.
    pub actor: String,
    pub reason: Option<String>,
    pub at: DateTime<Utc>,
}

/// One launch of a job: all its replicas, from start to end.
#[derive(Debug, Clone, Serialize, Deserialize, ToSchema)]
pub struct JobAttempt {
    /// 1 for the first launch, 2 after the first restart, ...
    pub attempt: i32,
    /// Where the replicas ran (executor-specific: host, process ids, GPUs, rendezvous port).
    #[schema(value_type = Object)]
    pub placement: Option<serde_json::Value>,
    /// Exit code per replica; null while running or when unknown (killed by a signal, lost).
    pub exit_codes: Vec<Option<i32>>,
    pub reason: Option<String>,
    pub started_at: DateTime<Utc>,
    pub ended_at: Option<DateTime<Utc>>,
}

/// Who the caller is.
#[derive(Debug, Clone, Serialize, Deserialize, ToSchema)]
pub struct Me {
    pub user: String,
    pub tenant: String,
    pub role: Role,
    pub platform_admin: bool,
}

#[derive(Debug, Clone, Serialize, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct TokenCreate {
    /// A label to recognise the token by, e.g. `laptop` or `ci`.
    pub name: String,
    /// Days until the token stops working; never when absent.
    #[serde(default)]
    pub expires_in_days: Option<u32>,
}

/// A freshly created token. The secret is shown here once and never again.
#[derive(Debug, Clone, Serialize, Deserialize, ToSchema)]
pub struct TokenCreated {
    pub id: Uuid,
    pub name: String,
    pub token: String,
    pub expires_at: Option<DateTime<Utc>>,
}

/// A token as listed: never its secret.
#[derive(Debug, Clone, Serialize, Deserialize, ToSchema)]
pub struct TokenInfo {
    pub id: Uuid,
    pub name: String,
    pub user: String,
    pub tenant: String,
    pub created_at: DateTime<Utc>,
    pub expires_at: Option<DateTime<Utc>>,
    pub last_used_at: Option<DateTime<Utc>>,
    pub revoked_at: Option<DateTime<Utc>>,
}

#[derive(Debug, Clone, Serialize, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct TenantCreate {
    /// Short name: lowercase letters, digits and '-'.
    pub name: String,
}

#[derive(Debug, Clone, Serialize, Deserialize, ToSchema)]
pub struct Tenant {
    pub id: Uuid,
    pub name: String,
    pub created_at: DateTime<Utc>,
}

/// Adds a user to a tenant with a role (creating the user if new) and issues a first token.
#[derive(Debug, Clone, Serialize, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct MemberAdd {
    pub user: String,
    pub role: Role,
    /// Name of the token issued to the member.
    #[serde(default = "default_token_name")]
    pub token_name: String,
    #[serde(default)]
    pub expires_in_days: Option<u32>,
}

fn default_token_name() -> String {
    "default".to_string()
}

#[derive(Debug, Clone, Serialize, Deserialize, ToSchema)]
pub struct MemberAdded {
    pub user: String,
    pub tenant: String,
    pub role: Role,
    pub token: TokenCreated,
}

/// The error body of every non-2xx response.
#[derive(Debug, Clone, Serialize, Deserialize, ToSchema)]
pub struct ErrorBody {
    pub error: ErrorDetail,
}

#[derive(Debug, Clone, Serialize, Deserialize, ToSchema)]
pub struct ErrorDetail {
    /// Stable machine-readable code, e.g. `invalid_input`, `not_found`, `unauthenticated`.
    pub code: String,
    /// What went wrong, for people.
    pub message: String,
    /// The offending input, as a path such as `resources.gpus`, when there is one.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub field: Option<String>,
}
