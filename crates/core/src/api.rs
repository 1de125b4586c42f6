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
    /// For a job from a template: the parameters as given (the template is in `spec.template`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schema(value_type = Option<Object>)]
    pub params: Option<serde_json::Value>,
    /// The exact dataset versions it used (name, version, URI, content hash).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub datasets: Vec<DatasetUse>,
    /// Set when this server cannot read the job's stored spec (a row written by another version
    /// or by hand): why. `spec` is then empty; the job is shown and can be cancelled, and the
    /// control loop leaves it alone.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub spec_unreadable: Option<String>,
    /// The job this one runs again (`yard rerun`), and the parameters it changed (none: an
    /// exact rerun). The jobs that rerun this one: `GET /api/v1/jobs?rerun_of=<id>`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub rerun_of: Option<Uuid>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schema(value_type = Option<Object>)]
    pub rerun_overrides: Option<serde_json::Value>,
    /// For a rerun: the inputs of the original it could not pin (a file on the machine, an
    /// image tag), which whoever ran it again accepted (`accept_unpinned`). Its run record
    /// lists them too.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub rerun_unpinned: Vec<crate::rerun::UnpinnedInput>,
    /// The job array it belongs to (the id of the array's first job) and its index there.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub array_id: Option<Uuid>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub array_index: Option<u32>,
    /// For a run fine-tuned from another job's checkpoint (`init_from`): that job and step.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub init_from: Option<CheckpointSource>,
}

/// The checkpoint a run started its weights from (a template's `checkpoint` parameter): the
/// job that wrote it and the step it was written at.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
pub struct CheckpointSource {
    pub job_id: Uuid,
    pub step: u64,
}

/// One checkpoint a job wrote (`GET /api/v1/jobs/{id}/checkpoints`).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, ToSchema)]
pub struct Checkpoint {
    pub step: u64,
    pub size_bytes: u64,
    /// When the file was last written (the time it was saved).
    pub saved_at: DateTime<Utc>,
    /// The file as the job's replicas see it (`/volumes/<volume>/jobs/<job>/checkpoints/ckpt-<step>.pt`).
    pub path: String,
}

/// A job's checkpoints, oldest step first, and where they are.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, ToSchema)]
pub struct JobCheckpoints {
    /// The folder the job writes them to, as its replicas see it; null when the job keeps none
    /// the server can find (not from a template that writes checkpoints).
    pub folder: Option<String>,
    pub checkpoints: Vec<Checkpoint>,
    /// Why the list is empty or cannot be complete, when there is a reason to say (checkpoints
    /// kept in a working folder, on a Kubernetes claim the server does not read).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub note: Option<String>,
}

/// Run a job again (`POST /api/v1/jobs/{id}/rerun`): the recorded template (by digest),
/// parameters, dataset versions and code, with the changes given here.
#[derive(Debug, Clone, Default, Serialize, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct RerunRequest {
    /// Parameters to change, by name (a job from a template only).
    #[serde(default)]
    #[schema(value_type = Object)]
    pub set: serde_json::Map<String, serde_json::Value>,
    /// Say when it would start instead of submitting it.
    #[serde(default)]
    pub what_if: bool,
    /// Run it even though some of what the job ran cannot be pinned (a `path` parameter naming
    /// a file or folder on the machine, an image given by a tag): without this, such a rerun
    /// is refused with 409 naming each. The new job lists what was accepted.
    #[serde(default)]
    pub accept_unpinned: bool,
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
    /// Where the replicas ran (executor-specific: host, process ids, GPUs, rendezvous port);
    /// null while the launch has not stored it yet.
    #[schema(value_type = Option<Object>)]
    pub placement: Option<serde_json::Value>,
    /// Exit code per replica; null while running or when unknown (killed by a signal, lost).
    pub exit_codes: Vec<Option<i32>>,
    pub reason: Option<String>,
    /// The images the replicas actually ran, by digest (`repo@sha256:...`), when the executor
    /// runs images (Kubernetes); empty otherwise.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub image_digests: Vec<String>,
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
    /// The tenant the token acts in: one you are a member of. The caller's tenant when absent.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tenant: Option<String>,
}

/// A freshly created token. The secret is shown here once and never again (its `Debug` shows
/// it never).
#[derive(Clone, Serialize, Deserialize, ToSchema)]
pub struct TokenCreated {
    pub id: Uuid,
    pub name: String,
    pub token: String,
    pub expires_at: Option<DateTime<Utc>>,
}

