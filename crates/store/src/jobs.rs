//! Job queries made on behalf of a caller. Each takes the caller's tenant id and filters by it,
//! so another tenant's job id finds nothing (and the API answers 404, leaking no existence).

use chrono::{DateTime, Utc};
use trainyard_core::api::{CheckpointSource, Job, JobAttempt, JobEvent, JobPage};
use trainyard_core::auth::Caller;
use trainyard_core::error::ObjectKind;
use trainyard_core::job::{JobSpec, JobState, ValidSubmission};
use trainyard_core::{Error, Result};
use uuid::Uuid;

use crate::audit::{self, Audit, Outcome};
use crate::{Store, db_error, violated_constraint};

/// Filters and paging of a job listing.
#[derive(Debug, Clone, Default)]
pub struct JobFilter {
    pub state: Option<JobState>,
    pub name: Option<String>,
    /// Only jobs from this template (by name).
    pub template: Option<String>,
    /// Jobs older than this id (the previous page's last job).
    pub before: Option<Uuid>,
    /// Only ids in this range, both ends included: the ids a short id (a prefix) can stand for.
    pub id_range: Option<(Uuid, Uuid)>,
    /// Only jobs submitted by this user (by name).
    pub user: Option<String>,
    /// Only jobs whose name contains this text, ignoring case.
    pub name_contains: Option<String>,
    /// Only the reruns of this job.
    pub rerun_of: Option<Uuid>,
    pub limit: u32,
}

pub const MAX_PAGE: u32 = 500;

/// A `SELECT` of every column a job read needs, joined with the names people know, followed by
/// the rest of the statement. A macro rather than `format!` so the SQL stays a static string.
macro_rules! job_select {
    ($($rest:expr),+) => {
        concat!(
            "SELECT j.id, n.name AS tenant_name, j.name, j.state, j.reason, j.priority, j.max_restarts,
                    j.restart_count, j.spec, j.idempotency_key, u.name AS created_by_name, j.created_at,
                    j.updated_at, j.started_at, j.finished_at, j.cancel_requested_at, j.request_hash, j.params, j.datasets,
                    j.rerun_of, j.rerun_overrides, j.rerun_unpinned, j.array_id, j.array_index,
                    j.init_from_job, j.init_from_step
             FROM jobs j JOIN tenants n ON n.id = j.tenant_id JOIN users u ON u.id = j.created_by ",
            $($rest),+
        )
    };
}

/// The filters and order of a page of jobs ([`Store::jobs_list`]), after its tenant clause.
macro_rules! jobs_page_filters {
    () => {
        "
               AND ($2::text IS NULL OR j.state = $2)
               AND ($3::text IS NULL OR j.name = $3)
               AND ($4::uuid IS NULL OR j.id < $4)
               AND ($6::text IS NULL OR j.template_name = $6)
               AND ($7::uuid IS NULL OR j.id BETWEEN $7 AND $8)
               AND ($9::text IS NULL OR u.name = $9)
               AND ($10::text IS NULL OR strpos(lower(j.name), lower($10)) > 0)
               AND ($11::uuid IS NULL OR j.rerun_of = $11)
             ORDER BY j.id DESC
             LIMIT $5"
    };
}

/// What a job whose stored spec cannot be read shows as its spec: nothing to run.
fn unreadable_spec() -> JobSpec {
    JobSpec {
        command: Vec::new(),
        args: Vec::new(),
        env: Default::default(),
        resources: Default::default(),
        replicas: 0,
        template: None,
        image: None,
        volumes: Vec::new(),
        code: None,
        time_limit_seconds: None,
        cache_wait_seconds: None,
        spare: false,
    }
}

