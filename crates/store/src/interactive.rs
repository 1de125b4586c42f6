//! Interactive sessions (notebooks): the row that makes a job a session, the one-time grants a
//! browser exchanges for the session's cookie, and the cookie's check on every proxied request.
//! Only SHA-256 hashes of grants and cookies are kept.
//!
//! Tenant scoping: [`Store::interactive_session_get`] and the grant's creation take the caller's
//! tenant id. The proxy's two reads ([`Store::interactive_grant_redeem`],
//! [`Store::interactive_cookie_check`]) have no caller yet: the grant or cookie is the
//! credential, and each is bound to one session and the token it was made for, which must still
//! be live and its user still allowed to open the session.

use chrono::{DateTime, Utc};
use trainyard_core::error::ObjectKind;
use trainyard_core::{Error, Result};
use uuid::Uuid;

use crate::tenancy::token_hash;
use crate::{Store, db_error};

/// A session as its tenant sees it.
#[derive(Debug, Clone, sqlx::FromRow)]
pub struct InteractiveSessionRow {
    pub job_id: Uuid,
    pub user_id: Uuid,
    pub user_name: String,
    pub kind: String,
    pub state: String,
    pub created_at: DateTime<Utc>,
    pub last_activity_at: DateTime<Utc>,
}

/// Where the proxy sends a request the cookie allows: the session's job state and where its
/// current attempt runs (none before its launch).
#[derive(Debug, Clone, sqlx::FromRow)]
pub struct SessionUpstream {
    pub tenant_id: Uuid,
    pub state: String,
    pub placement: Option<serde_json::Value>,
}

/// Who may use a grant or cookie: the session's own user (a member or admin still), or an admin
/// of its tenant; through a token neither revoked nor expired.
macro_rules! allowed_through_token {
    () => {
        " JOIN api_tokens t ON t.id = g.token_id AND t.revoked_at IS NULL
                            AND (t.expires_at IS NULL OR t.expires_at > now())
          JOIN memberships m ON m.tenant_id = t.tenant_id AND m.user_id = t.user_id
                            AND (m.role = 'admin' OR (m.user_id = s.user_id AND m.role = 'member'))"
    };
}

impl Store {
    /// Marks a job of the tenant as a session of `kind`, opened by `user_id`.
    pub async fn interactive_session_insert(
        &self,
        tenant_id: Uuid,
        job_id: Uuid,
        user_id: Uuid,
        kind: &str,
    ) -> Result<()> {
        // language=PostgreSQL
        sqlx::query(
            "INSERT INTO interactive_sessions (job_id, tenant_id, user_id, kind) VALUES ($1, $2, $3, $4)
             ON CONFLICT (job_id) DO NOTHING",
        )
        .bind(job_id)
        .bind(tenant_id)
        .bind(user_id)
        .bind(kind)
        .execute(&self.pool)
        .await
        .map_err(db_error)?;
        Ok(())
    }

    /// A session of the tenant; another tenant's is as unknown as none.
    pub async fn interactive_session_get(&self, tenant_id: Uuid, job_id: Uuid) -> Result<InteractiveSessionRow> {
        // language=PostgreSQL
        sqlx::query_as(
            "SELECT s.job_id, s.user_id, u.name AS user_name, s.kind, j.state, s.created_at, s.last_activity_at
             FROM interactive_sessions s JOIN jobs j ON j.id = s.job_id JOIN users u ON u.id = s.user_id
             WHERE s.tenant_id = $1 AND s.job_id = $2",
        )
        .bind(tenant_id)
        .bind(job_id)
        .fetch_optional(&self.pool)
        .await
        .map_err(db_error)?
        .ok_or(Error::NotFound { kind: ObjectKind::Session })
    }

