//! What an attempt's observed replicas mean, as one pure function: still running, to be
//! stopped, or ended (succeeded, failed with which replica's cause, lost, cancelled, preempted),
//! and whether a failure restarts the job. The restart rule is [`state_after_failure`], the only
//! place it is written. The reconciler does the I/O around it (asking the executor, reading a
//! replica's last log line for the reason, recording the end).

use std::time::Duration;

use trainyard_core::job::JobState;
use trainyard_executor::ReplicaStatus;

/// The reason recorded when a replica vanished without an exit status.
pub const REASON_LOST: &str = "lost";

/// What the loop knows of a job when it looks at its attempt.
#[derive(Debug, Clone, Copy)]
pub struct JobFacts {
    pub cancel_requested: bool,
    pub preempt_requested: bool,
    /// The attempt has run as long as the job's time limit (in seconds) allows.
    pub time_limit_reached: Option<u32>,
    pub restart_count: i32,
    pub max_restarts: i32,
    /// This server asked the attempt's replicas to stop (SIGTERM): an exit after that is not
    /// the program finishing on its own.
    pub stop_sent: bool,
}

/// The replica whose end explains the attempt's failure.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Failure {
    /// The cluster's verdict on a replica (OOMKilled, Evicted, NodeLost, ...), in words.
    External(String),
    /// Replica `rank` exited with `code`.
    Exited { rank: usize, code: i32 },
    /// Replica `rank` vanished without an exit status.
    Lost { rank: usize },
}

/// What the observation means for the attempt.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Verdict {
    /// Replicas run and nothing asks them to stop; `all_started` once none waits for a node or
    /// an image any more.
    Running { all_started: bool },
    /// Replicas still run but the attempt must end (cancelled, preempted, or one failed and the
    /// gang fails with it): stop them; the end is recorded once none runs.
    Stop,
    /// No replica runs any more: the attempt ended and the job moves to `to`.
    Ended { to: JobState, cause: EndCause },
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum EndCause {
    Cancelled,
    Preempted,
    /// Stopped at its time limit (seconds): the job fails, with no restart.
    TimedOut(u32),
    Failed(Failure),
    Succeeded,
}

/// After a failed attempt (a failed run or a failed launch): another attempt while restarts
/// remain, else the job failed.
pub fn state_after_failure(restart_count: i32, max_restarts: i32) -> JobState {
    if restart_count < max_restarts { JobState::Restarting } else { JobState::Failed }
}

/// The longest a restart waits.
pub const RESTART_DELAY_MAX: Duration = Duration::from_secs(300);

/// How long after its failed attempt ended a job's `restart`-th restart (1, 2, ...) waits:
/// `base`, then twice as long each time, at most [`RESTART_DELAY_MAX`] (as Kubernetes backs off a
/// crashing container), so that a failing dependency gets time to come back and a crash loop
/// does not burn every restart in seconds.
pub fn restart_delay(base: Duration, restart: i32) -> Duration {
    let doublings = u32::try_from(restart.saturating_sub(1)).unwrap_or(0).min(20);
    base.saturating_mul(1 << doublings).min(RESTART_DELAY_MAX.max(base))
}

/// How a replica ended, for its reason: "exited with code 3", and for a code above 128 the
/// signal that ended it (a shell's and the executors' convention: 128 + the signal's number),
/// "exited with code 137 (SIGKILL: killed, for example for memory or at a deadline)".
pub fn exit_description(code: i32) -> String {
    let signal =
        code.checked_sub(128).filter(|n| (1..=64).contains(n)).and_then(|n| nix::sys::signal::Signal::try_from(n).ok());
    match signal {
        Some(nix::sys::signal::Signal::SIGKILL) => {
            format!("exited with code {code} (SIGKILL: killed, for example for memory or at a deadline)")
        }
        Some(signal) => format!("exited with code {code} ({})", signal.as_str()),
        None => format!("exited with code {code}"),
    }
}

