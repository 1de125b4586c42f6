//! Job-scoped tokens and the metrics engines report with them.

use trainyard_core::api::{MetricPoint, MetricSeries};
use trainyard_core::compare::MetricSummary;
use trainyard_core::error::ObjectKind;
use trainyard_core::{Error, Result};
use uuid::Uuid;

use crate::tenancy::token_hash;
use crate::{Store, db_error};

/// Job tokens start with this, so the API can tell them from user tokens at a glance.
pub const JOB_TOKEN_PREFIX: &str = "tyj_";

/// The job an engine's token stands for.
#[derive(Debug, Clone, PartialEq, Eq, sqlx::FromRow)]
pub struct JobCaller {
    pub job_id: Uuid,
    pub tenant_id: Uuid,
    pub attempt: i32,
    /// The tenant's name.
    pub tenant: String,
}

impl Store {
    /// The job a job token stands for, while its job has not ended.
    pub async fn job_token_authenticate(&self, secret: &str) -> Result<JobCaller> {
        // language=PostgreSQL
        sqlx::query_as(
            "SELECT t.job_id, t.tenant_id, t.attempt, n.name AS tenant
             FROM job_tokens t JOIN jobs j ON j.id = t.job_id JOIN tenants n ON n.id = t.tenant_id
             WHERE t.token_hash = $1 AND j.state <> ALL($2)",
        )
        .bind(token_hash(secret))
        .bind(trainyard_core::job::JobState::names_where(trainyard_core::job::JobState::is_terminal))
        .fetch_optional(&self.pool)
        .await
        .map_err(db_error)?
        .ok_or_else(|| Error::Unauthenticated("the job token is not valid, or its job has ended".into()))
    }

    /// Stores a batch of points in one statement.
    pub async fn metrics_insert(&self, caller: &JobCaller, points: &[MetricPoint]) -> Result<u64> {
        let names: Vec<&str> = points.iter().map(|p| p.name.as_str()).collect();
        let steps: Vec<i64> = points.iter().map(|p| p.step).collect();
        let values: Vec<f64> = points.iter().map(|p| p.value).collect();
        // language=PostgreSQL
        let inserted = sqlx::query(
            "INSERT INTO metrics (job_id, tenant_id, attempt, name, step, value)
             SELECT $1, $2, $3, name, step, value FROM UNNEST($4::text[], $5::bigint[], $6::float8[]) AS p(name, step, value)",
        )
        .bind(caller.job_id)
        .bind(caller.tenant_id)
        .bind(caller.attempt)
        .bind(&names)
        .bind(&steps)
        .bind(&values)
        .execute(&self.pool)
        .await
        .map_err(db_error)?
        .rows_affected();
        Ok(inserted)
    }

    /// A job's series, each ordered by step; only `name` when given.
    pub async fn metrics_read(&self, tenant_id: Uuid, job_id: Uuid, name: Option<&str>) -> Result<Vec<MetricSeries>> {
        // language=PostgreSQL
        let exists: bool = sqlx::query_scalar("SELECT EXISTS (SELECT 1 FROM jobs WHERE id = $1 AND tenant_id = $2)")
            .bind(job_id)
            .bind(tenant_id)
            .fetch_one(&self.pool)
            .await
            .map_err(db_error)?;
        if !exists {
            return Err(Error::not_found(ObjectKind::Job));
        }
        // language=PostgreSQL
        let rows: Vec<(String, Vec<i64>, Vec<f64>)> = sqlx::query_as(
            "SELECT name, array_agg(step ORDER BY step, recorded_at) AS steps,
                    array_agg(value ORDER BY step, recorded_at) AS values
             FROM metrics WHERE job_id = $1 AND tenant_id = $2 AND ($3::text IS NULL OR name = $3)
             GROUP BY name ORDER BY name",
        )
        .bind(job_id)
        .bind(tenant_id)
        .bind(name)
        .fetch_all(&self.pool)
        .await
        .map_err(db_error)?;
        Ok(rows.into_iter().map(|(name, steps, values)| MetricSeries { name, steps, values }).collect())
    }

    /// One series of a job of the tenant by wall time: (seconds since its first point was
    /// received, value), in the order received. Empty for another tenant's job.
    pub async fn metric_timeline(&self, tenant_id: Uuid, job_id: Uuid, name: &str) -> Result<Vec<(f64, f64)>> {
        // language=PostgreSQL
        sqlx::query_as(
            "SELECT extract(epoch FROM recorded_at - min(recorded_at) OVER ())::float8, value
             FROM metrics WHERE job_id = $1 AND tenant_id = $2 AND name = $3 ORDER BY recorded_at, step",
        )
        .bind(job_id)
        .bind(tenant_id)
        .bind(name)
        .fetch_all(&self.pool)
        .await
        .map_err(db_error)
    }

