//! The dataset registry: named, immutable dataset versions per tenant.

use trainyard_core::api::Dataset;
use trainyard_core::auth::Caller;
use trainyard_core::{Error, Result};
use uuid::Uuid;

use crate::audit::{self, Audit, Outcome};
use crate::templates::Published;
use crate::{Store, db_error, violated_constraint};

/// A `SELECT` of a dataset version with the name of who registered it, followed by the rest of
/// the statement (a macro so the SQL stays a static string).
macro_rules! dataset_select {
    ($rest:literal) => {
        concat!(
            "SELECT d.name, d.version, d.uri, d.format, d.size_bytes, d.samples, d.content_hash, d.source_job,
                    d.store_prefix, u.name AS created_by_name, d.created_at,
                    ARRAY(SELECT c.node FROM node_datasets c
                          WHERE c.tenant_id = d.tenant_id AND c.content_hash = d.content_hash
                            AND c.reported_at > now() - interval '1 day' ORDER BY c.node) AS cached_on
             FROM datasets d JOIN users u ON u.id = d.created_by ",
            $rest
        )
    };
}

impl Store {
    /// Registers a version; the same content again is harmless, other content under a
    /// registered version is a conflict.
    pub async fn dataset_register(&self, caller: &Caller, d: &Dataset, audit: &Audit) -> Result<Published> {
        let mut tx = self.begin().await?;
        if let Some(prefix) = &d.store_prefix {
            // The push must still be there: the retention sweep removes one never registered
            // within a day, and takes this lock to do it.
            // language=PostgreSQL
            let pushed: Option<i32> = sqlx::query_scalar(
                "SELECT 1 FROM dataset_pushes WHERE tenant_id = $1 AND store_prefix = $2 FOR UPDATE",
            )
            .bind(caller.tenant_id)
            .bind(prefix)
            .fetch_optional(&mut *tx)
            .await
            .map_err(db_error)?;
            if pushed.is_none() {
                return Err(Error::invalid(
                    "from_store",
                    format!(
                        "{} was not pushed, or its push was removed (a push on which no version is registered \
                         within a day of its last upload is); push it again",
                        d.content_hash
                    ),
                ));
            }
        }
        // language=PostgreSQL
        let inserted = sqlx::query(
            "INSERT INTO datasets (tenant_id, name, version, uri, format, size_bytes, samples, content_hash,
                                   source_job, created_by, store_prefix)
             VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11)
             ON CONFLICT (tenant_id, name, version) DO NOTHING",
        )
        .bind(caller.tenant_id)
        .bind(&d.name)
        .bind(&d.version)
        .bind(&d.uri)
        .bind(&d.format)
        .bind(d.size_bytes)
        .bind(d.samples)
        .bind(&d.content_hash)
        .bind(d.source_job)
        .bind(caller.user_id)
        .bind(&d.store_prefix)
        .execute(&mut *tx)
        .await
        .map_err(|err| match violated_constraint(&err) {
            Some("datasets_name_format") => Error::invalid("name", "1 to 128 letters, digits, '.', '_' or '-'"),
            Some("datasets_version_format") => Error::invalid("version", "1 to 64 letters, digits, '.', '_' or '-'"),
            Some("datasets_store_prefix_in_tenant") => {
                Error::internal(format!("a dataset's store prefix {:?} is not its tenant's", d.store_prefix))
            }
            _ => db_error(err),
        })?
        .rows_affected();
        if inserted == 1 {
            audit::append(&mut *tx, audit, Outcome::Ok, None).await?;
            tx.commit().await.map_err(db_error)?;
            return Ok(Published::Created);
        }
        drop(tx);
        let existing = self.dataset_get(caller.tenant_id, &d.name, &d.version).await?;
        if existing.content_hash == d.content_hash && existing.uri == d.uri && existing.store_prefix == d.store_prefix {
            audit::append(&self.pool, audit, Outcome::Ok, Some("unchanged: registered before with this content"))
                .await?;
            Ok(Published::Unchanged)
        } else {
            Err(Error::Conflict(format!(
                "{}@{} is registered with other content ({}); a version never changes, so register a new one",
                d.name, d.version, existing.content_hash
            )))
        }
    }

    pub async fn datasets_list(&self, tenant_id: Uuid) -> Result<Vec<Dataset>> {
        let rows: Vec<DatasetRow> =
            sqlx::query_as(dataset_select!("WHERE d.tenant_id = $1 ORDER BY d.name, d.created_at"))
                .bind(tenant_id)
                .fetch_all(&self.pool)
                .await
                .map_err(db_error)?;
        Ok(rows.into_iter().map(Dataset::from).collect())
    }

    /// The tenant's registered dataset versions whose URI is one of `uris`.
    pub async fn datasets_at(&self, tenant_id: Uuid, uris: &[String]) -> Result<Vec<Dataset>> {
        let rows: Vec<DatasetRow> =
            sqlx::query_as(dataset_select!("WHERE d.tenant_id = $1 AND d.uri = ANY($2) ORDER BY d.name, d.created_at"))
                .bind(tenant_id)
                .bind(uris)
                .fetch_all(&self.pool)
                .await
                .map_err(db_error)?;
        Ok(rows.into_iter().map(Dataset::from).collect())
    }

    pub async fn dataset_get(&self, tenant_id: Uuid, name: &str, version: &str) -> Result<Dataset> {
        let row: DatasetRow =
            sqlx::query_as(dataset_select!("WHERE d.tenant_id = $1 AND d.name = $2 AND d.version = $3"))
                .bind(tenant_id)
                .bind(name)
                .bind(version)
                .fetch_optional(&self.pool)
                .await
                .map_err(db_error)?
                .ok_or_else(|| Error::not_found(trainyard_core::error::ObjectKind::Dataset))?;
        Ok(row.into())
    }

    /// The tenant's dataset versions among `refs` (name, version); those not registered are
    /// left out.
    pub async fn datasets_by_refs(&self, tenant_id: Uuid, refs: &[(String, String)]) -> Result<Vec<Dataset>> {
        let (names, versions): (Vec<&str>, Vec<&str>) = refs.iter().map(|(n, v)| (n.as_str(), v.as_str())).unzip();
        let rows: Vec<DatasetRow> = sqlx::query_as(dataset_select!(
            "WHERE d.tenant_id = $1 AND (d.name, d.version) IN (SELECT * FROM unnest($2::text[], $3::text[]))"
        ))
        .bind(tenant_id)
        .bind(names)
        .bind(versions)
        .fetch_all(&self.pool)
        .await
        .map_err(db_error)?;
        Ok(rows.into_iter().map(Dataset::from).collect())
    }

    /// Whether a version of the tenant's datasets keeps its files under `store_prefix`.
    pub async fn dataset_content_registered(&self, tenant_id: Uuid, store_prefix: &str) -> Result<bool> {
        let mut connection = self.pool.acquire().await.map_err(db_error)?;
        content_registered(&mut connection, tenant_id, store_prefix).await
    }

    /// Records the content being pushed under `store_prefix` (its manifest, `bytes` of shards)
    /// within the tenant's storage quota, which its volumes and the rest of its pushed content
    /// share; pushing the same content again replaces its size and renews it. 422 on `file` when
    /// it would take the tenant over its quota.
    pub async fn dataset_push_begin(&self, tenant_id: Uuid, store_prefix: &str, bytes: u64) -> Result<()> {
        let size = i64::try_from(bytes).map_err(|_| Error::invalid("file", "the manifest's shards are too large"))?;
        let mut tx = self.begin().await?;
        // language=PostgreSQL
        let (tenant, quota): (String, Option<i64>) =
            sqlx::query_as("SELECT name, storage_quota_bytes FROM tenants WHERE id = $1 FOR UPDATE")
                .bind(tenant_id)
                .fetch_one(&mut *tx)
                .await
                .map_err(db_error)?;
        let used = crate::storage::storage_used(&mut tx, tenant_id, Some(store_prefix)).await?;
        if let Some(quota) = quota
            && used.saturating_add(size) > quota
        {
            return Err(Error::invalid(
                "file",
                format!(
                    "dataset.json: its shards take {size} bytes, which would exceed tenant {tenant}'s storage quota: \
                     {used} of {quota} bytes are in use by its volumes and pushed datasets, {} left",
                    (quota - used).max(0)
                ),
            ));
        }
        // language=PostgreSQL
        sqlx::query(
            "INSERT INTO dataset_pushes (tenant_id, store_prefix, bytes) VALUES ($1, $2, $3)
             ON CONFLICT (tenant_id, store_prefix) DO UPDATE
             SET pushed_at = now(),
                 -- A registered version's content keeps its size (its manifest cannot change).
                 bytes = CASE WHEN EXISTS (SELECT 1 FROM datasets d WHERE d.tenant_id = $1 AND d.store_prefix = $2)
                              THEN dataset_pushes.bytes ELSE excluded.bytes END",
        )
        .bind(tenant_id)
        .bind(store_prefix)
        .bind(size)
        .execute(&mut *tx)
        .await
        .map_err(db_error)?;
        tx.commit().await.map_err(db_error)?;
        Ok(())
    }

    /// The push's row, locked against a registration on its content until
    /// [`PushLock::release`] (a registration takes the same lock); none when there is no such
    /// push. Says whether a version is registered on it already.
    pub async fn dataset_push_lock(&self, tenant_id: Uuid, store_prefix: &str) -> Result<Option<PushLock>> {
        let mut tx = self.begin().await?;
        // language=PostgreSQL
        let pushed: Option<i32> =
            sqlx::query_scalar("SELECT 1 FROM dataset_pushes WHERE tenant_id = $1 AND store_prefix = $2 FOR UPDATE")
                .bind(tenant_id)
                .bind(store_prefix)
                .fetch_optional(&mut *tx)
                .await
                .map_err(db_error)?;
        if pushed.is_none() {
            return Ok(None);
        }
        // A statement of its own, after the lock: one that waited for a registration to commit
        // sees it (a subquery of the locking statement would read the snapshot from before).
        let registered = content_registered(&mut tx, tenant_id, store_prefix).await?;
        Ok(Some(PushLock { tx, registered }))
    }

    /// Renews a push with each file uploaded to it (a long push is not abandoned); false when
    /// there is no such push (its manifest was never uploaded, or the push was removed).
    pub async fn dataset_push_renew(&self, tenant_id: Uuid, store_prefix: &str) -> Result<bool> {
        // language=PostgreSQL
        let done =
            sqlx::query("UPDATE dataset_pushes SET pushed_at = now() WHERE tenant_id = $1 AND store_prefix = $2")
                .bind(tenant_id)
                .bind(store_prefix)
                .execute(&self.pool)
                .await
                .map_err(db_error)?;
        Ok(done.rows_affected() == 1)
    }

    /// Forgets up to `limit` pushes on which no version is registered and nothing was uploaded
    /// for a day (`older_than`), returning their prefixes, whose objects the caller removes. A
    /// registration waits on the row's lock, then finds it gone. Fenced: the retention sweep's.
    pub async fn dataset_pushes_abandoned(&self, older_than: chrono::Duration, limit: i64) -> Result<Vec<String>> {
        // language=PostgreSQL
        sqlx::query_scalar(
            "DELETE FROM dataset_pushes p
             WHERE (p.tenant_id, p.store_prefix) IN (
                 SELECT q.tenant_id, q.store_prefix FROM dataset_pushes q
                 WHERE q.pushed_at <= now() - $1::interval
                   AND NOT EXISTS (SELECT 1 FROM datasets d
                                   WHERE d.tenant_id = q.tenant_id AND d.store_prefix = q.store_prefix)
                 LIMIT $2 FOR UPDATE SKIP LOCKED)
               AND (SELECT control_fence($3))
             RETURNING p.store_prefix",
        )
        .bind(older_than)
        .bind(limit)
        .bind(self.control_epoch())
        .fetch_all(&self.pool)
        .await
        .map_err(db_error)
    }

    /// Whether the tenant's job `job_id` recorded reading dataset version `name@version` (its
    /// `datasets`, written with the job): what a job token may fetch the files of.
    pub async fn job_reads_dataset(&self, tenant_id: Uuid, job_id: Uuid, name: &str, version: &str) -> Result<bool> {
        // language=PostgreSQL
        sqlx::query_scalar(
            "SELECT EXISTS (SELECT 1 FROM jobs WHERE id = $1 AND tenant_id = $2 AND datasets IS NOT NULL
                              AND datasets @> jsonb_build_array(jsonb_build_object('name', $3::text, 'version', $4::text)))",
        )
        .bind(job_id)
        .bind(tenant_id)
        .bind(name)
        .bind(version)
        .fetch_one(&self.pool)
        .await
        .map_err(db_error)
    }

    /// Records that the shard cache of `node` holds every shard of the version `name@version`
    /// that job `job_id` of the tenant read (its engine's report), when the job recorded reading
    /// it and runs on that node. One statement: the check and the write cannot be torn apart.
    ///
    /// `sharing` names the nodes whose cache is the reporting node's (the local machine's
    /// nodes, one per GPU type): each gets the entry too.
    #[allow(clippy::too_many_arguments)]
    pub async fn node_dataset_report(
        &self,
        tenant_id: Uuid,
        job_id: Uuid,
        name: &str,
        version: &str,
        node: &str,
        sharing: &[String],
        bytes: i64,
    ) -> Result<NodeReport> {
        // language=PostgreSQL
        let (reads, on_node, _written): (bool, bool, bool) = sqlx::query_as(
            "WITH used AS (SELECT j.assigned_nodes, d->>'content_hash' AS content_hash
                           FROM jobs j, jsonb_array_elements(j.datasets) d
                           WHERE j.id = $1 AND j.tenant_id = $2 AND jsonb_typeof(j.datasets) = 'array'
                             AND d->>'name' = $3 AND d->>'version' = $4
                           LIMIT 1),
                  written AS (INSERT INTO node_datasets (tenant_id, content_hash, node, bytes, job_id)
                              SELECT $2, content_hash, n, $6, $1 FROM used, unnest(array_append($7::text[], $5)) n
                              WHERE $5 = ANY(assigned_nodes)
                              ON CONFLICT (tenant_id, content_hash, node)
                              DO UPDATE SET bytes = EXCLUDED.bytes, job_id = EXCLUDED.job_id, reported_at = now()
                              RETURNING 1)
             SELECT EXISTS (SELECT 1 FROM used),
                    EXISTS (SELECT 1 FROM used WHERE $5 = ANY(assigned_nodes)),
                    EXISTS (SELECT 1 FROM written)",
        )
        .bind(job_id)
        .bind(tenant_id)
        .bind(name)
        .bind(version)
        .bind(node)
        .bind(bytes)
        .bind(sharing)
        .fetch_one(&self.pool)
        .await
        .map_err(db_error)?;
        Ok(match (reads, on_node) {
            (false, _) => NodeReport::NotRead,
            (true, false) => NodeReport::NotItsNode,
            (true, true) => NodeReport::Recorded,
        })
    }

    /// Per node, the tenant's dataset versions (`NAME@VERSION`) whose content its shard cache
    /// holds (reported within the last day).
    pub async fn node_cached_datasets(&self, tenant_id: Uuid) -> Result<Vec<(String, String)>> {
        // language=PostgreSQL
        sqlx::query_as(
            "SELECT c.node, d.name || '@' || d.version FROM node_datasets c
             JOIN datasets d ON d.tenant_id = c.tenant_id AND d.content_hash = c.content_hash
             WHERE c.tenant_id = $1 AND c.reported_at > now() - interval '1 day'
             ORDER BY c.node, d.name, d.version",
        )
        .bind(tenant_id)
        .fetch_all(&self.pool)
        .await
        .map_err(db_error)
    }

    /// Forgets cache reports older than a day (no longer trusted: a cache evicts without
    /// telling); the number forgotten. Fenced: the retention sweep's.
    pub async fn node_datasets_forget_stale(&self) -> Result<u64> {
        // language=PostgreSQL
        let done = sqlx::query(
            "DELETE FROM node_datasets WHERE reported_at <= now() - interval '1 day' AND (SELECT control_fence($1))",
        )
        .bind(self.control_epoch())
        .execute(&self.pool)
        .await
        .map_err(db_error)?;
        Ok(done.rows_affected())
    }

    /// The nodes whose shard cache holds any of the tenant's `content_hashes` (reported within
    /// the last day), by name.
    pub async fn nodes_caching(&self, tenant_id: Uuid, content_hashes: &[String]) -> Result<Vec<String>> {
        // language=PostgreSQL
        sqlx::query_scalar(
            "SELECT DISTINCT node FROM node_datasets
             WHERE tenant_id = $1 AND content_hash = ANY($2) AND reported_at > now() - interval '1 day'
             ORDER BY node",
        )
        .bind(tenant_id)
        .bind(content_hashes)
        .fetch_all(&self.pool)
        .await
        .map_err(db_error)
    }

    /// The tenant's dataset versions registered from the output of one of `jobs`.
    pub async fn datasets_produced_by(&self, tenant_id: Uuid, jobs: &[Uuid]) -> Result<Vec<Dataset>> {
        let rows: Vec<DatasetRow> =
            sqlx::query_as(dataset_select!("WHERE d.tenant_id = $1 AND d.source_job = ANY($2) ORDER BY d.created_at"))
                .bind(tenant_id)
                .bind(jobs)
                .fetch_all(&self.pool)
                .await
                .map_err(db_error)?;
        Ok(rows.into_iter().map(Dataset::from).collect())
    }
}

