//! Storage records: artefact hashes, volumes under the tenant's storage quota, the storage
//! policy (retention, quota), what retention has removed and the logs archived. The bytes
//! themselves live in the object store (`trainyard-storage`); these rows hold what a store
//! cannot. (The key that signs download links is in a file, never here: docs/security.md.)

use std::collections::HashMap;
use std::time::Duration;

use chrono::{DateTime, Utc};
use trainyard_core::api::{AccessMode, StoragePolicy, StorageReport, Volume};
use trainyard_core::auth::Caller;
use trainyard_core::error::ObjectKind;
use trainyard_core::{Error, Result};
use uuid::Uuid;

use crate::audit::{self, Audit, Outcome};
use crate::{Store, db_error, violated_constraint};

/// A volume to create, checked by the caller except for the quota and name uniqueness.
#[derive(Debug, Clone)]
pub struct NewVolume<'a> {
    pub name: &'a str,
    pub size_bytes: u64,
    pub access_mode: AccessMode,
    pub storage_class: Option<&'a str>,
    pub path: &'a str,
}

/// A finished job whose logs or artefacts are older than its tenant keeps them.
#[derive(Debug, Clone, PartialEq, Eq, sqlx::FromRow)]
pub struct RetentionDue {
    #[sqlx(rename = "id")]
    pub job_id: Uuid,
    pub tenant_id: Uuid,
    pub logs: bool,
    pub artifacts: bool,
}

/// When retention removed a job's logs and artefacts.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Expiry {
    pub logs: Option<DateTime<Utc>>,
    pub artifacts: Option<DateTime<Utc>>,
}

const DAYS_MAX: u32 = 36_500;

impl Store {
    /// Records an artefact uploaded through the API (replacing an earlier one at that path), and
    /// with it, in one transaction, the audit entry of a member's upload.
    pub async fn artifact_record(
        &self,
        tenant_id: Uuid,
        job_id: Uuid,
        path: &str,
        size_bytes: u64,
        sha256: &str,
        audit: Option<&Audit>,
    ) -> Result<()> {
        let mut tx = self.begin().await?;
        // language=PostgreSQL
        sqlx::query(
            "INSERT INTO artifacts (tenant_id, job_id, path, size_bytes, sha256) VALUES ($1, $2, $3, $4, $5)
             ON CONFLICT (tenant_id, job_id, path)
             DO UPDATE SET size_bytes = excluded.size_bytes, sha256 = excluded.sha256, uploaded_at = now()",
        )
        .bind(tenant_id)
        .bind(job_id)
        .bind(path)
        .bind(i64::try_from(size_bytes).map_err(Error::internal)?)
        .bind(sha256)
        .execute(&mut *tx)
        .await
        .map_err(db_error)?;
        if let Some(audit) = audit {
            audit::append(&mut *tx, audit, Outcome::Ok, None).await?;
        }
        tx.commit().await.map_err(db_error)?;
        Ok(())
    }

    /// The SHA-256 of each of a job's artefacts that came through the API, by path.
    pub async fn artifact_hashes(&self, tenant_id: Uuid, job_id: Uuid) -> Result<HashMap<String, String>> {
        // language=PostgreSQL
        let rows: Vec<(String, String)> =
            sqlx::query_as("SELECT path, sha256 FROM artifacts WHERE tenant_id = $1 AND job_id = $2")
                .bind(tenant_id)
                .bind(job_id)
                .fetch_all(&self.pool)
                .await
                .map_err(db_error)?;
        Ok(rows.into_iter().collect())
    }

    /// When retention removed this job's logs and artefacts, if it did.
    pub async fn job_storage_expiry(&self, tenant_id: Uuid, job_id: Uuid) -> Result<Expiry> {
        // language=PostgreSQL
        let (logs, artifacts) =
            sqlx::query_as("SELECT logs_expired_at, artifacts_expired_at FROM jobs WHERE tenant_id = $1 AND id = $2")
                .bind(tenant_id)
                .bind(job_id)
                .fetch_optional(&self.pool)
                .await
                .map_err(db_error)?
                .ok_or_else(|| Error::not_found(ObjectKind::Job))?;
        Ok(Expiry { logs, artifacts })
    }

