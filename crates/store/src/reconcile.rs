//! Queries of the control loops (admission and the reconciler). They act for the platform,
//! across tenants, by job id; no request reaches them. Every write is a conditional statement
//! on the state it expects, so a loop that raced a user (a cancel) or another loop simply
//! finds nothing to change.

use std::collections::{HashMap, HashSet};

// The pass's maps of thousands of job ids hash with FxHash: the ids are the server's own
// (random UUIDs), and SipHash's resistance to chosen keys buys nothing here at several times the cost.
use rustc_hash::FxHashMap;
use std::sync::{Arc, Mutex, PoisonError};

use chrono::{DateTime, Utc};
use sqlx::{FromRow, Row};
use trainyard_core::job::{JobSpec, JobState};
use trainyard_core::record::ServerRecord;
use trainyard_core::{Error, Result};
use uuid::Uuid;

use crate::jobs::to_stored_exit_code;
use crate::{Store, db_error};

/// The metric an engine reports after each checkpoint it saved (its value: the step saved).
pub const CHECKPOINT_METRIC: &str = "checkpoint_step";

/// An unfinished job as the loops see it.
#[derive(Debug, Clone)]
pub struct UnfinishedJob {
    pub id: Uuid,
    pub tenant_id: Uuid,
    /// The tenant's name.
    pub tenant: String,
    /// The job's own name.
    pub name: String,
    /// The user who submitted it.
    pub created_by: Uuid,
    pub state: JobState,
    pub reason: Option<String>,
    /// Shared with the read's cache (see [`Store::jobs_unfinished`]).
    pub spec: Arc<JobSpec>,
    pub priority: i32,
    pub max_restarts: i32,
    pub restart_count: i32,
    pub cancel_requested: bool,
    /// Someone (the scheduler) asked to stop it to make room; it returns to the queue.
    pub preempt_requested: bool,
    /// The job it is being stopped to make room for, while `preempt_requested`: the room is
    /// that job's until this one has ended.
    pub preempted_for: Option<Uuid>,
    pub created_at: DateTime<Utc>,
    /// When it was last admitted (holding jobs only).
    pub admitted_at: Option<DateTime<Utc>>,
    /// The GPU type its quota is counted in, and the node of each replica, once admitted.
    pub flavor: Option<String>,
    pub assigned_nodes: Option<Vec<String>>,
    /// Queued jobs only: the nodes whose shard cache holds content the job reads (reported
    /// within the last day), which the scheduler prefers.
    pub warm_nodes: Vec<String>,
    pub expected_runtime_seconds: Option<i32>,
    /// The latest attempt, if the job was ever launched.
    pub attempt: Option<AttemptRecord>,
    /// Holding jobs on spare room only: when it last reported a checkpoint (its
    /// `checkpoint_step` metric), for choosing the one that loses least when stopped.
    pub saved_at: Option<DateTime<Utc>>,
}

/// A kind of job whose past run times predict the next one's: the same template (or, without
/// one, the same job name) in one tenant, with the same shape.
#[derive(Debug, Clone, PartialEq, Eq, Hash, serde::Serialize)]
pub struct RunClass {
    pub tenant_id: Uuid,
    pub template: Option<String>,
    /// The job's name, for a job of no template.
    pub name: Option<String>,
    pub replicas: i32,
    /// GPUs per replica.
    pub gpus: i32,
}

/// One past successful run of a [`RunClass`] (its index in the classes asked for).
#[derive(Debug, Clone, PartialEq, Eq, FromRow)]
pub struct PastRun {
    pub class: i64,
    pub created_by: Uuid,
    pub seconds: i64,
}

/// The decoded rows of unfinished jobs by row versions (see [`Store::jobs_unfinished`]).
#[derive(Debug, Default)]
pub(crate) struct RowCache {
    entries: Mutex<FxHashMap<Uuid, CachedRow>>,
}

#[derive(Debug)]
struct CachedRow {
    /// The job row's `xmin`, and its latest attempt's (holding jobs only).
    version: i64,
    attempt_version: Option<i64>,
    row: Arc<DecodedRow>,
}

/// A job as the loops see it with the content hashes its datasets read (queued jobs only), or
/// what is wrong with its row.
type DecodedRow = std::result::Result<(Arc<UnfinishedJob>, Vec<String>), Box<UnhandledJob>>;

/// A job row the loops cannot decode (a spec or state this version does not understand): it is
/// reported and left out of scheduling, and every other job goes on. What does decode of it is
/// kept, so that it still holds what its attempt holds and still stops when cancelled.
#[derive(Debug, Clone)]
pub struct UnhandledJob {
    pub id: Uuid,
    pub problem: String,
    pub tenant_id: Uuid,
    /// Its state, when that decodes.
    pub state: Option<JobState>,
    pub priority: i32,
    pub cancel_requested: bool,
    pub flavor: Option<String>,
    pub assigned_nodes: Option<Vec<String>>,
    /// Since when it holds capacity (admitted), or was submitted.
    pub since: DateTime<Utc>,
    /// Its latest attempt, if it has one.
    pub attempt: Option<AttemptRecord>,
    /// How many replicas it runs and what each takes, read from the stored spec as plain JSON
    /// (its `replicas` and `resources`), each when it decodes on its own.
    pub replicas: Option<u32>,
    pub resources: Option<trainyard_core::resources::Resources>,
}

impl UnhandledJob {
    /// Its attempt that began and has not ended (it holds GPUs and processes), by number.
    pub fn live_attempt(&self) -> Option<&AttemptRecord> {
        self.attempt.as_ref().filter(|attempt| !attempt.ended)
    }
}

/// The unfinished jobs, and the rows among them that could not be decoded.
#[derive(Debug, Clone, Default)]
pub struct Unfinished {
    /// Shared with the read's cache: a pass reads thousands, most of them unchanged.
    pub jobs: Vec<Arc<UnfinishedJob>>,
    pub unhandled: Vec<UnhandledJob>,
}

/// What the database holds of one attempt.
#[derive(Debug, Clone)]
pub struct AttemptRecord {
    pub number: i32,
    pub placement: Option<serde_json::Value>,
    pub ended: bool,
    /// When it began (a time limit counts from here).
    pub started_at: Option<DateTime<Utc>>,
    /// When it ended (a restart waits its back-off from here).
    pub ended_at: Option<DateTime<Utc>>,
}

/// How many queued jobs of each tenant one admission pass looks at: the head of every tenant's
/// queue, so that fair share sees every tenant however long another's queue is.
pub const QUEUE_WINDOW_PER_TENANT: i64 = 500;

/// How far [`Store::queued_ahead`] counts the jobs ahead of one: 20 windows deep.
pub const QUEUED_AHEAD_COUNTED: i64 = 10_000;

/// Where a queued job stands in its tenant's queue.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct QueuedAhead {
    /// Queued jobs of the tenant before it (at most [`QUEUED_AHEAD_COUNTED`] + 1).
    pub ahead: i64,
    /// Of those, the ones of higher priority (at most [`QUEUED_AHEAD_COUNTED`] + 1).
    pub higher: i64,
    /// More than [`QUEUED_AHEAD_COUNTED`] are ahead: `ahead` is a lower bound.
    pub more_than_counted: bool,
}

/// A tenant's scheduling policy and quotas, as stored.
#[derive(Debug, Clone, FromRow)]
pub struct TenantPolicyRow {
    pub id: Uuid,
    pub name: String,
    pub cohort: Option<String>,
    pub weight: f64,
    pub preempt_lower_priority: bool,
    #[sqlx(json)]
    pub quotas: Vec<QuotaRow>,
}

