//! Notifications: subscriptions to a tenant's job events, delivered as signed webhooks. The
//! request and answer types, and the rules a subscription must follow (no I/O: the addresses a
//! host resolves to are checked again at each delivery, see the server's `webhooks.rs`).

use std::net::IpAddr;

use chrono::{DateTime, Utc};
use serde::{Deserialize, Serialize};
use utoipa::ToSchema;
use uuid::Uuid;

use crate::error::{Error, Problems};

/// What a subscription can hear of: `ended` (succeeded, failed or cancelled), `succeeded`,
/// `failed`, `preempted`, `waiting` (queued longer than `wait_seconds`), `idle` (a notebook
/// session about to be stopped for idleness).
pub const EVENTS: [&str; 6] = ["ended", "succeeded", "failed", "preempted", "waiting", "idle"];

/// A new subscription.
#[derive(Debug, Clone, Serialize, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct SubscriptionCreate {
    /// Where the notices are POSTed: an `http` or `https` URL, without credentials in it.
    /// (Missing fields are refused with the others, after the caller's role is checked.)
    #[serde(default)]
    pub url: String,
    /// What to hear of: any of `ended`, `succeeded`, `failed`, `preempted`, `waiting`, `idle`.
    #[serde(default)]
    pub events: Vec<String>,
    /// `user` (the default: your own jobs) or `tenant` (every job of the tenant; its admins only).
    #[serde(default)]
    pub scope: Option<String>,
    /// `standard` (the default: a JSON event signed as Standard Webhooks sign) or `slack` (a
    /// Slack incoming webhook's `{"text": ...}`, signed the same way).
    #[serde(default)]
    pub format: Option<String>,
    /// With `waiting`: how long a job is queued before the notice, in seconds.
    #[serde(default)]
    pub wait_seconds: Option<u32>,
}

/// A subscription as listed: never its secret.
#[derive(Debug, Clone, Serialize, Deserialize, ToSchema)]
pub struct Subscription {
    pub id: Uuid,
    /// The member who made it.
    pub user: String,
    pub scope: String,
    pub url: String,
    pub format: String,
    pub events: Vec<String>,
    pub wait_seconds: Option<u32>,
    pub created_at: DateTime<Utc>,
}

/// A subscription just made, with the secret its notices are signed with: shown here once
/// (the server does not store it; its `Debug` never shows it).
#[derive(Clone, Serialize, Deserialize, ToSchema)]
pub struct SubscriptionCreated {
    #[serde(flatten)]
    pub subscription: Subscription,
    /// `whsec_` and the base64 of the HMAC-SHA256 key, as Standard Webhooks' libraries take it.
    pub secret: String,
}

impl std::fmt::Debug for SubscriptionCreated {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SubscriptionCreated")
            .field("subscription", &self.subscription)
            .field("secret", &"<redacted>")
            .finish()
    }
}

/// One notice to a subscriber and every try to deliver it.
#[derive(Debug, Clone, Serialize, Deserialize, ToSchema)]
pub struct Delivery {
    /// The `webhook-id` header of each try: the same for every retry of this notice.
    pub id: Uuid,
    /// `job.succeeded`, `job.failed`, `job.cancelled`, `job.preempted`, `job.waiting`, `session.idle`.
    pub kind: String,
    pub job_id: Uuid,
    pub created_at: DateTime<Utc>,
    /// `delivered`, `retrying` (the next try at `next_attempt_at`) or `abandoned`.
    pub status: String,
    pub next_attempt_at: Option<DateTime<Utc>>,
    pub attempts: Vec<DeliveryAttempt>,
}

/// One try: when, how long, the receiver's status code or why there was none.
#[derive(Debug, Clone, Serialize, Deserialize, ToSchema)]
pub struct DeliveryAttempt {
    pub attempt: u32,
    pub at: DateTime<Utc>,
    pub duration_ms: u32,
    pub status_code: Option<u16>,
    pub error: Option<String>,
}

/// A subscription that follows every rule.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ValidSubscription {
    pub url: String,
    pub events: Vec<String>,
    pub tenant_wide: bool,
    pub slack: bool,
    pub wait_seconds: Option<u32>,
}

/// The longest wait a `waiting` subscription may ask for: 30 days.
pub const WAIT_SECONDS_MAX: u32 = 30 * 24 * 3600;

