//! The usage ledger (`usage_ledger`, migration 14): one row per attempt with what it held, opened
//! by [`Store::attempt_begin`](crate::Store::attempt_begin) and closed by
//! [`Store::attempt_end`](crate::Store::attempt_end) in their transactions. Reports are made from
//! its rows by the server (clipping, buckets and decay are pure functions of
//! `trainyard_scheduler::usage`).

use chrono::{DateTime, Utc};
use uuid::Uuid;

use crate::{Store, db_error};
use trainyard_core::Result;

/// One attempt's row, with its group keys by name.
#[derive(Debug, Clone, sqlx::FromRow)]
pub struct LedgerRow {
    pub job_id: Uuid,
    pub tenant: String,
    pub user_name: String,
    pub gpu_type: Option<String>,
    pub template: Option<String>,
    pub gpus: i32,
    pub cpu_millis: i64,
    pub started_at: DateTime<Utc>,
    /// `None`: still running (counts up to now).
    pub ended_at: Option<DateTime<Utc>>,
    /// The mean of the `gpu_utilization` (0 to 1) the job's engine reported, if it did.
    pub gpu_utilization: Option<f64>,
}

impl Store {
    /// Every attempt that held anything in `[from, to)`, of one tenant or (with `None`) of all.
    pub async fn usage_ledger(
        &self,
        tenant_id: Option<Uuid>,
        from: DateTime<Utc>,
        to: DateTime<Utc>,
    ) -> Result<Vec<LedgerRow>> {
        // language=PostgreSQL
        sqlx::query_as(
            "SELECT l.job_id, n.name AS tenant, u.name AS user_name, l.gpu_type, l.template, l.gpus, l.cpu_millis,
                    l.started_at, l.ended_at,
                    (SELECT avg(m.value) FROM metrics m WHERE m.job_id = l.job_id AND m.name = 'gpu_utilization')
                        AS gpu_utilization
             FROM usage_ledger l JOIN tenants n ON n.id = l.tenant_id JOIN users u ON u.id = l.user_id
             WHERE ($1::uuid IS NULL OR l.tenant_id = $1)
               AND l.started_at < $3 AND (l.ended_at IS NULL OR l.ended_at > $2)
             ORDER BY l.started_at",
        )
        .bind(tenant_id)
        .bind(from)
        .bind(to)
        .fetch_all(&self.pool)
        .await
        .map_err(db_error)
    }
}