/// One job the scheduler admits, and where ([`Store::jobs_admit`]).
#[derive(Debug, Clone, serde::Serialize)]
pub struct Admission<'a> {
    pub id: Uuid,
    pub flavor: Option<&'a str>,
    pub nodes: &'a [String],
}

/// One job the scheduler preempts ([`Store::jobs_preempt`]): why, in words, and for which job.
#[derive(Debug, Clone)]
pub struct Victim {
    pub id: Uuid,
    pub reason: String,
    /// The job its room is for.
    pub for_job: Uuid,
}

#[derive(Debug, Clone, PartialEq, Eq, serde::Deserialize)]
pub struct QuotaRow {
    pub flavor: String,
    pub nominal: i64,
    pub borrowing_limit: Option<i64>,
    pub lending_limit: Option<i64>,
}

/// The batch of [`Store::attempts_end`] as a relation `u`, in each of its statements.
macro_rules! ends_batch {
    () => {
        "jsonb_to_recordset($1) AS u(job_id uuid, attempt int, exit_codes int[], image_digests text[], \"to\" text,
                                     reason text, actor text, restart int)"
    };
}

impl Store {
    /// Every job that holds capacity or is being stopped, and the head of the queue in
    /// admission order (priority, then submit order). A row that does not decode is returned
    /// apart, in `unhandled`, instead of failing the whole read.
    ///
    /// Each pass reads every such job, thousands under load, so the read is in two steps: the
    /// first brings only each job's id and row versions (Postgres's `xmin` of the job's row and
    /// of its latest attempt's, new with every update of either); the second brings, in one
    /// more statement, the whole rows of the jobs that are new or changed since the last read.
    /// The decoded rows are kept while their jobs are unfinished ([`RowCache`]).
    pub async fn jobs_unfinished(&self) -> Result<Unfinished> {
        // language=PostgreSQL
        let versions: Vec<(Uuid, i64, Option<i64>)> = sqlx::query_as(
            "(SELECT j.id, j.xmin::text::bigint, a.version
              FROM jobs j
              LEFT JOIN LATERAL (SELECT xmin::text::bigint AS version FROM job_attempts
                                 WHERE job_id = j.id ORDER BY attempt DESC LIMIT 1) a ON true
              -- JobState::holds_capacity, as a literal: the planner matches it to the partial
              -- index jobs_unfinished, which a bound array would not (a test pins the two).
              WHERE j.state IN ('admitted', 'starting', 'running', 'restarting'))
             UNION ALL
             (SELECT j.id, j.version, NULL
              FROM tenants t
              CROSS JOIN LATERAL (SELECT q.id, q.xmin::text::bigint AS version FROM jobs q
                                  WHERE q.tenant_id = t.id AND q.state = 'queued'
                                  ORDER BY q.priority DESC, q.id LIMIT $1) j)",
        )
        .bind(QUEUE_WINDOW_PER_TENANT)
        .fetch_all(&self.pool)
        .await
        .map_err(db_error)?;
        let decoded = self.rows_of(&versions).await?;
        let mut unfinished = Unfinished::default();
        let mut reads_data: Vec<(usize, &[String])> = Vec::new();
        for (id, _, _) in &versions {
            let Some(row) = decoded.get(id) else { continue }; // gone meanwhile, or undecodable
            match row.as_ref() {
                Ok((job, hashes)) => {
                    if !hashes.is_empty() {
                        reads_data.push((unfinished.jobs.len(), hashes));
                    }
                    unfinished.jobs.push(Arc::clone(job));
                }
                Err(unhandled) => unfinished.unhandled.push((**unhandled).clone()),
            }
        }
        if !reads_data.is_empty() {
            let warm = self.warm_nodes_by_content().await?;
            for (index, hashes) in reads_data {
                // A copy of its own (the cache's stays without): the nodes change pass by pass.
                let job = Arc::make_mut(&mut unfinished.jobs[index]);
                let mut nodes: Vec<String> = hashes
                    .iter()
                    .filter_map(|hash| warm.get(&(job.tenant_id, hash.clone())))
                    .flatten()
                    .cloned()
                    .collect();
                nodes.sort_unstable();
                nodes.dedup();
                job.warm_nodes = nodes;
            }
        }
        self.spare_saved_at(&mut unfinished.jobs).await?;
        Ok(unfinished)
    }

    /// Fills in when each holding job on spare room last reported a checkpoint (the engine's
    /// `checkpoint_step` metric): a copy of its own, as the time changes pass by pass. One
    /// index range per job (`metrics_by_series`), and nothing read when no such job holds room.
    async fn spare_saved_at(&self, jobs: &mut [Arc<UnfinishedJob>]) -> Result<()> {
        let spare: Vec<Uuid> = jobs.iter().filter(|j| j.spec.spare && j.state.holds_capacity()).map(|j| j.id).collect();
        if spare.is_empty() {
            return Ok(());
        }
        // language=PostgreSQL
        let saved: Vec<(Uuid, DateTime<Utc>)> = sqlx::query_as(
            "SELECT m.job_id, max(m.recorded_at) FROM metrics m
              WHERE m.job_id = ANY($1) AND m.name = $2
              GROUP BY m.job_id",
        )
        .bind(&spare)
        .bind(CHECKPOINT_METRIC)
        .fetch_all(&self.pool)
        .await
        .map_err(db_error)?;
        let saved: FxHashMap<Uuid, DateTime<Utc>> = saved.into_iter().collect();
        for job in jobs.iter_mut().filter(|j| saved.contains_key(&j.id)) {
            Arc::make_mut(job).saved_at = saved.get(&job.id).copied();
        }
        Ok(())
    }

    /// The decoded row of each job in `versions` (id, job row version, latest attempt's
    /// version): from the cache where both versions match, else read and decoded again.
    /// Jobs absent from the answer left the unfinished states meanwhile, or their row does not
    /// decode at all (logged).
    async fn rows_of(&self, versions: &[(Uuid, i64, Option<i64>)]) -> Result<FxHashMap<Uuid, Arc<DecodedRow>>> {
        let mut rows = FxHashMap::with_capacity_and_hasher(versions.len(), Default::default());
        let stale: Vec<Uuid> = {
            let cache = self.unfinished_rows.entries.lock().unwrap_or_else(PoisonError::into_inner);
            versions
                .iter()
                .filter(|(id, version, attempt_version)| match cache.get(id) {
                    Some(cached) if cached.version == *version && cached.attempt_version == *attempt_version => {
                        rows.insert(*id, Arc::clone(&cached.row));
                        false
                    }
                    _ => true,
                })
                .map(|(id, _, _)| *id)
                .collect()
        };
        if !stale.is_empty() {
            // Each branch as the versions' read chose it: a queued job is seen without the
            // admission and attempt it may keep from before a preemption.
            // language=PostgreSQL
            let fetched = sqlx::query(
                "(SELECT j.id, j.tenant_id, n.name AS tenant_name, j.state, j.reason, j.xmin::text::bigint AS version,
                         a.version AS attempt_version, j.priority, j.max_restarts, j.restart_count,
                         j.cancel_requested_at IS NOT NULL AS cancel_requested,
                         j.preempt_requested_at IS NOT NULL AS preempt_requested,
                         CASE WHEN j.preempt_requested_at IS NOT NULL THEN j.preempted_for END AS preempted_for,
                         j.created_at, j.admitted_at,
                         j.flavor, j.assigned_nodes, j.expected_runtime_seconds,
                         a.attempt, a.placement, a.ended_at IS NOT NULL AS attempt_ended, a.ended_at AS attempt_ended_at,
                         j.name AS job_name, a.started_at AS attempt_started_at, NULL::jsonb AS content_hashes,
                         j.spec::text AS spec, j.created_by
                  FROM jobs j
                  JOIN tenants n ON n.id = j.tenant_id
                  LEFT JOIN LATERAL (SELECT attempt, placement, started_at, ended_at, xmin::text::bigint AS version
                                     FROM job_attempts
                                     WHERE job_id = j.id ORDER BY attempt DESC LIMIT 1) a ON true
                  WHERE j.id = ANY($1) AND j.state IN ('admitted', 'starting', 'running', 'restarting'))
                 UNION ALL
                 (SELECT j.id, j.tenant_id, t.name, j.state, j.reason, j.xmin::text::bigint, NULL, j.priority,
                         j.max_restarts, j.restart_count, false, false, NULL::uuid, j.created_at, NULL, NULL, NULL,
                         j.expected_runtime_seconds, NULL, NULL, NULL, NULL, j.name, NULL,
                         -- The content its datasets hold: one function call, not a subquery a
                         -- row (matched with the nodes' caches: 50,000 queued jobs, +23 ms,
                         -- where a join per row took a second).
                         CASE WHEN jsonb_typeof(j.datasets) = 'array' AND j.datasets <> '[]'
                              THEN jsonb_path_query_array(j.datasets, '$[*].content_hash') END,
                         j.spec::text, j.created_by
                  FROM jobs j
                  JOIN tenants t ON t.id = j.tenant_id
                  WHERE j.id = ANY($1) AND j.state = 'queued')",
            )
            .bind(&stale)
            .fetch_all(&self.pool)
            .await
            .map_err(db_error)?;
            let mut cache = self.unfinished_rows.entries.lock().unwrap_or_else(PoisonError::into_inner);
            for row in &fetched {
                let row = match UnfinishedRow::from_row(row) {
                    Ok(row) => row,
                    Err(err) => {
                        let id: Option<Uuid> = row.try_get("id").ok();
                        tracing::error!(job = ?id, %err, "an unfinished job's row does not decode");
                        continue;
                    }
                };
                let (id, version, attempt_version) = (row.id, row.version, row.attempt_version);
                let decoded = Arc::new(unfinished_job_decode(row));
                cache.insert(id, CachedRow { version, attempt_version, row: Arc::clone(&decoded) });
                rows.insert(id, decoded);
            }
        }
        // Kept only for the jobs still unfinished.
        let mut cache = self.unfinished_rows.entries.lock().unwrap_or_else(PoisonError::into_inner);
        cache.retain(|id, _| rows.contains_key(id));
        Ok(rows)
    }

    /// Per tenant and content hash, the nodes whose shard cache holds it (reported within the
    /// last day): one small read (tenants x datasets x nodes) per pass that has queued jobs
    /// reading datasets.
    async fn warm_nodes_by_content(&self) -> Result<std::collections::HashMap<(Uuid, String), Vec<String>>> {
        // language=PostgreSQL
        let rows: Vec<(Uuid, String, Vec<String>)> = sqlx::query_as(
            "SELECT tenant_id, content_hash, array_agg(node ORDER BY node) FROM node_datasets
             WHERE reported_at > now() - interval '1 day' GROUP BY tenant_id, content_hash",
        )
        .fetch_all(&self.pool)
        .await
        .map_err(db_error)?;
        Ok(rows.into_iter().map(|(tenant, hash, nodes)| ((tenant, hash), nodes)).collect())
    }

    /// Records a note on a job without changing its state: the reason says it and an event
    /// records it (a job the loops cannot handle, a launch retried after a control-plane
    /// error). Only when the reason changes, so repeating it adds nothing.
    pub async fn job_note(&self, job_id: Uuid, reason: &str, actor: &str) -> Result<bool> {
        // language=PostgreSQL
        let marked = sqlx::query(
            "WITH marked AS (
                 UPDATE jobs SET reason = $2, last_actor = $3, event_seq = event_seq + 1, updated_at = now()
                 WHERE id = $1 AND reason IS DISTINCT FROM $2 AND (SELECT control_fence($4))
                 RETURNING id, tenant_id, state, event_seq)
             INSERT INTO job_events (job_id, tenant_id, seq, from_state, to_state, actor, reason)
             SELECT id, tenant_id, event_seq, state, state, $3, $2 FROM marked",
        )
        .bind(job_id)
        .bind(reason)
        .bind(actor)
        .bind(self.control_epoch())
        .execute(&self.pool)
        .await
        .map_err(db_error)?;
        Ok(marked.rows_affected() > 0)
    }

    /// Moves a job from one of `from` to `to`, recording who and why. False when the job was
    /// not in any of `from` (someone else moved it first).
    pub async fn job_transition(
        &self,
        job_id: Uuid,
        from: &[JobState],
        to: JobState,
        actor: &str,
        reason: Option<&str>,
    ) -> Result<bool> {
        let from: Vec<&str> = from.iter().map(|s| s.as_str()).collect();
        // language=PostgreSQL
        let result = sqlx::query(
            "UPDATE jobs SET state = $3, reason = $4, last_actor = $5
             WHERE id = $1 AND state = ANY($2) AND (SELECT control_fence($6))",
        )
        .bind(job_id)
        .bind(&from)
        .bind(to.as_str())
        .bind(reason)
        .bind(actor)
        .bind(self.control_epoch())
        .execute(&self.pool)
        .await
        .map_err(db_error)?;
        Ok(result.rows_affected() == 1)
    }

    /// Run times of the newest successful jobs of each class (at most 50 a class, of the last
    /// 90 days), newest first, with who submitted each: what start estimates guess run times
    /// from (`trainyard_scheduler::history`). A job's run time is the sum of its attempts' (the
    /// time it held its resources), so that waits between attempts do not count.
    pub async fn runtimes_recent(&self, classes: &[RunClass]) -> Result<Vec<PastRun>> {
        if classes.is_empty() {
            return Ok(Vec::new());
        }
        let classes = serde_json::to_value(classes).map_err(Error::internal)?;
        // Each class's newest jobs through its own index (template, else name), newest first.
        // language=PostgreSQL
        sqlx::query_as(
            "WITH k AS (SELECT * FROM ROWS FROM (jsonb_to_recordset($1)
                            AS (tenant_id uuid, template text, name text, replicas int, gpus int))
                        WITH ORDINALITY AS k(tenant_id, template, name, replicas, gpus, i))
             SELECT k.i - 1 AS class, r.created_by, r.seconds
             FROM k CROSS JOIN LATERAL (
                 SELECT j.id, j.created_by,
                        (SELECT extract(epoch FROM sum(a.ended_at - a.started_at))::bigint FROM job_attempts a
                         WHERE a.job_id = j.id AND a.ended_at IS NOT NULL) AS seconds
                 FROM jobs j
                 WHERE j.tenant_id = k.tenant_id
                   AND CASE WHEN k.template IS NULL THEN j.template_name IS NULL AND j.name = k.name
                            ELSE j.template_name = k.template END
                   AND j.state = 'succeeded' AND j.finished_at > now() - interval '90 days'
                   AND (j.spec->>'replicas')::int = k.replicas
                   AND coalesce((j.spec->'resources'->>'gpus')::int, 0) = k.gpus
                 ORDER BY j.id DESC LIMIT 50) r
             WHERE r.seconds IS NOT NULL
             ORDER BY k.i, r.id DESC",
        )
        .bind(classes)
        .fetch_all(&self.pool)
        .await
        .map_err(db_error)
    }

    /// Every tenant's scheduling policy and quotas; a removed tenant's quota no longer counts in
    /// its cohort (one being removed still holds what its stopping jobs hold).
    pub async fn tenant_policies(&self) -> Result<Vec<TenantPolicyRow>> {
        // language=PostgreSQL
        sqlx::query_as(
            "SELECT t.id, t.name, t.cohort, t.weight, t.preempt_lower_priority,
                    coalesce(json_agg(json_build_object('flavor', q.flavor, 'nominal', q.nominal,
                             'borrowing_limit', q.borrowing_limit, 'lending_limit', q.lending_limit))
                             FILTER (WHERE q.flavor IS NOT NULL), '[]') AS quotas
             FROM tenants t LEFT JOIN quotas q ON q.tenant_id = t.id
             WHERE t.removed_at IS NULL
             GROUP BY t.id ORDER BY t.name",
        )
        .fetch_all(&self.pool)
        .await
        .map_err(db_error)
    }

    /// Admits still-queued jobs with the scheduler's placements, in one statement (a pass admits
    /// many at once). Returns the ids admitted; a job that moved meanwhile is not among them.
    pub async fn jobs_admit(&self, admissions: &[Admission<'_>]) -> Result<HashSet<Uuid>> {
        if admissions.is_empty() {
            return Ok(HashSet::new());
        }
        let admissions = serde_json::to_value(admissions).map_err(Error::internal)?;
        // language=PostgreSQL
        let admitted: Vec<Uuid> = sqlx::query_scalar(
            "UPDATE jobs SET state = 'admitted', reason = NULL, last_actor = 'scheduler', flavor = u.flavor,
                             assigned_nodes = u.nodes, preempt_requested_at = NULL
             FROM jsonb_to_recordset($1) AS u(id uuid, flavor text, nodes text[])
             WHERE jobs.id = u.id AND jobs.state = 'queued' AND (SELECT control_fence($2))
             RETURNING jobs.id",
        )
        .bind(admissions)
        .bind(self.control_epoch())
        .fetch_all(&self.pool)
        .await
        .map_err(db_error)?;
        Ok(admitted.into_iter().collect())
    }

    /// Marks running every job of `started` that is `starting`, and records the images each
    /// job's replicas run when known: one statement for a whole pass's starts. Returns the jobs
    /// it moved.
    pub async fn jobs_running(&self, started: &[Started<'_>], actor: &str) -> Result<HashSet<Uuid>> {
        if started.is_empty() {
            return Ok(HashSet::new());
        }
        let started = serde_json::to_value(started).map_err(Error::internal)?;
        // language=PostgreSQL
        let moved: Vec<Uuid> = sqlx::query_scalar(
            "WITH u AS (SELECT * FROM jsonb_to_recordset($1) AS u(job_id uuid, attempt int, image_digests text[])),
             images AS (
                 UPDATE job_attempts a SET image_digests = u.image_digests FROM u
                 WHERE a.job_id = u.job_id AND a.attempt = u.attempt AND cardinality(u.image_digests) > 0
                   AND (SELECT control_fence($3)))
             UPDATE jobs SET state = 'running', reason = NULL, last_actor = $2
             FROM u WHERE jobs.id = u.job_id AND jobs.state = 'starting' AND (SELECT control_fence($3))
             RETURNING jobs.id",
        )
        .bind(started)
        .bind(actor)
        .bind(self.control_epoch())
        .fetch_all(&self.pool)
        .await
        .map_err(db_error)?;
        Ok(moved.into_iter().collect())
    }

    /// Asks to stop each victim (with its reason) so that other jobs can start; the reconciler
    /// stops them and requeues them. An admitted victim that has not launched goes straight back
    /// to the queue. One statement for a whole cycle's preemptions; returns the victims it
    /// requeued or marked (not those that ended or were cancelled meanwhile).
    pub async fn jobs_preempt(&self, victims: &[Victim]) -> Result<HashSet<Uuid>> {
        if victims.is_empty() {
            return Ok(HashSet::new());
        }
        let ids: Vec<Uuid> = victims.iter().map(|v| v.id).collect();
        let reasons: Vec<&str> = victims.iter().map(|v| v.reason.as_str()).collect();
        let for_jobs: Vec<Uuid> = victims.iter().map(|v| v.for_job).collect();
        // Two updates of disjoint rows (by state), one snapshot.
        // language=PostgreSQL
        let preempted: Vec<Uuid> = sqlx::query_scalar(
            "WITH u AS (SELECT * FROM unnest($1::uuid[], $2::text[], $4::uuid[]) AS u(id, reason, for_job)),
             requeued AS (
                 UPDATE jobs SET state = 'queued', reason = u.reason, last_actor = 'scheduler', flavor = NULL,
                                 assigned_nodes = NULL
                 FROM u WHERE jobs.id = u.id AND jobs.state = 'admitted' AND (SELECT control_fence($3))
                 RETURNING jobs.id),
             marked AS (
                 -- A victim asked to stop before keeps its first preemptor: its room is promised.
                 UPDATE jobs SET preempt_requested_at = coalesce(preempt_requested_at, now()), reason = u.reason,
                                 preempted_for = CASE WHEN preempt_requested_at IS NULL THEN u.for_job
                                                      ELSE preempted_for END
                 FROM u WHERE jobs.id = u.id AND jobs.state IN ('starting', 'running', 'restarting')
                   AND jobs.cancel_requested_at IS NULL AND (SELECT control_fence($3))
                 RETURNING jobs.id)
             SELECT id FROM requeued UNION ALL SELECT id FROM marked",
        )
        .bind(&ids)
        .bind(&reasons)
        .bind(self.control_epoch())
        .bind(&for_jobs)
        .fetch_all(&self.pool)
        .await
        .map_err(db_error)?;
        Ok(preempted.into_iter().collect())
    }

    /// Where a queued job of `tenant_id` stands in its tenant's queue (the order of
    /// [`Store::jobs_unfinished`]): how many queued jobs come before it, and how many of those
    /// have a higher priority, each counted up to [`QUEUED_AHEAD_COUNTED`] + 1 (more than
    /// that reads "more than 10,000"). Zeros when it is not queued.
    ///
    /// A B-tree cannot rank, so an exact count reads every entry ahead: about 30 ms at 100,000
    /// queued, for each poll of a deep job's page. Two range scans of `jobs_queued_by_tenant`
    /// (higher priority; same priority, submitted earlier), each stopped at the bound, cost at
    /// most 20,002 index entries, a few milliseconds, however long the queue.
    pub async fn queued_ahead(&self, tenant_id: Uuid, job_id: Uuid) -> Result<QueuedAhead> {
        // language=PostgreSQL
        let (higher, same): (i64, i64) = sqlx::query_as(
            "WITH me AS (SELECT priority, id FROM jobs WHERE id = $1 AND tenant_id = $2 AND state = 'queued')
             SELECT (SELECT count(*) FROM (SELECT 1 FROM jobs q, me
                                            WHERE q.tenant_id = $2 AND q.state = 'queued' AND q.priority > me.priority
                                            LIMIT $3) higher),
                    (SELECT count(*) FROM (SELECT 1 FROM jobs q, me
                                            WHERE q.tenant_id = $2 AND q.state = 'queued' AND q.priority = me.priority
                                                  AND q.id < me.id
                                            LIMIT $3) same)",
        )
        .bind(job_id)
        .bind(tenant_id)
        .bind(QUEUED_AHEAD_COUNTED + 1)
        .fetch_one(&self.pool)
        .await
        .map_err(db_error)?;
        let ahead = (higher + same).min(QUEUED_AHEAD_COUNTED + 1);
        Ok(QueuedAhead { ahead, higher, more_than_counted: ahead > QUEUED_AHEAD_COUNTED })
    }

    /// Sets why queued jobs wait for admission, and why starting jobs wait for their replicas
    /// (`ids[i]` gets `reasons[i]`), in one statement; jobs in any other state are left alone.
    ///
    /// A change of usage rewords thousands of reasons at once, pass after pass: the rows the
    /// loops read last ([`Store::jobs_unfinished`]) are kept up to date here, so that the next
    /// read does not fetch them again. Only rows unchanged since that read are reworded (their
    /// version checked in the statement); one changed meanwhile is reworded at a later pass,
    /// once read again.
    pub async fn job_pending_reasons_set(&self, ids: &[Uuid], reasons: &[String]) -> Result<()> {
        let versions: Vec<Option<i64>> = {
            let cache = self.unfinished_rows.entries.lock().unwrap_or_else(PoisonError::into_inner);
            ids.iter().map(|id| cache.get(id).map(|cached| cached.version)).collect()
        };
        // language=PostgreSQL
        let reworded: Vec<(Uuid, i64)> = sqlx::query_as(
            "UPDATE jobs SET reason = u.reason
               FROM unnest($1::uuid[], $2::text[], $4::bigint[]) AS u(id, reason, version)
              WHERE jobs.id = u.id AND jobs.state IN ('queued', 'starting') AND jobs.reason IS DISTINCT FROM u.reason
                AND (u.version IS NULL OR jobs.xmin::text::bigint = u.version)
                AND (SELECT control_fence($3))
              RETURNING jobs.id, jobs.xmin::text::bigint",
        )
        .bind(ids)
        .bind(reasons)
        .bind(self.control_epoch())
        .bind(&versions)
        .fetch_all(&self.pool)
        .await
        .map_err(db_error)?;
        let reason_of: HashMap<Uuid, &String> = ids.iter().copied().zip(reasons).collect();
        let mut cache = self.unfinished_rows.entries.lock().unwrap_or_else(PoisonError::into_inner);
        for (id, version) in reworded {
            let (Some(cached), Some(reason)) = (cache.get_mut(&id), reason_of.get(&id)) else { continue };
            if let Ok((job, hashes)) = cached.row.as_ref() {
                let mut job = UnfinishedJob::clone(job);
                job.reason = Some((*reason).clone());
                let row = Arc::new(Ok((Arc::new(job), hashes.clone())));
                *cached = CachedRow { version, attempt_version: cached.attempt_version, row };
            }
        }
        Ok(())
    }

    /// Moves an admitted or restarting job to `starting` and opens its next attempt and its row
    /// of the usage ledger (what it holds, from now), in one transaction. Returns the attempt
    /// number, or `None` when the job was no longer launchable. For an attempt that will not
    /// start (its launch failed before anything ran); a launch uses [`Store::attempts_open`].
    pub async fn attempt_begin(&self, job_id: Uuid, actor: &str, held: Held) -> Result<Option<i32>> {
        let mut tx = self.begin().await?;
        let Some((_, attempt)) = self.attempt_begin_in(&mut tx, job_id, actor, held).await? else {
            return Ok(None);
        };
        tx.commit().await.map_err(db_error)?;
        Ok(Some(attempt))
    }

    /// Opens the next attempt of each job of `opens` and prepares its launch, in one statement
    /// (one commit), however many: what [`Store::attempt_begin`] does, then what
    /// [`Store::attempt_prepare`] does; launches running side by side open their attempts
    /// together. All or none: a refused row refuses the whole batch. Returns, for each
    /// job that was still launchable, its attempt number and job token.
    pub async fn attempts_open(&self, opens: &[AttemptToOpen], actor: &str) -> Result<HashMap<Uuid, (i32, String)>> {
        if opens.is_empty() {
            return Ok(HashMap::new());
        }
        let count = |n: u64| i64::try_from(n).unwrap_or(i64::MAX);
        let mut tokens = HashMap::with_capacity(opens.len());
        let mut hashes = Vec::with_capacity(opens.len());
        for open in opens {
            let (token, hash) = crate::metrics::job_token_new();
            tokens.insert(open.job_id, token);
            hashes.push(hash);
        }
        // One statement (one round trip, atomic as a transaction): each job to `starting`, its
        // attempt, its row of the usage ledger, the server's part of its run record and its job
        // token, each as `attempt_begin_in` and `attempt_prepare_in` write them; and, with its
        // first attempt, the job's MLflow run (its id the job's, in the Default experiment, 0:
        // MLFLOW_RUN_ID in its replicas), kept across attempts.
        // language=PostgreSQL
        let opened: Vec<(Uuid, i32)> = sqlx::query_as(
            "WITH input AS (
                 SELECT * FROM unnest($3::uuid[], $4::int[], $5::bigint[], $6::bigint[], $7::jsonb[], $8::bytea[])
                     AS i(job_id, gpus, cpu_millis, memory_bytes, server, token_hash)),
             moved AS (
                 UPDATE jobs j SET state = 'starting', reason = NULL, last_actor = $1
                 FROM input i
                 WHERE j.id = i.job_id AND j.state IN ('admitted', 'restarting') AND j.cancel_requested_at IS NULL
                   AND j.preempt_requested_at IS NULL AND (SELECT control_fence($2))
                 RETURNING j.id, j.tenant_id, j.created_by, j.template_name, j.flavor, j.params, j.datasets,
                           j.rerun_unpinned, j.init_from_job, j.init_from_step, j.name, i.gpus, i.cpu_millis, i.memory_bytes, i.server, i.token_hash),
             opened AS (
                 INSERT INTO job_attempts (job_id, tenant_id, attempt)
                 SELECT m.id, m.tenant_id, coalesce((SELECT max(attempt) FROM job_attempts WHERE job_id = m.id), 0) + 1
                 FROM moved m
                 RETURNING job_id, tenant_id, attempt, started_at),
             ledger AS (
                 INSERT INTO usage_ledger (job_id, attempt, tenant_id, user_id, template, gpu_type, gpus, cpu_millis,
                                           memory_bytes, started_at)
                 SELECT m.id, o.attempt, m.tenant_id, m.created_by, m.template_name, m.flavor, m.gpus, m.cpu_millis,
                        m.memory_bytes, o.started_at
                 FROM moved m JOIN opened o ON o.job_id = m.id),
             record AS (
                 INSERT INTO run_records (job_id, attempt, tenant_id, server)
                 SELECT o.job_id, o.attempt, o.tenant_id,
                        m.server || jsonb_build_object('params', m.params, 'datasets', coalesce(m.datasets, '[]'::jsonb))
                        || CASE WHEN m.rerun_unpinned IS NULL THEN '{}'::jsonb
                                ELSE jsonb_build_object('accepted_unpinned', m.rerun_unpinned) END
                        || CASE WHEN m.init_from_job IS NULL THEN '{}'::jsonb
                                ELSE jsonb_build_object('init_from', jsonb_build_object(
                                    'job_id', m.init_from_job, 'step', m.init_from_step)) END
                 FROM moved m JOIN opened o ON o.job_id = m.id
                 ON CONFLICT (job_id, attempt) DO NOTHING),
             token AS (
                 INSERT INTO job_tokens (token_hash, job_id, tenant_id, attempt)
                 SELECT m.token_hash, o.job_id, o.tenant_id, o.attempt FROM moved m JOIN opened o ON o.job_id = m.id),
             mlflow_run AS (
                 INSERT INTO mlflow_runs (id, job_id, tenant_id, experiment_id, name, user_name, created_by, start_time)
                 SELECT m.id, m.id, m.tenant_id, 0, m.name, u.name, m.created_by,
                        floor(extract(epoch FROM o.started_at) * 1000)::bigint
                 FROM moved m JOIN opened o ON o.job_id = m.id JOIN users u ON u.id = m.created_by
                 ON CONFLICT (id) DO NOTHING),
             mlflow_run_name AS (
                 INSERT INTO mlflow_tags (run_id, tenant_id, key, value)
                 SELECT m.id, m.tenant_id, 'mlflow.runName', m.name FROM moved m
                 ON CONFLICT ON CONSTRAINT mlflow_tags_unique DO NOTHING)
             SELECT job_id, attempt FROM opened",
        )
        .bind(actor)
        .bind(self.control_epoch())
        .bind(opens.iter().map(|o| o.job_id).collect::<Vec<_>>())
        .bind(opens.iter().map(|o| i32::try_from(o.held.gpus).unwrap_or(i32::MAX)).collect::<Vec<_>>())
        .bind(opens.iter().map(|o| count(o.held.cpu_millis)).collect::<Vec<_>>())
        .bind(opens.iter().map(|o| count(o.held.memory_bytes)).collect::<Vec<_>>())
        .bind(opens.iter().map(|o| &o.server).collect::<Vec<_>>())
        .bind(hashes)
        .fetch_all(&self.pool)
        .await
        .map_err(db_error)?;
        Ok(opened
            .into_iter()
            .filter_map(|(job_id, attempt)| Some((job_id, (attempt, tokens.remove(&job_id)?))))
            .collect())
    }

    /// [`Store::attempt_begin`]'s statements, in the caller's transaction: the job's tenant and
    /// the new attempt's number.
    async fn attempt_begin_in(
        &self,
        tx: &mut sqlx::PgConnection,
        job_id: Uuid,
        actor: &str,
        held: Held,
    ) -> Result<Option<(Uuid, i32)>> {
        // language=PostgreSQL
        let tenant_id: Option<Uuid> = sqlx::query_scalar(
            "UPDATE jobs SET state = 'starting', reason = NULL, last_actor = $2
             WHERE id = $1 AND state IN ('admitted', 'restarting') AND cancel_requested_at IS NULL
               AND preempt_requested_at IS NULL AND (SELECT control_fence($3))
             RETURNING tenant_id",
        )
        .bind(job_id)
        .bind(actor)
        .bind(self.control_epoch())
        .fetch_optional(&mut *tx)
        .await
        .map_err(db_error)?;
        let Some(tenant_id) = tenant_id else {
            return Ok(None);
        };
        // The attempt and its ledger row in one statement.
        // language=PostgreSQL
        let attempt: i32 = sqlx::query_scalar(
            "WITH opened AS (
                 INSERT INTO job_attempts (job_id, tenant_id, attempt)
                 SELECT $1, $2, coalesce(max(attempt), 0) + 1 FROM job_attempts WHERE job_id = $1
                 RETURNING attempt, started_at),
             ledger AS (
                 INSERT INTO usage_ledger (job_id, attempt, tenant_id, user_id, template, gpu_type, gpus, cpu_millis,
                                           memory_bytes, started_at)
                 SELECT j.id, o.attempt, j.tenant_id, j.created_by, j.template_name, j.flavor, $3, $4, $5, o.started_at
                 FROM jobs j, opened o WHERE j.id = $1)
             SELECT attempt FROM opened",
        )
        .bind(job_id)
        .bind(tenant_id)
        .bind(i32::try_from(held.gpus).unwrap_or(i32::MAX))
        .bind(i64::try_from(held.cpu_millis).unwrap_or(i64::MAX))
        .bind(i64::try_from(held.memory_bytes).unwrap_or(i64::MAX))
        .fetch_one(&mut *tx)
        .await
        .map_err(db_error)?;
        Ok(Some((tenant_id, attempt)))
    }

    pub async fn attempt_placement_set(&self, job_id: Uuid, attempt: i32, placement: &serde_json::Value) -> Result<()> {
        self.attempts_placement_set(&[(job_id, attempt, placement)]).await
    }

    /// Stores where each attempt of `placements` runs, in one statement, however many:
    /// launches ending side by side store their placements together.
    pub async fn attempts_placement_set(&self, placements: &[(Uuid, i32, &serde_json::Value)]) -> Result<()> {
        if placements.is_empty() {
            return Ok(());
        }
        // language=PostgreSQL
        sqlx::query(
            "UPDATE job_attempts a SET placement = u.placement
             FROM unnest($1::uuid[], $2::int[], $3::jsonb[]) AS u(job_id, attempt, placement)
             WHERE a.job_id = u.job_id AND a.attempt = u.attempt AND (SELECT control_fence($4))",
        )
        .bind(placements.iter().map(|(job_id, _, _)| *job_id).collect::<Vec<_>>())
        .bind(placements.iter().map(|(_, attempt, _)| *attempt).collect::<Vec<_>>())
        .bind(placements.iter().map(|(_, _, placement)| *placement).collect::<Vec<_>>())
        .bind(self.control_epoch())
        .execute(&self.pool)
        .await
        .map_err(db_error)?;
        Ok(())
    }

    /// Prepares an attempt's launch in one transaction (one commit): writes the server's part of
    /// its run record, before its replicas start (`server` with the job's parameters and datasets,
    /// and a rerun's accepted unpinned inputs, taken from its row in the same statement), and
    /// makes a job token for its engine, returned. Once written the record stays as it is: a
    /// resumed launch of the same attempt finds it and changes nothing (and the table's trigger
    /// refuses any change but the engine's part arriving), and makes another token for the same
    /// attempt (the replicas started before keep theirs; all of them die with the attempt).
    pub async fn attempt_prepare(
        &self,
        job_id: Uuid,
        tenant_id: Uuid,
        attempt: i32,
        server: &ServerRecord,
    ) -> Result<String> {
        let server = serde_json::to_value(server).map_err(Error::internal)?;
        let mut tx = self.begin().await?;
        let token = self.attempt_prepare_in(&mut tx, job_id, tenant_id, attempt, &server).await?;
        tx.commit().await.map_err(db_error)?;
        Ok(token)
    }

    /// [`Store::attempt_prepare`]'s statements, in the caller's transaction.
    async fn attempt_prepare_in(
        &self,
        tx: &mut sqlx::PgConnection,
        job_id: Uuid,
        tenant_id: Uuid,
        attempt: i32,
        server: &serde_json::Value,
    ) -> Result<String> {
        // language=PostgreSQL
        sqlx::query(
            "INSERT INTO run_records (job_id, attempt, tenant_id, server)
             SELECT a.job_id, a.attempt, a.tenant_id,
                    $3::jsonb || jsonb_build_object('params', j.params, 'datasets', coalesce(j.datasets, '[]'::jsonb))
                    -- A rerun's accepted unpinned inputs; absent otherwise, as in every record before.
                    || CASE WHEN j.rerun_unpinned IS NULL THEN '{}'::jsonb
                            ELSE jsonb_build_object('accepted_unpinned', j.rerun_unpinned) END
                    -- A fine-tune's source checkpoint; absent otherwise.
                    || CASE WHEN j.init_from_job IS NULL THEN '{}'::jsonb
                            ELSE jsonb_build_object('init_from', jsonb_build_object(
                                'job_id', j.init_from_job, 'step', j.init_from_step)) END
             FROM job_attempts a JOIN jobs j ON j.id = a.job_id
             WHERE a.job_id = $1 AND a.attempt = $2 AND (SELECT control_fence($4))
             ON CONFLICT (job_id, attempt) DO NOTHING",
        )
        .bind(job_id)
        .bind(attempt)
        .bind(server)
        .bind(self.control_epoch())
        .execute(&mut *tx)
        .await
        .map_err(db_error)?;
        crate::metrics::job_token_insert(&mut *tx, job_id, tenant_id, attempt).await
    }

    /// Closes an attempt with its exit codes and moves the job on, in one transaction:
    /// to `to` (succeeded, failed, cancelled) or, for `restarting`, counting one more restart.
    /// True when the job moved (it was `starting` or `running`).
    pub async fn attempt_end(&self, end: AttemptEnd<'_>) -> Result<bool> {
        let job_id = end.job_id;
        Ok(self.attempts_end(&[end]).await?.contains(&job_id))
    }

    /// Closes each attempt of `ends` and moves its job on, as [`Store::attempt_end`] does, all in
    /// one transaction of four statements, however many ended: a pass records every end it saw
    /// at once. All or none: a refused row (a transition the database forbids) refuses the
    /// whole batch, and the caller records them one at a time to find it. Returns the jobs that
    /// moved.
    pub async fn attempts_end(&self, ends: &[AttemptEnd<'_>]) -> Result<HashSet<Uuid>> {
        if ends.is_empty() {
            return Ok(HashSet::new());
        }
        #[derive(serde::Serialize)]
        struct Row<'a> {
            job_id: Uuid,
            attempt: i32,
            exit_codes: Vec<i32>,
            image_digests: &'a [String],
            to: &'a str,
            reason: Option<&'a str>,
            actor: &'a str,
            restart: i32,
        }
        let rows: Vec<Row> = ends
            .iter()
            .map(|end| Row {
                job_id: end.job_id,
                attempt: end.attempt,
                exit_codes: end.exit_codes.iter().copied().map(to_stored_exit_code).collect(),
                image_digests: end.image_digests,
                to: end.to.as_str(),
                reason: end.reason,
                actor: end.actor,
                restart: i32::from(end.to == JobState::Restarting),
            })
            .collect();
        let rows = serde_json::to_value(rows).map_err(Error::internal)?;
        let mut tx = self.begin().await?;
        // language=PostgreSQL
        sqlx::query(concat!(
            "UPDATE job_attempts a SET exit_codes = u.exit_codes, reason = u.reason, ended_at = coalesce(a.ended_at, now()),
                 image_digests = CASE WHEN cardinality(u.image_digests) > 0 THEN u.image_digests ELSE a.image_digests END
             FROM ",
            ends_batch!(),
            " WHERE a.job_id = u.job_id AND a.attempt = u.attempt AND (SELECT control_fence($2))"
        ))
        .bind(&rows)
        .bind(self.control_epoch())
        .execute(&mut *tx)
        .await
        .map_err(db_error)?;
        // The usage ledger's row ends when the attempt does.
        // language=PostgreSQL
        sqlx::query(concat!(
            "UPDATE usage_ledger l SET ended_at = a.ended_at FROM job_attempts a, ",
            ends_batch!(),
            " WHERE l.job_id = u.job_id AND l.attempt = u.attempt AND a.job_id = l.job_id AND a.attempt = l.attempt
               AND l.ended_at IS NULL"
        ))
        .bind(&rows)
        .execute(&mut *tx)
        .await
        .map_err(db_error)?;
        // The attempt's engine token dies with it.
        // language=PostgreSQL
        sqlx::query(concat!(
            "DELETE FROM job_tokens t USING ",
            ends_batch!(),
            " WHERE t.job_id = u.job_id AND t.attempt = u.attempt"
        ))
        .bind(&rows)
        .execute(&mut *tx)
        .await
        .map_err(db_error)?;
        // language=PostgreSQL
        let moved: Vec<Uuid> = sqlx::query_scalar(concat!(
            "UPDATE jobs SET state = u.\"to\", reason = u.reason, last_actor = u.actor, restart_count = restart_count + u.restart,
                             -- back in the queue, a job holds nothing
                             preempt_requested_at = CASE WHEN u.\"to\" = 'queued' THEN NULL ELSE preempt_requested_at END,
                             flavor = CASE WHEN u.\"to\" = 'queued' THEN NULL ELSE flavor END,
                             assigned_nodes = CASE WHEN u.\"to\" = 'queued' THEN NULL ELSE assigned_nodes END
             FROM ",
            ends_batch!(),
            " WHERE jobs.id = u.job_id AND jobs.state IN ('starting', 'running')
             RETURNING jobs.id"
        ))
        .bind(&rows)
        .fetch_all(&mut *tx)
        .await
        .map_err(db_error)?;
        // An experiment's trial back in the queue (preempted): its searcher is told so here.
        let requeued: Vec<Uuid> =
            ends.iter().filter(|e| e.to == JobState::Queued && moved.contains(&e.job_id)).map(|e| e.job_id).collect();
        if !requeued.is_empty() {
            crate::experiments::trials_preempted(&mut tx, &requeued).await?;
        }
        tx.commit().await.map_err(db_error)?;
        Ok(moved.into_iter().collect())
    }
}

