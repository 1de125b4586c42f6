//! Notifications: subscriptions, the outbox and its delivery log.
//!
//! A job event's notices are written by the trigger `notifications_enqueue` on `job_events`
//! (`migrations/*_notifications.sql`), in the transaction of the change of state itself; the
//! `waiting` notices by [`Store::notifications_waiting_sweep`]. The leader's delivery worker
//! reads [`Store::notifications_due`] and writes each try with [`Store::notification_attempt_record`]
//! (fenced: a deposed leader's tries are not recorded, and the new leader sends again; receivers
//! dedupe by the notice's id).
//!
//! Tenant scoping: the subscriber's reads and writes take the caller's tenant id and see their
//! own subscriptions, or all of the tenant's for its admins. The worker's two queries read
//! across tenants, as the control loop does.

use chrono::{DateTime, Utc};
use trainyard_core::auth::{Caller, Role};
use trainyard_core::error::ObjectKind;
use trainyard_core::notifications::{Delivery, DeliveryAttempt, Subscription, ValidSubscription};
use trainyard_core::{Error, Result};
use uuid::Uuid;

use crate::audit::{self, Audit, Outcome};
use crate::{Store, db_error};

#[derive(sqlx::FromRow)]
struct SubscriptionRow {
    id: Uuid,
    user_name: String,
    scope: String,
    url: String,
    format: String,
    events: Vec<String>,
    wait_seconds: Option<i32>,
    created_at: DateTime<Utc>,
}

impl From<SubscriptionRow> for Subscription {
    fn from(r: SubscriptionRow) -> Subscription {
        Subscription {
            id: r.id,
            user: r.user_name,
            scope: r.scope,
            url: r.url,
            format: r.format,
            events: r.events,
            wait_seconds: r.wait_seconds.map(|s| s as u32),
            created_at: r.created_at,
        }
    }
}

/// A notice due to be sent: where, in which form, and what.
#[derive(Debug, Clone, sqlx::FromRow)]
pub struct DueNotice {
    pub id: Uuid,
    pub subscription_id: Uuid,
    pub url: String,
    pub format: String,
    pub kind: String,
    pub payload: serde_json::Value,
    pub created_at: DateTime<Utc>,
    /// Tries made before this one.
    pub attempts: i32,
}

/// How one try went.
#[derive(Debug, Clone)]
pub struct TryOutcome {
    pub duration_ms: u32,
    pub status_code: Option<u16>,
    pub error: Option<String>,
    /// Delivered (a 2xx); else retried at `retry_at`, or given up when `None`.
    pub delivered: bool,
    pub retry_at: Option<DateTime<Utc>>,
}

impl Store {
    pub async fn subscription_create(
        &self,
        caller: &Caller,
        id: Uuid,
        valid: &ValidSubscription,
        audit: &Audit,
    ) -> Result<Subscription> {
        let mut tx = self.begin().await?;
        // language=PostgreSQL
        sqlx::query(
            "INSERT INTO notification_subscriptions (id, tenant_id, user_id, scope, url, format, events, wait_seconds)
             VALUES ($1, $2, $3, $4, $5, $6, $7, $8)",
        )
        .bind(id)
        .bind(caller.tenant_id)
        .bind(caller.user_id)
        .bind(if valid.tenant_wide { "tenant" } else { "user" })
        .bind(&valid.url)
        .bind(if valid.slack { "slack" } else { "standard" })
        .bind(&valid.events)
        .bind(valid.wait_seconds.map(|s| s as i32))
        .execute(&mut *tx)
        .await
        .map_err(db_error)?;
        // The URL is not audited: a Slack webhook's URL is itself a credential.
        audit::append(&mut *tx, audit, Outcome::Ok, None).await?;
        // language=PostgreSQL
        let row: SubscriptionRow = sqlx::query_as(
            "SELECT s.id, u.name AS user_name, s.scope, s.url, s.format, s.events, s.wait_seconds, s.created_at FROM notification_subscriptions s JOIN users u ON u.id = s.user_id
             WHERE s.id = $1 AND s.tenant_id = $2",
        )
        .bind(id)
        .bind(caller.tenant_id)
        .fetch_one(&mut *tx)
        .await
        .map_err(db_error)?;
        tx.commit().await.map_err(db_error)?;
        Ok(row.into())
    }

