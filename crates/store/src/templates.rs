//! Tenant-owned task templates: publish once per (name, version), list, fetch. Built-in
//! templates live in the server binary, not here.

use std::collections::BTreeMap;

use chrono::{DateTime, Utc};
use trainyard_core::auth::Caller;
use trainyard_core::{Error, Result};
use uuid::Uuid;

use crate::audit::{self, Audit, Outcome};
use crate::{Store, db_error};

/// A stored template version: what was uploaded.
#[derive(Debug, Clone)]
pub struct StoredTemplate {
    pub name: String,
    pub version: String,
    pub digest: String,
    pub description: String,
    pub manifest: String,
    pub files: BTreeMap<String, Vec<u8>>,
    pub created_by: String,
    pub created_at: DateTime<Utc>,
}

/// One row of a listing (no files).
#[derive(Debug, Clone, sqlx::FromRow)]
pub struct TemplateVersionRow {
    pub name: String,
    pub version: String,
    pub digest: String,
    pub description: String,
    pub created_at: DateTime<Utc>,
}

/// What a publish did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Published {
    Created,
    /// The same (name, version) with the same digest was published before: nothing changed.
    Unchanged,
}

impl Store {
    /// Publishes a version, all or nothing. The same content again is harmless; other content
    /// under a published (name, version) is a conflict.
    pub async fn template_publish(&self, caller: &Caller, t: &StoredTemplate, audit: &Audit) -> Result<Published> {
        let mut tx = self.begin().await?;
        // language=PostgreSQL
        let inserted = sqlx::query(
            "INSERT INTO templates (tenant_id, name, version, digest, description, manifest, created_by)
             VALUES ($1, $2, $3, $4, $5, $6, $7)
             ON CONFLICT (tenant_id, name, version) DO NOTHING",
        )
        .bind(caller.tenant_id)
        .bind(&t.name)
        .bind(&t.version)
        .bind(&t.digest)
        .bind(&t.description)
        .bind(&t.manifest)
        .bind(caller.user_id)
        .execute(&mut *tx)
        .await
        .map_err(db_error)?
        .rows_affected();
        if inserted == 0 {
            // language=PostgreSQL
            let digest: String =
                sqlx::query_scalar("SELECT digest FROM templates WHERE tenant_id = $1 AND name = $2 AND version = $3")
                    .bind(caller.tenant_id)
                    .bind(&t.name)
                    .bind(&t.version)
                    .fetch_one(&mut *tx)
                    .await
                    .map_err(db_error)?;
            return if digest == t.digest {
                audit::append(&mut *tx, audit, Outcome::Ok, Some("unchanged: published before with this content"))
                    .await?;
                tx.commit().await.map_err(db_error)?;
                Ok(Published::Unchanged)
            } else {
                Err(Error::Conflict(format!(
                    "{}@{} is already published with other content ({digest}); a published version never changes, so publish a new version",
                    t.name, t.version
                )))
            };
        }
        let paths: Vec<&str> = t.files.keys().map(String::as_str).collect();
        let contents: Vec<&[u8]> = t.files.values().map(Vec::as_slice).collect();
        // language=PostgreSQL
        sqlx::query(
            "INSERT INTO template_files (tenant_id, name, version, path, content)
             SELECT $1, $2, $3, path, content FROM UNNEST($4::text[], $5::bytea[]) AS f(path, content)",
        )
        .bind(caller.tenant_id)
        .bind(&t.name)
        .bind(&t.version)
        .bind(&paths)
        .bind(&contents)
        .execute(&mut *tx)
        .await
        .map_err(db_error)?;
        audit::append(&mut *tx, audit, Outcome::Ok, None).await?;
        tx.commit().await.map_err(db_error)?;
        Ok(Published::Created)
    }

    /// Every version of every template of the tenant.
    pub async fn templates_list(&self, tenant_id: Uuid) -> Result<Vec<TemplateVersionRow>> {
        // language=PostgreSQL
        sqlx::query_as(
            "SELECT name, version, digest, description, created_at FROM templates
             WHERE tenant_id = $1 ORDER BY name, created_at",
        )
        .bind(tenant_id)
        .fetch_all(&self.pool)
        .await
        .map_err(db_error)
    }