    /// Replaces a tenant's storage policy (platform admins).
    pub async fn storage_policy_set(&self, tenant: &str, policy: &StoragePolicy, audit: &Audit) -> Result<()> {
        let days = |field: &str, value: Option<u32>| match value {
            Some(d) if d == 0 || d > DAYS_MAX => {
                Err(Error::invalid(field, format!("1 to {DAYS_MAX} days, or null to keep forever")))
            }
            other => Ok(other.map(|d| d as i32)),
        };
        let logs = days("log_retention_days", policy.log_retention_days)?;
        let artifacts = days("artifact_retention_days", policy.artifact_retention_days)?;
        let quota = policy
            .storage_quota_bytes
            .map(i64::try_from)
            .transpose()
            .map_err(|_| Error::invalid("storage_quota_bytes", "too large"))?;
        let mut tx = self.begin().await?;
        // language=PostgreSQL
        let tenant_id: Uuid = sqlx::query_scalar(
            "UPDATE tenants SET log_retention_days = $2, artifact_retention_days = $3, storage_quota_bytes = $4
             WHERE name = $1 RETURNING id",
        )
        .bind(tenant)
        .bind(logs)
        .bind(artifacts)
        .bind(quota)
        .fetch_optional(&mut *tx)
        .await
        .map_err(db_error)?
        .ok_or_else(|| Error::not_found(ObjectKind::Tenant))?;
        audit::append(&mut *tx, &audit.clone().on_tenant(Some(tenant_id), tenant), Outcome::Ok, None).await?;
        tx.commit().await.map_err(db_error)?;
        Ok(())
    }

    /// The tenant's storage policy and what its volumes and pushed datasets take.
    pub async fn storage_report(&self, tenant_id: Uuid) -> Result<StorageReport> {
        // language=PostgreSQL
        let row: StorageReportRow = sqlx::query_as(
            "SELECT t.name, t.log_retention_days, t.artifact_retention_days, t.storage_quota_bytes,
                    (SELECT count(*) FROM volumes v WHERE v.tenant_id = t.id) AS volumes,
                    (SELECT coalesce(sum(size_bytes), 0)::bigint FROM volumes v WHERE v.tenant_id = t.id) AS bytes,
                    (SELECT coalesce(sum(bytes), 0)::bigint FROM dataset_pushes p WHERE p.tenant_id = t.id) AS dataset_bytes
             FROM tenants t WHERE t.id = $1",
        )
        .bind(tenant_id)
        .fetch_one(&self.pool)
        .await
        .map_err(db_error)?;
        Ok(StorageReport {
            tenant: row.name,
            policy: StoragePolicy {
                log_retention_days: row.log_retention_days.map(|d| d as u32),
                artifact_retention_days: row.artifact_retention_days.map(|d| d as u32),
                storage_quota_bytes: row.storage_quota_bytes.map(|b| b as u64),
            },
            volumes: row.volumes as u64,
            volume_bytes: row.bytes as u64,
            dataset_bytes: row.dataset_bytes as u64,
        })
    }

    /// Records a volume, within the tenant's storage quota. The tenant's row is locked while the
    /// sum is taken, so two concurrent creations cannot both squeeze under the quota.
    pub async fn volume_create(&self, caller: &Caller, volume: &NewVolume<'_>, audit: &Audit) -> Result<Volume> {
        let size = i64::try_from(volume.size_bytes).map_err(|_| Error::invalid("size", "too large"))?;
        let mut tx = self.begin().await?;
        // language=PostgreSQL
        let quota: Option<i64> = sqlx::query_scalar("SELECT storage_quota_bytes FROM tenants WHERE id = $1 FOR UPDATE")
            .bind(caller.tenant_id)
            .fetch_one(&mut *tx)
            .await
            .map_err(db_error)?;
        let used = storage_used(&mut tx, caller.tenant_id, None).await?;
        if let Some(quota) = quota
            && used.saturating_add(size) > quota
        {
            return Err(Error::invalid(
                "size",
                format!(
                    "{size} bytes would exceed tenant {}'s storage quota: {used} of {quota} bytes are in use by its \
                     volumes and pushed datasets, {} left",
                    caller.tenant,
                    (quota - used).max(0)
                ),
            ));
        }
        // language=PostgreSQL
        let inserted = sqlx::query(
            "INSERT INTO volumes (tenant_id, name, size_bytes, access_mode, storage_class, path, created_by)
             VALUES ($1, $2, $3, $4, $5, $6, $7) ON CONFLICT (tenant_id, name) DO NOTHING",
        )
        .bind(caller.tenant_id)
        .bind(volume.name)
        .bind(size)
        .bind(volume.access_mode.as_str())
        .bind(volume.storage_class)
        .bind(volume.path)
        .bind(caller.user_id)
        .execute(&mut *tx)
        .await
        .map_err(|err| match violated_constraint(&err) {
            Some("volumes_name_format") => {
                Error::invalid("name", "1 to 63 lowercase letters, digits or '-', starting with a letter or digit")
            }
            Some("volumes_storage_class_format") => {
                Error::invalid("storage_class", "1 to 63 lowercase letters, digits, '.' or '-'")
            }
            _ => db_error(err),
        })?
        .rows_affected();
        if inserted == 0 {
            return Err(Error::Conflict(format!("a volume named {} exists in this tenant", volume.name)));
        }
        audit::append(&mut *tx, audit, Outcome::Ok, None).await?;
        tx.commit().await.map_err(db_error)?;
        self.volume_get(caller.tenant_id, volume.name).await
    }

