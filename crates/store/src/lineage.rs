//! The links lineage walks that are not a job's or a dataset's own columns: the jobs that read a
//! dataset version, a job's reruns and fine-tunes, and its uploaded artefacts. Every query is scoped by tenant
//! and takes a limit, so one busy node cannot make a walk unbounded; each answers one more than
//! the limit when there is more, for the caller to say the walk was cut.

use trainyard_core::Result;
use uuid::Uuid;

use crate::{Store, db_error};

/// An artefact a job uploaded, as lineage shows it.
#[derive(Debug, Clone, sqlx::FromRow)]
pub struct ArtifactRow {
    pub job_id: Uuid,
    pub path: String,
    pub size_bytes: i64,
    pub sha256: String,
}

impl Store {
    /// Up to `limit` + 1 of the tenant's jobs that read `name@version` through a parameter,
    /// oldest first (by the GIN index on `jobs.datasets`).
    pub async fn jobs_reading(&self, tenant_id: Uuid, name: &str, version: &str, limit: i64) -> Result<Vec<Uuid>> {
        let wanted = serde_json::json!([{"name": name, "version": version}]);
        // language=PostgreSQL
        sqlx::query_scalar(
            "SELECT id FROM jobs WHERE tenant_id = $1 AND datasets IS NOT NULL AND datasets @> $2 ORDER BY id LIMIT $3",
        )
        .bind(tenant_id)
        .bind(wanted)
        .bind(limit + 1)
        .fetch_all(&self.pool)
        .await
        .map_err(db_error)
    }

    /// Up to `limit` + 1 reruns of each of `jobs`: (original, rerun), oldest first.
    pub async fn reruns_of(&self, tenant_id: Uuid, jobs: &[Uuid], limit: i64) -> Result<Vec<(Uuid, Uuid)>> {
        // language=PostgreSQL
        sqlx::query_as(
            "SELECT o.id, r.id FROM unnest($2::uuid[]) AS o(id),
                 LATERAL (SELECT id FROM jobs WHERE tenant_id = $1 AND rerun_of = o.id ORDER BY id LIMIT $3) AS r",
        )
        .bind(tenant_id)
        .bind(jobs)
        .bind(limit + 1)
        .fetch_all(&self.pool)
        .await
        .map_err(db_error)
    }

    /// Up to `limit` + 1 runs fine-tuned from a checkpoint of each of `jobs`: (source, run),
    /// oldest first.
    pub async fn fine_tunes_of(&self, tenant_id: Uuid, jobs: &[Uuid], limit: i64) -> Result<Vec<(Uuid, Uuid)>> {
        // language=PostgreSQL
        sqlx::query_as(
            "SELECT s.id, r.id FROM unnest($2::uuid[]) AS s(id),
                 LATERAL (SELECT id FROM jobs WHERE tenant_id = $1 AND init_from_job = s.id ORDER BY id LIMIT $3) AS r",
        )
        .bind(tenant_id)
        .bind(jobs)
        .bind(limit + 1)
        .fetch_all(&self.pool)
        .await
        .map_err(db_error)
    }

    /// Up to `limit` + 1 uploaded artefacts of each of `jobs`, by path.
    pub async fn artifacts_of(&self, tenant_id: Uuid, jobs: &[Uuid], limit: i64) -> Result<Vec<ArtifactRow>> {
        // language=PostgreSQL
        sqlx::query_as(
            "SELECT a.job_id, a.path, a.size_bytes, a.sha256 FROM unnest($2::uuid[]) AS j(id),
                 LATERAL (SELECT job_id, path, size_bytes, sha256 FROM artifacts
                          WHERE tenant_id = $1 AND job_id = j.id ORDER BY path LIMIT $3) AS a",
        )
        .bind(tenant_id)
        .bind(jobs)
        .bind(limit + 1)
        .fetch_all(&self.pool)
        .await
        .map_err(db_error)
    }
}
