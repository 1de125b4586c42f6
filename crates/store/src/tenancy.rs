//! Tenants, users, memberships and API tokens, and turning a bearer token into a [`Caller`].

use chrono::{DateTime, Duration, Utc};
use sha2::{Digest, Sha256};
use trainyard_core::api::{MemberAdded, Tenant, TokenCreated, TokenInfo};
use trainyard_core::auth::{Caller, Role};
use trainyard_core::error::ObjectKind;
use trainyard_core::job::JobState;
use trainyard_core::{Error, Result};
use uuid::Uuid;

use crate::audit::{self, Audit, Outcome};
use crate::{Store, db_error, violated_constraint};

/// Tokens start with this, so that they are recognisable in a leaked file or a secret scanner.
pub const TOKEN_PREFIX: &str = "tyd_";

/// A new random token secret: the prefix and 256 random bits in hex.
pub fn token_generate() -> String {
    let mut bytes = [0u8; 32];
    rand::fill(&mut bytes);
    format!("{TOKEN_PREFIX}{}", hex::encode(bytes))
}

/// What the database keeps of a token: its SHA-256.
pub fn token_hash(secret: &str) -> Vec<u8> {
    Sha256::digest(secret.as_bytes()).to_vec()
}

/// A token as [`Store::tokens_list`] reads it.
#[derive(sqlx::FromRow)]
struct TokenRow {
    id: Uuid,
    name: String,
    created_at: DateTime<Utc>,
    expires_at: Option<DateTime<Utc>>,
    last_used_at: Option<DateTime<Utc>>,
    revoked_at: Option<DateTime<Utc>>,
}

/// A role as stored; an unknown one is the database's fault.
fn parse_role(text: &str) -> Result<Role> {
    Role::parse(text).ok_or_else(|| Error::internal(format!("unknown role {text}")))
}

/// The one answer for a token that does not authenticate, whatever the cause: telling "revoked"
/// or "expired" from "unknown" would tell whoever holds a leaked token that it was once valid.
pub const TOKEN_NOT_VALID: &str = "the token is not valid (unknown, revoked or expired)";

/// `last_used_at` is refreshed at most this often, so that authenticating is a read, not a write.
const LAST_USED_GRANULARITY_SECS: i64 = 60;

/// The columns [`Store::caller_from_row`] reads: a token with its user, tenant and membership.
/// A macro so that callers can append their `WHERE` and keep the SQL a static string.
macro_rules! caller_select {
    () => {
        caller_select!("")
    };
    ($extra_columns:literal) => {
        concat!(
            "SELECT t.id AS token_id, t.expires_at, t.revoked_at, t.last_used_at,
                    u.id AS user_id, u.name AS user_name, u.platform_admin,
                    n.id AS tenant_id, n.name AS tenant_name, m.role",
            $extra_columns,
            " FROM api_tokens t
             JOIN memberships m ON m.tenant_id = t.tenant_id AND m.user_id = t.user_id
             JOIN users u ON u.id = t.user_id
             JOIN tenants n ON n.id = t.tenant_id"
        )
    };
}
pub(crate) use caller_select;

/// The columns of a [`Tenant`], for [`TenantRow`].
macro_rules! tenant_select {
    () => {
        "SELECT id, name, created_at, removal_requested_at, removed_at FROM tenants"
    };
}

/// A tenant as stored.
#[derive(sqlx::FromRow)]
struct TenantRow {
    id: Uuid,
    name: String,
    created_at: DateTime<Utc>,
    removal_requested_at: Option<DateTime<Utc>>,
    removed_at: Option<DateTime<Utc>>,
}

impl From<TenantRow> for Tenant {
    fn from(row: TenantRow) -> Tenant {
        let TenantRow { id, name, created_at, removal_requested_at, removed_at } = row;
        Tenant { id, name, created_at, removal_requested_at, removed_at }
    }
}

/// The row [`caller_select!`] reads.
#[derive(sqlx::FromRow)]
pub(crate) struct CallerRow {
    token_id: Uuid,
    expires_at: Option<DateTime<Utc>>,
    revoked_at: Option<DateTime<Utc>>,
    last_used_at: Option<DateTime<Utc>>,
    pub(crate) user_id: Uuid,
    pub(crate) user_name: String,
    platform_admin: bool,
    pub(crate) tenant_id: Uuid,
    pub(crate) tenant_name: String,
    role: String,
}

