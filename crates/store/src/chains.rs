//! Job chains and arrays, as the leader applies them before each admission cycle
//! (`migrations/*_chains_and_arrays.sql`): a queued job whose dependencies are not met, or an
//! array's job beyond its limit, is held out of the cycle with its reason; one whose dependency
//! can never be met is cancelled. Across tenants, like the rest of the control loop's queries
//! (each dependency is of its job's own tenant: `job_dependencies_same_tenant`).

use trainyard_core::Result;
use uuid::Uuid;

use crate::{Store, db_error};

impl Store {
    /// Cancels (fenced) each queued job with a dependency that can never be met (Slurm's
    /// semantics): `ok` on a job that failed or was cancelled, `failed` on one that succeeded
    /// or was cancelled. The reason names the dependency and what became of it. Returns the
    /// jobs cancelled; a chain unravels one link per pass.
    pub async fn jobs_dependency_doomed_cancel(&self) -> Result<Vec<Uuid>> {
        // language=PostgreSQL
        sqlx::query_scalar(
            "WITH doomed AS (
                 SELECT DISTINCT ON (j.id) j.id,
                        format('cancelled: it was to start after %s %s, which %s', left(p.id::text, 8),
                               CASE d.kind WHEN 'ok' THEN 'succeeded' ELSE 'failed' END,
                               CASE p.state WHEN 'cancelled' THEN 'was cancelled' ELSE p.state END) AS reason
                 FROM jobs j JOIN job_dependencies d ON d.job_id = j.id JOIN jobs p ON p.id = d.depends_on
                 WHERE j.state = 'queued' AND j.cancel_requested_at IS NULL
                   AND ((d.kind = 'ok' AND p.state IN ('failed', 'cancelled'))
                        OR (d.kind = 'failed' AND p.state IN ('succeeded', 'cancelled')))
                 ORDER BY j.id, p.id)
             UPDATE jobs j SET state = 'cancelled', reason = doomed.reason, last_actor = 'scheduler:dependency'
             FROM doomed WHERE j.id = doomed.id AND j.state = 'queued' AND (SELECT control_fence($1))
             RETURNING j.id",
        )
        .bind(self.control_epoch())
        .fetch_all(&self.pool)
        .await
        .map_err(db_error)
    }

    /// Why a queued job of `tenant_id` is held out of the admission cycle (as
    /// [`Store::jobs_held`] says), if it is: for its schedule, which then has no estimate.
    pub async fn job_hold_reason(&self, tenant_id: Uuid, job_id: Uuid) -> Result<Option<String>> {
        // language=PostgreSQL
        sqlx::query_scalar(
            "WITH me AS (SELECT id, array_id, array_index FROM jobs WHERE id = $2 AND tenant_id = $1 AND state = 'queued')
             (SELECT 'waiting for ' || string_agg(left(p.id::text, 8) || ': ' || p.state, ', ' ORDER BY p.id)
              FROM me JOIN job_dependencies d ON d.job_id = me.id AND d.tenant_id = $1 JOIN jobs p ON p.id = d.depends_on
              WHERE p.state NOT IN ('succeeded', 'failed', 'cancelled')
              HAVING count(*) > 0)
             UNION ALL
             (SELECT format('array %s: %s of at most %s running', left(a.array_id::text, 8), a.active, a.lim)
              FROM me, LATERAL (SELECT array_id, max(array_limit) AS lim,
                                       count(*) FILTER (WHERE state IN ('admitted', 'starting', 'running', 'restarting')) AS active
                                FROM jobs WHERE tenant_id = $1 AND array_id = me.array_id AND array_limit IS NOT NULL
                                  AND state IN ('queued', 'admitted', 'starting', 'running', 'restarting')
                                GROUP BY array_id) a
              WHERE (SELECT count(*) FROM jobs q WHERE q.tenant_id = $1 AND q.array_id = a.array_id
                       AND q.state = 'queued' AND q.array_index < me.array_index) >= a.lim - a.active)
             LIMIT 1",
        )
        .bind(tenant_id)
        .bind(job_id)
        .fetch_optional(&self.pool)
        .await
        .map_err(db_error)
    }

    /// The queued jobs the admission cycle must not take now, each with its reason: those
    /// waiting for a dependency ("waiting for 01a2b3c4: running"), and an array's jobs beyond
    /// its limit (all but the lowest indexes that fit beside those admitted or running).
    pub async fn jobs_held(&self) -> Result<Vec<(Uuid, String)>> {
        // language=PostgreSQL
        sqlx::query_as(
            "SELECT j.id, 'waiting for ' || string_agg(left(p.id::text, 8) || ': ' || p.state, ', ' ORDER BY p.id)
             FROM jobs j JOIN job_dependencies d ON d.job_id = j.id JOIN jobs p ON p.id = d.depends_on
             WHERE j.state = 'queued' AND p.state NOT IN ('succeeded', 'failed', 'cancelled')
             GROUP BY j.id
             UNION ALL
             SELECT q.id, format('array %s: %s of at most %s running', left(q.array_id::text, 8), a.active, a.lim)
             FROM (SELECT array_id, max(array_limit) AS lim,
                          count(*) FILTER (WHERE state IN ('admitted', 'starting', 'running', 'restarting')) AS active
                   FROM jobs WHERE array_limit IS NOT NULL
                     AND state IN ('queued', 'admitted', 'starting', 'running', 'restarting')
                   GROUP BY array_id) a
             JOIN LATERAL (SELECT id, array_id, row_number() OVER (ORDER BY array_index) AS rank
                           FROM jobs WHERE array_id = a.array_id AND state = 'queued') q ON true
             WHERE q.rank > a.lim - a.active",
        )
        .fetch_all(&self.pool)
        .await
        .map_err(db_error)
    }

    /// What start estimates need to run down chains and through arrays' windows, across
    /// tenants (the board serves each reader its own tenant's jobs only): each queued job's
    /// dependencies that have not ended, and every unfinished member of a limited array, by
    /// array and index.
    pub async fn chains_now(&self) -> Result<ChainsNow> {
        // language=PostgreSQL
        let dependencies = sqlx::query_as(
            "SELECT d.job_id, d.depends_on
             FROM jobs j JOIN job_dependencies d ON d.job_id = j.id JOIN jobs p ON p.id = d.depends_on
             WHERE j.state = 'queued' AND p.state NOT IN ('succeeded', 'failed', 'cancelled')
             ORDER BY d.job_id, d.depends_on",
        )
        .fetch_all(&self.pool)
        .await
        .map_err(db_error)?;
        // language=PostgreSQL
        let arrays = sqlx::query_as(
            "SELECT array_id, array_limit, id FROM jobs
             WHERE array_limit IS NOT NULL AND state IN ('queued', 'admitted', 'starting', 'running', 'restarting')
             ORDER BY array_id, array_index",
        )
        .fetch_all(&self.pool)
        .await
        .map_err(db_error)?;
        Ok(ChainsNow { dependencies, arrays })
    }
}

/// See [`Store::chains_now`].
#[derive(Debug, Clone, Default)]
pub struct ChainsNow {
    /// `(job, dependency)` for each queued job's dependencies that have not ended.
    pub dependencies: Vec<(Uuid, Uuid)>,
    /// `(array, its limit, member)` for each unfinished member of a limited array.
    pub arrays: Vec<(Uuid, i32, Uuid)>,
}