/// A hint for a command that was not found because it is a shell line given as one word
/// (`yard submit -- "echo hi && ls"`): commands run without a shell.
pub fn shell_hint(code: i32, command: &[String]) -> Option<String> {
    let program = command.first()?;
    let shell_line = program.contains(char::is_whitespace) || program.contains(['&', '|', ';', '<', '>', '$', '`']);
    (code == 127 && shell_line)
        .then(|| format!("; commands run without a shell: to run a shell line, submit `sh -c '{program}'`"))
}

/// Why a failure will happen again however often it is retried, from the exit code and the
/// replica's last log line: a command that is not there or cannot run, a Python import or
/// syntax error. `None` for failures a restart may cure.
pub fn deterministic_failure(code: i32, last_line: Option<&str>) -> Option<&'static str> {
    match code {
        127 => return Some("the command was not found"),
        126 => return Some("the command cannot be executed"),
        _ => {}
    }
    let line = last_line?.trim_start();
    let python = ["ModuleNotFoundError", "ImportError", "SyntaxError", "IndentationError", "TabError"];
    python.iter().any(|error| line.starts_with(error)).then_some("a Python import or syntax error")
}

/// The failure that explains the others: the cluster's verdict first, then an exit code of the
/// program's own before one from a signal (the rest of a gang is stopped with SIGTERM), then a
/// vanished replica; the lowest rank among equals.
pub fn failure_of(statuses: &[ReplicaStatus], external: Option<String>) -> Option<Failure> {
    if let Some(sentence) = external {
        return Some(Failure::External(sentence));
    }
    statuses
        .iter()
        .enumerate()
        .filter_map(|(rank, status)| match status {
            ReplicaStatus::Exited(0) | ReplicaStatus::Running => None,
            ReplicaStatus::Exited(code) => Some((u8::from(*code >= 128), rank, Some(*code))),
            ReplicaStatus::Lost => Some((2, rank, None)),
        })
        .min()
        .map(|(_, rank, code)| match code {
            Some(code) => Failure::Exited { rank, code },
            None => Failure::Lost { rank },
        })
}

/// The decision table of an observed attempt. `pending` says whether a replica still waits for
/// a node or its image (it counts as running); `external` is the cluster's verdict on a replica,
/// if any.
pub fn attempt_verdict(job: JobFacts, statuses: &[ReplicaStatus], pending: bool, external: Option<String>) -> Verdict {
    let running = statuses.contains(&ReplicaStatus::Running);
    let failure = failure_of(statuses, external);
    let stopping = job.cancel_requested || job.preempt_requested || job.time_limit_reached.is_some();
    if running {
        return if stopping || failure.is_some() { Verdict::Stop } else { Verdict::Running { all_started: !pending } };
    }
    // Every replica exited 0: the work is done. A preemption never sends finished work back to
    // the queue to run again, even when its stop signal crossed the replicas' own exit (as
    // Kubernetes counts a Job's succeeded pods and Kueue finishes their workload). A cancel
    // wins unless the replicas had finished before this server asked them to stop.
    let all_exited_0 = !statuses.is_empty() && statuses.iter().all(|s| *s == ReplicaStatus::Exited(0));
    let (to, cause) = if job.cancel_requested && (job.stop_sent || !all_exited_0) {
        (JobState::Cancelled, EndCause::Cancelled)
    } else if all_exited_0 {
        (JobState::Succeeded, EndCause::Succeeded)
    } else if job.preempt_requested {
        // Back to the queue; the next attempt resumes from the job's last checkpoint.
        (JobState::Queued, EndCause::Preempted)
    } else if let Some(limit) = job.time_limit_reached
        && (failure.is_some() || statuses.iter().any(|s| *s != ReplicaStatus::Exited(0)))
    {
        // Stopped at its limit (its replicas then exit by the signal): it ran out of time.
        (JobState::Failed, EndCause::TimedOut(limit))
    } else if let Some(failure) = failure {
        (state_after_failure(job.restart_count, job.max_restarts), EndCause::Failed(failure))
    } else {
        (JobState::Succeeded, EndCause::Succeeded)
    };
    Verdict::Ended { to, cause }
}

#[cfg(test)]
mod tests {
    use super::*;
    use ReplicaStatus::{Exited, Lost, Running};