impl Store {
    /// The caller a bearer token stands for, or `Unauthenticated` with the reason. The role comes
    /// from the membership now, not from when the token was made.
    pub async fn token_authenticate(&self, secret: &str) -> Result<Caller> {
        let unauthenticated = || Error::Unauthenticated(TOKEN_NOT_VALID.into());
        if !secret.starts_with(TOKEN_PREFIX) {
            return Err(unauthenticated());
        }
        let row: CallerRow = sqlx::query_as(concat!(caller_select!(), " WHERE t.token_hash = $1"))
            .bind(token_hash(secret))
            .fetch_optional(&self.pool)
            .await
            .map_err(db_error)?
            .ok_or_else(unauthenticated)?;
        self.caller_from_row(row).await
    }

    /// The caller a token row stands for, after checking that the token is still good. Shared by
    /// bearer tokens and browser sessions, so a session is never worth more than its token.
    pub(crate) async fn caller_from_row(&self, row: CallerRow) -> Result<Caller> {
        if row.revoked_at.is_some() || row.expires_at.is_some_and(|at| at <= Utc::now()) {
            return Err(Error::Unauthenticated(TOKEN_NOT_VALID.into()));
        }
        if row.last_used_at.is_none_or(|at| Utc::now() - at > Duration::seconds(LAST_USED_GRANULARITY_SECS)) {
            // language=PostgreSQL
            sqlx::query("UPDATE api_tokens SET last_used_at = now() WHERE id = $1")
                .bind(row.token_id)
                .execute(&self.pool)
                .await
                .map_err(db_error)?;
        }
        Ok(Caller {
            role: parse_role(&row.role)?,
            user_id: row.user_id,
            user: row.user_name,
            tenant_id: row.tenant_id,
            tenant: row.tenant_name,
            platform_admin: row.platform_admin,
            token_id: row.token_id,
            session: false,
            source: None,
        })
    }

    /// A member acting without a token: a background task working on the member's behalf (an
    /// experiment's driver submitting its trials), with the role the membership has now.
    /// `NotFound` when the user is no longer a member.
    pub async fn member_as_caller(&self, tenant_id: Uuid, user_id: Uuid) -> Result<Caller> {
        // language=PostgreSQL
        let row: Option<(String, String, String)> = sqlx::query_as(
            "SELECT u.name, n.name, m.role FROM memberships m
               JOIN users u ON u.id = m.user_id JOIN tenants n ON n.id = m.tenant_id
              WHERE m.tenant_id = $1 AND m.user_id = $2",
        )
        .bind(tenant_id)
        .bind(user_id)
        .fetch_optional(&self.pool)
        .await
        .map_err(db_error)?;
        let (user, tenant, role) = row.ok_or_else(|| Error::not_found(ObjectKind::User))?;
        Ok(Caller {
            role: parse_role(&role)?,
            user_id,
            user,
            tenant_id,
            tenant,
            platform_admin: false,
            token_id: Uuid::nil(),
            session: false,
            source: None,
        })
    }

    /// Creates a token for a member of a tenant. The secret is in the result and nowhere else.
    pub async fn token_create(
        &self,
        tenant_id: Uuid,
        user_id: Uuid,
        name: &str,
        expires_in_days: Option<u32>,
        audit: &Audit,
    ) -> Result<TokenCreated> {
        let mut tx = self.begin().await?;
        let created = token_create_in(&mut *tx, tenant_id, user_id, name, expires_in_days).await?;
        let audit = audit.clone().target(format!("token:{}", created.id));
        audit::append(&mut *tx, &audit, Outcome::Ok, None).await?;
        tx.commit().await.map_err(db_error)?;
        Ok(created)
    }