impl std::fmt::Debug for TokenCreated {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("TokenCreated")
            .field("id", &self.id)
            .field("name", &self.name)
            .field("token", &"<redacted>")
            .field("expires_at", &self.expires_at)
            .finish()
    }
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
    #[schema(pattern = "^[a-z0-9][a-z0-9-]{0,62}$")]
    pub name: String,
}

#[derive(Debug, Clone, Serialize, Deserialize, ToSchema)]
pub struct Tenant {
    pub id: Uuid,
    pub name: String,
    pub created_at: DateTime<Utc>,
    /// When a platform admin asked to remove it: from then on it takes nothing new, its tokens
    /// are revoked and its unfinished jobs cancelled.
    #[serde(default)]
    pub removal_requested_at: Option<DateTime<Utc>>,
    /// When its last job had ended and what the executor held for it (a namespace, volumes)
    /// was removed. Its records stay.
    #[serde(default)]
    pub removed_at: Option<DateTime<Utc>>,
}

/// Adds a user to a tenant with a role (creating the user if new) and issues a first token.
#[derive(Debug, Clone, Serialize, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct MemberAdd {
    pub user: String,
    pub role: Role,
    /// Name of the first token issued to a user this call creates.
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
    /// Whether this call created the user (an invitation).
    pub user_created: bool,
    /// The invited user's first token, for the inviter to hand over; only when this call created
    /// the user. An existing user gets no token here: nobody obtains a token in another user's
    /// name. They create their own for this tenant (`POST /api/v1/tokens` with `tenant`).
    pub token: Option<TokenCreated>,
}

/// A member removed from a tenant (`DELETE /api/v1/admin/tenants/{tenant}/members/{user}`).
#[derive(Debug, Clone, Serialize, Deserialize, ToSchema)]
pub struct MemberRemoved {
    pub user: String,
    pub tenant: String,
    /// Their tokens for this tenant, revoked by the removal (a request with one is 401 now).
    pub tokens_revoked: u64,
    /// Their unfinished jobs in this tenant cancelled (only with `cancel_jobs`); their jobs are
    /// otherwise kept, listed and left running.
    pub jobs_cancelled: u64,
}

/// A new token for a member who lost theirs (`POST .../members/{user}/tokens`), made by a
/// tenant admin or a platform admin.
#[derive(Debug, Clone, Default, Serialize, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct MemberTokenReissue {
    /// The new token's label (default `reissued`).
    #[serde(default)]
    pub name: Option<String>,
    /// Days until it stops working; never when absent.
    #[serde(default)]
    pub expires_in_days: Option<u32>,
    /// Revoke the member's other tokens in this tenant (a lost laptop's).
    #[serde(default)]
    pub revoke_others: bool,
}

/// The reissued token: its secret is here once and nowhere else (not in the audit log).
#[derive(Debug, Clone, Serialize, Deserialize, ToSchema)]
pub struct MemberToken {
    pub user: String,
    pub tenant: String,
    pub token: TokenCreated,
    /// Their other tokens revoked (with `revoke_others`).
    pub tokens_revoked: u64,
}

/// Drain a node (`PUT /api/v1/admin/nodes/{node}/drain`).
#[derive(Debug, Clone, Default, Serialize, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct NodeDrainRequest {
    /// Why, for the people whose jobs wait (up to 500 characters).
    #[serde(default)]
    pub reason: Option<String>,
    /// Send the jobs running on it back to the queue now (as a preemption: no restart counted);
    /// without it they run to their end.
    #[serde(default)]
    pub preempt: bool,
}

/// A drained node: it takes no new placements.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
pub struct NodeDrain {
    pub node: String,
    /// Empty when none was given.
    pub reason: String,
    /// `user:<name>`.
    pub drained_by: String,
    pub drained_at: DateTime<Utc>,
    /// Jobs this drain sent back to the queue (with `preempt`).
    #[serde(default)]
    pub jobs_preempted: u64,
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
    /// The offending input, as a path such as `resources.gpus`, when there is one (the first,
    /// when several are).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub field: Option<String>,
    /// Every offending input with its message (`invalid_input` only): all the rules a request
    /// breaks are named at once.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub errors: Vec<crate::error::FieldProblem>,
}

/// One reported value of a metric.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct MetricPoint {
    /// Training step (or any non-negative ordinal).
    pub step: i64,
    /// Series name, e.g. `loss`, `train/throughput`: letters, digits, `_ . / -`.
    pub name: String,
    pub value: f64,
}