/// A job whose every replica started, for [`Store::jobs_running`].
#[derive(Debug, Clone, serde::Serialize)]
pub struct Started<'a> {
    pub job_id: Uuid,
    pub attempt: i32,
    /// The images its replicas run, by digest; empty when unknown (kept as recorded before).
    pub image_digests: &'a [String],
}

/// A job whose next attempt a launch opens ([`Store::attempts_open`]).
#[derive(Debug, Clone)]
pub struct AttemptToOpen {
    pub job_id: Uuid,
    /// What it holds while it runs.
    pub held: Held,
    /// The server's part of its run record ([`ServerRecord`], serialised).
    pub server: serde_json::Value,
}

/// What an attempt holds, all replicas together: its row of the usage ledger.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Held {
    pub gpus: u64,
    pub cpu_millis: u64,
    pub memory_bytes: u64,
}

impl Held {
    /// What a job with this spec holds while it runs.
    pub fn of(spec: &trainyard_core::job::JobSpec) -> Held {
        let replicas = u64::from(spec.replicas);
        Held {
            gpus: u64::from(spec.resources.gpus) * replicas,
            cpu_millis: spec.resources.cpu.millis() * replicas,
            memory_bytes: spec.resources.memory.bytes() * replicas,
        }
    }
}

/// The end of an attempt, for [`Store::attempt_end`].
#[derive(Debug, Clone)]
pub struct AttemptEnd<'a> {
    pub job_id: Uuid,
    pub attempt: i32,
    pub exit_codes: &'a [Option<i32>],
    /// The images the replicas ran, by digest; empty when unknown (kept as recorded before).
    pub image_digests: &'a [String],
    pub to: JobState,
    pub reason: Option<&'a str>,
    pub actor: &'a str,
}

