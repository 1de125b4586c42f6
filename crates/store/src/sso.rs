//! Single sign-on's records: sign-ins in flight, the identities users sign in with, the
//! memberships an identity provider's groups grant, and the dashboard session a sign-in opens.
//! The protocol itself (discovery, the code exchange, verifying the ID token) is the server's
//! `oidc` module; this module trusts what it is given.

use chrono::{DateTime, Duration, Utc};
use trainyard_core::auth::{Caller, Role};
use trainyard_core::{Error, Result};
use uuid::Uuid;

use crate::sessions::{SESSION_LIFETIME_HOURS, WebSession, session_insert};
use crate::tenancy::{CallerRow, caller_select, token_generate, token_hash};
use crate::{Store, db_error};

/// How long the browser may take at the identity provider before its sign-in is forgotten.
pub const SSO_LOGIN_MINUTES: i64 = 10;

/// What the server keeps of a sign-in while the browser is at the identity provider. Its `Debug`
/// shows neither secret.
#[derive(Clone)]
pub struct PendingLogin {
    pub pkce_verifier: String,
    pub nonce: String,
    pub tenant: Option<String>,
}

impl std::fmt::Debug for PendingLogin {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PendingLogin")
            .field("pkce_verifier", &"<redacted>")
            .field("nonce", &"<redacted>")
            .field("tenant", &self.tenant)
            .finish()
    }
}

/// A verified identity and what the identity provider's groups grant it.
#[derive(Debug, Clone)]
pub struct SsoSignIn<'a> {
    pub issuer: &'a str,
    pub subject: &'a str,
    /// The name a user created by this sign-in gets.
    pub user_name: &'a str,
    /// Whether a sign-in with an identity not seen before creates its user.
    pub provision: bool,
    /// The platform-admin flag the groups give, when the operator maps a group to it.
    pub platform_admin: Option<bool>,
    /// Every tenant the operator's group mapping names: memberships there follow the groups.
    pub mapped_tenants: &'a [String],
    /// The memberships the identity's groups grant now (a subset of `mapped_tenants`).
    pub grants: &'a [(String, Role)],
    /// The browser's address, for the audit log.
    pub source: Option<std::net::IpAddr>,
    /// The tenant asked for; otherwise the first of the user's tenants by name.
    pub tenant: Option<&'a str>,
}

impl Store {
    /// Remembers a sign-in that is leaving for the identity provider.
    pub async fn sso_login_begin(&self, state: &str, login: &PendingLogin) -> Result<()> {
        // language=PostgreSQL
        sqlx::query("DELETE FROM sso_logins WHERE expires_at < now()").execute(&self.pool).await.map_err(db_error)?;
        // language=PostgreSQL
        sqlx::query(
            "INSERT INTO sso_logins (state_hash, pkce_verifier, nonce, tenant, expires_at) VALUES ($1, $2, $3, $4, $5)",
        )
        .bind(token_hash(state))
        .bind(&login.pkce_verifier)
        .bind(&login.nonce)
        .bind(&login.tenant)
        .bind(Utc::now() + Duration::minutes(SSO_LOGIN_MINUTES))
        .execute(&self.pool)
        .await
        .map_err(db_error)?;
        Ok(())
    }

    /// Takes back the sign-in a returning browser names by its `state`: once, and only before
    /// it expires. A replayed or unknown state is refused.
    pub async fn sso_login_take(&self, state: &str) -> Result<PendingLogin> {
        // language=PostgreSQL
        let row: Option<(String, String, Option<String>)> = sqlx::query_as(
            "DELETE FROM sso_logins WHERE state_hash = $1 AND expires_at > now()
             RETURNING pkce_verifier, nonce, tenant",
        )
        .bind(token_hash(state))
        .fetch_optional(&self.pool)
        .await
        .map_err(db_error)?;
        let (pkce_verifier, nonce, tenant) = row.ok_or_else(|| {
            Error::Unauthenticated("this sign-in is unknown, used already or expired; start again".into())
        })?;
        Ok(PendingLogin { pkce_verifier, nonce, tenant })
    }