/// A job as `job_select!` reads it. Decoding is checked per column, so a column that does not
/// match its type is an error for that read, never a panic.
#[derive(sqlx::FromRow)]
pub(crate) struct JobRow {
    id: Uuid,
    tenant_name: String,
    name: String,
    state: String,
    reason: Option<String>,
    priority: i32,
    max_restarts: i32,
    restart_count: i32,
    spec: serde_json::Value,
    idempotency_key: Option<String>,
    created_by_name: String,
    created_at: DateTime<Utc>,
    updated_at: DateTime<Utc>,
    started_at: Option<DateTime<Utc>>,
    finished_at: Option<DateTime<Utc>>,
    cancel_requested_at: Option<DateTime<Utc>>,
    request_hash: Option<Vec<u8>>,
    params: Option<serde_json::Value>,
    datasets: Option<serde_json::Value>,
    rerun_of: Option<Uuid>,
    rerun_overrides: Option<serde_json::Value>,
    rerun_unpinned: Option<serde_json::Value>,
    array_id: Option<Uuid>,
    array_index: Option<i32>,
    init_from_job: Option<Uuid>,
    init_from_step: Option<i64>,
}

impl TryFrom<JobRow> for Job {
    type Error = Error;

    fn try_from(row: JobRow) -> Result<Job> {
        // A spec this version cannot read still shows its job (with the reason), never a 500 for
        // the job or for the whole list it is in.
        let (spec, spec_unreadable) = match serde_json::from_value::<JobSpec>(row.spec) {
            Ok(spec) => (spec, None),
            Err(err) => (unreadable_spec(), Some(format!("the stored spec does not decode: {err}"))),
        };
        Ok(Job {
            id: row.id,
            tenant: row.tenant_name,
            name: row.name,
            state: parse_state(&row.state)?,
            reason: row.reason,
            priority: row.priority,
            max_restarts: row.max_restarts,
            restart_count: row.restart_count,
            spec,
            spec_unreadable,
            idempotency_key: row.idempotency_key,
            created_by: row.created_by_name,
            created_at: row.created_at,
            updated_at: row.updated_at,
            started_at: row.started_at,
            finished_at: row.finished_at,
            cancel_requested_at: row.cancel_requested_at,
            params: row.params,
            datasets: row
                .datasets
                .map(serde_json::from_value)
                .transpose()
                .map_err(Error::internal)?
                .unwrap_or_default(),
            rerun_of: row.rerun_of,
            rerun_overrides: row.rerun_overrides,
            rerun_unpinned: row
                .rerun_unpinned
                .map(serde_json::from_value)
                .transpose()
                .map_err(Error::internal)?
                .unwrap_or_default(),
            array_id: row.array_id,
            array_index: row.array_index.map(|i| i as u32),
            init_from: match (row.init_from_job, row.init_from_step) {
                (Some(job_id), Some(step)) => Some(CheckpointSource { job_id, step: step.max(0) as u64 }),
                _ => None,
            },
        })
    }
}

/// A job state as stored; an unknown one is the database's fault, not the caller's.
pub(crate) fn parse_state(text: &str) -> Result<JobState> {
    JobState::parse(text).ok_or_else(|| Error::internal(format!("unknown job state {text}")))
}

/// What a submit did.
#[derive(Debug)]
pub enum Submitted {
    Created(Job),
    /// The idempotency key was used before with the same request: the job from then.
    Replayed(Job),
}