/// Leadership of the control loops: the lease row (`control_lease`, migration 10) held by one
/// server at a time. The leader renews it; once it expired (the leader died, hung, was paused or
/// cut off from the database), a standby takes it with the next epoch. The epoch held is
/// recorded in the [`Store`], and every control-loop write is fenced by it in the database.
pub struct Leadership {
    store: Store,
    holder: Uuid,
    epoch: i64,
    lease: std::time::Duration,
}

impl Store {
    /// The leadership epoch this process holds; 0 when none.
    pub fn control_epoch(&self) -> i64 {
        self.control_epoch.load(std::sync::atomic::Ordering::SeqCst)
    }

    /// `Error::Fenced` unless this process holds the current epoch: asked before a control-loop
    /// action outside the database that a deposed leader must not take (deleting objects,
    /// removing a tenant's namespace), whose record is fenced too but comes after it.
    pub async fn control_fence_check(&self) -> Result<()> {
        // language=PostgreSQL
        sqlx::query_scalar::<_, bool>("SELECT control_fence($1)")
            .bind(self.control_epoch())
            .fetch_one(&self.pool)
            .await
            .map_err(db_error)?;
        Ok(())
    }

    /// This installation's id (made with the database, migration 25): what the Kubernetes
    /// executor labels its objects with, so that its garbage collection takes only its own.
    pub async fn installation_id(&self) -> Result<Uuid> {
        // language=PostgreSQL
        let (id,): (Uuid,) =
            sqlx::query_as("SELECT id FROM installation").fetch_one(&self.pool).await.map_err(db_error)?;
        Ok(id)
    }

