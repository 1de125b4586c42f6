//! An admin's work on one member of a tenant: removing them, and reissuing a lost token. Each
//! is one transaction with its audit entry; a token's secret is returned, never stored or logged.

use trainyard_core::api::{MemberRemoved, MemberToken};
use trainyard_core::error::ObjectKind;
use trainyard_core::job::JobState;
use trainyard_core::{Error, Result};
use uuid::Uuid;

use crate::audit::{self, Audit, Outcome};
use crate::tenancy::token_create_in;
use crate::{Store, db_error};

/// A membership found for an admin's operation: the tenant, the user and their role.
struct Membership {
    tenant_id: Uuid,
    user_id: Uuid,
    role: String,
    platform_admin: bool,
}

/// The membership of `user` in `tenant` (both by name), locked for the transaction: 404 for
/// a tenant that does not exist (`Tenant`) or a user who is not its member (`Member`).
async fn membership_lock(tx: &mut sqlx::PgConnection, tenant: &str, user: &str) -> Result<Membership> {
    // language=PostgreSQL
    let tenant_id: Uuid = sqlx::query_scalar("SELECT id FROM tenants WHERE name = $1")
        .bind(tenant)
        .fetch_optional(&mut *tx)
        .await
        .map_err(db_error)?
        .ok_or_else(|| Error::not_found(ObjectKind::Tenant))?;
    // language=PostgreSQL
    let found: Option<(Uuid, String, bool)> = sqlx::query_as(
        "SELECT m.user_id, m.role, u.platform_admin FROM memberships m JOIN users u ON u.id = m.user_id
          WHERE m.tenant_id = $1 AND u.name = $2 FOR UPDATE OF m",
    )
    .bind(tenant_id)
    .bind(user)
    .fetch_optional(&mut *tx)
    .await
    .map_err(db_error)?;
    let (user_id, role, platform_admin) = found.ok_or_else(|| Error::not_found(ObjectKind::Member))?;
    Ok(Membership { tenant_id, user_id, role, platform_admin })
}

/// Revokes the member's unrevoked tokens in the tenant but `keep`, ending their dashboard
/// sessions; how many were revoked.
async fn tokens_revoke_of(
    tx: &mut sqlx::PgConnection,
    tenant_id: Uuid,
    user_id: Uuid,
    keep: Option<Uuid>,
) -> Result<u64> {
    // language=PostgreSQL
    let revoked: Vec<Uuid> = sqlx::query_scalar(
        "UPDATE api_tokens SET revoked_at = now()
          WHERE tenant_id = $1 AND user_id = $2 AND revoked_at IS NULL AND ($3::uuid IS NULL OR id <> $3)
          RETURNING id",
    )
    .bind(tenant_id)
    .bind(user_id)
    .bind(keep)
    .fetch_all(&mut *tx)
    .await
    .map_err(db_error)?;
    // language=PostgreSQL
    sqlx::query("DELETE FROM web_sessions WHERE token_id = ANY($1)")
        .bind(&revoked)
        .execute(&mut *tx)
        .await
        .map_err(db_error)?;
    Ok(revoked.len() as u64)
}

