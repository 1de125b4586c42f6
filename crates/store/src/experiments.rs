//! Experiments (migration 28): the searches, their event logs and the job of each decided run.
//! Request queries take the caller's tenant id. The driver's reads across tenants
//! (`experiments_unfinished`) and its per-experiment reads (by an id it got from them) serve the
//! background task that advances searches, never a request.

use chrono::{DateTime, Utc};
use trainyard_core::error::ObjectKind;
use trainyard_core::{Error, Result};
use uuid::Uuid;

use crate::audit::{self, Audit, Outcome};
use crate::{Store, db_error, violated_constraint};

/// An experiment as stored.
#[derive(Debug, Clone, sqlx::FromRow)]
pub struct ExperimentRow {
    pub id: Uuid,
    pub tenant_id: Uuid,
    pub name: String,
    pub created_by: Uuid,
    pub template: String,
    pub template_version: String,
    pub params: serde_json::Value,
    pub space: serde_json::Value,
    pub searcher: serde_json::Value,
    pub budget_gpu_hours: Option<f64>,
    /// Its trials run on spare room (`JobSpec::spare`).
    pub spare: bool,
    pub state: String,
    pub reason: Option<String>,
    pub best: Option<serde_json::Value>,
    pub created_at: DateTime<Utc>,
    pub ended_at: Option<DateTime<Utc>>,
}

/// What a new experiment is made of, checked by the caller.
#[derive(Debug, Clone)]
pub struct ExperimentNew<'a> {
    pub tenant_id: Uuid,
    pub name: &'a str,
    pub created_by: Uuid,
    pub template: &'a str,
    pub template_version: &'a str,
    pub params: serde_json::Value,
    pub space: serde_json::Value,
    pub searcher: serde_json::Value,
    pub budget_gpu_hours: Option<f64>,
    pub spare: bool,
    pub idempotency_key: Option<&'a str>,
    pub request_hash: Vec<u8>,
}

/// A decided run and where its job stands.
#[derive(Debug, Clone, sqlx::FromRow)]
pub struct ExperimentRunJob {
    pub trial: i32,
    pub rung: i32,
    pub job_id: Uuid,
    pub job_state: String,
    pub job_reason: Option<String>,
    pub finished_at: Option<DateTime<Utc>>,
}

/// How the driver leaves an experiment after a pass: what its replay says.
#[derive(Debug, Clone)]
pub struct ExperimentStanding<'a> {
    pub state: &'a str,
    pub reason: Option<&'a str>,
    pub best: Option<serde_json::Value>,
}

/// The columns of an [`ExperimentRow`] (a macro, so that statements stay static strings).
macro_rules! experiment_select {
    ($rest:literal) => {
        concat!(
            "SELECT id, tenant_id, name, created_by, template, template_version, params, space, searcher,
                    budget_gpu_hours, spare, state, reason, best, created_at, ended_at FROM experiments ",
            $rest
        )
    };
}

