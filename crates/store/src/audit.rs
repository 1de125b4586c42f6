//! The audit log (`audit_log`, migration 14): who changed what through the API, the dashboard or
//! the CLI, and every refused attempt at a change.
//!
//! A change and its entry are written in one transaction (each audited write of this crate
//! takes an [`Audit`] and appends it with [`append`] before committing), so an entry exists
//! exactly when its change does. A refusal changes nothing and is appended on its own
//! ([`Store::audit_refusal`]). The table is append-only: a trigger refuses `UPDATE`, `DELETE`
//! and `TRUNCATE`.

use std::net::IpAddr;

use chrono::{DateTime, Utc};
use sqlx::PgExecutor;
use trainyard_core::api::{AuditEntry, AuditPage};
use trainyard_core::auth::Caller;
use trainyard_core::{Error, Result};
use uuid::Uuid;

use crate::{Store, db_error};

/// Who is making a change, to what, and on which tenant's behalf: the part of an audit entry
/// known before the change is tried. The target may be refined once known (a new job's id).
#[derive(Debug, Clone)]
pub struct Audit {
    pub tenant_id: Option<Uuid>,
    pub tenant: Option<String>,
    pub actor: String,
    pub user_id: Option<Uuid>,
    pub credential: Option<String>,
    pub action: &'static str,
    pub target: String,
    pub source: Option<IpAddr>,
}

impl Audit {
    /// A change by an authenticated caller, in the caller's tenant.
    pub fn by(caller: &Caller, action: &'static str, target: impl Into<String>) -> Audit {
        Audit {
            tenant_id: Some(caller.tenant_id),
            tenant: Some(caller.tenant.clone()),
            actor: caller.actor(),
            user_id: Some(caller.user_id),
            credential: Some(caller.credential()),
            action,
            target: target.into(),
            source: caller.source,
        }
    }

    /// A change made by one of the server's admin commands on this machine (`trainyard
    /// admin-token`): no caller, no credential.
    pub fn local(command: &str, action: &'static str, target: impl Into<String>) -> Audit {
        Audit {
            tenant_id: None,
            tenant: None,
            actor: format!("local:{command}"),
            user_id: None,
            credential: None,
            action,
            target: target.into(),
            source: None,
        }
    }

    /// A change the control loop made on its own (finishing a tenant's removal).
    pub fn control_loop(action: &'static str, target: impl Into<String>) -> Audit {
        Audit {
            tenant_id: None,
            tenant: None,
            actor: "trainyard:reconciler".into(),
            user_id: None,
            credential: None,
            action,
            target: target.into(),
            source: None,
        }
    }

    /// The same entry about another tenant (a platform admin's change to tenant `name`).
    pub fn on_tenant(mut self, tenant_id: Option<Uuid>, name: &str) -> Audit {
        self.tenant_id = tenant_id;
        self.tenant = Some(name.to_string());
        self
    }

    /// The same entry about no tenant in particular (creating one).
    pub fn platform_wide(mut self) -> Audit {
        self.tenant_id = None;
        self.tenant = None;
        self
    }

    /// The user a local command acted for (the owner of the token it minted).
    pub fn for_user(mut self, user_id: Uuid, user: &str) -> Audit {
        self.user_id = Some(user_id);
        self.target = format!("{} (user:{user})", self.target);
        self
    }

    pub fn target(mut self, target: impl Into<String>) -> Audit {
        self.target = target.into();
        self
    }
}

/// How an audited call ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Outcome {
    Ok,
    /// Refused for the caller's role or tenant (including "not found" for another tenant's
    /// object).
    Denied,
    /// Refused for bad input.
    Invalid,
    Conflict,
    /// Failed for a reason of the server's (the database was away).
    Error,
}

impl Outcome {
    pub fn as_str(self) -> &'static str {
        match self {
            Outcome::Ok => "ok",
            Outcome::Denied => "denied",
            Outcome::Invalid => "invalid",
            Outcome::Conflict => "conflict",
            Outcome::Error => "error",
        }
    }

    /// The outcome a refused call is recorded with.
    pub fn of_error(error: &Error) -> Outcome {
        match error {
            Error::Forbidden(_)
            | Error::NotFound { .. }
            | Error::Unauthenticated(_)
            | Error::TooManyRequests { .. } => Outcome::Denied,
            Error::InvalidInput { .. } | Error::InvalidFields(_) => Outcome::Invalid,
            Error::Conflict(_) | Error::AlreadyExists(_) => Outcome::Conflict,
            Error::Unavailable(_) | Error::Fenced(_) | Error::Internal(_) => Outcome::Error,
        }
    }
}