    const FRESH: JobFacts = JobFacts {
        cancel_requested: false,
        preempt_requested: false,
        time_limit_reached: None,
        restart_count: 0,
        max_restarts: 2,
        stop_sent: false,
    };

    fn ended(to: JobState, cause: EndCause) -> Verdict {
        Verdict::Ended { to, cause }
    }

    /// Every row of the table, in the order the function decides.
    #[test]
    fn the_decision_table() {
        let no_restarts_left = JobFacts { restart_count: 2, ..FRESH };
        let cancel = JobFacts { cancel_requested: true, ..FRESH };
        let preempt = JobFacts { preempt_requested: true, ..FRESH };
        let preempt_sent = JobFacts { preempt_requested: true, stop_sent: true, ..FRESH };
        let cancel_sent = JobFacts { cancel_requested: true, stop_sent: true, ..FRESH };
        let out_of_time = JobFacts { time_limit_reached: Some(60), ..FRESH };
        // name, job, replica statuses, a replica pending, the cluster's verdict, expected
        type Row = (&'static str, JobFacts, Vec<ReplicaStatus>, bool, Option<&'static str>, Verdict);
        let rows: Vec<Row> = vec![
            ("all running", FRESH, vec![Running, Running], false, None, Verdict::Running { all_started: true }),
            ("one still pending", FRESH, vec![Running, Running], true, None, Verdict::Running { all_started: false }),
            ("time limit reached, replicas run", out_of_time, vec![Running, Running], false, None, Verdict::Stop),
            (
                "time limit reached, replicas stopped",
                out_of_time,
                vec![Exited(143), Exited(143)],
                false,
                None,
                ended(JobState::Failed, EndCause::TimedOut(60)),
            ),
            (
                "time limit reached as every replica succeeded",
                out_of_time,
                vec![Exited(0), Exited(0)],
                false,
                None,
                ended(JobState::Succeeded, EndCause::Succeeded),
            ),
            (
                "all exited 0",
                FRESH,
                vec![Exited(0), Exited(0)],
                false,
                None,
                ended(JobState::Succeeded, EndCause::Succeeded),
            ),
            ("one failed, the gang still runs", FRESH, vec![Exited(3), Running], false, None, Verdict::Stop),
            (
                "one failed, restarts left",
                FRESH,
                vec![Exited(0), Exited(3)],
                false,
                None,
                ended(JobState::Restarting, EndCause::Failed(Failure::Exited { rank: 1, code: 3 })),
            ),
            (
                "one failed, no restarts left",
                no_restarts_left,
                vec![Exited(3), Exited(0)],
                false,
                None,
                ended(JobState::Failed, EndCause::Failed(Failure::Exited { rank: 0, code: 3 })),
            ),
            (
                "the program's own code explains before the SIGTERM of the others",
                FRESH,
                vec![Exited(143), Exited(1)],
                false,
                None,
                ended(JobState::Restarting, EndCause::Failed(Failure::Exited { rank: 1, code: 1 })),
            ),
            (
                "lost",
                no_restarts_left,
                vec![Exited(0), Lost],
                false,
                None,
                ended(JobState::Failed, EndCause::Failed(Failure::Lost { rank: 1 })),
            ),
            (
                "an exit code explains before a vanished replica",
                FRESH,
                vec![Lost, Exited(137)],
                false,
                None,
                ended(JobState::Restarting, EndCause::Failed(Failure::Exited { rank: 1, code: 137 })),
            ),
            (
                "the cluster's verdict explains first",
                FRESH,
                vec![Exited(137)],
                false,
                Some("replica 0 was OOMKilled"),
                ended(JobState::Restarting, EndCause::Failed(Failure::External("replica 0 was OOMKilled".into()))),
            ),
            ("cancel requested, still running", cancel, vec![Running], false, None, Verdict::Stop),
            (
                "cancel requested, stopped",
                cancel,
                vec![Exited(143)],
                false,
                None,
                ended(JobState::Cancelled, EndCause::Cancelled),
            ),
            ("preempt requested, still running", preempt, vec![Running, Exited(0)], false, None, Verdict::Stop),
            (
                "preempt requested, stopped",
                preempt_sent,
                vec![Exited(143)],
                false,
                None,
                ended(JobState::Queued, EndCause::Preempted),
            ),
            (
                "preempt requested, every replica exited 0 as the stop crossed its end: done",
                preempt_sent,
                vec![Exited(0)],
                false,
                None,
                ended(JobState::Succeeded, EndCause::Succeeded),
            ),
            (
                "preempt requested after every replica finished: done, not run again",
                preempt,
                vec![Exited(0), Exited(0)],
                false,
                None,
                ended(JobState::Succeeded, EndCause::Succeeded),
            ),
            (
                "cancel requested after every replica finished: it succeeded",
                cancel,
                vec![Exited(0)],
                false,
                None,
                ended(JobState::Succeeded, EndCause::Succeeded),
            ),
            (
                "cancel requested, stopped, exits 0 on SIGTERM",
                cancel_sent,
                vec![Exited(0)],
                false,
                None,
                ended(JobState::Cancelled, EndCause::Cancelled),
            ),
            (
                "a cancel wins over a failure",
                JobFacts { cancel_requested: true, ..no_restarts_left },
                vec![Exited(1)],
                false,
                None,
                ended(JobState::Cancelled, EndCause::Cancelled),
            ),
        ];
        for (name, job, statuses, pending, external, expected) in rows {
            assert_eq!(attempt_verdict(job, &statuses, pending, external.map(str::to_string)), expected, "{name}");
        }
    }

