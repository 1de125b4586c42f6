//! Run records (see [`trainyard_core::record`]) as requests reach them: the engine's part,
//! posted once with the attempt's job token, and a job's records read for its tenant. The
//! server's part is written by the control loop when an attempt begins
//! ([`Store::attempt_prepare`](crate::Store::attempt_prepare), in `reconcile`). The table
//! `run_records` (migration 15) refuses by trigger every change but the engine's part arriving
//! once.

use chrono::{DateTime, Utc};
use trainyard_core::error::ObjectKind;
use trainyard_core::record::{AttemptRunRecord, EngineRecord, RunRecord, ServerRecord, record_hash};
use trainyard_core::{Error, Result};
use uuid::Uuid;

use crate::metrics::JobCaller;
use crate::{Store, db_error};

impl Store {
    /// Adds the engine's part to the record of the caller's attempt. A conflict when it was
    /// added before (a record never changes) or when the attempt has no record (it began before
    /// Trainyard kept them).
    pub async fn run_record_complete(&self, caller: &JobCaller, engine: &EngineRecord) -> Result<()> {
        let engine = serde_json::to_value(engine).map_err(Error::internal)?;
        // language=PostgreSQL
        let completed = sqlx::query(
            "UPDATE run_records SET engine = $4, engine_recorded_at = now()
             WHERE job_id = $1 AND attempt = $2 AND tenant_id = $3 AND engine IS NULL",
        )
        .bind(caller.job_id)
        .bind(caller.attempt)
        .bind(caller.tenant_id)
        .bind(&engine)
        .execute(&self.pool)
        .await
        .map_err(db_error)?
        .rows_affected()
            == 1;
        if completed {
            return Ok(());
        }
        // language=PostgreSQL
        let exists: Option<bool> =
            sqlx::query_scalar("SELECT true FROM run_records WHERE job_id = $1 AND attempt = $2 AND tenant_id = $3")
                .bind(caller.job_id)
                .bind(caller.attempt)
                .bind(caller.tenant_id)
                .fetch_optional(&self.pool)
                .await
                .map_err(db_error)?;
        Err(Error::Conflict(match exists {
            Some(_) => format!(
                "the run record of attempt {} is complete already; a record is posted once and never changes",
                caller.attempt
            ),
            None => format!("attempt {} has no run record: it began before Trainyard kept them", caller.attempt),
        }))
    }

    /// The run records of a tenant's job, by attempt, each with its hash. A job of another
    /// tenant is not found, like one that does not exist.
    pub async fn run_records(&self, tenant_id: Uuid, job_id: Uuid) -> Result<Vec<AttemptRunRecord>> {
        // The job row anchors the query so that "no record yet" and "no such job" differ.
        // language=PostgreSQL
        let rows: Vec<RecordRow> = sqlx::query_as(
            "SELECT r.attempt, r.server, r.recorded_at, r.engine, r.engine_recorded_at, a.image_digests
             FROM jobs j
             LEFT JOIN run_records r ON r.job_id = j.id AND r.tenant_id = j.tenant_id
             LEFT JOIN job_attempts a ON a.job_id = r.job_id AND a.attempt = r.attempt
             WHERE j.tenant_id = $1 AND j.id = $2
             ORDER BY r.attempt",
        )
        .bind(tenant_id)
        .bind(job_id)
        .fetch_all(&self.pool)
        .await
        .map_err(db_error)?;
        if rows.is_empty() {
            return Err(Error::not_found(ObjectKind::Job));
        }
        rows.into_iter().filter(|row| row.attempt.is_some()).map(AttemptRunRecord::try_from).collect()
    }

    /// The record of a tenant's job's latest attempt that has one (none when no attempt began,
    /// or the job's attempts began before Trainyard kept records); only that one is read.
    pub async fn run_record_latest(&self, tenant_id: Uuid, job_id: Uuid) -> Result<Option<AttemptRunRecord>> {
        // language=PostgreSQL
        let row: Option<RecordRow> = sqlx::query_as(
            "SELECT r.attempt, r.server, r.recorded_at, r.engine, r.engine_recorded_at, a.image_digests
             FROM jobs j
             LEFT JOIN LATERAL (
                 SELECT * FROM run_records r WHERE r.job_id = j.id AND r.tenant_id = j.tenant_id
                 ORDER BY r.attempt DESC LIMIT 1) r ON true
             LEFT JOIN job_attempts a ON a.job_id = r.job_id AND a.attempt = r.attempt
             WHERE j.tenant_id = $1 AND j.id = $2",
        )
        .bind(tenant_id)
        .bind(job_id)
        .fetch_optional(&self.pool)
        .await
        .map_err(db_error)?;
        match row {
            None => Err(Error::not_found(ObjectKind::Job)),
            Some(row) if row.attempt.is_none() => Ok(None),
            Some(row) => AttemptRunRecord::try_from(row).map(Some),
        }
    }
}

/// A record as the job-anchored left join reads it: every column nullable.
#[derive(sqlx::FromRow)]
struct RecordRow {
    attempt: Option<i32>,
    server: Option<serde_json::Value>,
    recorded_at: Option<DateTime<Utc>>,
    engine: Option<serde_json::Value>,
    engine_recorded_at: Option<DateTime<Utc>>,
    image_digests: Option<Vec<String>>,
}

impl TryFrom<RecordRow> for AttemptRunRecord {
    type Error = Error;

    fn try_from(row: RecordRow) -> Result<AttemptRunRecord> {
        let missing = |column: &str| Error::internal(format!("a run record without {column}"));
        let attempt = row.attempt.ok_or_else(|| missing("an attempt"))?;
        let server: ServerRecord = serde_json::from_value(row.server.ok_or_else(|| missing("its server part"))?)
            .map_err(|err| Error::internal(format!("the run record of attempt {attempt} does not decode: {err}")))?;
        let engine: Option<EngineRecord> = row.engine.map(serde_json::from_value).transpose().map_err(|err| {
            Error::internal(format!("the engine's record of attempt {attempt} does not decode: {err}"))
        })?;
        let record = RunRecord::merge(server, row.image_digests.unwrap_or_default(), engine);
        Ok(AttemptRunRecord {
            attempt,
            recorded_at: row.recorded_at.ok_or_else(|| missing("its time"))?,
            engine_recorded_at: row.engine_recorded_at,
            record_hash: record_hash(&record),
            record,
        })
    }
}