    pub async fn volumes_list(&self, tenant_id: Uuid) -> Result<Vec<Volume>> {
        // language=PostgreSQL
        let rows: Vec<VolumeRow> = sqlx::query_as(
            "SELECT v.name, v.size_bytes, v.access_mode, v.storage_class, v.path, u.name AS created_by_name, v.created_at
             FROM volumes v JOIN users u ON u.id = v.created_by
             WHERE v.tenant_id = $1 ORDER BY v.name",
        )
        .bind(tenant_id)
        .fetch_all(&self.pool)
        .await
        .map_err(db_error)?;
        rows.into_iter().map(Volume::try_from).collect()
    }

    pub async fn volume_get(&self, tenant_id: Uuid, name: &str) -> Result<Volume> {
        // language=PostgreSQL
        let row: VolumeRow = sqlx::query_as(
            "SELECT v.name, v.size_bytes, v.access_mode, v.storage_class, v.path, u.name AS created_by_name, v.created_at
             FROM volumes v JOIN users u ON u.id = v.created_by
             WHERE v.tenant_id = $1 AND v.name = $2",
        )
        .bind(tenant_id)
        .bind(name)
        .fetch_optional(&self.pool)
        .await
        .map_err(db_error)?
        .ok_or_else(|| Error::not_found(ObjectKind::Volume))?;
        row.try_into()
    }

    /// Removes a volume's record and returns it (its directory is the caller's to remove).
    /// Refused while an unfinished job of the tenant mounts it (queued ones included: they
    /// would start without their data), naming a few of them; the volume stays as it was.
    pub async fn volume_delete(&self, tenant_id: Uuid, name: &str, audit: &Audit) -> Result<Volume> {
        let volume = self.volume_get(tenant_id, name).await?;
        let mut tx = self.begin().await?;
        // language=PostgreSQL
        let locked = sqlx::query("SELECT 1 FROM volumes WHERE tenant_id = $1 AND name = $2 FOR UPDATE")
            .bind(tenant_id)
            .bind(name)
            .fetch_optional(&mut *tx)
            .await
            .map_err(db_error)?;
        if locked.is_none() {
            return Err(Error::not_found(ObjectKind::Volume));
        }
        // language=PostgreSQL
        let users: Vec<(Uuid, String, i64)> = sqlx::query_as(
            "SELECT id, name, count(*) OVER () FROM jobs
              WHERE tenant_id = $1 AND state <> ALL($3)
                AND spec -> 'volumes' @> jsonb_build_array(jsonb_build_object('name', $2::text))
              ORDER BY id LIMIT 3",
        )
        .bind(tenant_id)
        .bind(name)
        .bind(trainyard_core::job::JobState::names_where(trainyard_core::job::JobState::is_terminal))
        .fetch_all(&mut *tx)
        .await
        .map_err(db_error)?;
        if let Some((_, _, count)) = users.first() {
            let named: Vec<String> = users.iter().map(|(id, job, _)| format!("{job} ({id})")).collect();
            let more = if *count > users.len() as i64 {
                format!(" and {} more", *count - users.len() as i64)
            } else {
                String::new()
            };
            return Err(Error::Conflict(format!(
                "volume {name} is mounted by {count} unfinished job(s): {}{more}; cancel them or let them end, then delete it",
                named.join(", ")
            )));
        }
        // language=PostgreSQL
        sqlx::query("DELETE FROM volumes WHERE tenant_id = $1 AND name = $2")
            .bind(tenant_id)
            .bind(name)
            .execute(&mut *tx)
            .await
            .map_err(db_error)?;
        audit::append(&mut *tx, audit, Outcome::Ok, None).await?;
        tx.commit().await.map_err(db_error)?;
        Ok(volume)
    }