impl Store {
    /// Makes an experiment with its audit entry. A retried create with the same idempotency key
    /// returns the first experiment when the request is the same, else a conflict.
    pub async fn experiment_create(&self, new: &ExperimentNew<'_>, audit: &Audit) -> Result<ExperimentRow> {
        let id = Uuid::now_v7();
        let mut tx = self.begin().await?;
        // language=PostgreSQL
        let inserted: Option<Uuid> = sqlx::query_scalar(
            "INSERT INTO experiments (id, tenant_id, name, created_by, template, template_version, params, space,
                                      searcher, budget_gpu_hours, idempotency_key, request_hash, spare)
             VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11, $12, $13)
             ON CONFLICT ON CONSTRAINT experiments_idempotency_key_unique DO NOTHING
             RETURNING id",
        )
        .bind(id)
        .bind(new.tenant_id)
        .bind(new.name)
        .bind(new.created_by)
        .bind(new.template)
        .bind(new.template_version)
        .bind(&new.params)
        .bind(&new.space)
        .bind(&new.searcher)
        .bind(new.budget_gpu_hours)
        .bind(new.idempotency_key)
        .bind(&new.request_hash)
        .bind(new.spare)
        .fetch_optional(&mut *tx)
        .await
        .map_err(|err| match violated_constraint(&err) {
            Some("experiments_budget_positive") => Error::invalid("budget_gpu_hours", "a budget must be above 0"),
            _ => db_error(err),
        })?;
        let id = match inserted {
            Some(id) => {
                audit::append(&mut *tx, &audit.clone().target(format!("experiment:{id}")), Outcome::Ok, None).await?;
                id
            }
            None => {
                // language=PostgreSQL
                let (first, hash): (Uuid, Option<Vec<u8>>) = sqlx::query_as(
                    "SELECT id, request_hash FROM experiments WHERE tenant_id = $1 AND idempotency_key = $2",
                )
                .bind(new.tenant_id)
                .bind(new.idempotency_key)
                .fetch_one(&mut *tx)
                .await
                .map_err(db_error)?;
                if hash.as_deref() != Some(new.request_hash.as_slice()) {
                    return Err(Error::Conflict(
                        "this idempotency key was used for another experiment; use a new key".into(),
                    ));
                }
                first
            }
        };
        tx.commit().await.map_err(db_error)?;
        self.experiment_get(new.tenant_id, id).await
    }

    pub async fn experiment_get(&self, tenant_id: Uuid, id: Uuid) -> Result<ExperimentRow> {
        sqlx::query_as(experiment_select!("WHERE tenant_id = $1 AND id = $2"))
            .bind(tenant_id)
            .bind(id)
            .fetch_optional(&self.pool)
            .await
            .map_err(db_error)?
            .ok_or_else(|| Error::not_found(ObjectKind::Experiment))
    }

    /// The tenant's experiments, newest first, at most `limit`.
    pub async fn experiments_list(&self, tenant_id: Uuid, limit: i64) -> Result<Vec<ExperimentRow>> {
        sqlx::query_as(experiment_select!("WHERE tenant_id = $1 ORDER BY id DESC LIMIT $2"))
            .bind(tenant_id)
            .bind(limit)
            .fetch_all(&self.pool)
            .await
            .map_err(db_error)
    }

    /// The experiments still searching or paused, of every tenant: the driver's work list.
    pub async fn experiments_unfinished(&self) -> Result<Vec<ExperimentRow>> {
        sqlx::query_as(experiment_select!("WHERE state IN ('searching', 'paused') ORDER BY id LIMIT 10000"))
            .fetch_all(&self.pool)
            .await
            .map_err(db_error)
    }

    /// The experiment's events from `from` on, in order (the caller found the experiment in
    /// its tenant, or is the driver).
    pub async fn experiment_events(&self, id: Uuid, from: i32) -> Result<Vec<(i32, serde_json::Value)>> {
        // language=PostgreSQL
        sqlx::query_as("SELECT seq, event FROM experiment_events WHERE experiment_id = $1 AND seq >= $2 ORDER BY seq")
            .bind(id)
            .bind(from)
            .fetch_all(&self.pool)
            .await
            .map_err(db_error)
    }

    /// Appends `events` at `seq` on, all or none. `Ok(false)`: another writer stored an event at
    /// one of those places first; read the log again and decide again.
    pub async fn experiment_events_append(&self, id: Uuid, seq: i32, events: &[serde_json::Value]) -> Result<bool> {
        if events.is_empty() {
            return Ok(true);
        }
        let seqs: Vec<i32> = (0..events.len() as i32).map(|i| seq + i).collect();
        let mut tx = self.begin().await?;
        // The control loop appends too (`trials_preempted`), at the end of the log as it finds
        // it: both hold the experiment's row meanwhile.
        // language=PostgreSQL
        sqlx::query("SELECT 1 FROM experiments WHERE id = $1 FOR UPDATE")
            .bind(id)
            .execute(&mut *tx)
            .await
            .map_err(db_error)?;
        // language=PostgreSQL
        let outcome = sqlx::query(
            "INSERT INTO experiment_events (experiment_id, seq, event)
             SELECT $1, s, e FROM unnest($2::integer[], $3::jsonb[]) AS t (s, e)",
        )
        .bind(id)
        .bind(&seqs)
        .bind(events)
        .execute(&mut *tx)
        .await;
        match outcome {
            Ok(_) => {
                tx.commit().await.map_err(db_error)?;
                Ok(true)
            }
            Err(err) if violated_constraint(&err) == Some("experiment_events_pkey") => Ok(false),
            Err(err) => Err(db_error(err)),
        }
    }

    /// Every decided run that has its job, with the job's state.
    pub async fn experiment_run_jobs(&self, id: Uuid) -> Result<Vec<ExperimentRunJob>> {
        // language=PostgreSQL
        sqlx::query_as(
            "SELECT r.trial, r.rung, r.job_id, j.state AS job_state, j.reason AS job_reason, j.finished_at
               FROM experiment_runs r JOIN jobs j ON j.id = r.job_id
              WHERE r.experiment_id = $1 ORDER BY r.trial, r.rung",
        )
        .bind(id)
        .fetch_all(&self.pool)
        .await
        .map_err(db_error)
    }

    /// Records the job of a decided run; a second record of the same run keeps the first.
    pub async fn experiment_run_link(&self, id: Uuid, trial: u32, rung: u32, job_id: Uuid) -> Result<()> {
        // language=PostgreSQL
        sqlx::query(
            "INSERT INTO experiment_runs (experiment_id, trial, rung, job_id) VALUES ($1, $2, $3, $4)
             ON CONFLICT DO NOTHING",
        )
        .bind(id)
        .bind(trial as i32)
        .bind(rung as i32)
        .bind(job_id)
        .execute(&self.pool)
        .await
        .map_err(db_error)?;
        Ok(())
    }

    /// Writes what the replay says of the experiment; an end is written once.
    pub async fn experiment_standing_set(&self, id: Uuid, standing: &ExperimentStanding<'_>) -> Result<()> {
        // language=PostgreSQL
        sqlx::query(
            "UPDATE experiments SET state = $2, reason = $3, best = $4,
                    ended_at = CASE WHEN $2 IN ('completed', 'failed', 'cancelled') THEN coalesce(ended_at, now()) END
              WHERE id = $1 AND state IN ('searching', 'paused')",
        )
        .bind(id)
        .bind(standing.state)
        .bind(standing.reason)
        .bind(&standing.best)
        .execute(&self.pool)
        .await
        .map_err(db_error)?;
        Ok(())
    }

    /// The job's last value of metric `name` at or before `step`, and the metric names it
    /// reported at all (for the reason when the searched one is not among them).
    pub async fn job_metric_at(&self, job_id: Uuid, name: &str, step: i64) -> Result<(Option<f64>, Vec<String>)> {
        // language=PostgreSQL
        let value: Option<f64> = sqlx::query_scalar(
            "SELECT value FROM metrics WHERE job_id = $1 AND name = $2 AND step <= $3
              ORDER BY step DESC, recorded_at DESC LIMIT 1",
        )
        .bind(job_id)
        .bind(name)
        .bind(step)
        .fetch_optional(&self.pool)
        .await
        .map_err(db_error)?;
        if value.is_some() {
            return Ok((value, Vec::new()));
        }
        // language=PostgreSQL
        let names: Vec<String> =
            sqlx::query_scalar("SELECT DISTINCT name FROM metrics WHERE job_id = $1 ORDER BY name LIMIT 50")
                .bind(job_id)
                .fetch_all(&self.pool)
                .await
                .map_err(db_error)?;
        Ok((None, names))
    }

    /// GPU-hours the experiment's jobs have taken so far (running attempts up to now).
    pub async fn experiment_gpu_hours(&self, id: Uuid) -> Result<f64> {
        // language=PostgreSQL
        sqlx::query_scalar(
            "SELECT coalesce(sum(u.gpus * extract(epoch FROM coalesce(u.ended_at, now()) - u.started_at)), 0)::float8 / 3600
               FROM usage_ledger u JOIN experiment_runs r ON r.job_id = u.job_id
              WHERE r.experiment_id = $1",
        )
        .bind(id)
        .fetch_one(&self.pool)
        .await
        .map_err(db_error)
    }

    /// Seconds a step of the template took in the tenant's latest finished job of it that
    /// reported steps (its running time over its last step); `None` without such a job.
    pub async fn template_seconds_per_step(&self, tenant_id: Uuid, template: &str) -> Result<Option<f64>> {
        // language=PostgreSQL
        sqlx::query_scalar(
            "SELECT extract(epoch FROM j.finished_at - j.started_at)::float8 / m.last_step
               FROM jobs j
               CROSS JOIN LATERAL (SELECT max(step) AS last_step FROM metrics WHERE job_id = j.id) m
              WHERE j.tenant_id = $1 AND j.template_name = $2 AND j.state = 'succeeded'
                AND j.started_at IS NOT NULL AND m.last_step > 0
              ORDER BY j.finished_at DESC LIMIT 1",
        )
        .bind(tenant_id)
        .bind(template)
        .fetch_optional(&self.pool)
        .await
        .map_err(db_error)
    }
}