    /// The caller's own tokens in its tenant, newest first.
    pub async fn tokens_list(&self, caller: &Caller) -> Result<Vec<TokenInfo>> {
        // language=PostgreSQL
        let rows: Vec<TokenRow> = sqlx::query_as(
            "SELECT t.id, t.name, t.created_at, t.expires_at, t.last_used_at, t.revoked_at
             FROM api_tokens t WHERE t.tenant_id = $1 AND t.user_id = $2
             ORDER BY t.created_at DESC",
        )
        .bind(caller.tenant_id)
        .bind(caller.user_id)
        .fetch_all(&self.pool)
        .await
        .map_err(db_error)?;
        Ok(rows
            .into_iter()
            .map(|row| TokenInfo {
                id: row.id,
                name: row.name,
                user: caller.user.clone(),
                tenant: caller.tenant.clone(),
                created_at: row.created_at,
                expires_at: row.expires_at,
                last_used_at: row.last_used_at,
                revoked_at: row.revoked_at,
            })
            .collect())
    }

    /// Revokes one of the caller's tokens (a tenant admin may revoke any token of the tenant).
    /// Revoking twice is harmless.
    pub async fn token_revoke(&self, caller: &Caller, token_id: Uuid, audit: &Audit) -> Result<()> {
        let mut tx = self.begin().await?;
        // language=PostgreSQL
        let result = sqlx::query(
            "UPDATE api_tokens SET revoked_at = coalesce(revoked_at, now())
             WHERE id = $1 AND tenant_id = $2 AND (user_id = $3 OR $4)",
        )
        .bind(token_id)
        .bind(caller.tenant_id)
        .bind(caller.user_id)
        .bind(caller.role == Role::Admin)
        .execute(&mut *tx)
        .await
        .map_err(db_error)?;
        if result.rows_affected() == 0 {
            return Err(Error::not_found(ObjectKind::Token));
        }
        audit::append(&mut *tx, audit, Outcome::Ok, None).await?;
        tx.commit().await.map_err(db_error)?;
        Ok(())
    }

    /// Every membership: tenant name, user name and role, by tenant then user.
    pub async fn members_list(&self) -> Result<Vec<(String, String, Role)>> {
        // language=PostgreSQL
        let rows: Vec<(String, String, String)> = sqlx::query_as(
            "SELECT n.name AS tenant, u.name AS user_name, m.role
             FROM memberships m JOIN tenants n ON n.id = m.tenant_id JOIN users u ON u.id = m.user_id
             ORDER BY n.name, u.name",
        )
        .fetch_all(&self.pool)
        .await
        .map_err(db_error)?;
        rows.into_iter().map(|(tenant, user, role)| Ok((tenant, user, parse_role(&role)?))).collect()
    }

    pub async fn tenant_create(&self, name: &str, audit: &Audit) -> Result<Tenant> {
        let mut tx = self.begin().await?;
        // language=PostgreSQL
        let (id, name, created_at) =
            sqlx::query_as("INSERT INTO tenants (id, name) VALUES ($1, $2) RETURNING id, name, created_at")
                .bind(Uuid::now_v7())
                .bind(name)
                .fetch_one(&mut *tx)
                .await
                .map_err(|err| match violated_constraint(&err) {
                    Some("tenants_name_unique") => Error::Conflict(format!(
                        "a tenant named {name:?} exists or existed (a removed tenant's name is kept with its records)"
                    )),
                    Some("tenants_name_format") => Error::invalid(
                        "name",
                        "must be 1 to 63 lowercase letters, digits or '-', starting with a letter or digit",
                    ),
                    _ => db_error(err),
                })?;
        audit::append(&mut *tx, audit, Outcome::Ok, None).await?;
        tx.commit().await.map_err(db_error)?;
        Ok(Tenant { id, name, created_at, removal_requested_at: None, removed_at: None })
    }

    pub async fn tenants_list(&self) -> Result<Vec<Tenant>> {
        // language=PostgreSQL
        let rows: Vec<TenantRow> = sqlx::query_as(concat!(tenant_select!(), " ORDER BY name"))
            .fetch_all(&self.pool)
            .await
            .map_err(db_error)?;
        Ok(rows.into_iter().map(Tenant::from).collect())
    }