/// A batch of points posted by a job's engine with its job token.
#[derive(Debug, Clone, Serialize, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct MetricBatch {
    pub points: Vec<MetricPoint>,
}

#[derive(Debug, Clone, Serialize, Deserialize, ToSchema)]
pub struct MetricsAccepted {
    pub accepted: u64,
}

/// One series, columnar (ready to plot): `steps[i]` goes with `values[i]`, ordered by step.
#[derive(Debug, Clone, Serialize, Deserialize, ToSchema)]
pub struct MetricSeries {
    pub name: String,
    pub steps: Vec<i64>,
    pub values: Vec<f64>,
}

#[derive(Debug, Clone, Serialize, Deserialize, ToSchema)]
pub struct JobMetrics {
    pub series: Vec<MetricSeries>,
}

/// Where a template comes from.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
#[serde(rename_all = "lowercase")]
pub enum TemplateSource {
    /// Ships with Trainyard; every tenant sees it.
    Builtin,
    /// Uploaded by this tenant; only it sees it.
    Tenant,
}

/// A template and its versions, as listed.
#[derive(Debug, Clone, Serialize, Deserialize, ToSchema)]
pub struct TemplateSummary {
    pub name: String,
    pub source: TemplateSource,
    pub description: String,
    /// Newest first.
    pub versions: Vec<String>,
    pub latest: String,
}

/// One version of a template in full.
#[derive(Debug, Clone, Serialize, Deserialize, ToSchema)]
pub struct TemplateDetail {
    pub name: String,
    pub version: String,
    pub source: TemplateSource,
    pub digest: String,
    /// Every version of this template, newest first.
    pub versions: Vec<String>,
    /// The manifest as loaded (see docs/templates.md for its fields).
    #[schema(value_type = Object)]
    pub manifest: serde_json::Value,
    /// The files a job receives, under `template/` in each replica's working directory.
    pub files: Vec<String>,
}

/// A template bundle to publish: `template.yaml` as text and the other files, base64-encoded.
#[derive(Debug, Clone, Serialize, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct TemplateUpload {
    pub manifest: String,
    #[serde(default)]
    pub files: std::collections::BTreeMap<String, String>,
}

/// Submit a job from a template.
#[derive(Debug, Clone, Serialize, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct TemplateRun {
    /// The version; the newest when absent.
    #[serde(default)]
    pub version: Option<String>,
    /// Parameter values by name. Numbers and booleans may also be given as strings.
    #[serde(default)]
    #[schema(value_type = Object)]
    pub params: serde_json::Map<String, serde_json::Value>,
    /// The job's name; the template's name when absent.
    #[serde(default)]
    pub name: Option<String>,
    #[serde(default)]
    pub priority: i32,
    #[serde(default)]
    pub max_restarts: u32,
    #[serde(default)]
    pub idempotency_key: Option<String>,
    /// Wait up to this many seconds for room on a node whose shard cache holds the run's
    /// datasets before taking any node (as a job's `cache_wait_seconds`). At most an hour.
    #[serde(default)]
    #[schema(maximum = 3600)]
    pub cache_wait_seconds: Option<u32>,
    /// Run on spare room only (as a job's `spare`): outside the tenant's quota, placed after
    /// every other job, stopped first when a job within its quota needs the room.
    #[serde(default)]
    pub spare: bool,
}

/// What a template run would be, without queueing anything.
#[derive(Debug, Clone, Serialize, Deserialize, ToSchema)]
pub struct DryRun {
    pub name: String,
    /// Every parameter's value after defaults and type conversion.
    #[schema(value_type = Object)]
    pub values: serde_json::Value,
    /// Exactly the spec the job would record and run.
    pub spec: crate::job::JobSpec,
}

/// A named output a job reports (for example `dataset`), recorded with its job token.
#[derive(Debug, Clone, Serialize, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct JobOutput {
    /// 1 to 64 letters, digits, `_`, `.` or `-`.
    pub name: String,
    #[schema(value_type = Object)]
    pub value: serde_json::Value,
}

/// A tenant's quotas and what it uses of them, per GPU type.
#[derive(Debug, Clone, Serialize, Deserialize, ToSchema)]
pub struct QuotaReport {
    pub tenant: String,
    /// Tenants of one cohort lend each other idle quota.
    pub cohort: Option<String>,
    pub weight: f64,
    pub flavors: Vec<FlavorUsage>,
}