    /// Stores a grant for the caller's token to open the tenant's session until `expires_at`.
    pub async fn interactive_grant_create(
        &self,
        tenant_id: Uuid,
        job_id: Uuid,
        token_id: Uuid,
        grant: &str,
        expires_at: DateTime<Utc>,
    ) -> Result<()> {
        // Expired grants that were never used go where a write happens anyway.
        // language=PostgreSQL
        sqlx::query("DELETE FROM interactive_session_grants WHERE redeemed_at IS NULL AND grant_expires_at < now()")
            .execute(&self.pool)
            .await
            .map_err(db_error)?;
        // language=PostgreSQL
        let inserted = sqlx::query(
            "INSERT INTO interactive_session_grants (grant_hash, job_id, token_id, grant_expires_at)
             SELECT $3, s.job_id, $4, $5 FROM interactive_sessions s WHERE s.tenant_id = $1 AND s.job_id = $2",
        )
        .bind(tenant_id)
        .bind(job_id)
        .bind(token_hash(grant))
        .bind(token_id)
        .bind(expires_at)
        .execute(&self.pool)
        .await
        .map_err(db_error)?;
        if inserted.rows_affected() == 0 {
            return Err(Error::NotFound { kind: ObjectKind::Session });
        }
        Ok(())
    }