    /// Each series of these jobs of the tenant in brief, in one statement: its count of points
    /// and the value at its last step (the latest recorded of equal steps), as `(job, summary)`
    /// ordered by job and name. The last value is one index probe per series
    /// (`metrics_by_series`), not a sort of its points.
    pub async fn metrics_summaries(&self, tenant_id: Uuid, job_ids: &[Uuid]) -> Result<Vec<(Uuid, MetricSummary)>> {
        // language=PostgreSQL
        let rows: Vec<(Uuid, String, i64, f64)> = sqlx::query_as(
            "SELECT s.job_id, s.name, s.points,
                    (SELECT m.value FROM metrics m WHERE m.job_id = s.job_id AND m.name = s.name
                     ORDER BY m.step DESC, m.recorded_at DESC LIMIT 1) AS last
             FROM (SELECT job_id, name, count(*) AS points FROM metrics
                   WHERE job_id = ANY($2) AND tenant_id = $1 GROUP BY job_id, name) s
             ORDER BY s.job_id, s.name",
        )
        .bind(tenant_id)
        .bind(job_ids)
        .fetch_all(&self.pool)
        .await
        .map_err(db_error)?;
        Ok(rows.into_iter().map(|(job, name, points, last)| (job, MetricSummary { name, points, last })).collect())
    }
}

impl Store {
    /// Records (or replaces) a named output of the caller's job.
    pub async fn job_output_set(&self, caller: &JobCaller, name: &str, value: &serde_json::Value) -> Result<()> {
        // language=PostgreSQL
        sqlx::query(
            "INSERT INTO job_outputs (job_id, tenant_id, name, value, attempt) VALUES ($1, $2, $3, $4, $5)
             ON CONFLICT (job_id, name) DO UPDATE SET value = EXCLUDED.value, attempt = EXCLUDED.attempt,
                                                    recorded_at = now()",
        )
        .bind(caller.job_id)
        .bind(caller.tenant_id)
        .bind(name)
        .bind(value)
        .bind(caller.attempt)
        .execute(&self.pool)
        .await
        .map_err(|err| match crate::violated_constraint(&err) {
            Some("job_outputs_name_format") => Error::invalid("name", "1 to 64 letters, digits, '_', '.' or '-'"),
            _ => db_error(err),
        })?;
        Ok(())
    }

    /// A job's outputs by name.
    pub async fn job_outputs(
        &self,
        tenant_id: Uuid,
        job_id: Uuid,
    ) -> Result<std::collections::BTreeMap<String, serde_json::Value>> {
        // language=PostgreSQL
        // The left join gives one empty row for a job without outputs.
        let rows: Vec<(Option<String>, Option<serde_json::Value>)> = sqlx::query_as(
            "SELECT o.name, o.value FROM jobs j LEFT JOIN job_outputs o ON o.job_id = j.id
             WHERE j.id = $1 AND j.tenant_id = $2",
        )
        .bind(job_id)
        .bind(tenant_id)
        .fetch_all(&self.pool)
        .await
        .map_err(db_error)?;
        if rows.is_empty() {
            return Err(Error::not_found(ObjectKind::Job));
        }
        Ok(rows.into_iter().filter_map(|(name, value)| Some((name?, value?))).collect())
    }
}

/// Makes a job token for an attempt in `executor` (the caller's transaction); returns the
/// secret, of which only the hash is stored.
/// A new job token: the secret the engine is given, and its hash as stored.
pub(crate) fn job_token_new() -> (String, Vec<u8>) {
    let mut bytes = [0u8; 32];
    rand::fill(&mut bytes);
    let secret = format!("{JOB_TOKEN_PREFIX}{}", hex::encode(bytes));
    let hash = token_hash(&secret);
    (secret, hash)
}

pub(crate) async fn job_token_insert<'e>(
    executor: impl sqlx::PgExecutor<'e>,
    job_id: Uuid,
    tenant_id: Uuid,
    attempt: i32,
) -> Result<String> {
    let (secret, hash) = job_token_new();
    // language=PostgreSQL
    sqlx::query("INSERT INTO job_tokens (token_hash, job_id, tenant_id, attempt) VALUES ($1, $2, $3, $4)")
        .bind(hash)
        .bind(job_id)
        .bind(tenant_id)
        .bind(attempt)
        .execute(executor)
        .await
        .map_err(db_error)?;
    Ok(secret)
}
