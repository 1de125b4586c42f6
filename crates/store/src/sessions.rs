//! Browser sessions of the dashboard. Signing in with an API token opens a session; the cookie
//! carries a random secret whose SHA-256 is all the database keeps. Each request re-checks the
//! token behind the session, so revoking the token (or its expiry) ends the session too.

use chrono::{DateTime, Duration, Utc};
use trainyard_core::auth::Caller;
use trainyard_core::{Error, Result};

use crate::tenancy::{CallerRow, caller_select, token_hash};
use crate::{Store, db_error};

/// How long a session lasts at most; never longer than its token.
pub const SESSION_LIFETIME_HOURS: i64 = 12;

/// A session as the browser holds it.
#[derive(Debug, Clone)]
pub struct WebSession {
    /// The cookie's value. Shown once, here.
    pub secret: String,
    /// The value every form post of this session must carry.
    pub csrf: String,
    pub expires_at: DateTime<Utc>,
}

/// 256 random bits in hex: session secrets, CSRF values.
pub fn random_hex() -> String {
    let mut bytes = [0u8; 32];
    rand::fill(&mut bytes);
    hex::encode(bytes)
}

impl Store {
    /// Opens a session for the holder of an API token, or says why the token is refused.
    pub async fn session_open(&self, token: &str) -> Result<(WebSession, Caller)> {
        let caller = self.token_authenticate(token).await?;
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
        let mut conn = self.pool.acquire().await.map_err(db_error)?;
        let session = session_insert(&mut conn, caller.token_id, expires_at).await?;
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
        Ok((self.caller_from_row(row.caller).await?, row.csrf))
    }

    /// Ends a session, and the token single sign-on opened for it, if any. Ending one that is
    /// gone already is harmless.
    pub async fn session_close(&self, secret: &str) -> Result<()> {
        // language=PostgreSQL
        sqlx::query(
            "WITH ended AS (DELETE FROM web_sessions WHERE secret_hash = $1 RETURNING token_id)
             UPDATE api_tokens SET revoked_at = now()
             WHERE id IN (SELECT token_id FROM ended) AND session_only AND revoked_at IS NULL",
        )
        .bind(token_hash(secret))
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
