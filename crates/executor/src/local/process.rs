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

/// Sends a signal to one process; one that is gone already is fine.
pub fn signal(pid: u32, signal: Signal) {
    let Ok(raw) = i32::try_from(pid) else { return };
    let _ = nix::sys::signal::kill(Pid::from_raw(raw), signal);
}

/// True while a process of the group is alive. Zombies (ended, not yet reaped by their parent)
/// do not count: they run nothing and hold nothing but a pid.
pub fn group_has_live_members(pgid: u32) -> bool {
    // No process in the group at all, zombie or not (the common case: its supervisor ended and
    // was reaped, and so were its children): one call, not a read of every process's stat.
    let Ok(raw) = i32::try_from(pgid) else { return false };
    if killpg(Pid::from_raw(raw), None) == Err(nix::errno::Errno::ESRCH) {
        return false;
    }
    let Ok(entries) = std::fs::read_dir("/proc") else {
        return false;
    };
    entries.flatten().any(|entry| {
        let Some(pid) = entry.file_name().to_str().and_then(|n| n.parse::<u32>().ok()) else {
            return false;
        };
        let Ok(stat) = std::fs::read_to_string(format!("/proc/{pid}/stat")) else {
            return false;
        };
        let Some(close) = stat.rfind(')') else {
            return false;
        };
        // Fields after the command name: state, ppid, pgrp, ...
        let mut fields = stat[close + 2..].split_whitespace();
        let state = fields.next();
        let pgrp = fields.nth(1).and_then(|f| f.parse::<u32>().ok());
        pgrp == Some(pgid) && !matches!(state, Some("Z") | Some("X"))
    })
}

/// A live supervisor whose command line names `exit_file` (`trainyard-shim --exit-file F ...`),
/// if the process table holds one: how a resumed launch recognises a shim that started but has
/// not written its pid file yet.
pub fn find_shim(exit_file: &std::path::Path) -> Option<(u32, u64)> {
    let wanted = exit_file.as_os_str().as_encoded_bytes();
    let entries = std::fs::read_dir("/proc").ok()?;
    entries.flatten().find_map(|entry| {
        let pid = entry.file_name().to_str()?.parse::<u32>().ok()?;
        let cmdline = std::fs::read(format!("/proc/{pid}/cmdline")).ok()?;
        let mut args = cmdline.split(|b| *b == 0);
        let names_it = args.by_ref().any(|a| a == b"--exit-file") && args.next() == Some(wanted);
        let started = start_time(pid)?;
        (names_it && is_alive(pid, started)).then_some((pid, started))
    })
}

#[cfg(test)]
mod tests {
    use std::os::unix::process::CommandExt;

    use super::*;

    #[test]
    fn our_own_process_is_alive_and_a_wrong_start_time_is_not() {
        let me = std::process::id();
        let started = start_time(me).expect("start time of this process");
        assert!(is_alive(me, started));
        assert!(!is_alive(me, started + 1));
        assert!(!is_alive(u32::MAX - 1, started));
    }

    #[test]
    fn a_killed_group_has_no_live_members() {
        let child = std::process::Command::new("sleep").arg("30").process_group(0).spawn().unwrap();
        let pgid = child.id();
        assert!(group_has_live_members(pgid));
        signal_group(pgid, Signal::SIGKILL);
        let mut child = child;
        child.wait().unwrap();
        assert!(!group_has_live_members(pgid));
    }

    #[test]
    fn a_group_of_only_a_zombie_has_no_live_members() {
        let mut child = std::process::Command::new("sleep").arg("30").process_group(0).spawn().unwrap();
        let pgid = child.id();
        signal_group(pgid, Signal::SIGKILL);
        // Ended, not yet reaped: the group still exists for the kernel, but runs nothing.
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(5);
        while std::fs::read_to_string(format!("/proc/{pgid}/stat")).is_ok_and(|s| !s.contains(") Z ")) {
            assert!(std::time::Instant::now() < deadline, "the killed child never became a zombie");
            std::thread::sleep(std::time::Duration::from_millis(10));
        }
        assert_eq!(killpg(Pid::from_raw(pgid as i32), None), Ok(()), "a zombie still answers");
        assert!(!group_has_live_members(pgid));
        child.wait().unwrap();
    }
}