    /// For the control loop, across tenants: finished jobs whose logs or artefacts have been
    /// kept as long as their tenant keeps them, counted from the job's end, at `now`.
    pub async fn retention_due(&self, now: DateTime<Utc>, limit: i64) -> Result<Vec<RetentionDue>> {
        // language=PostgreSQL
        sqlx::query_as(
            "SELECT j.id, j.tenant_id,
                    (j.logs_expired_at IS NULL AND t.log_retention_days IS NOT NULL
                     AND j.finished_at + make_interval(days => t.log_retention_days) <= $1) AS logs,
                    (j.artifacts_expired_at IS NULL AND t.artifact_retention_days IS NOT NULL
                     AND j.finished_at + make_interval(days => t.artifact_retention_days) <= $1) AS artifacts
             FROM jobs j JOIN tenants t ON t.id = j.tenant_id
             WHERE j.finished_at IS NOT NULL AND (j.logs_expired_at IS NULL OR j.artifacts_expired_at IS NULL)
               AND ((j.logs_expired_at IS NULL AND t.log_retention_days IS NOT NULL
                     AND j.finished_at + make_interval(days => t.log_retention_days) <= $1)
                 OR (j.artifacts_expired_at IS NULL AND t.artifact_retention_days IS NOT NULL
                     AND j.finished_at + make_interval(days => t.artifact_retention_days) <= $1))
             ORDER BY j.finished_at
             LIMIT $2",
        )
        .bind(now)
        .bind(limit)
        .fetch_all(&self.pool)
        .await
        .map_err(db_error)
    }

    /// Marks what retention removed of a job (after the objects are gone). A control-loop
    /// write: fenced by the leader's epoch, like the other writes of the retention sweep and of
    /// log archiving below.
    pub async fn retention_done(&self, due: &RetentionDue) -> Result<()> {
        let mut tx = self.begin().await?;
        // language=PostgreSQL
        sqlx::query(
            "UPDATE jobs SET
                 logs_expired_at = CASE WHEN $2 THEN coalesce(logs_expired_at, now()) ELSE logs_expired_at END,
                 artifacts_expired_at =
                     CASE WHEN $3 THEN coalesce(artifacts_expired_at, now()) ELSE artifacts_expired_at END
             WHERE id = $1 AND (SELECT control_fence($4))",
        )
        .bind(due.job_id)
        .bind(due.logs)
        .bind(due.artifacts)
        .bind(self.control_epoch())
        .execute(&mut *tx)
        .await
        .map_err(db_error)?;
        if due.artifacts {
            // language=PostgreSQL
            sqlx::query("DELETE FROM artifacts WHERE job_id = $1 AND (SELECT control_fence($2))")
                .bind(due.job_id)
                .bind(self.control_epoch())
                .execute(&mut *tx)
                .await
                .map_err(db_error)?;
        }
        tx.commit().await.map_err(db_error)
    }
}

#[derive(sqlx::FromRow)]
struct StorageReportRow {
    name: String,
    log_retention_days: Option<i32>,
    artifact_retention_days: Option<i32>,
    storage_quota_bytes: Option<i64>,
    volumes: i64,
    bytes: i64,
    dataset_bytes: i64,
}

#[derive(sqlx::FromRow)]
struct VolumeRow {
    name: String,
    size_bytes: i64,
    access_mode: String,
    storage_class: Option<String>,
    path: String,
    created_by_name: String,
    created_at: DateTime<Utc>,
}

impl TryFrom<VolumeRow> for Volume {
    type Error = Error;

    fn try_from(row: VolumeRow) -> Result<Volume> {
        Ok(Volume {
            access_mode: AccessMode::parse(&row.access_mode)
                .ok_or_else(|| Error::internal(format!("access mode {}", row.access_mode)))?,
            name: row.name,
            size_bytes: row.size_bytes as u64,
            storage_class: row.storage_class,
            path: row.path,
            created_by: row.created_by_name,
            created_at: row.created_at,
            pending_reason: None,
        })
    }
}