    /// Takes the lease for `lease` if no one holds an unexpired one (a takeover increments the
    /// epoch). `None` when another server leads.
    pub async fn leadership_try(&self, holder: Uuid, lease: std::time::Duration) -> Result<Option<Leadership>> {
        // language=PostgreSQL
        let epoch: Option<i64> = sqlx::query_scalar(
            "INSERT INTO control_lease (id, holder, epoch, expires_at)
             VALUES (true, $1, 1, clock_timestamp() + make_interval(secs => $2))
             ON CONFLICT (id) DO UPDATE SET holder = EXCLUDED.holder, epoch = control_lease.epoch + 1,
                                            expires_at = EXCLUDED.expires_at
             WHERE control_lease.expires_at <= clock_timestamp()
             RETURNING epoch",
        )
        .bind(holder)
        .bind(lease.as_secs_f64())
        .fetch_optional(&self.pool)
        .await
        .map_err(db_error)?;
        Ok(epoch.map(|epoch| {
            self.control_epoch.store(epoch, std::sync::atomic::Ordering::SeqCst);
            Leadership { store: self.clone(), holder, epoch, lease }
        }))
    }
}

impl Leadership {
    pub fn epoch(&self) -> i64 {
        self.epoch
    }

    /// Extends the lease. False when it is no longer this holder's (expired and taken, or
    /// expired): leadership is lost, and this process's epoch is cleared so that its writes
    /// are refused even before the loop stops.
    pub async fn renew(&self) -> Result<bool> {
        // language=PostgreSQL
        let renewed = sqlx::query(
            "UPDATE control_lease SET expires_at = clock_timestamp() + make_interval(secs => $3)
             WHERE holder = $1 AND epoch = $2 AND expires_at > clock_timestamp()",
        )
        .bind(self.holder)
        .bind(self.epoch)
        .bind(self.lease.as_secs_f64())
        .execute(&self.store.pool)
        .await
        .map_err(db_error)?
        .rows_affected()
            == 1;
        if !renewed {
            self.lost();
        }
        Ok(renewed)
    }