#[derive(Debug, Clone, Serialize, Deserialize, ToSchema)]
pub struct FlavorUsage {
    pub flavor: String,
    pub nominal: u64,
    pub borrowing_limit: Option<u64>,
    pub lending_limit: Option<u64>,
    /// GPUs held by the tenant's admitted and running jobs.
    pub used: u64,
    /// Of `used`, what is beyond nominal (taken from the cohort).
    pub borrowed: u64,
    /// Of the tenant's idle nominal, what others in the cohort use now.
    pub lent: u64,
    /// GPUs its jobs on spare room hold, beside `used` and outside every quota.
    #[serde(default)]
    pub spare: u64,
}

/// A quota that was set, with what may not work as meant.
#[derive(Debug, Clone, Default, Serialize, Deserialize, ToSchema)]
pub struct QuotaSetResult {
    /// For example a GPU type no node of the cluster has: no job can use the quota until such
    /// nodes join.
    pub warnings: Vec<String>,
}

/// Sets a tenant's quota for one GPU type.
#[derive(Debug, Clone, Serialize, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct QuotaSet {
    /// Guaranteed GPUs.
    pub nominal: u64,
    /// How many more it may borrow from its cohort; no limit when absent.
    #[serde(default)]
    pub borrowing_limit: Option<u64>,
    /// How many of its idle GPUs others may borrow; all when absent.
    #[serde(default)]
    pub lending_limit: Option<u64>,
    /// Set it even though no node has GPUs of this type (nodes of it are about to join); else a
    /// GPU type the cluster lacks (a typo, another spelling) is refused.
    #[serde(default)]
    pub allow_unknown: bool,
}

/// Changes a tenant's scheduling policy; absent fields stay as they are.
#[derive(Debug, Clone, Serialize, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct TenantPolicyUpdate {
    /// The cohort to join; "" leaves any cohort.
    #[serde(default)]
    pub cohort: Option<String>,
    /// Fair-share weight (default 1).
    #[serde(default)]
    pub weight: Option<f64>,
    /// Whether its higher-priority jobs may preempt its lower-priority ones.
    #[serde(default)]
    pub preempt_lower_priority: Option<bool>,
    /// Stop its interactive sessions after this many seconds without activity (10 to 2592000;
    /// warned at half of it, at most 5 minutes before); 0: never.
    #[serde(default)]
    pub session_idle_timeout_seconds: Option<u32>,
}

/// Where a waiting job stands: why it waits, its positions, and when it should start.
#[derive(Debug, Clone, Default, Serialize, Deserialize, ToSchema)]
pub struct Schedule {
    /// Admitted by the very next admission cycle.
    pub admitted_now: bool,
    pub reason: Option<String>,
    /// 1-based, among the tenant's waiting jobs.
    pub tenant_position: Option<usize>,
    /// 1-based, among all waiting jobs, in the order the scheduler considers them.
    pub cluster_position: Option<usize>,
    /// Higher-priority jobs of the same tenant waiting ahead.
    pub behind_higher_priority: usize,
    /// Estimated from the expected ends of running jobs; absent when beyond the horizon.
    pub estimated_start: Option<DateTime<Utc>>,
    /// For a job reading registered datasets: how many of the cluster's nodes hold its data in
    /// their shard cache (the scheduler prefers them; it never waits for them).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cached_on: Option<CacheLocality>,
    /// What the estimates assume this job's own run time is (jobs behind it wait on its end):
    /// "assuming 12 min, the median of the last 9 runs of pytorch-ddp on 1 x 1 GPU by the same
    /// user", "assuming 1h, the default of the template pytorch-ddp".
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub runtime_assumed: Option<String>,
    /// The jobs whose expected end its estimated start waits for (at most
    /// [`Schedule::WAITS_FOR_SHOWN`]), each with what its run time is assumed to be. Not filled
    /// in the queue's entries (`GET /queue`): only in a job's own schedule.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub waits_for: Vec<Blocker>,
    /// How many more jobs end at that instant than `waits_for` lists.
    #[serde(default, skip_serializing_if = "is_zero")]
    pub waits_for_more: usize,
    /// A what-if only: running jobs it would preempt; it would start once they have stopped
    /// (within their grace period), which `estimated_start` assumes.
    #[serde(default, skip_serializing_if = "is_zero")]
    pub would_preempt: usize,
}

fn is_zero(n: &usize) -> bool {
    *n == 0
}

impl Schedule {
    /// Blockers listed at most in `waits_for`.
    pub const WAITS_FOR_SHOWN: usize = 5;
}