    /// Exchanges a grant for a cookie, once: true when the grant was valid, unused and unexpired
    /// and its token may still open the session.
    pub async fn interactive_grant_redeem(
        &self,
        job_id: Uuid,
        grant: &str,
        cookie: &str,
        cookie_expires_at: DateTime<Utc>,
    ) -> Result<bool> {
        // language=PostgreSQL
        let redeemed = sqlx::query(concat!(
            "UPDATE interactive_session_grants SET cookie_hash = $3, redeemed_at = now(), cookie_expires_at = $4
             WHERE grant_hash = $2 AND job_id = $1 AND redeemed_at IS NULL AND grant_expires_at > now()
               AND EXISTS (SELECT 1 FROM interactive_session_grants g
                           JOIN interactive_sessions s ON s.job_id = g.job_id",
            allowed_through_token!(),
            " WHERE g.grant_hash = $2)"
        ))
        .bind(job_id)
        .bind(token_hash(grant))
        .bind(token_hash(cookie))
        .bind(cookie_expires_at)
        .execute(&self.pool)
        .await
        .map_err(db_error)?;
        Ok(redeemed.rows_affected() == 1)
    }

    /// Checks a session cookie; when it is good, counts the request as the session's activity
    /// and says where the session runs. `None`: refused (no such cookie for this session, expired,
    /// or its token or its user's right to the session gone).
    pub async fn interactive_cookie_check(&self, job_id: Uuid, cookie: &str) -> Result<Option<SessionUpstream>> {
        // language=PostgreSQL
        sqlx::query_as(concat!(
            "WITH allowed AS (
                 SELECT s.job_id, s.tenant_id FROM interactive_session_grants g
                 JOIN interactive_sessions s ON s.job_id = g.job_id",
            allowed_through_token!(),
            " WHERE g.job_id = $1 AND g.cookie_hash = $2 AND g.cookie_expires_at > now()),
             touched AS (
                 UPDATE interactive_sessions s SET last_activity_at = now(), idle_warned_at = NULL FROM allowed a
                 WHERE s.job_id = a.job_id AND s.last_activity_at < now() - interval '1 second')
             SELECT a.tenant_id, j.state,
                    (SELECT placement FROM job_attempts x WHERE x.job_id = j.id ORDER BY attempt DESC LIMIT 1)
                        AS placement
             FROM allowed a JOIN jobs j ON j.id = a.job_id"
        ))
        .bind(job_id)
        .bind(token_hash(cookie))
        .fetch_optional(&self.pool)
        .await
        .map_err(db_error)
    }

    /// The control loop's idle step, across tenants (fenced): warns each running session of a
    /// tenant with an idle timeout once it has been idle for half of it (at most 5 minutes before
    /// the stop), with an event on its job, and stops each warned one idle for all of it (its
    /// job cancelled, with an event saying why). Returns how many were warned and stopped.
    pub async fn sessions_idle_sweep(&self) -> Result<(u64, u64)> {
        // language=PostgreSQL
        let warned = sqlx::query_scalar::<_, i32>(
            "WITH due AS (
                 SELECT s.job_id, n.session_idle_timeout_seconds AS timeout, s.last_activity_at
                 FROM interactive_sessions s JOIN tenants n ON n.id = s.tenant_id JOIN jobs j ON j.id = s.job_id
                 WHERE j.state = 'running' AND j.cancel_requested_at IS NULL AND s.idle_warned_at IS NULL
                   AND n.session_idle_timeout_seconds IS NOT NULL
                   AND s.last_activity_at < now() - make_interval(secs => n.session_idle_timeout_seconds
                                                    - least(n.session_idle_timeout_seconds / 2, 300))
                   AND (SELECT control_fence($1))),
             marked AS (
                 UPDATE interactive_sessions s SET idle_warned_at = now() FROM due
                 WHERE s.job_id = due.job_id AND s.idle_warned_at IS NULL
                 RETURNING s.job_id, due.timeout, due.last_activity_at),
             noted AS (
                 UPDATE jobs j SET reason = format('idle: no use through its proxy since %s UTC; stops at %s UTC unless used (the tenant''s idle timeout is %s s)',
                                                   to_char(m.last_activity_at AT TIME ZONE 'UTC', 'HH24:MI:SS'),
                                                   to_char((m.last_activity_at + make_interval(secs => m.timeout)) AT TIME ZONE 'UTC', 'HH24:MI:SS'),
                                                   m.timeout),
                        last_actor = 'control:idle', event_seq = event_seq + 1, updated_at = now()
                 FROM marked m WHERE j.id = m.job_id
                 RETURNING j.id, j.tenant_id, j.state, j.event_seq, j.reason)
             INSERT INTO job_events (job_id, tenant_id, seq, from_state, to_state, actor, reason)
             SELECT id, tenant_id, event_seq, state, state, 'control:idle', reason FROM noted
             RETURNING 1",
        )
        .bind(self.control_epoch())
        .fetch_all(&self.pool)
        .await
        .map_err(db_error)?
        .len() as u64;
        // language=PostgreSQL
        let stopped = sqlx::query_scalar::<_, i32>(
            "WITH due AS (
                 SELECT s.job_id, n.session_idle_timeout_seconds AS timeout
                 FROM interactive_sessions s JOIN tenants n ON n.id = s.tenant_id JOIN jobs j ON j.id = s.job_id
                 WHERE j.state = 'running' AND j.cancel_requested_at IS NULL AND s.idle_warned_at IS NOT NULL
                   AND n.session_idle_timeout_seconds IS NOT NULL
                   AND s.last_activity_at < now() - make_interval(secs => n.session_idle_timeout_seconds)
                   AND (SELECT control_fence($1))),
             stopped AS (
                 UPDATE jobs j SET cancel_requested_at = now(),
                        reason = format('stopped: idle for %s s (the tenant''s idle timeout); its GPUs are given back', due.timeout),
                        last_actor = 'control:idle', event_seq = event_seq + 1, updated_at = now()
                 FROM due WHERE j.id = due.job_id AND j.cancel_requested_at IS NULL
                 RETURNING j.id, j.tenant_id, j.state, j.event_seq, j.reason)
             INSERT INTO job_events (job_id, tenant_id, seq, from_state, to_state, actor, reason)
             SELECT id, tenant_id, event_seq, state, state, 'control:idle', reason FROM stopped
             RETURNING 1",
        )
        .bind(self.control_epoch())
        .fetch_all(&self.pool)
        .await
        .map_err(db_error)?
        .len() as u64;
        Ok((warned, stopped))
    }
}