    /// The caller's subscriptions in this tenant; all of the tenant's for its admins.
    pub async fn subscriptions_list(&self, caller: &Caller) -> Result<Vec<Subscription>> {
        // language=PostgreSQL
        let rows: Vec<SubscriptionRow> = sqlx::query_as(
            "SELECT s.id, u.name AS user_name, s.scope, s.url, s.format, s.events, s.wait_seconds, s.created_at FROM notification_subscriptions s JOIN users u ON u.id = s.user_id
             WHERE s.tenant_id = $1 AND (s.user_id = $2 OR $3) ORDER BY s.created_at, s.id",
        )
        .bind(caller.tenant_id)
        .bind(caller.user_id)
        .bind(caller.role == Role::Admin)
        .fetch_all(&self.pool)
        .await
        .map_err(db_error)?;
        Ok(rows.into_iter().map(Subscription::from).collect())
    }

    /// Removes a subscription (the caller's, or any of the tenant's for its admins) with its
    /// undelivered notices and delivery log.
    pub async fn subscription_delete(&self, caller: &Caller, id: Uuid, audit: &Audit) -> Result<()> {
        let mut tx = self.begin().await?;
        // language=PostgreSQL
        let result = sqlx::query(
            "DELETE FROM notification_subscriptions WHERE id = $1 AND tenant_id = $2 AND (user_id = $3 OR $4)",
        )
        .bind(id)
        .bind(caller.tenant_id)
        .bind(caller.user_id)
        .bind(caller.role == Role::Admin)
        .execute(&mut *tx)
        .await
        .map_err(db_error)?;
        if result.rows_affected() == 0 {
            return Err(Error::not_found(ObjectKind::Subscription));
        }
        audit::append(&mut *tx, audit, Outcome::Ok, None).await?;
        tx.commit().await.map_err(db_error)?;
        Ok(())
    }

    /// A subscription's notices, newest first (at most `limit`), each with its tries.
    pub async fn subscription_deliveries(&self, caller: &Caller, id: Uuid, limit: u32) -> Result<Vec<Delivery>> {
        // language=PostgreSQL
        let visible: Option<Uuid> = sqlx::query_scalar(
            "SELECT id FROM notification_subscriptions WHERE id = $1 AND tenant_id = $2 AND (user_id = $3 OR $4)",
        )
        .bind(id)
        .bind(caller.tenant_id)
        .bind(caller.user_id)
        .bind(caller.role == Role::Admin)
        .fetch_optional(&self.pool)
        .await
        .map_err(db_error)?;
        if visible.is_none() {
            return Err(Error::not_found(ObjectKind::Subscription));
        }
        type NoticeRow =
            (Uuid, String, Uuid, DateTime<Utc>, DateTime<Utc>, Option<DateTime<Utc>>, Option<DateTime<Utc>>);
        // language=PostgreSQL
        let notices: Vec<NoticeRow> = sqlx::query_as(
            "SELECT id, kind, job_id, created_at, next_attempt_at, delivered_at, abandoned_at
             FROM notification_outbox WHERE subscription_id = $1 AND tenant_id = $2
             ORDER BY created_at DESC, id LIMIT $3",
        )
        .bind(id)
        .bind(caller.tenant_id)
        .bind(i64::from(limit))
        .fetch_all(&self.pool)
        .await
        .map_err(db_error)?;
        let ids: Vec<Uuid> = notices.iter().map(|n| n.0).collect();
        type TryRow = (Uuid, i32, DateTime<Utc>, i32, Option<i32>, Option<String>);
        // language=PostgreSQL
        let tries: Vec<TryRow> = sqlx::query_as(
            "SELECT outbox_id, attempt, at, duration_ms, status_code, error FROM notification_attempts
             WHERE outbox_id = ANY($1) ORDER BY outbox_id, attempt",
        )
        .bind(&ids)
        .fetch_all(&self.pool)
        .await
        .map_err(db_error)?;
        Ok(notices
            .into_iter()
            .map(|(id, kind, job_id, created_at, next, delivered, abandoned)| Delivery {
                id,
                kind,
                job_id,
                created_at,
                status: if delivered.is_some() {
                    "delivered"
                } else if abandoned.is_some() {
                    "abandoned"
                } else {
                    "retrying"
                }
                .to_string(),
                next_attempt_at: (delivered.is_none() && abandoned.is_none()).then_some(next),
                attempts: tries
                    .iter()
                    .filter(|t| t.0 == id)
                    .map(|t| DeliveryAttempt {
                        attempt: t.1 as u32,
                        at: t.2,
                        duration_ms: t.3 as u32,
                        status_code: t.4.map(|c| c as u16),
                        error: t.5.clone(),
                    })
                    .collect(),
            })
            .collect())
    }