async fn content_registered(connection: &mut sqlx::PgConnection, tenant_id: Uuid, store_prefix: &str) -> Result<bool> {
    // language=PostgreSQL
    sqlx::query_scalar("SELECT EXISTS (SELECT 1 FROM datasets WHERE tenant_id = $1 AND store_prefix = $2)")
        .bind(tenant_id)
        .bind(store_prefix)
        .fetch_one(connection)
        .await
        .map_err(db_error)
}

/// A push's row, locked ([`Store::dataset_push_lock`]).
pub struct PushLock {
    tx: sqlx::Transaction<'static, sqlx::Postgres>,
    /// Whether a version is registered on the content.
    pub registered: bool,
}

impl PushLock {
    /// Lets a waiting registration go on.
    pub async fn release(self) -> Result<()> {
        self.tx.commit().await.map_err(db_error)
    }
}

/// What became of a node's cache report ([`Store::node_dataset_report`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum NodeReport {
    Recorded,
    /// The job did not record reading that version (or is not the tenant's).
    NotRead,
    /// The job does not run on that node.
    NotItsNode,
}

#[derive(sqlx::FromRow)]
struct DatasetRow {
    name: String,
    version: String,
    uri: String,
    format: String,
    size_bytes: Option<i64>,
    samples: Option<i64>,
    content_hash: String,
    source_job: Option<Uuid>,
    store_prefix: Option<String>,
    created_by_name: String,
    created_at: chrono::DateTime<chrono::Utc>,
    cached_on: Vec<String>,
}

impl From<DatasetRow> for Dataset {
    fn from(row: DatasetRow) -> Dataset {
        Dataset {
            name: row.name,
            version: row.version,
            uri: row.uri,
            format: row.format,
            size_bytes: row.size_bytes,
            samples: row.samples,
            content_hash: row.content_hash,
            source_job: row.source_job,
            store_prefix: row.store_prefix,
            created_by: row.created_by_name,
            created_at: row.created_at,
            cached_on: row.cached_on,
        }
    }
}