    /// Asks for a tenant's removal, all in one transaction: from now on it takes nothing new
    /// (the database refuses it; migration 18), its tokens are revoked and their dashboard
    /// sessions ended, a job that has not launched is cancelled and a launched one is marked for
    /// the reconciler to stop, as a cancel by `audit`'s actor would. The reconciler finishes
    /// the removal once nothing of the tenant runs ([`Store::tenant_removed`]). Asking again is
    /// harmless and changes nothing. `caller_tenant` is the tenant of the credential asking:
    /// removing it would lock the caller out mid-call, so that is refused.
    pub async fn tenant_remove_request(&self, name: &str, caller_tenant: Uuid, audit: &Audit) -> Result<Tenant> {
        let mut tx = self.begin().await?;
        // language=PostgreSQL
        let row: TenantRow = sqlx::query_as(concat!(tenant_select!(), " WHERE name = $1 FOR UPDATE"))
            .bind(name)
            .fetch_optional(&mut *tx)
            .await
            .map_err(db_error)?
            .ok_or_else(|| Error::not_found(ObjectKind::Tenant))?;
        if row.id == caller_tenant {
            return Err(Error::Conflict(format!(
                "your credential belongs to tenant {name}; remove it with a platform admin's token of another tenant"
            )));
        }
        if row.removal_requested_at.is_some() {
            drop(tx);
            let audit = audit.clone().on_tenant(Some(row.id), name);
            audit::append(&self.pool, &audit, Outcome::Ok, Some("unchanged: removal asked for before")).await?;
            return Ok(row.into());
        }
        // language=PostgreSQL
        let requested: TenantRow = sqlx::query_as(
            "UPDATE tenants SET removal_requested_at = now() WHERE id = $1
             RETURNING id, name, created_at, removal_requested_at, removed_at",
        )
        .bind(row.id)
        .fetch_one(&mut *tx)
        .await
        .map_err(db_error)?;
        // language=PostgreSQL
        let revoked =
            sqlx::query("UPDATE api_tokens SET revoked_at = now() WHERE tenant_id = $1 AND revoked_at IS NULL")
                .bind(row.id)
                .execute(&mut *tx)
                .await
                .map_err(db_error)?;
        // language=PostgreSQL
        sqlx::query("DELETE FROM web_sessions WHERE token_id IN (SELECT id FROM api_tokens WHERE tenant_id = $1)")
            .bind(row.id)
            .execute(&mut *tx)
            .await
            .map_err(db_error)?;
        let reason = format!("cancelled: tenant {name} is being removed");
        // As `job_cancel`, for every unfinished job of the tenant in one statement.
        // language=PostgreSQL
        let cancelled = sqlx::query(
            "UPDATE jobs SET
                 state = CASE WHEN state IN ('queued', 'admitted') THEN 'cancelled' ELSE state END,
                 reason = $2,
                 last_actor = CASE WHEN state IN ('queued', 'admitted') THEN $3 ELSE last_actor END,
                 cancel_requested_at = coalesce(cancel_requested_at, now())
             WHERE tenant_id = $1 AND state <> ALL($4)",
        )
        .bind(row.id)
        .bind(&reason)
        .bind(&audit.actor)
        .bind(JobState::names_where(JobState::is_terminal))
        .execute(&mut *tx)
        .await
        .map_err(db_error)?;
        let detail =
            format!("{} tokens revoked, {} jobs cancelled", revoked.rows_affected(), cancelled.rows_affected());
        let audit = audit.clone().on_tenant(Some(row.id), name);
        audit::append(&mut *tx, &audit, Outcome::Ok, Some(&detail)).await?;
        tx.commit().await.map_err(db_error)?;
        Ok(requested.into())
    }

    /// The tenants whose removal was asked for and is not finished: id and name.
    pub async fn tenants_being_removed(&self) -> Result<Vec<(Uuid, String)>> {
        // language=PostgreSQL
        sqlx::query_as("SELECT id, name FROM tenants WHERE removal_requested_at IS NOT NULL AND removed_at IS NULL")
            .fetch_all(&self.pool)
            .await
            .map_err(db_error)
    }

