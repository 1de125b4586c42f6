//! The replica supervisor (`trainyard shim`): a tiny process between the control plane and each
//! replica, the way containerd-shim or slurmstepd sit between their daemons and the work.
//!
//! It starts the replica, waits for it, and writes its exit status to a file. Because the exit
//! status lands on disk, it outlives the control plane: a server that was killed and restarted
//! reads the true exit code of a replica that ended while it was gone, instead of guessing.
//!
//! The shim leads the replica's process group, so a signal to the group reaches both. The shim
//! survives SIGTERM/SIGINT/SIGHUP (it notes them and keeps waiting, so it can record how the
//! replica ended); SIGKILL ends both.

use std::ffi::OsString;
use std::path::Path;
use std::process::{Command, ExitStatus, Stdio};
use std::sync::Arc;
use std::sync::atomic::AtomicBool;

use serde::{Deserialize, Serialize};

/// The exit code recorded when the program could not be started at all (as shells do).
pub const EXIT_CANNOT_START: i32 = 127;

/// What the shim writes when its replica ends.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct ExitRecord {
    /// The exit code; 128 + N when the replica was killed by signal N.
    pub exit_code: i32,
    /// The signal that killed it, if one did.
    pub signal: Option<i32>,
}

/// Runs `argv` to completion and records how it ended in `exit_file`. Returns the exit code.
pub fn shim_main(exit_file: &Path, argv: &[OsString]) -> i32 {
    let noted = Arc::new(AtomicBool::new(false));
    for signal in [signal_hook::consts::SIGTERM, signal_hook::consts::SIGINT, signal_hook::consts::SIGHUP] {
        // A handler, not SIG_IGN: handlers reset to the default on exec, so the replica still
        // dies of these signals while the shim lives on to record it.
        if let Err(err) = signal_hook::flag::register(signal, Arc::clone(&noted)) {
            eprintln!("trainyard shim: cannot handle signal {signal}: {err}");
        }
    }
    let record = match argv.split_first() {
        None => {
            eprintln!("trainyard shim: no command given");
            ExitRecord { exit_code: EXIT_CANNOT_START, signal: None }
        }
        Some((program, args)) => match Command::new(program).args(args).stdin(Stdio::null()).spawn() {
            Ok(mut child) => match child.wait() {
                Ok(status) => record_of(status),
                Err(err) => {
                    eprintln!("trainyard shim: lost track of the replica: {err}");
                    ExitRecord { exit_code: EXIT_CANNOT_START, signal: None }
                }
            },
            Err(err) => {
                eprintln!("trainyard: cannot start {}: {err}", program.to_string_lossy());
                ExitRecord { exit_code: EXIT_CANNOT_START, signal: None }
            }
        },
    };
    if let Err(err) = write_exit_record(exit_file, &record) {
        eprintln!("trainyard shim: cannot record the exit status in {}: {err}", exit_file.display());
    }
    record.exit_code
}

fn record_of(status: ExitStatus) -> ExitRecord {
    use std::os::unix::process::ExitStatusExt;
    match (status.code(), status.signal()) {
        (Some(code), _) => ExitRecord { exit_code: code, signal: None },
        (None, Some(signal)) => ExitRecord { exit_code: 128 + signal, signal: Some(signal) },
        (None, None) => ExitRecord { exit_code: EXIT_CANNOT_START, signal: None },
    }
}

/// Written aside and renamed, so a reader sees the whole record or none.
fn write_exit_record(path: &Path, record: &ExitRecord) -> std::io::Result<()> {
    let aside = path.with_extension("exit.partial");
    std::fs::write(&aside, serde_json::to_vec(record)?)?;
    std::fs::rename(&aside, path)
}

/// The record a shim left, if it finished.
pub fn read_exit_record(path: &Path) -> Option<ExitRecord> {
    serde_json::from_slice(&std::fs::read(path).ok()?).ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn records_exit_codes_signals_and_missing_programs() {
        let dir = tempfile::tempdir().unwrap();
        let file = dir.path().join("r.exit");
        let run = |argv: &[&str]| {
            let argv: Vec<OsString> = argv.iter().map(OsString::from).collect();
            shim_main(&file, &argv);
            read_exit_record(&file).unwrap()
        };
        assert_eq!(run(&["sh", "-c", "exit 3"]), ExitRecord { exit_code: 3, signal: None });
        assert_eq!(run(&["sh", "-c", "kill -TERM $$"]), ExitRecord { exit_code: 143, signal: Some(15) });
        assert_eq!(run(&["/no/such/program"]).exit_code, EXIT_CANNOT_START);
    }
}