    /// One version with its files, or `None`.
    pub async fn template_get(&self, tenant_id: Uuid, name: &str, version: &str) -> Result<Option<StoredTemplate>> {
        // language=PostgreSQL
        let Some(row): Option<TemplateRow> = sqlx::query_as(
            "SELECT t.name, t.version, t.digest, t.description, t.manifest, u.name AS created_by, t.created_at
             FROM templates t JOIN users u ON u.id = t.created_by
             WHERE t.tenant_id = $1 AND t.name = $2 AND t.version = $3",
        )
        .bind(tenant_id)
        .bind(name)
        .bind(version)
        .fetch_optional(&self.pool)
        .await
        .map_err(db_error)?
        else {
            return Ok(None);
        };
        // language=PostgreSQL
        let files: Vec<(String, Vec<u8>)> = sqlx::query_as(
            "SELECT path, content FROM template_files WHERE tenant_id = $1 AND name = $2 AND version = $3",
        )
        .bind(tenant_id)
        .bind(name)
        .bind(version)
        .fetch_all(&self.pool)
        .await
        .map_err(db_error)?;
        Ok(Some(StoredTemplate {
            name: row.name,
            version: row.version,
            digest: row.digest,
            description: row.description,
            manifest: row.manifest,
            files: files.into_iter().collect(),
            created_by: row.created_by,
            created_at: row.created_at,
        }))
    }
}

/// A template version's row, without its files.
#[derive(sqlx::FromRow)]
struct TemplateRow {
    name: String,
    version: String,
    digest: String,
    description: String,
    manifest: String,
    created_by: String,
    created_at: DateTime<Utc>,
}

/// A kept built-in version as stored: name, version, digest, manifest, files (base64 by path).
type KeptRow = (String, String, String, String, sqlx::types::Json<BTreeMap<String, String>>);

/// A built-in template version as kept by [`Store::builtin_version_keep`]: enough to load it
/// again (manifest and files as delivered).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct KeptBuiltin {
    pub name: String,
    pub version: String,
    pub digest: String,
    pub manifest: String,
    pub files: BTreeMap<String, Vec<u8>>,
}

impl Store {
    /// Keeps a built-in template version by its digest (harmless when kept before).
    pub async fn builtin_version_keep(&self, kept: &KeptBuiltin) -> Result<()> {
        use base64::Engine;
        let files: BTreeMap<&str, String> = kept
            .files
            .iter()
            .map(|(path, content)| (path.as_str(), base64::engine::general_purpose::STANDARD.encode(content)))
            .collect();
        // language=PostgreSQL
        sqlx::query(
            "INSERT INTO builtin_template_versions (digest, name, version, manifest, files)
             VALUES ($1, $2, $3, $4, $5) ON CONFLICT (digest) DO NOTHING",
        )
        .bind(&kept.digest)
        .bind(&kept.name)
        .bind(&kept.version)
        .bind(&kept.manifest)
        .bind(sqlx::types::Json(&files))
        .execute(&self.pool)
        .await
        .map_err(db_error)?;
        Ok(())
    }

    /// A kept built-in version by name and version (the newest kept when several builds
    /// offered different contents under one version), or by digest.
    pub async fn builtin_version_get(
        &self,
        name: &str,
        version: &str,
        digest: Option<&str>,
    ) -> Result<Option<KeptBuiltin>> {
        use base64::Engine;
        // language=PostgreSQL
        let row: Option<KeptRow> = sqlx::query_as(
            "SELECT name, version, digest, manifest, files FROM builtin_template_versions
                 WHERE name = $1 AND version = $2 AND ($3::text IS NULL OR digest = $3)
                 ORDER BY first_seen DESC LIMIT 1",
        )
        .bind(name)
        .bind(version)
        .bind(digest)
        .fetch_optional(&self.pool)
        .await
        .map_err(db_error)?;
        let Some((name, version, digest, manifest, files)) = row else { return Ok(None) };
        let files = files
            .0
            .into_iter()
            .map(|(path, encoded)| {
                let content = base64::engine::general_purpose::STANDARD.decode(encoded).map_err(Error::internal)?;
                Ok((path, content))
            })
            .collect::<Result<BTreeMap<_, _>>>()?;
        Ok(Some(KeptBuiltin { name, version, digest, manifest, files }))
    }
}