    /// Finishes a removal once the executor holds nothing of the tenant: its volumes are
    /// forgotten (their storage went with the executor's cleanup) and `removed_at` is set. False
    /// when a job of the tenant is still unfinished (nothing is changed then) or it was finished
    /// before. A control-loop write, fenced by the leader's epoch (the whole transaction).
    pub async fn tenant_removed(&self, tenant_id: Uuid, audit: &Audit) -> Result<bool> {
        let mut tx = self.begin().await?;
        // language=PostgreSQL
        let finished: Option<Uuid> = sqlx::query_scalar(
            "UPDATE tenants SET removed_at = now()
             WHERE id = $1 AND removal_requested_at IS NOT NULL AND removed_at IS NULL
               AND NOT EXISTS (SELECT 1 FROM jobs WHERE tenant_id = $1 AND state <> ALL($2))
               AND (SELECT control_fence($3))
             RETURNING id",
        )
        .bind(tenant_id)
        .bind(JobState::names_where(JobState::is_terminal))
        .bind(self.control_epoch())
        .fetch_optional(&mut *tx)
        .await
        .map_err(db_error)?;
        if finished.is_none() {
            return Ok(false);
        }
        // language=PostgreSQL
        let volumes = sqlx::query("DELETE FROM volumes WHERE tenant_id = $1")
            .bind(tenant_id)
            .execute(&mut *tx)
            .await
            .map_err(db_error)?;
        // Its pushed content goes with its objects (the retention sweep removes them).
        // language=PostgreSQL
        sqlx::query("DELETE FROM dataset_pushes WHERE tenant_id = $1")
            .bind(tenant_id)
            .execute(&mut *tx)
            .await
            .map_err(db_error)?;
        audit::append(&mut *tx, audit, Outcome::Ok, Some(&format!("{} volumes removed", volumes.rows_affected())))
            .await?;
        tx.commit().await.map_err(db_error)?;
        Ok(true)
    }

    /// Up to `limit` removed tenants whose objects are still in the object store.
    pub async fn tenants_objects_to_remove(&self, limit: i64) -> Result<Vec<Uuid>> {
        // language=PostgreSQL
        sqlx::query_scalar(
            "SELECT id FROM tenants WHERE removed_at IS NOT NULL AND objects_removed_at IS NULL ORDER BY removed_at LIMIT $1",
        )
        .bind(limit)
        .fetch_all(&self.pool)
        .await
        .map_err(db_error)
    }

    /// Records that a removed tenant's objects are gone from the object store (fenced).
    pub async fn tenant_objects_removed(&self, tenant_id: Uuid) -> Result<()> {
        // language=PostgreSQL
        sqlx::query(
            "UPDATE tenants SET objects_removed_at = now()
             WHERE id = $1 AND removed_at IS NOT NULL AND (SELECT control_fence($2))",
        )
        .bind(tenant_id)
        .bind(self.control_epoch())
        .execute(&self.pool)
        .await
        .map_err(db_error)?;
        Ok(())
    }