    /// Forgets the epoch in this process (its writes are refused from now on).
    pub fn lost(&self) {
        let _ = self.store.control_epoch.compare_exchange(
            self.epoch,
            0,
            std::sync::atomic::Ordering::SeqCst,
            std::sync::atomic::Ordering::SeqCst,
        );
    }

    /// Gives the lease up at once (a clean shutdown), so that a standby takes over without
    /// waiting for it to expire.
    pub async fn release(&self) {
        self.lost();
        // language=PostgreSQL
        let _ = sqlx::query("UPDATE control_lease SET expires_at = clock_timestamp() WHERE holder = $1 AND epoch = $2")
            .bind(self.holder)
            .bind(self.epoch)
            .execute(&self.store.pool)
            .await;
    }
}

/// One row of [`Store::jobs_unfinished`] as stored.
#[derive(FromRow)]
struct UnfinishedRow {
    id: Uuid,
    tenant_id: Uuid,
    tenant_name: String,
    job_name: String,
    state: String,
    reason: Option<String>,
    /// The row's version (`xmin`), and its latest attempt's: the row is decoded again only
    /// when one changed.
    version: i64,
    attempt_version: Option<i64>,
    priority: i32,
    max_restarts: i32,
    restart_count: i32,
    cancel_requested: bool,
    preempt_requested: bool,
    preempted_for: Option<Uuid>,
    created_at: DateTime<Utc>,
    admitted_at: Option<DateTime<Utc>>,
    flavor: Option<String>,
    assigned_nodes: Option<Vec<String>>,
    expected_runtime_seconds: Option<i32>,
    attempt: Option<i32>,
    placement: Option<serde_json::Value>,
    attempt_ended: Option<bool>,
    attempt_ended_at: Option<DateTime<Utc>>,
    attempt_started_at: Option<DateTime<Utc>>,
    content_hashes: Option<serde_json::Value>,
    spec: String,
    created_by: Uuid,
}