impl SubscriptionCreate {
    /// Every rule checked, each broken one named by its field, all at once. With
    /// `allow_private` false a URL naming a loopback, private or link-local address is refused
    /// (host names are checked when they are resolved, at each delivery).
    pub fn validate(&self, allow_private: bool) -> Result<ValidSubscription, Error> {
        let mut problems = Problems::default();
        match url::Url::parse(&self.url) {
            Err(_) if self.url.is_empty() => problems.add("url", "required: where to send the notices"),
            Err(err) => problems.add("url", format!("not a URL: {err}")),
            Ok(url) => {
                if !matches!(url.scheme(), "http" | "https") {
                    problems.add("url", format!("must be http or https, not {}", url.scheme()));
                } else if !url.username().is_empty() || url.password().is_some() {
                    problems.add("url", "must not hold credentials (they would be stored and shown in lists)");
                } else if self.url.len() > 2048 {
                    problems.add("url", "is longer than 2048 characters");
                } else {
                    let literal = match url.host() {
                        Some(url::Host::Ipv4(ip)) => Some(IpAddr::V4(ip)),
                        Some(url::Host::Ipv6(ip)) => Some(IpAddr::V6(ip)),
                        _ => None,
                    };
                    if let Some(ip) = literal
                        && !allow_private
                        && address_is_private(ip)
                    {
                        problems.add(
                            "url",
                            format!("{ip} is a private or local address; this server sends only to public ones"),
                        );
                    }
                }
            }
        }
        let mut events: Vec<String> = Vec::new();
        if self.events.is_empty() {
            problems.add("events", format!("name at least one of {}", EVENTS.join(", ")));
        }
        for event in &self.events {
            if !EVENTS.contains(&event.as_str()) {
                problems.add("events", format!("{event:?} is not one of {}", EVENTS.join(", ")));
            } else if !events.contains(event) {
                events.push(event.clone());
            }
        }
        let waiting = events.iter().any(|e| e == "waiting");
        match (waiting, self.wait_seconds) {
            (true, None) => problems.add("wait_seconds", "`waiting` needs how long a job waits before the notice"),
            (false, Some(_)) => problems.add("wait_seconds", "only for the `waiting` event"),
            (_, Some(s)) if s == 0 || s > WAIT_SECONDS_MAX => {
                problems.add("wait_seconds", format!("must be between 1 and {WAIT_SECONDS_MAX} (30 days)"))
            }
            _ => {}
        }
        let tenant_wide = match self.scope.as_deref() {
            None | Some("user") => false,
            Some("tenant") => true,
            Some(other) => {
                problems.add("scope", format!("{other:?} is neither `user` nor `tenant`"));
                false
            }
        };
        let slack = match self.format.as_deref() {
            None | Some("standard") => false,
            Some("slack") => true,
            Some(other) => {
                problems.add("format", format!("{other:?} is neither `standard` nor `slack`"));
                false
            }
        };
        problems.into_result()?;
        Ok(ValidSubscription { url: self.url.clone(), events, tenant_wide, slack, wait_seconds: self.wait_seconds })
    }
}

/// Whether a webhook to `ip` would reach this machine or a private network rather than the
/// internet: loopback, unspecified, private (RFC 1918, unique local), link-local (cloud
/// metadata services live at 169.254.169.254), shared (CGNAT), multicast, broadcast,
/// documentation and benchmarking ranges, and IPv4 mapped into IPv6.
pub fn address_is_private(ip: IpAddr) -> bool {
    match ip {
        IpAddr::V4(v4) => {
            let [a, b, ..] = v4.octets();
            v4.is_loopback()
                || v4.is_unspecified()
                || v4.is_private()
                || v4.is_link_local()
                || v4.is_multicast()
                || v4.is_broadcast()
                || v4.is_documentation()
                || a == 0
                || (a == 100 && (64..128).contains(&b))
                || (a == 198 && (b == 18 || b == 19))
                || a >= 240
        }
        IpAddr::V6(v6) => {
            if let Some(v4) = v6.to_ipv4_mapped() {
                return address_is_private(IpAddr::V4(v4));
            }
            let first = v6.segments()[0];
            v6.is_loopback()
                || v6.is_unspecified()
                || v6.is_multicast()
                || (first & 0xfe00) == 0xfc00
                || (first & 0xffc0) == 0xfe80
                || first == 0x2001 && v6.segments()[1] == 0x0db8
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn create(url: &str, events: &[&str]) -> SubscriptionCreate {
        SubscriptionCreate {
            url: url.into(),
            events: events.iter().map(|e| e.to_string()).collect(),
            scope: None,
            format: None,
            wait_seconds: None,
        }
    }

    #[test]
    fn every_bad_field_is_named_at_once() {
        let mut bad = create("ftp://example.com/hook", &["ended", "exploded"]);
        bad.scope = Some("world".into());
        bad.wait_seconds = Some(5);
        let problems = bad.validate(false).unwrap_err().field_problems();
        let fields: Vec<&str> = problems.iter().map(|p| p.field.as_str()).collect();
        assert_eq!(fields, ["url", "events", "wait_seconds", "scope"], "{problems:?}");
        assert!(problems[0].message.contains("http or https"), "{problems:?}");
        assert!(problems[1].message.contains("\"exploded\""), "{problems:?}");
    }

    #[test]
    fn private_addresses_are_refused_unless_allowed() {
        for url in ["http://127.0.0.1:9/h", "http://10.1.2.3/h", "http://169.254.169.254/latest", "http://[::1]/h"] {
            let err = create(url, &["failed"]).validate(false).unwrap_err();
            assert!(err.to_string().contains("private or local"), "{url}: {err}");
            assert!(create(url, &["failed"]).validate(true).is_ok(), "{url}");
        }
        assert!(create("https://hooks.example.com/x", &["failed"]).validate(false).is_ok());
        assert!(!address_is_private("93.184.216.34".parse().unwrap()));
        assert!(address_is_private("::ffff:192.168.1.1".parse().unwrap()));
    }

    #[test]
    fn credentials_in_the_url_are_refused() {
        let err = create("https://user:pw@example.com/h", &["ended"]).validate(true).unwrap_err();
        assert!(err.to_string().contains("credentials"), "{err}");
    }

    #[test]
    fn waiting_needs_its_threshold() {
        let err = create("https://example.com/h", &["waiting"]).validate(false).unwrap_err();
        assert!(err.to_string().contains("how long"), "{err}");
        let mut ok = create("https://example.com/h", &["waiting", "waiting"]);
        ok.wait_seconds = Some(60);
        assert_eq!(ok.validate(false).unwrap().events, ["waiting"]);
    }
}
