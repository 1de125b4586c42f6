//! How the control loop is doing, shared between the loop (which reports) and the readiness
//! endpoint (which reads): whether this server leads, when its loop last completed a pass, the
//! panics it survived, and the jobs it could not handle. In memory only: a restarted server
//! starts afresh, and the first pass after it tells the truth again.

use std::sync::Mutex;
use std::time::{Duration, Instant};

use serde::Serialize;
use utoipa::ToSchema;

pub struct LoopHealth {
    /// A leader whose loop completed no pass for this long is unready.
    max_pass_age: Duration,
    state: Mutex<State>,
}

#[derive(Default)]
struct State {
    /// Since when this server leads; `None` while it stands by.
    leading_since: Option<Instant>,
    last_pass: Option<Instant>,
    panics: u64,
    last_panic: Option<String>,
    unhandled_jobs: usize,
    fenced_writes: u64,
    abandoned_launches: u64,
}

/// What `/readyz` answers.
#[derive(Debug, Clone, Serialize, ToSchema)]
pub struct Readiness {
    /// Ready to serve: the database answers, and if this server leads, its control loop
    /// completed a pass recently.
    pub ready: bool,
    pub database: bool,
    /// Whether this server runs the control loops (one leader among replicas).
    pub leader: bool,
    /// Seconds since the leader's loop last completed a pass.
    pub last_pass_seconds_ago: Option<f64>,
    /// Panics the loop caught and survived since this server started.
    pub panics: u64,
    pub last_panic: Option<String>,
    /// Jobs the last pass skipped because they cannot be handled (see their reason).
    pub unhandled_jobs: usize,
    /// Control-loop writes the database refused because this server had lost the leadership
    /// it wrote with (fencing).
    pub fenced_writes: u64,
    /// Launches this server cut short when it lost the leadership, for the next leader to
    /// resume (see `control::launcher`).
    pub abandoned_launches: u64,
    /// How jobs on this server's machine fall short of confinement (replicas not isolated as
    /// their tenant's user, not confined in cgroups): empty when they are fully confined. Not a
    /// reason to be unready; an operator's to know.
    pub node_warnings: Vec<String>,
}

impl LoopHealth {
    pub fn new(max_pass_age: Duration) -> LoopHealth {
        LoopHealth { max_pass_age, state: Mutex::default() }
    }

    fn with<T>(&self, f: impl FnOnce(&mut State) -> T) -> T {
        // A panic while holding this lock leaves plain counters behind: keep using them.
        let mut state = self.state.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
        f(&mut state)
    }

    pub fn leading(&self, leading: bool) {
        self.with(|s| match (leading, s.leading_since) {
            (true, None) => s.leading_since = Some(Instant::now()),
            (false, _) => s.leading_since = None,
            _ => {}
        });
    }

    /// Whether this server holds the lease now.
    pub fn is_leading(&self) -> bool {
        self.with(|s| s.leading_since.is_some())
    }

    pub fn pass_completed(&self, unhandled_jobs: usize) {
        self.with(|s| {
            s.last_pass = Some(Instant::now());
            s.unhandled_jobs = unhandled_jobs;
        });
    }

    pub fn fenced_write(&self) {
        self.with(|s| s.fenced_writes += 1);
    }

    pub fn launches_abandoned(&self, count: usize) {
        self.with(|s| s.abandoned_launches += count as u64);
    }

    pub fn panicked(&self, message: String) {
        self.with(|s| {
            s.panics += 1;
            s.last_panic = Some(message);
        });
    }

    /// The report, unready when this server leads and its loop has not completed a pass within
    /// the maximum age (counted from when it began to lead, for a new leader).
    pub fn readiness(&self, database: bool) -> Readiness {
        let max_pass_age = self.max_pass_age;
        self.with(|s| {
            let since_pass = s.last_pass.map(|at| at.elapsed());
            let loop_ok = match s.leading_since {
                None => true,
                Some(since) => {
                    let reference = s.last_pass.map_or(since, |pass| pass.max(since));
                    reference.elapsed() <= max_pass_age
                }
            };
            Readiness {
                ready: database && loop_ok,
                database,
                leader: s.leading_since.is_some(),
                last_pass_seconds_ago: since_pass.map(|d| (d.as_secs_f64() * 1000.0).round() / 1000.0),
                panics: s.panics,
                last_panic: s.last_panic.clone(),
                unhandled_jobs: s.unhandled_jobs,
                fenced_writes: s.fenced_writes,
                abandoned_launches: s.abandoned_launches,
                node_warnings: Vec::new(),
            }
        })
    }
}

/// The text of a caught panic's payload.
pub fn panic_message(payload: &(dyn std::any::Any + Send)) -> String {
    payload
        .downcast_ref::<&str>()
        .map(|s| s.to_string())
        .or_else(|| payload.downcast_ref::<String>().cloned())
        .unwrap_or_else(|| "a panic without a message".to_string())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_leader_whose_loop_stalls_goes_unready_and_a_standby_stays_ready() {
        let health = LoopHealth::new(Duration::from_millis(50));
        assert!(health.readiness(true).ready, "a standby is ready while the database answers");
        assert!(!health.readiness(false).ready);
        health.leading(true);
        assert!(health.readiness(true).ready, "a new leader has time for its first pass");
        std::thread::sleep(Duration::from_millis(60));
        assert!(!health.readiness(true).ready, "no pass within the limit");
        health.pass_completed(2);
        let report = health.readiness(true);
        assert!(report.ready && report.leader);
        assert_eq!(report.unhandled_jobs, 2);
        health.panicked("boom".into());
        let report = health.readiness(true);
        assert_eq!((report.panics, report.last_panic.as_deref()), (1, Some("boom")));
        health.leading(false);
        std::thread::sleep(Duration::from_millis(60));
        assert!(health.readiness(true).ready, "a server that stopped leading is judged as a standby");
    }
}