    /// Signs in a verified identity, all or nothing: finds its user (or creates it when
    /// provisioning is allowed), brings the platform-admin flag and the mapped tenants'
    /// memberships in step with the groups, and opens a dashboard session on a token that lives
    /// as long as the session.
    pub async fn sso_sign_in(&self, sign_in: &SsoSignIn<'_>) -> Result<(WebSession, Caller)> {
        let mut tx = self.begin().await?;
        // language=PostgreSQL
        let known: Option<Uuid> = sqlx::query_scalar(
            "UPDATE user_identities SET last_sign_in_at = now() WHERE issuer = $1 AND subject = $2 RETURNING user_id",
        )
        .bind(sign_in.issuer)
        .bind(sign_in.subject)
        .fetch_optional(&mut *tx)
        .await
        .map_err(db_error)?;
        let user_id = match known {
            Some(user_id) => user_id,
            None if !sign_in.provision => {
                return Err(Error::Forbidden(
                    "there is no Trainyard user for this identity, and this server does not create users at \
                     their first sign-in; ask an operator (`--oidc-provision-users`)"
                        .into(),
                ));
            }
            None => {
                let user_id = Uuid::now_v7();
                // language=PostgreSQL
                let created = sqlx::query(
                    "INSERT INTO users (id, name, platform_admin) VALUES ($1, $2, false) ON CONFLICT (name) DO NOTHING",
                )
                .bind(user_id)
                .bind(sign_in.user_name)
                .execute(&mut *tx)
                .await
                .map_err(db_error)?
                .rows_affected();
                if created == 0 {
                    // Never link to an existing user by name: whoever controls a name at the
                    // identity provider would take over the Trainyard user of that name.
                    return Err(Error::Forbidden(format!(
                        "a Trainyard user named {:?} exists already and is not this identity; ask an administrator",
                        sign_in.user_name
                    )));
                }
                // language=PostgreSQL
                sqlx::query("INSERT INTO user_identities (issuer, subject, user_id) VALUES ($1, $2, $3)")
                    .bind(sign_in.issuer)
                    .bind(sign_in.subject)
                    .bind(user_id)
                    .execute(&mut *tx)
                    .await
                    .map_err(db_error)?;
                user_id
            }
        };
        if let Some(admin) = sign_in.platform_admin {
            // language=PostgreSQL
            sqlx::query("UPDATE users SET platform_admin = $2 WHERE id = $1")
                .bind(user_id)
                .bind(admin)
                .execute(&mut *tx)
                .await
                .map_err(db_error)?;
        }
        // Memberships in the mapped tenants follow the groups: granted ones set (the group's
        // role wins over one set by hand), ones the groups granted before and no longer do end.
        let (grant_tenants, grant_roles): (Vec<&str>, Vec<&str>) =
            sign_in.grants.iter().map(|(tenant, role)| (tenant.as_str(), role.as_str())).unzip();
        // language=PostgreSQL
        sqlx::query(
            "INSERT INTO memberships (tenant_id, user_id, role, granted_by_sso)
             SELECT n.id, $1, g.role, true FROM unnest($2::text[], $3::text[]) AS g (tenant, role)
             JOIN tenants n ON n.name = g.tenant
             ON CONFLICT (tenant_id, user_id) DO UPDATE SET role = EXCLUDED.role, granted_by_sso = true",
        )
        .bind(user_id)
        .bind(&grant_tenants)
        .bind(&grant_roles)
        .execute(&mut *tx)
        .await
        .map_err(db_error)?;
        // A platform admin no longer: the viewer seat a platform admin was given (below) in a
        // tenant the mapping does not name ends too.
        // language=PostgreSQL
        sqlx::query(
            "DELETE FROM memberships m USING tenants n
             WHERE m.tenant_id = n.id AND m.user_id = $1 AND m.granted_by_sso
               AND (n.name = ANY($2) OR $4) AND NOT n.name = ANY($3)",
        )
        .bind(user_id)
        .bind(sign_in.mapped_tenants)
        .bind(&grant_tenants)
        .bind(sign_in.platform_admin == Some(false))
        .execute(&mut *tx)
        .await
        .map_err(db_error)?;
        if sign_in.platform_admin == Some(true) {
            // A platform admin by the admin group alone has no tenant of their own: a session
            // needs one, so they get a viewer seat in the tenant asked for, else the oldest
            // (their platform-admin powers do not depend on it).
            // language=PostgreSQL
            sqlx::query(
                "INSERT INTO memberships (tenant_id, user_id, role, granted_by_sso)
                 SELECT n.id, $1, 'viewer', true FROM tenants n
                 WHERE ($2::text IS NULL OR n.name = $2) AND n.removal_requested_at IS NULL
                   AND NOT EXISTS (SELECT 1 FROM memberships m JOIN tenants t ON t.id = m.tenant_id
                                   WHERE m.user_id = $1 AND ($2::text IS NULL OR t.name = $2))
                 ORDER BY n.created_at, n.name LIMIT 1
                 ON CONFLICT (tenant_id, user_id) DO NOTHING",
            )
            .bind(user_id)
            .bind(sign_in.tenant)
            .execute(&mut *tx)
            .await
            .map_err(db_error)?;
        }
        // language=PostgreSQL
        let tenant_id: Option<Uuid> = sqlx::query_scalar(
            "SELECT n.id FROM memberships m JOIN tenants n ON n.id = m.tenant_id
             WHERE m.user_id = $1 AND ($2::text IS NULL OR n.name = $2)
             ORDER BY n.name LIMIT 1",
        )
        .bind(user_id)
        .bind(sign_in.tenant)
        .fetch_optional(&mut *tx)
        .await
        .map_err(db_error)?;
        let tenant_id = tenant_id.ok_or_else(|| {
            Error::Forbidden(match sign_in.tenant {
                Some(tenant) => format!("you are not a member of a tenant {tenant:?}"),
                None => "you are not a member of any tenant".into(),
            })
        })?;
        let expires_at: DateTime<Utc> = Utc::now() + Duration::hours(SESSION_LIFETIME_HOURS);
        let token_id = Uuid::now_v7();
        // language=PostgreSQL
        sqlx::query(
            "INSERT INTO api_tokens (id, tenant_id, user_id, name, token_hash, expires_at, session_only)
             VALUES ($1, $2, $3, 'dashboard (single sign-on)', $4, $5, true)",
        )
        .bind(token_id)
        .bind(tenant_id)
        .bind(user_id)
        .bind(token_hash(&token_generate()))
        .bind(expires_at)
        .execute(&mut *tx)
        .await
        .map_err(db_error)?;
        let session = session_insert(&mut tx, token_id, expires_at).await?;
        let row: CallerRow = sqlx::query_as(concat!(caller_select!(), " WHERE t.id = $1"))
            .bind(token_id)
            .fetch_one(&mut *tx)
            .await
            .map_err(db_error)?;
        let audit = crate::audit::Audit {
            tenant_id: Some(row.tenant_id),
            tenant: Some(row.tenant_name.clone()),
            actor: format!("user:{}", row.user_name),
            user_id: Some(row.user_id),
            credential: Some(format!("session:{token_id}")),
            action: "session.open",
            target: format!("user:{}", row.user_name),
            source: sign_in.source,
        };
        crate::audit::append(&mut *tx, &audit, crate::audit::Outcome::Ok, Some("single sign-on")).await?;
        tx.commit().await.map_err(db_error)?;
        let mut caller = self.caller_from_row(row).await?;
        caller.session = true;
        Ok((session, caller))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_pending_sign_ins_debug_shows_neither_its_verifier_nor_its_nonce() {
        let pending = PendingLogin {
            pkce_verifier: "verifier-0123456789".into(),
            nonce: "nonce-0123456789".into(),
            tenant: Some("vision".into()),
        };
        let printed = format!("{pending:?}");
        assert!(!printed.contains("verifier-0123456789") && !printed.contains("nonce-0123456789"), "{printed}");
        assert!(printed.contains("vision"), "{printed}");
    }
}