/// A job a waiting job's estimated start waits on: it is expected to end then.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
pub struct Blocker {
    /// The job, when it is of the waiting job's own tenant (another tenant's jobs are not named).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub job: Option<Uuid>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub name: Option<String>,
    /// Its tenant, when another's.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tenant: Option<String>,
    /// `running` (or starting, stopping...) or `queued`: a queued job ahead of it starts and
    /// ends first.
    pub state: String,
    /// What its run time is assumed to be.
    pub assuming: String,
}

/// "job 019ad1c2-7f3e train-x (running; assuming 12 min, ...)", "a job of team-b (running; ...)"
impl std::fmt::Display for Blocker {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match (&self.job, &self.tenant) {
            (Some(job), _) => {
                // The short id the CLI prints and every id argument takes.
                write!(f, "job {}", &job.to_string()[..13])?;
                if let Some(name) = &self.name {
                    write!(f, " {name}")?;
                }
            }
            (None, Some(tenant)) => write!(f, "a job of tenant {tenant}")?,
            (None, None) => write!(f, "a job")?,
        }
        write!(f, " ({}; {})", self.state, self.assuming)
    }
}

/// How many of the cluster's nodes hold a job's data in their shard cache.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
pub struct CacheLocality {
    pub nodes: usize,
    pub of: usize,
}

impl std::fmt::Display for CacheLocality {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let plural = if self.of == 1 { "" } else { "s" };
        write!(f, "cached on {} of {} node{plural}", self.nodes, self.of)
    }
}

/// One waiting job in the cluster's queue.
#[derive(Debug, Clone, Serialize, Deserialize, ToSchema)]
pub struct QueueEntry {
    pub id: Uuid,
    pub name: String,
    pub tenant: String,
    pub priority: i32,
    pub created_at: DateTime<Utc>,
    /// Why it waits, where it stands, when it should start (as `GET /jobs/{id}/schedule`).
    pub schedule: Schedule,
}

/// The waiting jobs the caller may see, in the order the scheduler considers them.
#[derive(Debug, Clone, Serialize, Deserialize, ToSchema)]
pub struct Queue {
    pub items: Vec<QueueEntry>,
    /// Other tenants' waiting jobs, counted but not shown (platform admins see them all).
    pub others_waiting: usize,
    /// When the standings were computed (the schedule board's snapshot): served at once while
    /// a newer one is computed, so it may be some seconds old; never older than a change made
    /// through the server that answered.
    pub as_of: DateTime<Utc>,
}

/// An uploaded code archive.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
pub struct CodeUploaded {
    /// `sha256:<hex>`: what a job's `code` names.
    pub digest: String,
    pub size_bytes: u64,
    /// Files in it.
    pub files: usize,
    /// False when the tenant had uploaded the same archive before (nothing was stored again).
    pub created: bool,
}

/// One node the scheduler places on: what it has, what running jobs hold of it, what is free.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
pub struct NodeUsage {
    pub name: String,
    /// The type of its GPUs; absent for a node without GPUs.
    pub gpu_type: Option<String>,
    pub gpus: u32,
    pub gpus_allocated: u32,
    pub cpu_millis: u64,
    pub cpu_millis_allocated: u64,
    pub memory_bytes: u64,
    pub memory_bytes_allocated: u64,
    /// Replicas of unfinished jobs placed on it (every tenant's, counted, not named).
    pub replicas: u32,
    /// The caller's tenant's dataset versions its shard cache holds (`NAME@VERSION`, as its jobs'
    /// engines reported them within the last day); never another tenant's.
    #[serde(default)]
    pub cached_datasets: Vec<String>,
    /// Drained by an admin: no new placements here (`yard admin node drain`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub drained: Option<NodeDrain>,
}

/// Every node the scheduler may place on, by name.
#[derive(Debug, Clone, Serialize, Deserialize, ToSchema)]
pub struct Nodes {
    pub items: Vec<NodeUsage>,
}

