//! Webhooks as the notifications' delivery worker sends them (`app/notifications.rs`): the
//! body (a Standard Webhooks event or a Slack message), its signature, the HTTP client and
//! the retry schedule.
//!
//! **Signature** (Standard Webhooks, as Svix and Stripe sign): headers `webhook-id` (the
//! notice's id, the same on every retry: receivers dedupe by it), `webhook-timestamp` (Unix
//! seconds of this try: receivers refuse old ones, against replay) and `webhook-signature`:
//! `v1,` and the base64 of HMAC-SHA256 over `{id}.{timestamp}.{body}` with the subscription's
//! key. The key is derived from the server's signing key and the subscription's id, so no table
//! holds it; the subscriber is shown it once, as `whsec_<base64>`.
//!
//! **Where it may send** (server-side request forgery): only `http`/`https`, no redirects
//! followed, 5 s to connect and 10 s in all. Unless the operator allows private addresses
//! (`--notify-allow-private-addresses`), a URL naming a loopback, private, link-local (cloud
//! metadata) or other non-public address is refused at creation, and a host name is resolved
//! by [`PublicOnly`], which drops such addresses: the connection goes to the addresses checked,
//! so a name that later resolves elsewhere (DNS rebinding) is checked again.

use std::net::{IpAddr, SocketAddr};
use std::sync::Arc;
use std::time::Duration;

use base64::Engine;
use chrono::{DateTime, Utc};
use hmac::{Hmac, Mac};
use sha2::Sha256;
use trainyard_core::notifications::address_is_private;

/// Tries of one notice before it is given up: with the schedule of [`retry_delay`], about 4
/// hours after the first.
pub const TRIES_MAX: i32 = 18;

/// The wait after the `tries`-th failed try: 1 s doubled each time, at most 30 minutes, with
/// "equal jitter" (half of it fixed, half random) so that receivers coming back from an outage
/// are not hit by every sender at once.
pub fn retry_delay(tries: i32, random: f64) -> Duration {
    let base = Duration::from_secs(1).saturating_mul(1u32 << tries.clamp(0, 20) as u32);
    let capped = base.min(Duration::from_secs(30 * 60));
    capped / 2 + capped.mul_f64(random.clamp(0.0, 1.0) / 2.0)
}

/// The secret as the subscriber is shown it.
pub fn secret_text(key: &[u8]) -> String {
    format!("whsec_{}", base64::engine::general_purpose::STANDARD.encode(key))
}

/// The `webhook-signature` header of `body` sent as notice `id` at `timestamp`.
pub fn signature(key: &[u8], id: &str, timestamp: i64, body: &[u8]) -> String {
    let mut mac = Hmac::<Sha256>::new_from_slice(key).expect("HMAC takes keys of any length");
    mac.update(format!("{id}.{timestamp}.").as_bytes());
    mac.update(body);
    format!("v1,{}", base64::engine::general_purpose::STANDARD.encode(mac.finalize().into_bytes()))
}

/// The body of a notice: the stored event as a Standard Webhooks event (`type`, `timestamp`,
/// `data`), or a Slack incoming webhook's message.
pub fn body(kind: &str, created_at: DateTime<Utc>, payload: &serde_json::Value, slack: bool) -> Vec<u8> {
    let value = if slack {
        serde_json::json!({ "text": slack_text(kind, payload) })
    } else {
        serde_json::json!({ "type": kind, "timestamp": created_at.to_rfc3339(), "data": payload })
    };
    serde_json::to_vec(&value).expect("JSON values serialize")
}

fn slack_text(kind: &str, payload: &serde_json::Value) -> String {
    let text = |key: &str| payload[key].as_str().unwrap_or_default().to_string();
    let id = text("job_id");
    let short = id.get(..8).unwrap_or(&id);
    let what = match kind {
        "job.succeeded" => "succeeded".to_string(),
        "job.failed" => "failed".to_string(),
        "job.cancelled" => "was cancelled".to_string(),
        "job.preempted" => "was preempted and is queued again".to_string(),
        "job.waiting" => format!("has waited more than {} s in the queue", payload["wait_seconds"]),
        "session.idle" => "(a notebook) is idle and will be stopped".to_string(),
        other => other.to_string(),
    };
    let reason = text("reason");
    let reason = if reason.is_empty() { String::new() } else { format!(": {reason}") };
    format!("Job `{}` ({short}) of {} {what}{reason}", text("job_name"), text("tenant"))
}

