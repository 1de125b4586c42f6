//! Browser sessions of the dashboard. Signing in with an API token opens a session; the cookie
//! carries a random secret whose SHA-256 is all the database keeps. Each request re-checks the
//! token behind the session, so revoking the token (or its expiry) ends the session too.

use chrono::{DateTime, Duration, Utc};
use trainyard_core::auth::Caller;
use trainyard_core::{Error, Result};

use crate::audit::{self, Audit, Outcome};
use crate::tenancy::{CallerRow, caller_select, token_hash};
use crate::{Store, db_error};

/// How long a session lasts at most; never longer than its token.
pub const SESSION_LIFETIME_HOURS: i64 = 12;

/// A session as the browser holds it. Its `Debug` shows neither secret.
#[derive(Clone)]
pub struct WebSession {
    /// The cookie's value. Shown once, here.
    pub secret: String,
    /// The value every form post of this session must carry.
    pub csrf: String,
    pub expires_at: DateTime<Utc>,
}

impl std::fmt::Debug for WebSession {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("WebSession")
            .field("secret", &"<redacted>")
            .field("csrf", &"<redacted>")
            .field("expires_at", &self.expires_at)
            .finish()
    }
}

/// 256 random bits in hex: session secrets, CSRF values.
pub fn random_hex() -> String {
    let mut bytes = [0u8; 32];
    rand::fill(&mut bytes);
    hex::encode(bytes)
}

impl Store {
    /// Opens a session for the holder of an API token, or says why the token is refused.
    pub async fn session_open(&self, token: &str, source: Option<std::net::IpAddr>) -> Result<(WebSession, Caller)> {
        let mut caller = self.token_authenticate(token).await?;
        caller.source = source;
        // language=PostgreSQL
        let token_expires: Option<DateTime<Utc>> =
            sqlx::query_scalar("SELECT expires_at FROM api_tokens WHERE id = $1")
                .bind(caller.token_id)
                .fetch_one(&self.pool)
                .await
                .map_err(db_error)?;
        let mut expires_at = Utc::now() + Duration::hours(SESSION_LIFETIME_HOURS);
        if let Some(token_expires) = token_expires {
            expires_at = expires_at.min(token_expires);
        }
        let mut tx = self.begin().await?;
        let session = session_insert(&mut tx, caller.token_id, expires_at).await?;
        let audit = Audit::by(&caller, "session.open", format!("user:{}", caller.user));
        audit::append(&mut *tx, &audit, Outcome::Ok, Some("API token")).await?;
        tx.commit().await.map_err(db_error)?;
        caller.session = true;
        Ok((session, caller))
    }

    /// The caller and CSRF value of a session cookie, checked against its token now.
    pub async fn session_authenticate(&self, secret: &str) -> Result<(Caller, String)> {
        let row: SessionRow = sqlx::query_as(concat!(
            caller_select!(", s.csrf"),
            " JOIN web_sessions s ON s.token_id = t.id WHERE s.secret_hash = $1 AND s.expires_at > now()"
        ))
        .bind(token_hash(secret))
        .fetch_optional(&self.pool)
        .await
        .map_err(db_error)?
        .ok_or_else(|| Error::Unauthenticated("the session has ended; sign in again".into()))?;
        let mut caller = self.caller_from_row(row.caller).await?;
        caller.session = true;
        Ok((caller, row.csrf))
    }

    /// Ends a session, and the token single sign-on opened for it, if any. Ending one that is
    /// gone already is harmless.
    pub async fn session_close(&self, secret: &str, source: Option<std::net::IpAddr>) -> Result<()> {
        // One statement ends the session, revokes its single sign-on token and records it.
        // language=PostgreSQL
        sqlx::query(
            "WITH ended AS (DELETE FROM web_sessions WHERE secret_hash = $1 RETURNING token_id),
                  revoked AS (UPDATE api_tokens SET revoked_at = now()
                              WHERE id IN (SELECT token_id FROM ended) AND session_only AND revoked_at IS NULL)
             INSERT INTO audit_log (tenant_id, tenant, actor, user_id, credential, action, target, outcome, source)
             SELECT t.tenant_id, n.name, 'user:' || u.name, u.id, 'session:' || t.id, 'session.close',
                    'user:' || u.name, 'ok', $2::inet
             FROM ended e JOIN api_tokens t ON t.id = e.token_id JOIN users u ON u.id = t.user_id
                  JOIN tenants n ON n.id = t.tenant_id",
        )
        .bind(token_hash(secret))
        .bind(source.map(|ip| ip.to_string()))
        .execute(&self.pool)
        .await
        .map_err(db_error)?;
        Ok(())
    }
}

/// Stores a new session for a token (sweeping expired ones, where a write happens anyway).
pub(crate) async fn session_insert(
    conn: &mut sqlx::PgConnection,
    token_id: uuid::Uuid,
    expires_at: DateTime<Utc>,
) -> Result<WebSession> {
    let session = WebSession { secret: random_hex(), csrf: random_hex(), expires_at };
    // language=PostgreSQL
    sqlx::query("DELETE FROM web_sessions WHERE expires_at < now()").execute(&mut *conn).await.map_err(db_error)?;
    // language=PostgreSQL
    sqlx::query("INSERT INTO web_sessions (secret_hash, token_id, csrf, expires_at) VALUES ($1, $2, $3, $4)")
        .bind(token_hash(&session.secret))
        .bind(token_id)
        .bind(&session.csrf)
        .bind(session.expires_at)
        .execute(&mut *conn)
        .await
        .map_err(db_error)?;
    Ok(session)
}

/// A session's caller and its CSRF value.
#[derive(sqlx::FromRow)]
struct SessionRow {
    #[sqlx(flatten)]
    caller: CallerRow,
    csrf: String,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_sessions_debug_shows_neither_its_cookie_nor_its_csrf_value() {
        let session = WebSession { secret: random_hex(), csrf: random_hex(), expires_at: Utc::now() };
        for printed in [format!("{session:?}"), format!("{session:#?}")] {
            assert!(!printed.contains(&session.secret) && !printed.contains(&session.csrf), "{printed}");
            assert!(printed.contains("expires_at"), "{printed}");
        }
    }
}