/// A registered dataset version.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, ToSchema)]
pub struct Dataset {
    pub name: String,
    pub version: String,
    /// Where it is (a path on shared storage, an object-store URL).
    pub uri: String,
    /// `trainyard-shards-v1` for data-pack output.
    pub format: String,
    pub size_bytes: Option<i64>,
    pub samples: Option<i64>,
    /// The data pipeline's content hash: the same for the same content, always.
    pub content_hash: String,
    /// The job that produced it, when registered from one.
    pub source_job: Option<Uuid>,
    /// Where its files are in Trainyard's object store (a key prefix under the tenant's), when
    /// it was pushed there (`yard datasets push`); none for a dataset kept elsewhere. Jobs read
    /// such a version as `store:NAME@VERSION` (its `uri`).
    #[serde(default)]
    pub store_prefix: Option<String>,
    pub created_by: String,
    pub created_at: DateTime<Utc>,
    /// The nodes whose shard cache holds all of it (reported by the engines of jobs that read
    /// it, within the last day): the scheduler prefers them for jobs reading it.
    #[serde(default)]
    pub cached_on: Vec<String>,
}

/// The headers of `HEAD /api/v1/datasets/{name}/{version}/files/{file}`: what a node's cache
/// agent learns of a file a job asks it for (lowercase, as HTTP/2 sends them).
pub mod dataset_headers {
    /// The version's tenant id: the agent keeps each tenant's copies apart.
    pub const TENANT_HEADER: &str = "x-trainyard-tenant";
    /// The version's content hash, 64 hex digits.
    pub const CONTENT_HEADER: &str = "x-trainyard-content";
    /// `manifest`, `shard` or `index`.
    pub const KIND_HEADER: &str = "x-trainyard-file-kind";
    /// A shard's SHA-256 from the manifest, 64 hex digits.
    pub const SHA256_HEADER: &str = "x-trainyard-sha256";
}

/// A job's engine saying that its node's shard cache holds every shard of a dataset version
/// the job reads (`POST /api/v1/jobs/{id}/cached-datasets`, with the job token).
#[derive(Debug, Clone, Serialize, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct NodeCacheReport {
    /// The node the replica runs on (`TRAINYARD_NODE`): one the job was placed on.
    pub node: String,
    pub name: String,
    pub version: String,
    /// Bytes of the version's shards in the cache.
    pub bytes: i64,
}

/// Registers a dataset version: either described in full, or taken from a data-pack job's
/// `dataset` output (`from_job`).
#[derive(Debug, Clone, Serialize, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct DatasetRegister {
    pub name: String,
    pub version: String,
    #[serde(default)]
    pub from_job: Option<Uuid>,
    #[serde(default)]
    pub uri: Option<String>,
    #[serde(default)]
    pub format: Option<String>,
    #[serde(default)]
    pub content_hash: Option<String>,
    #[serde(default)]
    pub size_bytes: Option<i64>,
    #[serde(default)]
    pub samples: Option<i64>,
    /// The content hash (`sha256:...`) of a dataset whose manifest and files were uploaded to
    /// the tenant's object store (`PUT /api/v1/dataset-content/{hash}/{file}`): registered only
    /// when every file the manifest names is there with its size. Its location, size, samples
    /// and format come from the manifest.
    #[serde(default)]
    pub from_store: Option<String>,
}

/// What an upload of one file of a pushed dataset stored.
#[derive(Debug, Clone, Serialize, Deserialize, ToSchema)]
pub struct DatasetFileUploaded {
    /// The file's name, as the manifest gives it (`dataset.json` for the manifest).
    pub file: String,
    /// `manifest`, `shard` or `index`.
    pub kind: String,
    pub size_bytes: u64,
    /// Hex SHA-256 of what was stored.
    pub sha256: String,
}

/// A dataset version a job used, as recorded with the job.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
pub struct DatasetUse {
    /// The template parameter that named it.
    pub param: String,
    pub name: String,
    pub version: String,
    pub uri: String,
    pub content_hash: String,
}

/// One artefact of a job: a file its engine (or a member) uploaded, kept in object storage.
#[derive(Debug, Clone, Serialize, Deserialize, ToSchema)]
pub struct Artifact {
    /// Relative to the job's artefacts, e.g. `checkpoints/step-100.pt`.
    pub path: String,
    pub size_bytes: u64,
    /// Hex SHA-256, known when the file came through the upload endpoint.
    pub sha256: Option<String>,
    pub modified_at: DateTime<Utc>,
}

/// What an upload stored.
#[derive(Debug, Clone, Serialize, Deserialize, ToSchema)]
pub struct ArtifactUploaded {
    pub path: String,
    pub size_bytes: u64,
    pub sha256: String,
    /// Parts of the multipart upload (1 when the body fit in one part).
    pub parts: usize,
}

/// A short-lived download link for one artefact: fetch `url` with no credentials before
/// `expires_at`. Relative for the local store (served by this server), absolute for S3.
#[derive(Debug, Clone, Serialize, Deserialize, ToSchema)]
pub struct ArtifactLink {
    pub path: String,
    pub url: String,
    pub expires_at: DateTime<Utc>,
    pub size_bytes: u64,
}