impl Store {
    /// Writes a new queued job (the trigger records its first event in the same statement).
    /// With an idempotency key seen before, returns the earlier job when the request is the
    /// same and a conflict when it differs. `params` are a template's parameters as the user
    /// gave them (the template itself is named in the spec). A rerun's link to its original
    /// (`job.rerun`) is written in the same statement, so the launch's run record sees it.
    pub async fn job_submit(
        &self,
        caller: &Caller,
        job: ValidSubmission,
        params: Option<&serde_json::Value>,
        request_hash: &[u8],
        audit: &Audit,
    ) -> Result<Submitted> {
        let template = job.spec.template.clone();
        let spec = serde_json::to_value(&job.spec).map_err(Error::internal)?;
        let rerun = job.rerun.clone();
        let unpinned = match &rerun {
            Some(link) if !link.unpinned.is_empty() => {
                Some(serde_json::to_value(&link.unpinned).map_err(Error::internal)?)
            }
            _ => None,
        };
        type Inserted = (Uuid, DateTime<Utc>, DateTime<Utc>);
        // One job, or one per index of an array (its index in TRAINYARD_ARRAY_INDEX; the key
        // on the first only), each with its dependencies.
        let indexes: Vec<Option<i32>> = match job.array {
            Some(array) => array.indexes().map(|i| Some(i as i32)).collect(),
            None => vec![None],
        };
        let ids: Vec<Uuid> = indexes.iter().map(|_| Uuid::now_v7()).collect();
        let (after_ids, after_kinds): (Vec<Uuid>, Vec<&str>) =
            job.after.iter().map(|(id, k)| (*id, k.as_str())).unzip();
        // The jobs, their dependencies and audit entries in one statement (one round trip, one
        // transaction). A rerun's original was read for this tenant by the caller. A used
        // idempotency key fails the whole statement (jobs_idempotency_key_unique): replayed below.
        // language=PostgreSQL
        let inserted: std::result::Result<Vec<Inserted>, sqlx::Error> = sqlx::query_as(
            "WITH job AS (
                 INSERT INTO jobs (id, tenant_id, name, spec, priority, max_restarts, last_actor,
                                   idempotency_key, request_hash, created_by,
                                   template_name, template_version, template_digest, params, expected_runtime_seconds,
                                   datasets, rerun_of, rerun_overrides, rerun_unpinned, array_id, array_index, array_limit,
                                   init_from_job, init_from_step)
                 SELECT u.id, $2, $3,
                        CASE WHEN u.idx IS NULL THEN $4
                             ELSE jsonb_set($4, '{env,TRAINYARD_ARRAY_INDEX}', to_jsonb(u.idx::text)) END,
                        $5, $6, $7, CASE WHEN u.ord = 1 THEN $8 END, $9, $10, $11, $12, $13, $14, $15, $16, $21, $22, $23,
                        CASE WHEN u.idx IS NOT NULL THEN ($1::uuid[])[1] END, u.idx, $26, $28, $29
                 FROM unnest($1::uuid[], $24::int[]) WITH ORDINALITY AS u(id, idx, ord)
                 ORDER BY u.ord
                 RETURNING id, created_at, updated_at),
             deps AS (
                 INSERT INTO job_dependencies (job_id, tenant_id, depends_on, kind)
                 SELECT job.id, $2, d.id, d.kind FROM job, unnest($25::uuid[], $27::text[]) AS d(id, kind)),
             audited AS (
                 INSERT INTO audit_log (tenant_id, tenant, actor, user_id, credential, action, target, outcome, source)
                 SELECT $2, $17, $7, $10, $18, $19, 'job:' || job.id, 'ok', $20::inet FROM job)
             SELECT id, created_at, updated_at FROM job",
        )
        .bind(&ids)
        .bind(caller.tenant_id)
        .bind(&job.name)
        .bind(&spec)
        .bind(job.priority)
        .bind(job.max_restarts as i32)
        .bind(caller.actor())
        .bind(&job.idempotency_key)
        .bind(request_hash)
        .bind(caller.user_id)
        .bind(template.as_ref().map(|t| &t.name))
        .bind(template.as_ref().map(|t| &t.version))
        .bind(template.as_ref().map(|t| &t.digest))
        .bind(params)
        .bind(job.expected_runtime_seconds.map(|s| s as i32))
        .bind((!job.datasets.is_empty()).then(|| serde_json::to_value(&job.datasets).expect("serialises")))
        .bind(&audit.tenant)
        .bind(&audit.credential)
        .bind(audit.action)
        .bind(audit.source.map(|ip| ip.to_string()))
        .bind(rerun.as_ref().map(|link| link.of))
        .bind(rerun.as_ref().and_then(|link| link.overrides.as_ref()))
        .bind(&unpinned)
        .bind(&indexes)
        .bind(&after_ids)
        .bind(job.array.and_then(|a| a.limit).map(|l| l as i32))
        .bind(&after_kinds)
        .bind(job.init_from.map(|source| source.job_id))
        .bind(job.init_from.map(|source| i64::try_from(source.step).unwrap_or(i64::MAX)))
        .fetch_all(&self.pool)
        .await;
        let inserted = match inserted {
            Ok(rows) => rows.into_iter().find(|row| row.0 == ids[0]),
            Err(err) if violated_constraint(&err) == Some("jobs_idempotency_key_unique") => None,
            Err(err) if violated_constraint(&err) == Some("job_dependencies_same_tenant") => {
                return Err(Error::invalid("after_ok", "names a job that is not one of your tenant's"));
            }
            Err(err) if violated_constraint(&err) == Some("jobs_init_from_same_tenant") => {
                return Err(Error::invalid("params.init_from", "names a job that is not one of your tenant's"));
            }
            Err(err) => return Err(db_error(err)),
        };

