//! `yard notify`: webhooks when jobs end, fail, are preempted or wait too long, and the log of
//! each delivery.

use std::process::ExitCode;

use clap::Subcommand;
use trainyard_core::notifications::{Delivery, Subscription, SubscriptionCreate, SubscriptionCreated};

use crate::Output;
use crate::client::Client;
use crate::output::{self, table, when};

#[derive(Subcommand)]
pub enum NotifyCommand {
    /// Subscribe URL to job events; prints the signing secret once.
    Add {
        /// Where the notices are POSTed (http or https).
        url: String,
        /// Comma-separated: ended, succeeded, failed, preempted, waiting, idle.
        #[arg(long, value_delimiter = ',', required = true)]
        on: Vec<String>,
        /// With `waiting`: how long a job waits in the queue before the notice (`30m`, `2h`).
        #[arg(long)]
        after: Option<humantime::Duration>,
        /// Every job of the tenant, not only yours (tenant admins).
        #[arg(long)]
        tenant: bool,
        /// Send Slack's incoming-webhook message (`{"text": ...}`) instead of the JSON event.
        #[arg(long)]
        slack: bool,
    },
    /// Your subscriptions (a tenant admin: all of the tenant's).
    Ls,
    /// Remove a subscription.
    Rm { id: String },
    /// A subscription's latest notices and every try of each.
    Deliveries { id: String },
}

pub async fn notify(client: &Client, out: Output, command: NotifyCommand) -> anyhow::Result<ExitCode> {
    match command {
        NotifyCommand::Add { url, on, after, tenant, slack } => {
            let body = SubscriptionCreate {
                url,
                events: on,
                scope: tenant.then(|| "tenant".to_string()),
                format: slack.then(|| "slack".to_string()),
                wait_seconds: after.map(|d| d.as_secs().min(u64::from(u32::MAX)) as u32),
            };
            let created: SubscriptionCreated = client.post("/api/v1/notifications/subscriptions", &body).await?;
            output::print(out, &created, |c| {
                format!(
                    "subscription {}\nsigning secret (shown once; verify the webhook-signature header with it):\n{}\n",
                    c.subscription.id, c.secret
                )
            })
        }
        NotifyCommand::Ls => {
            let list: Vec<Subscription> = client.get("/api/v1/notifications/subscriptions").await?;
            output::print(out, &list, |list| {
                let mut t = table(&["ID", "EVENTS", "SCOPE", "FORMAT", "URL", "BY"]);
                for s in list {
                    let mut events = s.events.join(",");
                    if let Some(wait) = s.wait_seconds {
                        events.push_str(&format!(
                            " (after {})",
                            humantime::format_duration(std::time::Duration::from_secs(wait.into()))
                        ));
                    }
                    t.add_row(vec![
                        s.id.to_string(),
                        events,
                        s.scope.clone(),
                        s.format.clone(),
                        s.url.clone(),
                        s.user.clone(),
                    ]);
                }
                format!("{t}\n")
            })
        }
        NotifyCommand::Rm { id } => {
            client.delete(&format!("/api/v1/notifications/subscriptions/{id}")).await?;
            eprintln!("removed {id}");
            Ok(ExitCode::SUCCESS)
        }
        NotifyCommand::Deliveries { id } => {
            let list: Vec<Delivery> =
                client.get(&format!("/api/v1/notifications/subscriptions/{id}/deliveries")).await?;
            output::print(out, &list, |list| {
                let mut t = table(&["NOTICE", "EVENT", "JOB", "STATUS", "TRIES", "LAST TRY", "LAST ANSWER"]);
                for d in list {
                    let last = d.attempts.last();
                    let answer = last
                        .map(|a| match (&a.status_code, &a.error) {
                            (Some(code), None) => code.to_string(),
                            (_, Some(error)) => error.clone(),
                            (None, None) => String::new(),
                        })
                        .unwrap_or_default();
                    let status = match d.next_attempt_at {
                        Some(next) => format!("{} (next {})", d.status, when(next)),
                        None => d.status.clone(),
                    };
                    t.add_row(vec![
                        d.id.to_string(),
                        d.kind.clone(),
                        d.job_id.to_string(),
                        status,
                        d.attempts.len().to_string(),
                        last.map(|a| when(a.at)).unwrap_or_default(),
                        answer,
                    ]);
                }
                format!("{t}\n")
            })
        }
    }
}