/// An ended attempt whose logs are not in the object store yet.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct UnarchivedAttempt {
    pub tenant_id: Uuid,
    pub job_id: Uuid,
    pub attempt: i32,
    pub replicas: u32,
    /// Failed tries so far.
    pub failures: i32,
}

impl Store {
    /// Ended attempts whose logs still wait for the object store, oldest first: those not tried
    /// yet, and failed ones whose backoff has passed and that have failed fewer than
    /// `max_failures` times. Jobs whose logs retention already removed are left out.
    pub async fn attempts_unarchived(&self, max_failures: i32, limit: i64) -> Result<Vec<UnarchivedAttempt>> {
        // language=PostgreSQL
        let rows: Vec<(Uuid, Uuid, i32, Option<i32>, i32)> = sqlx::query_as(
            "SELECT j.tenant_id, a.job_id, a.attempt, (j.spec ->> 'replicas')::integer AS replicas,
                    a.logs_archive_failures
               FROM job_attempts a JOIN jobs j ON j.id = a.job_id
              WHERE a.ended_at IS NOT NULL AND a.logs_archived_at IS NULL AND j.logs_expired_at IS NULL
                AND a.logs_archive_failures < $1
                AND (a.logs_archive_next_at IS NULL OR a.logs_archive_next_at <= now())
              ORDER BY a.ended_at LIMIT $2",
        )
        .bind(max_failures)
        .bind(limit)
        .fetch_all(&self.pool)
        .await
        .map_err(db_error)?;
        Ok(rows
            .into_iter()
            .map(|(tenant_id, job_id, attempt, replicas, failures)| UnarchivedAttempt {
                tenant_id,
                job_id,
                attempt,
                replicas: replicas.unwrap_or(1).max(1) as u32,
                failures,
            })
            .collect())
    }

    /// Records that the logs of each attempt of `attempts` (job, attempt) are archived: one
    /// statement for an archiving round's batch.
    pub async fn attempts_logs_archived(&self, attempts: &[(Uuid, i32)]) -> Result<()> {
        if attempts.is_empty() {
            return Ok(());
        }
        // language=PostgreSQL
        sqlx::query(
            "UPDATE job_attempts a SET logs_archived_at = now()
             FROM unnest($1::uuid[], $2::int[]) AS u(job_id, attempt)
             WHERE a.job_id = u.job_id AND a.attempt = u.attempt AND (SELECT control_fence($3))",
        )
        .bind(attempts.iter().map(|(job_id, _)| *job_id).collect::<Vec<_>>())
        .bind(attempts.iter().map(|(_, attempt)| *attempt).collect::<Vec<_>>())
        .bind(self.control_epoch())
        .execute(&self.pool)
        .await
        .map_err(db_error)?;
        Ok(())
    }

    /// Records a failed try, to be retried no sooner than `retry_in`.
    pub async fn attempt_logs_archive_failed(&self, job_id: Uuid, attempt: i32, retry_in: Duration) -> Result<()> {
        // language=PostgreSQL
        sqlx::query(
            "UPDATE job_attempts
                SET logs_archive_failures = logs_archive_failures + 1,
                    logs_archive_next_at = now() + make_interval(secs => $3)
              WHERE job_id = $1 AND attempt = $2 AND (SELECT control_fence($4))",
        )
        .bind(job_id)
        .bind(attempt)
        .bind(retry_in.as_secs_f64())
        .bind(self.control_epoch())
        .execute(&self.pool)
        .await
        .map_err(db_error)?;
        Ok(())
    }
}

/// What counts against a tenant's storage quota: its volumes' sizes and the shard bytes of the
/// content it pushed to the object store (but the content at `except`, being pushed again).
/// Called with the tenant's row locked, so that two requests cannot both squeeze under it.
pub(crate) async fn storage_used(
    tx: &mut sqlx::Transaction<'static, sqlx::Postgres>,
    tenant_id: Uuid,
    except: Option<&str>,
) -> Result<i64> {
    // language=PostgreSQL
    sqlx::query_scalar(
        "SELECT (SELECT coalesce(sum(size_bytes), 0)::bigint FROM volumes WHERE tenant_id = $1)
              + (SELECT coalesce(sum(bytes), 0)::bigint FROM dataset_pushes
                 WHERE tenant_id = $1 AND store_prefix IS DISTINCT FROM $2)",
    )
    .bind(tenant_id)
    .bind(except)
    .fetch_one(&mut **tx)
    .await
    .map_err(db_error)
}