        if let Some((id, created_at, updated_at)) = inserted {
            return Ok(Submitted::Created(Job {
                id,
                tenant: caller.tenant.clone(),
                name: job.name,
                state: JobState::Queued,
                reason: None,
                priority: job.priority,
                max_restarts: job.max_restarts as i32,
                restart_count: 0,
                spec: job.spec,
                idempotency_key: job.idempotency_key,
                created_by: caller.user.clone(),
                created_at,
                updated_at,
                started_at: None,
                finished_at: None,
                cancel_requested_at: None,
                params: params.cloned(),
                datasets: job.datasets,
                spec_unreadable: None,
                rerun_of: rerun.as_ref().map(|link| link.of),
                rerun_overrides: rerun.as_ref().and_then(|link| link.overrides.clone()),
                rerun_unpinned: rerun.map(|link| link.unpinned).unwrap_or_default(),
                array_id: job.array.map(|_| id),
                array_index: job.array.map(|a| a.first),
                init_from: job.init_from,
            }));
        }
        // Only a conflicting idempotency key makes the insert do nothing.
        let key = job.idempotency_key.as_deref().unwrap_or_default();
        let row: JobRow = sqlx::query_as(job_select!("WHERE j.tenant_id = $1 AND j.idempotency_key = $2"))
            .bind(caller.tenant_id)
            .bind(key)
            .fetch_one(&self.pool)
            .await
            .map_err(db_error)?;
        if row.request_hash.as_deref() != Some(request_hash) {
            return Err(Error::Conflict(format!(
                "idempotency key {key:?} was already used for a different request; use a new key for a new job"
            )));
        }
        Ok(Submitted::Replayed(row.try_into()?))
    }

    pub async fn job_get(&self, tenant_id: Uuid, job_id: Uuid) -> Result<Job> {
        let row: JobRow = sqlx::query_as(job_select!("WHERE j.tenant_id = $1 AND j.id = $2"))
            .bind(tenant_id)
            .bind(job_id)
            .fetch_optional(&self.pool)
            .await
            .map_err(db_error)?
            .ok_or_else(|| Error::not_found(ObjectKind::Job))?;
        row.try_into()
    }

    /// The tenant's jobs among `ids` (another tenant's id finds nothing), in no given order.
    pub async fn jobs_get_many(&self, tenant_id: Uuid, ids: &[Uuid]) -> Result<Vec<Job>> {
        let rows: Vec<JobRow> = sqlx::query_as(job_select!("WHERE j.tenant_id = $1 AND j.id = ANY($2)"))
            .bind(tenant_id)
            .bind(ids)
            .fetch_all(&self.pool)
            .await
            .map_err(db_error)?;
        rows.into_iter().map(Job::try_from).collect()
    }

    /// One page of the tenant's jobs, newest first. Keyset pagination on the time-ordered id, so
    /// a page costs the same however deep it is.
    pub async fn jobs_list(&self, tenant_id: Uuid, filter: &JobFilter) -> Result<JobPage> {
        self.jobs_page(Some(tenant_id), filter).await
    }

    /// One page of every tenant's jobs, or of the tenant named `tenant` (404 for no such
    /// tenant), newest first: platform admins' list, read across tenants after
    /// `Caller::require_platform_admin` in `app/`.
    pub async fn jobs_list_every_tenant(&self, tenant: Option<&str>, filter: &JobFilter) -> Result<JobPage> {
        let tenant_id = match tenant {
            None => None,
            // language=PostgreSQL
            Some(name) => Some(
                sqlx::query_scalar::<_, Uuid>("SELECT id FROM tenants WHERE name = $1")
                    .bind(name)
                    .fetch_optional(&self.pool)
                    .await
                    .map_err(db_error)?
                    .ok_or_else(|| Error::not_found(ObjectKind::Tenant))?,
            ),
        };
        self.jobs_page(tenant_id, filter).await
    }

    /// A page of one tenant's jobs (`Some`) or every tenant's (`None`). The tenant's own list
    /// keeps its plain `tenant_id = $1` (its index), whatever the other's plan.
    async fn jobs_page(&self, tenant_id: Option<Uuid>, filter: &JobFilter) -> Result<JobPage> {
        let limit = filter.limit.clamp(1, MAX_PAGE);
        let query = match tenant_id {
            Some(_) => sqlx::query_as::<_, JobRow>(job_select!("WHERE j.tenant_id = $1", jobs_page_filters!())),
            None => sqlx::query_as::<_, JobRow>(job_select!("WHERE $1::uuid IS NULL", jobs_page_filters!())),
        };
        let rows: Vec<JobRow> = query
            .bind(tenant_id)
            .bind(filter.state.map(JobState::as_str))
            .bind(&filter.name)
            .bind(filter.before)
            .bind(i64::from(limit) + 1)
            .bind(&filter.template)
            .bind(filter.id_range.map(|(low, _)| low))
            .bind(filter.id_range.map(|(_, high)| high))
            .bind(&filter.user)
            .bind(&filter.name_contains)
            .bind(filter.rerun_of)
            .fetch_all(&self.pool)
            .await
            .map_err(db_error)?;
        let mut items = rows.into_iter().map(Job::try_from).collect::<Result<Vec<_>>>()?;
        let next_cursor = if items.len() > limit as usize {
            items.truncate(limit as usize);
            items.last().map(|job| job.id.to_string())
        } else {
            None
        };
        Ok(JobPage { items, next_cursor })
    }

    /// Cancels a job. A job that has not launched is cancelled at once; a launched one is marked
    /// and the reconciler stops its processes, then records `cancelled`. Cancelling a cancelled
    /// job is harmless; cancelling a finished one is a conflict.
    pub async fn job_cancel(&self, caller: &Caller, job_id: Uuid, audit: &Audit) -> Result<Job> {
        let reason = format!("cancelled by {}", caller.actor());
        let mut tx = self.begin().await?;
        // One statement decides and writes, so a racing admission cannot slip between.
        // language=PostgreSQL
        let changed = sqlx::query(
            "UPDATE jobs SET
                 state = CASE WHEN state IN ('queued', 'admitted') THEN 'cancelled' ELSE state END,
                 reason = $3,
                 last_actor = CASE WHEN state IN ('queued', 'admitted') THEN $4 ELSE last_actor END,
                 cancel_requested_at = coalesce(cancel_requested_at, now())
             WHERE id = $1 AND tenant_id = $2 AND state <> ALL($5)
             RETURNING id",
        )
        .bind(job_id)
        .bind(caller.tenant_id)
        .bind(&reason)
        .bind(caller.actor())
        .bind(JobState::names_where(JobState::is_terminal))
        .fetch_optional(&mut *tx)
        .await
        .map_err(db_error)?;
        if changed.is_some() {
            audit::append(&mut *tx, audit, Outcome::Ok, None).await?;
            tx.commit().await.map_err(db_error)?;
            return self.job_get(caller.tenant_id, job_id).await;
        }
        drop(tx);
        let job = self.job_get(caller.tenant_id, job_id).await?;
        if job.state != JobState::Cancelled {
            return Err(Error::Conflict(format!("the job has already {}; there is nothing to cancel", job.state)));
        }
        audit::append(&self.pool, audit, Outcome::Ok, Some("unchanged: cancelled before")).await?;
        Ok(job)
    }

    pub async fn job_events(&self, tenant_id: Uuid, job_id: Uuid) -> Result<Vec<JobEvent>> {
        // language=PostgreSQL
        let rows: Vec<EventRow> = sqlx::query_as(
            "SELECT seq, from_state, to_state, actor, reason, at FROM job_events
             WHERE tenant_id = $1 AND job_id = $2 ORDER BY seq",
        )
        .bind(tenant_id)
        .bind(job_id)
        .fetch_all(&self.pool)
        .await
        .map_err(db_error)?;
        // Every job has at least its `queued` event, so no rows means no such job here.
        if rows.is_empty() {
            return Err(Error::not_found(ObjectKind::Job));
        }
        rows.into_iter()
            .map(|row| {
                Ok(JobEvent {
                    seq: row.seq,
                    from_state: row.from_state.as_deref().map(parse_state).transpose()?,
                    to_state: parse_state(&row.to_state)?,
                    actor: row.actor,
                    reason: row.reason,
                    at: row.at,
                })
            })
            .collect()
    }

    pub async fn job_attempts(&self, tenant_id: Uuid, job_id: Uuid) -> Result<Vec<JobAttempt>> {
        // The job row anchors the query so that "no attempts yet" and "no such job" differ.
        // language=PostgreSQL
        let rows: Vec<AttemptRow> = sqlx::query_as(
            "SELECT a.attempt, a.placement, a.exit_codes, a.reason, a.image_digests, a.started_at, a.ended_at
             FROM jobs j LEFT JOIN job_attempts a ON a.job_id = j.id AND a.tenant_id = j.tenant_id
             WHERE j.tenant_id = $1 AND j.id = $2
             ORDER BY a.attempt",
        )
        .bind(tenant_id)
        .bind(job_id)
        .fetch_all(&self.pool)
        .await
        .map_err(db_error)?;
        if rows.is_empty() {
            return Err(Error::not_found(ObjectKind::Job));
        }
        // The left join gives one row without an attempt for a job that has none yet.
        Ok(rows
            .into_iter()
            .filter_map(|row| {
                Some(JobAttempt {
                    attempt: row.attempt?,
                    placement: row.placement,
                    exit_codes: row.exit_codes.unwrap_or_default().into_iter().map(from_stored_exit_code).collect(),
                    reason: row.reason,
                    image_digests: row.image_digests.unwrap_or_default(),
                    started_at: row.started_at?,
                    ended_at: row.ended_at,
                })
            })
            .collect())
    }
}

#[derive(sqlx::FromRow)]
struct EventRow {
    seq: i64,
    from_state: Option<String>,
    to_state: String,
    actor: String,
    reason: Option<String>,
    at: DateTime<Utc>,
}

/// An attempt as the job-anchored left join reads it: every column nullable.
#[derive(sqlx::FromRow)]
struct AttemptRow {
    attempt: Option<i32>,
    placement: Option<serde_json::Value>,
    exit_codes: Option<Vec<i32>>,
    reason: Option<String>,
    image_digests: Option<Vec<String>>,
    started_at: Option<DateTime<Utc>>,
    ended_at: Option<DateTime<Utc>>,
}

/// Exit codes are stored as integers with this marker for "unknown" (killed, lost, running),
/// because Postgres arrays of nullable integers do not map cleanly to `Vec<Option<i32>>`.
pub(crate) const UNKNOWN_EXIT: i32 = -1;

pub(crate) fn from_stored_exit_code(code: i32) -> Option<i32> {
    (code != UNKNOWN_EXIT).then_some(code)
}

pub(crate) fn to_stored_exit_code(code: Option<i32>) -> i32 {
    code.unwrap_or(UNKNOWN_EXIT)
}