    /// The delivery worker's step one, across tenants (fenced): a `waiting` notice for each
    /// queued job that has waited longer than a subscription's threshold since it last entered
    /// the queue (once per time it entered it). Returns how many were written.
    pub async fn notifications_waiting_sweep(&self) -> Result<u64> {
        // language=PostgreSQL
        let result = sqlx::query(
            "INSERT INTO notification_outbox (subscription_id, tenant_id, kind, job_id, event_seq, payload)
             SELECT s.id, j.tenant_id, 'job.waiting', j.id, q.seq,
                    jsonb_build_object('tenant', n.name, 'job_id', j.id, 'job_name', j.name, 'state', j.state,
                                       'from_state', NULL, 'reason', j.reason, 'actor', 'control:notifications',
                                       'at', now(), 'queued_since', q.at, 'wait_seconds', s.wait_seconds)
             FROM notification_subscriptions s
             JOIN jobs j ON j.tenant_id = s.tenant_id AND j.state = 'queued'
                        AND (s.scope = 'tenant' OR j.created_by = s.user_id)
             JOIN tenants n ON n.id = j.tenant_id
             CROSS JOIN LATERAL (SELECT e.seq, e.at FROM job_events e
                                 WHERE e.job_id = j.id AND e.to_state = 'queued'
                                 ORDER BY e.seq DESC LIMIT 1) q
             WHERE 'waiting' = ANY (s.events) AND q.at < now() - make_interval(secs => s.wait_seconds)
               AND (SELECT control_fence($1))
             ON CONFLICT ON CONSTRAINT notification_outbox_once DO NOTHING",
        )
        .bind(self.control_epoch())
        .execute(&self.pool)
        .await
        .map_err(db_error)?;
        Ok(result.rows_affected())
    }

    /// Notices due now (never delivered, not given up, their next try due), oldest first.
    pub async fn notifications_due(&self, limit: u32) -> Result<Vec<DueNotice>> {
        // language=PostgreSQL
        sqlx::query_as(
            "SELECT o.id, o.subscription_id, s.url, s.format, o.kind, o.payload, o.created_at, o.attempts
             FROM notification_outbox o JOIN notification_subscriptions s ON s.id = o.subscription_id
             WHERE o.delivered_at IS NULL AND o.abandoned_at IS NULL AND o.next_attempt_at <= now()
             ORDER BY o.next_attempt_at, o.id LIMIT $1",
        )
        .bind(i64::from(limit))
        .fetch_all(&self.pool)
        .await
        .map_err(db_error)
    }

    /// Records one try of a notice and what comes next (fenced), in one statement.
    pub async fn notification_attempt_record(&self, notice: &DueNotice, outcome: &TryOutcome) -> Result<()> {
        // language=PostgreSQL
        sqlx::query(
            "WITH updated AS (
                 UPDATE notification_outbox SET attempts = attempts + 1,
                        delivered_at = CASE WHEN $2 THEN now() END,
                        abandoned_at = CASE WHEN NOT $2 AND $3::timestamptz IS NULL THEN now() END,
                        next_attempt_at = coalesce($3, next_attempt_at)
                 WHERE id = $1 AND attempts = $4 AND delivered_at IS NULL AND (SELECT control_fence($8))
                 RETURNING id, attempts)
             INSERT INTO notification_attempts (outbox_id, attempt, duration_ms, status_code, error)
             SELECT id, attempts, $5, $6, $7 FROM updated",
        )
        .bind(notice.id)
        .bind(outcome.delivered)
        .bind(outcome.retry_at)
        .bind(notice.attempts)
        .bind(outcome.duration_ms as i32)
        .bind(outcome.status_code.map(i32::from))
        .bind(outcome.error.as_deref())
        .bind(self.control_epoch())
        .execute(&self.pool)
        .await
        .map_err(db_error)?;
        Ok(())
    }
}