    /// Adds a user to a tenant with a role (or changes a member's role); all or nothing.
    ///
    /// A user this call creates is an invitation: the result carries the new user's first token
    /// for the inviter to hand over. An existing user gets the membership and no token — a token
    /// is only ever issued to its own user (see `docs/security.md`). An existing user who is not
    /// yet a member is added only when `may_add_existing_users` (platform admins); otherwise the
    /// call is refused. The `platform_admin` flag of an existing user is never changed here.
    pub async fn member_add(
        &self,
        tenant_name: &str,
        member: &trainyard_core::api::MemberAdd,
        may_add_existing_users: bool,
        audit: &Audit,
    ) -> Result<MemberAdded> {
        let (user_name, role) = (member.user.as_str(), member.role);
        let (token_name, expires_in_days) = (member.token_name.as_str(), member.expires_in_days);
        let mut tx = self.begin().await?;
        // language=PostgreSQL
        let tenant_id: Uuid = sqlx::query_scalar("SELECT id FROM tenants WHERE name = $1")
            .bind(tenant_name)
            .fetch_optional(&mut *tx)
            .await
            .map_err(db_error)?
            .ok_or_else(|| Error::not_found(ObjectKind::Tenant))?;
        // `xmax = 0` tells a row this statement inserted from one it found.
        // language=PostgreSQL
        let (user_id, user_created): (Uuid, bool) = sqlx::query_as(
            "INSERT INTO users (id, name, platform_admin) VALUES ($1, $2, false)
             ON CONFLICT (name) DO UPDATE SET name = users.name
             RETURNING id, (xmax = 0) AS created",
        )
        .bind(Uuid::now_v7())
        .bind(user_name)
        .fetch_one(&mut *tx)
        .await
        .map_err(|err| match violated_constraint(&err) {
            Some("users_name_format") => Error::invalid(
                "user",
                "must be 1 to 128 letters, digits, '.', '_', '@' or '-', starting with a letter or digit",
            ),
            _ => db_error(err),
        })?;
        if !user_created && !may_add_existing_users {
            // language=PostgreSQL
            let member: bool =
                sqlx::query_scalar("SELECT EXISTS (SELECT 1 FROM memberships WHERE tenant_id = $1 AND user_id = $2)")
                    .bind(tenant_id)
                    .bind(user_id)
                    .fetch_one(&mut *tx)
                    .await
                    .map_err(db_error)?;
            if !member {
                return Err(Error::Forbidden(format!(
                    "a user named {user_name:?} already exists; a tenant admin may invite new users and change \
                     the roles of the tenant's members, and only a platform admin may add an existing user"
                )));
            }
        }
        // language=PostgreSQL
        sqlx::query(
            "INSERT INTO memberships (tenant_id, user_id, role) VALUES ($1, $2, $3)
             ON CONFLICT (tenant_id, user_id) DO UPDATE SET role = EXCLUDED.role",
        )
        .bind(tenant_id)
        .bind(user_id)
        .bind(role.as_str())
        .execute(&mut *tx)
        .await
        .map_err(db_error)?;
        let token = if user_created {
            Some(token_create_in(&mut *tx, tenant_id, user_id, token_name, expires_in_days).await?)
        } else {
            None
        };
        let detail = format!("role {}{}", role.as_str(), if user_created { ", new user invited" } else { "" });
        audit::append(&mut *tx, &audit.clone().on_tenant(Some(tenant_id), tenant_name), Outcome::Ok, Some(&detail))
            .await?;
        tx.commit().await.map_err(db_error)?;
        Ok(MemberAdded { user: user_name.to_string(), tenant: tenant_name.to_string(), role, user_created, token })
    }

    /// The user's membership in the tenant named `tenant_name`: the tenant's id, or 404 when the
    /// tenant does not exist or the user is not a member (the same answer, so that tenant names
    /// do not leak).
    pub async fn membership_tenant(&self, user_id: Uuid, tenant_name: &str) -> Result<Uuid> {
        // language=PostgreSQL
        sqlx::query_scalar(
            "SELECT n.id FROM tenants n JOIN memberships m ON m.tenant_id = n.id
             WHERE n.name = $1 AND m.user_id = $2",
        )
        .bind(tenant_name)
        .bind(user_id)
        .fetch_optional(&self.pool)
        .await
        .map_err(db_error)?
        .ok_or_else(|| Error::not_found(ObjectKind::Tenant))
    }

    /// On an empty database, creates the first tenant, a platform-admin user who administers it,
    /// and that user's token, which expires like any admin's ([`ADMIN_TOKEN_DAYS`]). Returns
    /// `None` when any user exists already. Safe to race: the advisory lock lets only one caller
    /// bootstrap.
    pub async fn bootstrap(&self, tenant: &str, admin: &str) -> Result<Option<TokenCreated>> {
        let mut tx = self.begin().await?;
        // language=PostgreSQL
        sqlx::query("SELECT pg_advisory_xact_lock(hashtext('trainyard.bootstrap'))")
            .execute(&mut *tx)
            .await
            .map_err(db_error)?;
        // language=PostgreSQL
        let has_users: bool =
            sqlx::query_scalar("SELECT EXISTS (SELECT 1 FROM users)").fetch_one(&mut *tx).await.map_err(db_error)?;
        if has_users {
            return Ok(None);
        }
        let tenant_id = Uuid::now_v7();
        let user_id = Uuid::now_v7();
        // language=PostgreSQL
        sqlx::query("INSERT INTO tenants (id, name) VALUES ($1, $2)")
            .bind(tenant_id)
            .bind(tenant)
            .execute(&mut *tx)
            .await
            .map_err(db_error)?;
        // language=PostgreSQL
        sqlx::query("INSERT INTO users (id, name, platform_admin) VALUES ($1, $2, true)")
            .bind(user_id)
            .bind(admin)
            .execute(&mut *tx)
            .await
            .map_err(db_error)?;
        // language=PostgreSQL
        sqlx::query("INSERT INTO memberships (tenant_id, user_id, role) VALUES ($1, $2, 'admin')")
            .bind(tenant_id)
            .bind(user_id)
            .execute(&mut *tx)
            .await
            .map_err(db_error)?;
        let token = token_create_in(&mut *tx, tenant_id, user_id, "bootstrap", Some(ADMIN_TOKEN_DAYS)).await?;
        let audit =
            Audit::local("serve", "platform.bootstrap", format!("user:{admin}")).on_tenant(Some(tenant_id), tenant);
        audit::append(&mut *tx, &audit, Outcome::Ok, Some("first tenant, platform admin and token")).await?;
        tx.commit().await.map_err(db_error)?;
        Ok(Some(token))
    }
}