impl Store {
    /// Removes `user` from `tenant`, all in one transaction: their tokens for the tenant are
    /// revoked (and then go with the membership), their dashboard sessions end, and with
    /// `cancel_jobs` their unfinished jobs there are cancelled as a cancel by `audit`'s actor
    /// would; otherwise their jobs are kept as they are. The tenant's last admin is not removed
    /// (409): nobody would be left to manage it. The admin rows are locked first, so two
    /// removals of the last two admins cannot both pass. A platform admin is removed by a
    /// platform admin only (`may_remove_platform_admins`, else 403): a tenant admin could
    /// otherwise lock the installation's admin out of their only tenant, and with it out of the
    /// recovery path (`trainyard admin-token` mints in a tenant the admin is a member of).
    pub async fn member_remove(
        &self,
        tenant: &str,
        user: &str,
        cancel_jobs: bool,
        may_remove_platform_admins: bool,
        audit: &Audit,
    ) -> Result<MemberRemoved> {
        let mut tx = self.begin().await?;
        let member = membership_lock(&mut tx, tenant, user).await?;
        if member.platform_admin && !may_remove_platform_admins {
            return Err(Error::Forbidden(format!("{user} is a platform admin: only a platform admin may remove them")));
        }
        if member.role == "admin" {
            // language=PostgreSQL
            let admins: i64 = sqlx::query_scalar(
                "SELECT count(*) FROM (SELECT 1 FROM memberships WHERE tenant_id = $1 AND role = 'admin' FOR UPDATE) a",
            )
            .bind(member.tenant_id)
            .fetch_one(&mut *tx)
            .await
            .map_err(db_error)?;
            if admins <= 1 {
                return Err(Error::Conflict(format!(
                    "{user} is the last admin of tenant {tenant}: make another member admin first \
                     (yard admin member-add {tenant} USER --role admin)"
                )));
            }
        }
        let tokens_revoked = tokens_revoke_of(&mut tx, member.tenant_id, member.user_id, None).await?;
        let jobs_cancelled = if cancel_jobs {
            let reason = format!("cancelled: {user} was removed from tenant {tenant}");
            // As `job_cancel`, for every unfinished job of the member in one statement.
            // language=PostgreSQL
            sqlx::query(
                "UPDATE jobs SET
                     state = CASE WHEN state IN ('queued', 'admitted') THEN 'cancelled' ELSE state END,
                     reason = $3,
                     last_actor = CASE WHEN state IN ('queued', 'admitted') THEN $4 ELSE last_actor END,
                     cancel_requested_at = coalesce(cancel_requested_at, now())
                 WHERE tenant_id = $1 AND created_by = $2 AND state <> ALL($5) AND cancel_requested_at IS NULL",
            )
            .bind(member.tenant_id)
            .bind(member.user_id)
            .bind(&reason)
            .bind(&audit.actor)
            .bind(JobState::names_where(JobState::is_terminal))
            .execute(&mut *tx)
            .await
            .map_err(db_error)?
            .rows_affected()
        } else {
            0
        };
        // Its tokens and notification subscriptions go with it (foreign keys, on delete cascade).
        // language=PostgreSQL
        sqlx::query("DELETE FROM memberships WHERE tenant_id = $1 AND user_id = $2")
            .bind(member.tenant_id)
            .bind(member.user_id)
            .execute(&mut *tx)
            .await
            .map_err(db_error)?;
        let detail = format!("role {}, {tokens_revoked} tokens revoked, {jobs_cancelled} jobs cancelled", member.role);
        let audit = audit.clone().on_tenant(Some(member.tenant_id), tenant);
        audit::append(&mut *tx, &audit, Outcome::Ok, Some(&detail)).await?;
        tx.commit().await.map_err(db_error)?;
        Ok(MemberRemoved { user: user.to_string(), tenant: tenant.to_string(), tokens_revoked, jobs_cancelled })
    }

    /// A new token for a member of `tenant`, made by an admin for a member who lost theirs, on
    /// the same path as an invitation's first token; with `revoke_others`, the member's other
    /// tokens in the tenant are revoked in the same transaction. `may_reissue_platform_admins`:
    /// only a platform admin may mint a token for a platform admin (else 403).
    #[allow(clippy::too_many_arguments)]
    pub async fn member_token_reissue(
        &self,
        tenant: &str,
        user: &str,
        name: &str,
        expires_in_days: Option<u32>,
        revoke_others: bool,
        may_reissue_platform_admins: bool,
        audit: &Audit,
    ) -> Result<MemberToken> {
        let mut tx = self.begin().await?;
        let member = membership_lock(&mut tx, tenant, user).await?;
        if member.platform_admin && !may_reissue_platform_admins {
            return Err(Error::Forbidden(format!(
                "{user} is a platform admin: only a platform admin may reissue their token"
            )));
        }
        let token = token_create_in(&mut *tx, member.tenant_id, member.user_id, name, expires_in_days).await?;
        let tokens_revoked = if revoke_others {
            tokens_revoke_of(&mut tx, member.tenant_id, member.user_id, Some(token.id)).await?
        } else {
            0
        };
        let detail = format!("new token {} ({name}), {tokens_revoked} other tokens revoked", token.id);
        let audit = audit.clone().on_tenant(Some(member.tenant_id), tenant);
        audit::append(&mut *tx, &audit, Outcome::Ok, Some(&detail)).await?;
        tx.commit().await.map_err(db_error)?;
        Ok(MemberToken { user: user.to_string(), tenant: tenant.to_string(), token, tokens_revoked })
    }
}
