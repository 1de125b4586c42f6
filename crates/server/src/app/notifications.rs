//! Notifications: subscribing to a tenant's job events, and the leader's delivery worker.
//!
//! A subscription hears of its user's own jobs, or (made by a tenant admin, `scope: tenant`)
//! every job of the tenant. Notices are written to the outbox in Postgres with the change that
//! causes them (`store/src/notifications.rs`); [`App::notifications_deliver`] sends them from
//! there, at least once, retried with back-off, each try logged for the subscriber to read.
//! The wire format and the limits on where it sends are in [`crate::webhooks`].

use std::time::Instant;

use futures::StreamExt;
use trainyard_core::auth::{Action, Caller};
use trainyard_core::notifications::{Delivery, Subscription, SubscriptionCreate, SubscriptionCreated};
use trainyard_core::{Error, Result};
use trainyard_store::audit::Audit;
use trainyard_store::notifications::{DueNotice, TryOutcome};
use uuid::Uuid;

use super::App;
use crate::webhooks;

/// Notices taken by one pass of the worker, and sent at once at most.
const NOTICES_PER_PASS: u32 = 64;
const SENT_AT_ONCE: usize = 8;

impl App {
    /// A new subscription; its signing secret is in the answer only.
    pub async fn subscription_create(&self, caller: &Caller, body: &SubscriptionCreate) -> Result<SubscriptionCreated> {
        let id = Uuid::now_v7();
        let audit = Audit::by(caller, "notification.subscribe", format!("subscription:{id}"));
        let subscription = self
            .audited(&audit, async {
                caller.authorize(Action::Notify)?;
                let valid = body.validate(self.notify_allow_private)?;
                if valid.tenant_wide {
                    caller.authorize(Action::ManageTenant).map_err(|_| {
                        Error::Forbidden("only the tenant's admins may subscribe to every job of the tenant".into())
                    })?;
                }
                self.store.subscription_create(caller, id, &valid, &audit).await
            })
            .await?;
        let secret = webhooks::secret_text(&self.storage.notification_key(id));
        Ok(SubscriptionCreated { subscription, secret })
    }

    /// Your subscriptions; every one of the tenant's for its admins.
    pub async fn subscriptions_list(&self, caller: &Caller) -> Result<Vec<Subscription>> {
        caller.authorize(Action::Notify)?;
        self.store.subscriptions_list(caller).await
    }

    /// Removes a subscription: yours, or any of the tenant's for its admins.
    pub async fn subscription_delete(&self, caller: &Caller, id: Uuid) -> Result<()> {
        let audit = Audit::by(caller, "notification.unsubscribe", format!("subscription:{id}"));
        self.audited(&audit, async {
            caller.authorize(Action::Notify)?;
            self.store.subscription_delete(caller, id, &audit).await
        })
        .await
    }

    /// A subscription's latest notices, each with every try.
    pub async fn subscription_deliveries(&self, caller: &Caller, id: Uuid) -> Result<Vec<Delivery>> {
        caller.authorize(Action::Notify)?;
        self.store.subscription_deliveries(caller, id, 200).await
    }

    /// The delivery worker: on the leader, each second, writes the `waiting` notices that came
    /// due and sends every notice due, until `stop`. A panic in a pass is counted in the loop's
    /// health (`/readyz`) and the next pass runs. `stop` cuts a pass short (shutdown stays
    /// bounded however slow the receivers): a try cut off is not recorded and is sent again.
    pub async fn notifications_deliver(self, stop: tokio_util::sync::CancellationToken) {
        use futures::FutureExt;
        let client = webhooks::client(self.notify_allow_private);
        while !stop.is_cancelled() {
            if self.health.is_leading() {
                let pass = std::panic::AssertUnwindSafe(self.notifications_pass(&client)).catch_unwind();
                let outcome = tokio::select! {
                    _ = stop.cancelled() => break,
                    outcome = pass => outcome,
                };
                match outcome {
                    Ok(Ok(())) => {}
                    Ok(Err(err)) => tracing::warn!("the notifications' worker: {err}"),
                    Err(panic) => self.health.panicked(crate::scheduling::health::panic_message(&*panic)),
                }
            }
            tokio::select! {
                _ = stop.cancelled() => break,
                _ = tokio::time::sleep(std::time::Duration::from_secs(1)) => {}
            }
        }
    }

    async fn notifications_pass(&self, client: &reqwest::Client) -> Result<()> {
        self.store.notifications_waiting_sweep().await?;
        let due = self.store.notifications_due(NOTICES_PER_PASS).await?;
        let mut sends = futures::stream::iter(due.into_iter().map(|notice| async move {
            let outcome = self.notice_send(client, &notice).await;
            (notice, outcome)
        }))
        .buffer_unordered(SENT_AT_ONCE);
        while let Some((notice, outcome)) = sends.next().await {
            // Never the URL: a Slack webhook's URL is a credential.
            tracing::info!(notice = %notice.id, subscription = %notice.subscription_id, kind = notice.kind,
                           status = ?outcome.status_code, delivered = outcome.delivered, "webhook try");
            self.store.notification_attempt_record(&notice, &outcome).await?;
        }
        Ok(())
    }

    async fn notice_send(&self, client: &reqwest::Client, notice: &DueNotice) -> TryOutcome {
        let started = Instant::now();
        let body = webhooks::body(&notice.kind, notice.created_at, &notice.payload, notice.format == "slack");
        let id = notice.id.to_string();
        let timestamp = chrono::Utc::now().timestamp();
        let key = self.storage.notification_key(notice.subscription_id);
        let sent = match webhooks::refused_literal(&notice.url, self.notify_allow_private) {
            Some(refused) => Err(refused),
            None => client
                .post(&notice.url)
                .header("content-type", "application/json")
                .header("webhook-id", &id)
                .header("webhook-timestamp", timestamp.to_string())
                .header("webhook-signature", webhooks::signature(&key, &id, timestamp, &body))
                .body(body)
                .send()
                .await
                .map_err(|err| error_chain(&err)),
        };
        let duration_ms = started.elapsed().as_millis().min(u32::MAX as u128) as u32;
        let (status_code, error) = match sent {
            Ok(response) if response.status().is_success() => (Some(response.status().as_u16()), None),
            Ok(response) => {
                (Some(response.status().as_u16()), Some(format!("the receiver answered {}", response.status())))
            }
            Err(err) => (None, Some(err)),
        };
        let delivered = error.is_none();
        let tries = notice.attempts + 1;
        let retry_at = (!delivered && tries < webhooks::TRIES_MAX).then(|| {
            chrono::Utc::now()
                + chrono::Duration::from_std(webhooks::retry_delay(notice.attempts, rand::random::<f64>()))
                    .unwrap_or_default()
        });
        TryOutcome { duration_ms, status_code, error, delivered, retry_at }
    }

    /// Lets subscriptions send to loopback and private addresses (an operator's choice, for a
    /// receiver inside the cluster or the tests).
    pub(crate) fn notify_allow_private_set(&mut self, allow: bool) {
        self.notify_allow_private = allow;
    }
}

/// An error and its causes in one line ("error sending request: connection refused").
fn error_chain(err: &dyn std::error::Error) -> String {
    let mut text = err.to_string();
    let mut source = err.source();
    while let Some(cause) = source {
        text.push_str(": ");
        text.push_str(&cause.to_string());
        source = cause.source();
    }
    text
}
