//! Throttling failed authentication, by credential first. Anyone presenting the same wrong
//! token (by its first characters) more than [`FAILURES_PER_TOKEN`] times a minute is refused
//! with 429 and `Retry-After` until its allowance has grown back, before the token is looked up:
//! probing a leaked token's neighbours costs the attacker time and the database nothing.
//!
//! A client address that presents more than [`FAILURES_PER_CLIENT`] tokens a minute that do not
//! authenticate gets 429 instead of 401 for its next failures, but a valid credential from it is
//! always served: many tenants share one address (jobs on one host, a proxy, a node's cache
//! agent), and one of them guessing must not lock the others out. Successful authentication
//! costs nothing here. The allowances are GCRA limiters (`governor`), in memory per server
//! replica.
//!
//! Not per account: a credential is a random token found by its hash, with no account part that
//! a guess could name, and passwords are the identity provider's, which throttles its own.

use std::collections::HashMap;
use std::net::IpAddr;
use std::num::NonZeroU32;
use std::sync::Mutex;
use std::time::{Duration, Instant};

use governor::clock::{Clock, DefaultClock};
use governor::{DefaultKeyedRateLimiter, Quota};
use trainyard_core::Error;

/// Failed authentications a client may have per minute (all at once, then one per 2 s).
pub const FAILURES_PER_CLIENT: u32 = 30;
/// Failed authentications with one token (by its prefix) per minute.
pub const FAILURES_PER_TOKEN: u32 = 10;
/// The characters of a presented token that name it for throttling: the `tyd_` prefix and 8 of
/// its random characters.
const TOKEN_PREFIX_CHARS: usize = 12;

pub struct AuthThrottle {
    by_client: DefaultKeyedRateLimiter<IpAddr>,
    by_token: DefaultKeyedRateLimiter<String>,
    /// Who is refused until when, once an allowance ran out.
    blocked: Mutex<HashMap<Blocked, Instant>>,
}

#[derive(Debug, Clone, PartialEq, Eq, Hash)]
enum Blocked {
    Client(IpAddr),
    Token(String),
}

impl Default for AuthThrottle {
    fn default() -> Self {
        let per_minute = |n: u32| Quota::per_minute(NonZeroU32::new(n).expect("a positive allowance"));
        AuthThrottle {
            by_client: DefaultKeyedRateLimiter::keyed(per_minute(FAILURES_PER_CLIENT)),
            by_token: DefaultKeyedRateLimiter::keyed(per_minute(FAILURES_PER_TOKEN)),
            blocked: Mutex::new(HashMap::new()),
        }
    }
}

fn token_key(token: &str) -> String {
    token.chars().take(TOKEN_PREFIX_CHARS).collect()
}

impl AuthThrottle {
    fn blocked(&self) -> std::sync::MutexGuard<'_, HashMap<Blocked, Instant>> {
        self.blocked.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    /// Refuses a token (by its prefix) that failed too often, with how long to wait: before it
    /// is looked up.
    pub fn check(&self, token: &str) -> Result<(), Error> {
        self.refusal(&Blocked::Token(token_key(token)))
    }

    /// After a failure: refuses its client when the client failed too often (a 429 in place of
    /// the 401), with how long to wait.
    pub fn check_client(&self, client: Option<IpAddr>) -> Result<(), Error> {
        client.map_or(Ok(()), |ip| self.refusal(&Blocked::Client(ip)))
    }

    fn refusal(&self, key: &Blocked) -> Result<(), Error> {
        let now = Instant::now();
        match self.blocked().get(key).filter(|until| **until > now) {
            Some(until) => Err(Error::TooManyRequests {
                message: "too many failed authentications; wait before trying again".into(),
                retry_after_secs: (*until - now).as_secs().max(1),
            }),
            None => Ok(()),
        }
    }

    /// Counts a failed authentication against the client and the token; once either has no
    /// allowance left, it is refused until the allowance has grown back.
    pub fn failed(&self, client: Option<IpAddr>, token: &str) {
        let clock = DefaultClock::default();
        let mut outcomes = vec![(Blocked::Token(token_key(token)), self.by_token.check_key(&token_key(token)))];
        if let Some(ip) = client {
            outcomes.push((Blocked::Client(ip), self.by_client.check_key(&ip)));
        }
        for (key, outcome) in outcomes {
            if let Err(not_until) = outcome {
                let wait: Duration = not_until.wait_time_from(clock.now());
                tracing::warn!(?key, retry_after = ?wait, "throttling failed authentications");
                let mut blocked = self.blocked();
                let now = Instant::now();
                // Expired entries go here, on the failure path, never on every request's check.
                blocked.retain(|_, until| *until > now);
                blocked.insert(key, now + wait);
            }
        }
        // Keep the limiters' tables from growing without bound under a scan of many keys.
        if self.by_token.len() > 100_000 {
            self.by_token.retain_recent();
        }
        if self.by_client.len() > 100_000 {
            self.by_client.retain_recent();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_client_failing_too_often_is_refused_and_others_are_not() {
        let throttle = AuthThrottle::default();
        let (attacker, bystander) = (Some("10.0.0.1".parse().unwrap()), Some("10.0.0.2".parse().unwrap()));
        for i in 0..FAILURES_PER_CLIENT + 1 {
            assert!(throttle.check_client(attacker).is_ok(), "failure {i} is still allowed");
            throttle.failed(attacker, &format!("tyd_{i:08}"));
        }
        let refused = throttle.check_client(attacker).unwrap_err();
        assert!(matches!(refused, Error::TooManyRequests { retry_after_secs, .. } if retry_after_secs >= 1));
        assert!(throttle.check("tyd_someother").is_ok(), "another token from it is still looked up");
        assert!(throttle.check_client(bystander).is_ok(), "another client is not held back");
    }

    #[test]
    fn one_token_failing_too_often_is_refused_from_any_client() {
        let throttle = AuthThrottle::default();
        for i in 0..FAILURES_PER_TOKEN + 1 {
            let client = Some(IpAddr::from([10, 0, 1, i as u8]));
            throttle.failed(client, "tyd_deadbeef0000");
        }
        assert!(throttle.check("tyd_deadbeef1111").is_err());
        assert!(throttle.check("tyd_cafebabe1111").is_ok());
    }
}