/// Tells the searchers of the experiments whose trials `jobs` are (jobs just sent back to the
/// queue by a preemption) that those runs were preempted: an event at the end of each log, in
/// the caller's transaction, the one that requeues the jobs. Jobs that are no trial are skipped.
pub(crate) async fn trials_preempted(tx: &mut sqlx::PgConnection, jobs: &[Uuid]) -> Result<()> {
    // language=PostgreSQL
    let runs: Vec<(Uuid, i32, i32)> = sqlx::query_as(
        "SELECT experiment_id, trial, rung FROM experiment_runs WHERE job_id = ANY($1)
          ORDER BY experiment_id, trial, rung",
    )
    .bind(jobs)
    .fetch_all(&mut *tx)
    .await
    .map_err(db_error)?;
    if runs.is_empty() {
        return Ok(());
    }
    let mut experiments: Vec<Uuid> = runs.iter().map(|r| r.0).collect();
    experiments.dedup();
    // In id order, as every writer of several would: the driver's appends hold one each.
    // language=PostgreSQL
    sqlx::query("SELECT 1 FROM experiments WHERE id = ANY($1) ORDER BY id FOR UPDATE")
        .bind(&experiments)
        .execute(&mut *tx)
        .await
        .map_err(db_error)?;
    // Each run's place after the log's last event: its rank among its experiment's runs here.
    let mut ranks: Vec<i32> = Vec::with_capacity(runs.len());
    for (i, run) in runs.iter().enumerate() {
        ranks.push(if i > 0 && runs[i - 1].0 == run.0 { ranks[i - 1] + 1 } else { 0 });
    }
    let (ids, trials, rungs): (Vec<Uuid>, Vec<i32>, Vec<i32>) =
        runs.iter().fold((Vec::new(), Vec::new(), Vec::new()), |(mut e, mut t, mut r), run| {
            e.push(run.0);
            t.push(run.1);
            r.push(run.2);
            (e, t, r)
        });
    // A statement begun after the locks: it sees every event committed before them.
    // language=PostgreSQL
    sqlx::query(
        "INSERT INTO experiment_events (experiment_id, seq, event)
         SELECT u.experiment_id,
                coalesce((SELECT max(x.seq) + 1 FROM experiment_events x WHERE x.experiment_id = u.experiment_id), 0)
                  + u.place,
                jsonb_build_object('event', 'preempted', 'trial', u.trial, 'rung', u.rung)
           FROM unnest($1::uuid[], $2::integer[], $3::integer[], $4::integer[]) AS u (experiment_id, trial, rung, place)",
    )
    .bind(&ids)
    .bind(&trials)
    .bind(&rungs)
    .bind(&ranks)
    .execute(&mut *tx)
    .await
    .map_err(db_error)?;
    Ok(())
}
