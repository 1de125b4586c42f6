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
                    u.name AS created_by_name, d.created_at FROM datasets d JOIN users u ON u.id = d.created_by ",
            $rest
        )
    };
}

impl Store {
    /// Registers a version; the same content again is harmless, other content under a
    /// registered version is a conflict.
    pub async fn dataset_register(&self, caller: &Caller, d: &Dataset, audit: &Audit) -> Result<Published> {
        let mut tx = self.pool.begin().await.map_err(db_error)?;
        // language=PostgreSQL
        let inserted = sqlx::query(
            "INSERT INTO datasets (tenant_id, name, version, uri, format, size_bytes, samples, content_hash,
                                   source_job, created_by)
             VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10)
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
        .execute(&mut *tx)
        .await
        .map_err(|err| match violated_constraint(&err) {
            Some("datasets_name_format") => Error::invalid("name", "1 to 128 letters, digits, '.', '_' or '-'"),
            Some("datasets_version_format") => Error::invalid("version", "1 to 64 letters, digits, '.', '_' or '-'"),
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
        if existing.content_hash == d.content_hash && existing.uri == d.uri {
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
    created_by_name: String,
    created_at: chrono::DateTime<chrono::Utc>,
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
            created_by: row.created_by_name,
            created_at: row.created_at,
        }
    }
}