/// How a volume may be mounted (the Kubernetes access modes).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, ToSchema, Default)]
pub enum AccessMode {
    #[default]
    ReadWriteOnce,
    ReadOnlyMany,
    ReadWriteMany,
}

impl AccessMode {
    pub fn as_str(self) -> &'static str {
        match self {
            AccessMode::ReadWriteOnce => "ReadWriteOnce",
            AccessMode::ReadOnlyMany => "ReadOnlyMany",
            AccessMode::ReadWriteMany => "ReadWriteMany",
        }
    }

    pub fn parse(text: &str) -> Option<AccessMode> {
        [AccessMode::ReadWriteOnce, AccessMode::ReadOnlyMany, AccessMode::ReadWriteMany]
            .into_iter()
            .find(|m| m.as_str() == text)
    }
}

/// A tenant's named volume, shared by its jobs (a `volume` template parameter resolves to it).
#[derive(Debug, Clone, Serialize, Deserialize, ToSchema)]
pub struct Volume {
    pub name: String,
    pub size_bytes: u64,
    pub access_mode: AccessMode,
    /// `null`: the cluster's default class.
    pub storage_class: Option<String>,
    /// Where jobs find it (a directory under the data directory for the local executor).
    pub path: String,
    pub created_by: String,
    pub created_at: DateTime<Utc>,
    /// Why jobs cannot use it yet, as the cluster says (a claim no storage can bind, and why);
    /// absent when it is ready.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pending_reason: Option<String>,
}

/// Creates a volume. Its size counts against the tenant's storage quota.
#[derive(Debug, Clone, Serialize, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct VolumeCreate {
    /// 1 to 63 lowercase letters, digits or '-'.
    #[schema(pattern = "^[a-z0-9][a-z0-9-]{0,62}$")]
    pub name: String,
    /// Bytes, or a quantity such as "10Gi".
    #[schema(value_type = String, example = "10Gi")]
    pub size: crate::resources::Memory,
    #[serde(default)]
    pub access_mode: AccessMode,
    /// The cluster's default class unless named.
    #[serde(default)]
    pub storage_class: Option<String>,
}

/// A tenant's storage policy (platform admins set it). `null` keeps forever / sets no limit.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct StoragePolicy {
    /// Days after a job ends that its archived logs are kept.
    #[serde(default)]
    pub log_retention_days: Option<u32>,
    /// Days after a job ends that its artefacts are kept.
    #[serde(default)]
    pub artifact_retention_days: Option<u32>,
    /// The most bytes the tenant's volumes may add up to.
    #[serde(default)]
    pub storage_quota_bytes: Option<u64>,
}

/// The caller's tenant: its storage policy and what its volumes use.
#[derive(Debug, Clone, Serialize, Deserialize, ToSchema)]
pub struct StorageReport {
    pub tenant: String,
    pub policy: StoragePolicy,
    pub volumes: u64,
    pub volume_bytes: u64,
    /// The shard bytes of the datasets the tenant pushed to the object store (`yard datasets
    /// push`), which count against the storage quota with its volumes.
    #[serde(default)]
    pub dataset_bytes: u64,
}

/// One entry of the audit log: who changed what (or tried to), and how it ended.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, ToSchema)]
pub struct AuditEntry {
    /// Increases with every entry; `before` pages with it.
    pub seq: i64,
    pub at: DateTime<Utc>,
    /// The tenant the change concerns; absent for platform-wide changes (creating a tenant).
    pub tenant: Option<String>,
    /// `user:<name>`, or `local:<command>` for the server's admin commands.
    pub actor: String,
    /// `token:<id>` or `session:<token id>`: the credential used, never its secret.
    pub credential: Option<String>,
    /// What was done, e.g. `job.submit`, `quota.set`, `token.revoke`.
    pub action: String,
    /// What it was done to, e.g. `job:<id>`, `tenant:<name>`.
    pub target: String,
    /// `ok`, or why it was refused: `denied` (role or tenant), `invalid` (bad input),
    /// `conflict`, `error`.
    pub outcome: String,
    /// The refusal's message, for refused calls.
    pub detail: Option<String>,
    /// The client's address, when the server knew it.
    pub source: Option<String>,
}