/// How long the tokens minted outside the API last (the bootstrap admin's first token and the
/// recovery tokens of `trainyard admin-token` and `trainyard dev --new-admin-token`): like any
/// token, they end; the way back in is another recovery token.
pub const ADMIN_TOKEN_DAYS: u32 = 30;

impl Store {
    /// A new token for a platform admin, in their first tenant by name: the way back in when
    /// every admin token is lost. Only for whoever can reach the database (who can do anything
    /// already); the API never mints a token in another user's name.
    pub async fn admin_token_mint(&self, user: &str, name: &str) -> Result<TokenCreated> {
        // language=PostgreSQL
        let found: Option<(Uuid, Uuid, String)> = sqlx::query_as(
            "SELECT u.id, m.tenant_id, t.name FROM users u
               JOIN memberships m ON m.user_id = u.id JOIN tenants t ON t.id = m.tenant_id
              WHERE u.name = $1 AND u.platform_admin ORDER BY t.name LIMIT 1",
        )
        .bind(user)
        .fetch_optional(&self.pool)
        .await
        .map_err(db_error)?;
        let (user_id, tenant_id, tenant) = found.ok_or_else(|| {
            Error::invalid(
                "user",
                format!("no platform admin named {user:?} with a tenant; other users get tokens from an admin"),
            )
        })?;
        let mut tx = self.begin().await?;
        let created = token_create_in(&mut *tx, tenant_id, user_id, name, Some(ADMIN_TOKEN_DAYS)).await?;
        let audit = Audit::local("admin-token", "token.create", format!("token:{}", created.id))
            .on_tenant(Some(tenant_id), &tenant)
            .for_user(user_id, user);
        audit::append(&mut *tx, &audit, Outcome::Ok, None).await?;
        tx.commit().await.map_err(db_error)?;
        Ok(created)
    }
}

pub(crate) async fn token_create_in<'e>(
    executor: impl sqlx::PgExecutor<'e>,
    tenant_id: Uuid,
    user_id: Uuid,
    name: &str,
    expires_in_days: Option<u32>,
) -> Result<TokenCreated> {
    if name.is_empty() || name.chars().count() > 64 {
        return Err(Error::invalid("name", "a token name is 1 to 64 characters"));
    }
    if expires_in_days.is_some_and(|days| days == 0 || days > 3650) {
        return Err(Error::invalid("expires_in_days", "must be between 1 and 3650"));
    }
    let secret = token_generate();
    let id = Uuid::now_v7();
    let expires_at = expires_in_days.map(|days| Utc::now() + Duration::days(i64::from(days)));
    // language=PostgreSQL
    sqlx::query(
        "INSERT INTO api_tokens (id, tenant_id, user_id, name, token_hash, expires_at)
         VALUES ($1, $2, $3, $4, $5, $6)",
    )
    .bind(id)
    .bind(tenant_id)
    .bind(user_id)
    .bind(name)
    .bind(token_hash(&secret))
    .bind(expires_at)
    .execute(executor)
    .await
    .map_err(db_error)?;
    Ok(TokenCreated { id, name: name.to_string(), token: secret, expires_at })
}