/// A resolver that keeps only public addresses (see the module's notes).
pub struct PublicOnly;

impl reqwest::dns::Resolve for PublicOnly {
    fn resolve(&self, name: reqwest::dns::Name) -> reqwest::dns::Resolving {
        let host = name.as_str().to_string();
        Box::pin(async move {
            let all: Vec<SocketAddr> = tokio::net::lookup_host((host.as_str(), 0)).await?.collect();
            let public: Vec<SocketAddr> = all.iter().copied().filter(|a| !address_is_private(a.ip())).collect();
            if public.is_empty() {
                let shown: Vec<String> = all.iter().map(|a| a.ip().to_string()).collect();
                return Err(format!(
                    "{host} resolves only to private or local addresses ({}); this server sends only to public ones",
                    shown.join(", ")
                )
                .into());
            }
            let addrs: reqwest::dns::Addrs = Box::new(public.into_iter());
            Ok(addrs)
        })
    }
}

/// The client notices are sent with.
pub fn client(allow_private: bool) -> reqwest::Client {
    let mut builder = reqwest::Client::builder()
        .redirect(reqwest::redirect::Policy::none())
        .connect_timeout(Duration::from_secs(5))
        .timeout(Duration::from_secs(10))
        .user_agent("trainyard-webhooks/1");
    if !allow_private {
        builder = builder.dns_resolver(Arc::new(PublicOnly));
    }
    builder.build().expect("a client with a resolver and timeouts builds")
}

/// Why `url` must not be sent to now (an address literal that is not public), if so.
pub fn refused_literal(url: &str, allow_private: bool) -> Option<String> {
    if allow_private {
        return None;
    }
    let parsed = url::Url::parse(url).ok()?;
    let ip: IpAddr = match parsed.host()? {
        url::Host::Ipv4(ip) => ip.into(),
        url::Host::Ipv6(ip) => ip.into(),
        url::Host::Domain(_) => return None,
    };
    address_is_private(ip).then(|| format!("{ip} is a private or local address; this server sends only to public ones"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_signature_is_standard_webhooks() {
        // The example of the Standard Webhooks specification (its test vector).
        let key = base64::engine::general_purpose::STANDARD.decode("MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw").unwrap();
        let body = br#"{"test": 2432232314}"#;
        assert_eq!(
            signature(&key, "msg_p5jXN8AQM9LWM0D4loKWxJek", 1614265330, body),
            "v1,g0hM9SsE+OTPJTGt/tmIKtSyZlE3uFJELVlNIOLJ1OE="
        );
    }

    #[test]
    fn retries_back_off_with_jitter_up_to_a_cap() {
        assert_eq!(retry_delay(0, 0.0), Duration::from_millis(500));
        assert_eq!(retry_delay(0, 1.0), Duration::from_secs(1));
        assert_eq!(retry_delay(3, 1.0), Duration::from_secs(8));
        assert_eq!(retry_delay(30, 1.0), Duration::from_secs(1800));
        assert!(retry_delay(30, 0.0) >= Duration::from_secs(900));
    }

    #[test]
    fn a_slack_message_names_the_job_and_why() {
        let payload = serde_json::json!({"job_id": "01234567-89ab", "job_name": "train", "tenant": "vision",
                                         "reason": "exit code 3"});
        let body: serde_json::Value = serde_json::from_slice(&body("job.failed", Utc::now(), &payload, true)).unwrap();
        assert_eq!(body["text"], "Job `train` (01234567) of vision failed: exit code 3");
    }

    #[test]
    fn private_literals_are_refused_at_send_time() {
        assert!(refused_literal("http://127.0.0.1:8/h", false).is_some());
        assert!(refused_literal("http://127.0.0.1:8/h", true).is_none());
        assert!(refused_literal("https://example.com/h", false).is_none());
    }
}