/// Appends an entry, on the connection or transaction of the change it records.
pub(crate) async fn append<'e>(
    executor: impl PgExecutor<'e>,
    audit: &Audit,
    outcome: Outcome,
    detail: Option<&str>,
) -> Result<()> {
    // language=PostgreSQL
    sqlx::query(
        "INSERT INTO audit_log (tenant_id, tenant, actor, user_id, credential, action, target, outcome, detail, source)
         VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10::inet)",
    )
    .bind(audit.tenant_id)
    .bind(&audit.tenant)
    .bind(&audit.actor)
    .bind(audit.user_id)
    .bind(&audit.credential)
    .bind(audit.action)
    .bind(&audit.target)
    .bind(outcome.as_str())
    .bind(detail)
    .bind(audit.source.map(|ip| ip.to_string()))
    .execute(executor)
    .await
    .map_err(db_error)?;
    Ok(())
}

/// What to list of the audit log.
#[derive(Debug, Clone, Default)]
pub struct AuditFilter {
    /// Only this tenant's entries (a tenant admin's view is always limited to its tenant).
    pub tenant_id: Option<Uuid>,
    pub actor: Option<String>,
    /// An action, or a prefix ending in `.` (`job.`).
    pub action: Option<String>,
    pub since: Option<DateTime<Utc>>,
    pub before: Option<i64>,
    pub limit: u32,
}

#[derive(sqlx::FromRow)]
struct AuditRow {
    seq: i64,
    at: DateTime<Utc>,
    tenant: Option<String>,
    actor: String,
    credential: Option<String>,
    action: String,
    target: String,
    outcome: String,
    detail: Option<String>,
    source: Option<String>,
}

impl Store {
    /// Records a refused (or failed) change: nothing changed, so the entry stands alone.
    pub async fn audit_refusal(&self, audit: &Audit, error: &Error) -> Result<()> {
        let detail = match error {
            // Internal causes stay in the server's log, as they do in responses.
            Error::Internal(_) => "internal error".to_string(),
            other => other.to_string(),
        };
        append(&self.pool, audit, Outcome::of_error(error), Some(&detail)).await
    }

    /// Records a change made outside a transaction of this crate (by the object store, say),
    /// after it succeeded.
    pub async fn audit_done(&self, audit: &Audit) -> Result<()> {
        append(&self.pool, audit, Outcome::Ok, None).await
    }

    /// A page of entries, newest first.
    pub async fn audit_list(&self, filter: &AuditFilter) -> Result<AuditPage> {
        let limit = filter.limit.clamp(1, 1000);
        let (action_exact, action_prefix) = match &filter.action {
            Some(a) if a.ends_with('.') => (None, Some(format!("{a}%"))),
            Some(a) => (Some(a.clone()), None),
            None => (None, None),
        };
        // language=PostgreSQL
        let rows: Vec<AuditRow> = sqlx::query_as(
            "SELECT seq, at, tenant, actor, credential, action, target, outcome, detail, host(source) AS source
             FROM audit_log
             WHERE ($1::uuid IS NULL OR tenant_id = $1)
               AND ($2::text IS NULL OR actor = $2 OR actor = 'user:' || $2)
               AND ($3::text IS NULL OR action = $3)
               AND ($4::text IS NULL OR action LIKE $4)
               AND ($5::timestamptz IS NULL OR at >= $5)
               AND ($6::bigint IS NULL OR seq < $6)
             ORDER BY seq DESC LIMIT $7",
        )
        .bind(filter.tenant_id)
        .bind(&filter.actor)
        .bind(action_exact)
        .bind(action_prefix)
        .bind(filter.since)
        .bind(filter.before)
        .bind(i64::from(limit) + 1)
        .fetch_all(&self.pool)
        .await
        .map_err(db_error)?;
        let mut items: Vec<AuditEntry> = rows
            .into_iter()
            .map(|r| AuditEntry {
                seq: r.seq,
                at: r.at,
                tenant: r.tenant,
                actor: r.actor,
                credential: r.credential,
                action: r.action,
                target: r.target,
                outcome: r.outcome,
                detail: r.detail,
                source: r.source,
            })
            .collect();
        let next_before = if items.len() > limit as usize {
            items.truncate(limit as usize);
            items.last().map(|e| e.seq)
        } else {
            None
        };
        Ok(AuditPage { items, next_before })
    }
}