impl Store {
    /// Sets (or replaces) a tenant's quota for one GPU type.
    pub async fn quota_set(
        &self,
        tenant: &str,
        flavor: &str,
        nominal: u64,
        borrowing_limit: Option<u64>,
        lending_limit: Option<u64>,
        audit: &Audit,
    ) -> Result<()> {
        let as_db = |v: u64| i64::try_from(v).unwrap_or(i64::MAX);
        let mut tx = self.begin().await?;
        // language=PostgreSQL
        let tenant_id: Option<Uuid> = sqlx::query_scalar(
            "INSERT INTO quotas (tenant_id, flavor, nominal, borrowing_limit, lending_limit)
             SELECT id, $2, $3, $4, $5 FROM tenants WHERE name = $1
             ON CONFLICT (tenant_id, flavor) DO UPDATE SET nominal = EXCLUDED.nominal,
                 borrowing_limit = EXCLUDED.borrowing_limit, lending_limit = EXCLUDED.lending_limit, updated_at = now()
             RETURNING tenant_id",
        )
        .bind(tenant)
        .bind(flavor)
        .bind(as_db(nominal))
        .bind(borrowing_limit.map(as_db))
        .bind(lending_limit.map(as_db))
        .fetch_optional(&mut *tx)
        .await
        .map_err(|err| match violated_constraint(&err) {
            Some("quotas_flavor_format") => Error::invalid(
                "flavor",
                "a GPU type is lowercase letters, digits, '.', '_' or '-', e.g. nvidia-h100-80gb",
            ),
            Some("quotas_nominal_range") => Error::invalid("nominal", "must be between 0 and 1000000"),
            Some("quotas_borrowing_range") => Error::invalid("borrowing_limit", "must be between 0 and 1000000"),
            Some("quotas_lending_range") => Error::invalid("lending_limit", "must be between 0 and 1000000"),
            _ => db_error(err),
        })?;
        let tenant_id = tenant_id.ok_or_else(|| Error::not_found(ObjectKind::Tenant))?;
        let limit = |v: Option<u64>| v.map_or("none".to_string(), |v| v.to_string());
        let detail = format!(
            "nominal {nominal}, borrowing limit {}, lending limit {}",
            limit(borrowing_limit),
            limit(lending_limit)
        );
        audit::append(&mut *tx, &audit.clone().on_tenant(Some(tenant_id), tenant), Outcome::Ok, Some(&detail)).await?;
        tx.commit().await.map_err(db_error)?;
        Ok(())
    }

    /// Changes a tenant's scheduling policy; `None` leaves a field as it is. An empty cohort
    /// name takes the tenant out of its cohort.
    pub async fn tenant_policy_set(
        &self,
        tenant: &str,
        cohort: Option<&str>,
        weight: Option<f64>,
        preempt_lower_priority: Option<bool>,
        session_idle_timeout_seconds: Option<u32>,
        audit: &Audit,
    ) -> Result<()> {
        let mut tx = self.begin().await?;
        // language=PostgreSQL
        let tenant_id: Option<Uuid> = sqlx::query_scalar(
            "UPDATE tenants SET
                 cohort = CASE WHEN $2::text IS NULL THEN cohort ELSE nullif($2, '') END,
                 weight = coalesce($3, weight),
                 preempt_lower_priority = coalesce($4, preempt_lower_priority),
                 session_idle_timeout_seconds = CASE WHEN $5::bigint IS NULL THEN session_idle_timeout_seconds
                                                     ELSE nullif($5, 0) END
             WHERE name = $1 RETURNING id",
        )
        .bind(tenant)
        .bind(cohort)
        .bind(weight)
        .bind(preempt_lower_priority)
        .bind(session_idle_timeout_seconds.map(i64::from))
        .fetch_optional(&mut *tx)
        .await
        .map_err(|err| match violated_constraint(&err) {
            Some("tenants_cohort_format") => {
                Error::invalid("cohort", "1 to 63 lowercase letters, digits or '-', starting with a letter or digit")
            }
            Some("tenants_weight_positive") => Error::invalid("weight", "must be more than 0 and at most 1000"),
            Some("tenants_session_idle_timeout_range") => {
                Error::invalid("session_idle_timeout_seconds", "10 seconds to 30 days (2592000), or 0 for never")
            }
            _ => db_error(err),
        })?;
        let tenant_id = tenant_id.ok_or_else(|| Error::not_found(ObjectKind::Tenant))?;
        audit::append(&mut *tx, &audit.clone().on_tenant(Some(tenant_id), tenant), Outcome::Ok, None).await?;
        tx.commit().await.map_err(db_error)?;
        Ok(())
    }
}