/// A page of the audit log, newest first.
#[derive(Debug, Clone, Serialize, Deserialize, ToSchema)]
pub struct AuditPage {
    pub items: Vec<AuditEntry>,
    /// Pass as `before` for the next (older) page; absent on the last page.
    pub next_before: Option<i64>,
}

/// Resources held over time, for one group of a usage report.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, ToSchema)]
pub struct UsageRow {
    /// The group's keys, by the `by` asked for (`tenant`, `user`, `gpu_type`, `template`); a
    /// key not asked for is absent, a job with no GPU type or template has `-`.
    pub tenant: Option<String>,
    pub user: Option<String>,
    pub gpu_type: Option<String>,
    pub template: Option<String>,
    /// GPUs held x hours, within the window.
    pub gpu_hours: f64,
    /// CPU cores held x hours, within the window.
    pub cpu_hours: f64,
    /// Attempts that overlap the window.
    pub attempts: i64,
    /// GPU-hours decayed by age with the report's half-life (Slurm's fair-share usage): an hour
    /// one half-life ago counts half. Over all time, not clipped to the window.
    pub decayed_gpu_hours: f64,
    /// GPU-hours the engines report using (`gpu_utilization` metric) over GPU-hours held, when
    /// the jobs in the group reported it.
    pub efficiency: Option<f64>,
}

/// A usage report: GPU- and CPU-hours per group in a window, and per day per tenant.
#[derive(Debug, Clone, Serialize, Deserialize, ToSchema)]
pub struct UsageReport {
    pub from: DateTime<Utc>,
    pub to: DateTime<Utc>,
    pub by: Vec<String>,
    pub half_life_hours: f64,
    pub rows: Vec<UsageRow>,
    /// GPU-hours per tenant per bucket (`bucket_seconds` long, the first starting at `from`),
    /// for the chart.
    pub series: Vec<UsageSeries>,
    pub bucket_seconds: i64,
}

/// One tenant's GPU-hours per bucket of a usage report.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, ToSchema)]
pub struct UsageSeries {
    pub tenant: String,
    /// GPU-hours in each bucket, in order.
    pub gpu_hours: Vec<f64>,
}

#[cfg(test)]
mod debug_tests {
    use super::*;

    #[test]
    fn a_created_tokens_debug_does_not_show_the_token_also_inside_an_invitation() {
        let created = TokenCreated {
            id: Uuid::nil(),
            name: "laptop".into(),
            token: "tyd_0123456789abcdef".into(),
            expires_at: None,
        };
        let added = MemberAdded {
            user: "ada".into(),
            tenant: "vision".into(),
            role: Role::Member,
            user_created: true,
            token: Some(created.clone()),
        };
        for printed in [format!("{created:?}"), format!("{added:?}"), format!("{added:#?}")] {
            assert!(!printed.contains("tyd_0123456789abcdef"), "{printed}");
            assert!(printed.contains("laptop"), "{printed}");
        }
    }
}

/// The kinds of interactive session. Only notebooks are served so far (docs/sessions.md).
pub const SESSION_KINDS: [&str; 1] = ["notebook"];

/// Open an interactive session: a job of the caller's tenant, queued under its quota.
#[derive(Debug, Clone, Serialize, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct SessionCreate {
    /// `notebook` (JupyterLab).
    #[serde(default = "notebook_kind")]
    pub kind: String,
    /// The Python that has jupyterlab, as the replica runs it (the template's `python`).
    #[serde(default)]
    pub python: Option<String>,
    #[serde(default)]
    pub gpus: Option<u32>,
    #[serde(default)]
    pub gpu_type: Option<String>,
    #[serde(default)]
    pub cpu: Option<f64>,
    #[serde(default)]
    pub memory: Option<String>,
}

fn notebook_kind() -> String {
    "notebook".into()
}

/// An interactive session: its job's id (also the session's), kind and state.
#[derive(Debug, Clone, Serialize, Deserialize, ToSchema)]
pub struct Session {
    pub id: Uuid,
    pub kind: String,
    /// The state of the session's job.
    pub state: JobState,
    /// Who opened it.
    pub user: String,
    pub created_at: DateTime<Utc>,
    /// The last request that reached it through the proxy after authentication.
    pub last_activity_at: DateTime<Utc>,
}

/// A link that opens a session in a browser, once, within a minute: it carries a one-time grant
/// (not the caller's token), which the proxy exchanges for the session's own cookie.
#[derive(Debug, Clone, Serialize, Deserialize, ToSchema)]
pub struct SessionLink {
    pub url: String,
    pub expires_at: DateTime<Utc>,
}