/// One row of [`Store::jobs_unfinished`] decoded, with the content hashes of a queued job's
/// datasets (strings only: a malformed entry is skipped, never the job), or what is wrong with
/// it (a spec or state this version does not understand).
fn unfinished_job_decode(row: UnfinishedRow) -> DecodedRow {
    let hashes: Vec<String> = match &row.content_hashes {
        Some(serde_json::Value::Array(values)) => {
            values.iter().filter_map(|v| v.as_str().map(str::to_string)).collect()
        }
        _ => Vec::new(),
    };
    let attempt = row.attempt.map(|number| AttemptRecord {
        number,
        placement: row.placement.clone(),
        ended: row.attempt_ended.unwrap_or(false),
        started_at: row.attempt_started_at,
        ended_at: row.attempt_ended_at,
    });
    let state = JobState::parse(&row.state);
    let unhandled = |problem: String| {
        let plain: Option<serde_json::Value> = serde_json::from_str(&row.spec).ok();
        let field = |name: &str| plain.as_ref().and_then(|spec| spec.get(name)).cloned();
        UnhandledJob {
            id: row.id,
            problem,
            tenant_id: row.tenant_id,
            state,
            priority: row.priority,
            cancel_requested: row.cancel_requested,
            flavor: row.flavor.clone(),
            assigned_nodes: row.assigned_nodes.clone(),
            since: row.admitted_at.unwrap_or(row.created_at),
            attempt: attempt.clone(),
            replicas: field("replicas").and_then(|v| serde_json::from_value(v).ok()),
            resources: field("resources").and_then(|v| serde_json::from_value(v).ok()),
        }
    };
    // Decoded from text, no JSON tree in between.
    let spec: JobSpec = match serde_json::from_str(&row.spec) {
        Ok(spec) => spec,
        Err(err) => return Err(Box::new(unhandled(format!("its stored spec does not decode: {err}")))),
    };
    let Some(state) = state else {
        return Err(Box::new(unhandled(format!("its state {:?} is unknown", row.state))));
    };
    let job = UnfinishedJob {
        id: row.id,
        tenant_id: row.tenant_id,
        tenant: row.tenant_name,
        name: row.job_name,
        created_by: row.created_by,
        state,
        reason: row.reason,
        spec: Arc::new(spec),
        priority: row.priority,
        max_restarts: row.max_restarts,
        restart_count: row.restart_count,
        cancel_requested: row.cancel_requested,
        preempt_requested: row.preempt_requested,
        preempted_for: row.preempted_for,
        created_at: row.created_at,
        admitted_at: row.admitted_at,
        flavor: row.flavor,
        assigned_nodes: row.assigned_nodes,
        warm_nodes: Vec::new(),
        expected_runtime_seconds: row.expected_runtime_seconds,
        attempt,
        saved_at: None,
    };
    Ok((Arc::new(job), hashes))
}

#[cfg(test)]
mod tests {
    use trainyard_core::job::JobState;

    /// The literal state set of `jobs_unfinished` is `JobState::holds_capacity`.
    #[test]
    fn the_holding_states_literal_is_holds_capacity() {
        let literal = "'admitted', 'starting', 'running', 'restarting'";
        let derived: Vec<String> =
            JobState::names_where(JobState::holds_capacity).into_iter().map(|s| format!("'{s}'")).collect();
        assert_eq!(literal, derived.join(", "));
        assert!(include_str!("reconcile.rs").contains(&format!("WHERE j.state IN ({literal}))")));
    }
}
