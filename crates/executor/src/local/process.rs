//! Facts about processes from the process table: is this pid still the process we started?

use nix::sys::signal::{Signal, killpg};
use nix::unistd::Pid;

/// The kernel's start time of a process (clock ticks after boot), which together with the pid
/// names one process for good: a recycled pid has a different start time.
pub fn start_time(pid: u32) -> Option<u64> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    // The command name (field 2) may hold spaces and parentheses; fields after the last ')'.
    let after = &stat[stat.rfind(')')? + 2..];
    let fields: Vec<&str> = after.split_whitespace().collect();
    // `after` starts at field 3 (state); starttime is field 22.
    fields.get(19)?.parse().ok()
}

/// True while the process we started (pid + start time) exists and has not exited.
pub fn is_alive(pid: u32, started: u64) -> bool {
    let Ok(stat) = std::fs::read_to_string(format!("/proc/{pid}/stat")) else {
        return false;
    };
    let Some(close) = stat.rfind(')') else {
        return false;
    };
    let state = stat[close + 2..].chars().next();
    // Z: exited, waiting to be reaped; X: dead.
    !matches!(state, Some('Z') | Some('X')) && start_time(pid) == Some(started)
}

/// Sends a signal to a whole process group; a group that is gone already is fine.
pub fn signal_group(pgid: u32, signal: Signal) {
    let Ok(raw) = i32::try_from(pgid) else { return };
    match killpg(Pid::from_raw(raw), signal) {
        Ok(()) | Err(nix::errno::Errno::ESRCH) => {}
        Err(err) => tracing::warn!(pgid, %signal, %err, "could not signal process group"),
    }
}

/// True while any process is in the group.
pub fn group_exists(pgid: u32) -> bool {
    let Ok(raw) = i32::try_from(pgid) else {
        return false;
    };
    // Signal 0 checks for existence without sending anything.
    killpg(Pid::from_raw(raw), None).is_ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn our_own_process_is_alive_and_a_wrong_start_time_is_not() {
        let me = std::process::id();
        let started = start_time(me).expect("start time of this process");
        assert!(is_alive(me, started));
        assert!(!is_alive(me, started + 1));
        assert!(!is_alive(u32::MAX - 1, started));
    }
}