    #[test]
    fn the_restart_rule() {
        assert_eq!(state_after_failure(0, 0), JobState::Failed);
        assert_eq!(state_after_failure(0, 1), JobState::Restarting);
        assert_eq!(state_after_failure(1, 1), JobState::Failed);
        assert_eq!(state_after_failure(2, 3), JobState::Restarting);
    }

    #[test]
    fn restarts_wait_twice_as_long_each_time_up_to_five_minutes() {
        let base = Duration::from_secs(10);
        let delays: Vec<u64> = (1..=7).map(|n| restart_delay(base, n).as_secs()).collect();
        assert_eq!(delays, [10, 20, 40, 80, 160, 300, 300]);
        assert_eq!(restart_delay(Duration::ZERO, 5), Duration::ZERO, "no back-off when the base is 0");
        assert_eq!(restart_delay(base, 1_000_000), RESTART_DELAY_MAX);
    }

    #[test]
    fn failures_that_would_repeat_are_told_from_those_a_restart_may_cure() {
        let cases = [
            (127, None, true),
            (126, Some("sh: ./train.sh: Permission denied"), true),
            (1, Some("ModuleNotFoundError: No module named 'torch'"), true),
            (1, Some("ImportError: cannot import name 'x' from 'y'"), true),
            (1, Some("  SyntaxError: invalid syntax"), true),
            (1, Some("RuntimeError: NCCL error: unhandled system error"), false),
            (1, Some("torch.OutOfMemoryError: CUDA out of memory"), false),
            (137, None, false),
            (1, None, false),
        ];
        for (code, line, repeats) in cases {
            assert_eq!(deterministic_failure(code, line).is_some(), repeats, "{code} {line:?}");
        }
    }

    #[test]
    fn a_code_from_a_signal_names_the_signal() {
        assert_eq!(exit_description(3), "exited with code 3");
        assert_eq!(
            exit_description(137),
            "exited with code 137 (SIGKILL: killed, for example for memory or at a deadline)"
        );
        assert_eq!(exit_description(143), "exited with code 143 (SIGTERM)");
        assert_eq!(exit_description(139), "exited with code 139 (SIGSEGV)");
        assert_eq!(exit_description(255), "exited with code 255");
    }

    #[test]
    fn a_shell_line_given_as_one_word_gets_a_hint() {
        let line = vec!["echo hi && ls".to_string()];
        assert!(shell_hint(127, &line).unwrap().contains("sh -c 'echo hi && ls'"));
        assert_eq!(shell_hint(1, &line), None, "only when the command was not found");
        assert_eq!(shell_hint(127, &["no-such-program".to_string()]), None);
    }
}
