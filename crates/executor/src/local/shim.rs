//! The replica supervisor (`trainyard-shim`): a tiny process between the control plane and each
//! replica, the way containerd-shim or slurmstepd sit between their daemons and the work.
//!
//! It starts the replica, waits for it, and writes its exit status to a file. Because the exit
//! status lands on disk, it outlives the control plane: a server that was killed and restarted
//! reads the true exit code of a replica that ended while it was gone, instead of guessing.
//!
//! Before it starts the replica, the shim announces itself in its pid file beside the exit file
//! (`replica-<r>.pid`: its pid and kernel start time, written aside and renamed). The replica
//! starts only after that file exists, so a launch that resumes after a crash of the control
//! plane knows exactly which ranks started: those with a pid file (or, for the instant between
//! the shim's start and its announcement, a shim found in the process table).
//!
//! The shim leads the replica's process group, so a signal to the group reaches both. The shim
//! survives SIGTERM/SIGINT/SIGHUP (it notes them and keeps waiting, so it can record how the
//! replica ended); SIGKILL ends both.
//!
//! With `pid_namespace` (the local executor's default as root) the shim is started as PID 1 of a
//! new PID namespace, in a new mount namespace (the executor's `spawn_supervisor`): it mounts a
//! `/proc` of its own there, so the replica sees its own processes only (no other tenant's
//! command lines), as in a container. As the namespace's init it reaps what is orphaned inside,
//! and when it ends, the kernel kills whatever is left in the namespace: nothing the replica
//! started outlives it. A signal the control plane sends the group reaches the replica as
//! before; the shim's own handlers keep it alive to record how the replica ended.

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

/// How the shim starts its replica, beyond the command.
#[derive(Debug, Clone, Default)]
pub struct ShimOptions {
    /// The replica's environment (a JSON object), written by the server (mode 0600) and removed
    /// by the shim once read: the shim's own environment stays clean (a job's `LD_PRELOAD` never
    /// applies to it) and the job token is never on a command line. Without it, the replica
    /// inherits the shim's environment.
    pub env_file: Option<std::path::PathBuf>,
    /// The user and group the replica runs as (its tenant's), when the shim runs as root.
    pub run_as: Option<(u32, u32)>,
    /// Collect the replica's orphans (the shim's own process only: it reaps every child of the
    /// process it runs in).
    pub reap_orphans: bool,
    /// The replica's cgroup folders (one per controller on cgroup v1), which the shim joins
    /// before it starts the replica, so that the replica and everything it starts are born
    /// confined. A shim that cannot join runs nothing.
    pub cgroups: Vec<std::path::PathBuf>,
    /// The shim was started as PID 1 of a new PID and mount namespace: it mounts the
    /// namespace's own `/proc` before the replica starts (where it cannot, the replica's log
    /// says so and it runs on).
    pub pid_namespace: bool,
    /// Folders to bind in the namespace at the paths the replica sees them (the tenant's
    /// volumes at `/volumes/<name>`), with `pid_namespace`. A folder that cannot be bound
    /// stops the replica from starting: its writes would land nowhere durable.
    pub binds: Vec<(std::path::PathBuf, std::path::PathBuf)>,
}

/// Runs `argv` to completion and records how it ended in `exit_file`. Returns the exit code.
pub fn shim_main(exit_file: &Path, argv: &[OsString], options: &ShimOptions) -> i32 {
    let noted = Arc::new(AtomicBool::new(false));
    for signal in [signal_hook::consts::SIGTERM, signal_hook::consts::SIGINT, signal_hook::consts::SIGHUP] {
        // A handler, not SIG_IGN: handlers reset to the default on exec, so the replica still
        // dies of these signals while the shim lives on to record it.
        if let Err(err) = signal_hook::flag::register(signal, Arc::clone(&noted)) {
            eprintln!("trainyard-shim: cannot handle signal {signal}: {err}");
        }
    }
    // Orphans of the replica (a process whose parent died before it: its children, when a
    // stop's signal reaches the whole group at once) come to the shim, as to containerd-shim,
    // not to init: reaped here before the shim ends, so that its ended group is empty.
    if options.reap_orphans
        && let Err(err) = nix::sys::prctl::set_child_subreaper(true)
    {
        eprintln!("trainyard-shim: cannot collect the replica's orphans: {err}");
    }
    // Before /proc is the namespace's: the pid announced is the one the server sees.
    if let Err(err) = announce(exit_file) {
        // Without its announcement a resumed launch could start this rank again: run nothing.
        eprintln!("trainyard-shim: cannot write its pid file beside {}: {err}", exit_file.display());
        return EXIT_CANNOT_START;
    }
    if let Err(err) = super::cgroup::join(&options.cgroups) {
        eprintln!("trainyard: cannot confine the replica in its cgroup, so it does not start: {err}");
        let record = ExitRecord { exit_code: EXIT_CANNOT_START, signal: None };
        let _ = write_exit_record(exit_file, &record);
        return record.exit_code;
    }
    if options.pid_namespace {
        own_proc();
        if let Err(err) = bind_volumes(&options.binds) {
            eprintln!("trainyard: cannot bind the replica's volumes, so it does not start: {err}");
            let record = ExitRecord { exit_code: EXIT_CANNOT_START, signal: None };
            let _ = write_exit_record(exit_file, &record);
            return record.exit_code;
        }
    }
    let record = read_env_and_run(argv, options);
    if options.reap_orphans {
        reap_orphans();
    }
    if let Err(err) = write_exit_record(exit_file, &record) {
        eprintln!("trainyard-shim: cannot record the exit status in {}: {err}", exit_file.display());
    }
    record.exit_code
}

/// Starts the replica and waits for it.
fn run(mut command: Command) -> ExitRecord {
    match command.spawn() {
        Ok(mut child) => match child.wait() {
            Ok(status) => record_of(status),
            Err(err) => {
                eprintln!("trainyard-shim: lost track of the replica: {err}");
                ExitRecord { exit_code: EXIT_CANNOT_START, signal: None }
            }
        },
        Err(err) => {
            eprintln!("trainyard: cannot start {}: {err}", command.get_program().to_string_lossy());
            ExitRecord { exit_code: EXIT_CANNOT_START, signal: None }
        }
    }
}

/// Reads the replica's environment file and runs the replica (here, or as PID 1 of its
/// namespace: the same steps).
fn read_env_and_run(argv: &[OsString], options: &ShimOptions) -> ExitRecord {
    let env = match options.env_file.as_deref().map(read_env_file).transpose() {
        Ok(env) => env,
        Err(err) => {
            eprintln!("trainyard-shim: cannot read the replica's environment: {err}");
            return ExitRecord { exit_code: EXIT_CANNOT_START, signal: None };
        }
    };
    match argv.split_first() {
        None => {
            eprintln!("trainyard-shim: no command given");
            ExitRecord { exit_code: EXIT_CANNOT_START, signal: None }
        }
        Some((program, args)) => run(replica_command(program, args, env, options.run_as)),
    }
}

/// In the new PID and mount namespace the shim was started in: mounts there are made private,
/// then a `/proc` of the namespace is mounted over the machine's. A failure is said in the
/// replica's log; the replica runs on, seeing the machine's processes.
fn own_proc() {
    use nix::mount::{MsFlags, mount};
    let private = mount(None::<&str>, "/", None::<&str>, MsFlags::MS_REC | MsFlags::MS_PRIVATE, None::<&str>);
    let flags = MsFlags::MS_NOSUID | MsFlags::MS_NODEV | MsFlags::MS_NOEXEC;
    if let Err(err) = private.and_then(|()| mount(Some("proc"), "/proc", Some("proc"), flags, None::<&str>)) {
        eprintln!("trainyard: cannot mount this replica's own /proc ({err}): it sees every process of the machine");
    }
}

/// Binds each folder at the path the replica sees it, in the shim's own mount namespace: a
/// small tmpfs of the namespace's own goes over each target's parent (`/volumes`, an empty
/// folder on the machine), so that only this replica's volumes are there. The folder is opened
/// without following links and bound through its handle: the path is the server's
/// (`<data>/volumes/<tenant>/<name>`, whose parents the tenant cannot write), and even so no
/// link in it is followed.
fn bind_volumes(binds: &[(std::path::PathBuf, std::path::PathBuf)]) -> Result<(), String> {
    use std::os::fd::AsRawFd;

    use nix::fcntl::{OFlag, open};
    use nix::mount::{MsFlags, mount};
    use nix::sys::stat::Mode;
    let parents: std::collections::BTreeSet<&Path> = binds.iter().filter_map(|(_, to)| to.parent()).collect();
    for parent in parents {
        let flags = MsFlags::MS_NOSUID | MsFlags::MS_NODEV | MsFlags::MS_NOEXEC;
        mount(Some("tmpfs"), parent, Some("tmpfs"), flags, Some("mode=0755,size=64k"))
            .map_err(|err| format!("mounting a tmpfs on {}: {err}", parent.display()))?;
    }
    for (from, to) in binds {
        std::fs::create_dir(to).map_err(|err| format!("making {}: {err}", to.display()))?;
        let flags = OFlag::O_PATH | OFlag::O_NOFOLLOW | OFlag::O_DIRECTORY | OFlag::O_CLOEXEC;
        let folder =
            open(from.as_path(), flags, Mode::empty()).map_err(|err| format!("opening {}: {err}", from.display()))?;
        let by_handle = format!("/proc/self/fd/{}", folder.as_raw_fd());
        mount(Some(by_handle.as_str()), to, None::<&str>, MsFlags::MS_BIND, None::<&str>)
            .map_err(|err| format!("binding {} at {}: {err}", from.display(), to.display()))?;
        let flags = MsFlags::MS_REMOUNT | MsFlags::MS_BIND | MsFlags::MS_NOSUID | MsFlags::MS_NODEV;
        mount(None::<&str>, to, None::<&str>, flags, None::<&str>)
            .map_err(|err| format!("making {} nosuid: {err}", to.display()))?;
    }
    Ok(())
}

/// Reaps the replica's orphans that have ended or are ending (those a signal to the group
/// ended with it), waiting for them at most [`ORPHANS_WAIT`]. One still running after that was
/// left behind on purpose and is the executor's to stop (`release` kills the group).
fn reap_orphans() {
    use nix::sys::wait::{WaitPidFlag, WaitStatus, waitpid};
    let deadline = std::time::Instant::now() + ORPHANS_WAIT;
    loop {
        match waitpid(None, Some(WaitPidFlag::WNOHANG)) {
            Ok(WaitStatus::StillAlive) if std::time::Instant::now() < deadline => {
                std::thread::sleep(std::time::Duration::from_millis(1));
            }
            Ok(WaitStatus::StillAlive) | Err(_) => return, // none left (ECHILD), or left behind
            Ok(_) => {}                                    // one reaped; look again
        }
    }
}

/// How long the shim waits for the replica's orphans to end after the replica did.
const ORPHANS_WAIT: std::time::Duration = std::time::Duration::from_millis(20);

fn read_env_file(path: &Path) -> std::io::Result<std::collections::BTreeMap<String, String>> {
    let text = std::fs::read(path)?;
    std::fs::remove_file(path)?;
    serde_json::from_slice(&text).map_err(std::io::Error::other)
}

fn replica_command(
    program: &OsString,
    args: &[OsString],
    env: Option<std::collections::BTreeMap<String, String>>,
    run_as: Option<(u32, u32)>,
) -> Command {
    use std::os::unix::process::CommandExt;
    let mut command = Command::new(program);
    command.args(args).stdin(Stdio::null());
    if let Some(env) = env {
        // With PATH among them, the program is looked up on the replica's PATH.
        command.env_clear().envs(env);
    }
    if let Some((uid, gid)) = run_as {
        // As root, std drops the supplementary groups before switching.
        command.uid(uid).gid(gid);
    }
    command
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

/// The pid file of the shim whose exit file is `exit_file`.
pub fn pid_file_of(exit_file: &Path) -> std::path::PathBuf {
    exit_file.with_extension("pid")
}

/// A shim's announcement: its pid and kernel start time.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PidRecord {
    pub pid: u32,
    pub start_time: u64,
}

/// Writes this process's pid file (whole: aside, then renamed) before the replica starts.
fn announce(exit_file: &Path) -> std::io::Result<()> {
    // As the machine's /proc names it (in a PID namespace of its own, getpid() says 1).
    let pid = std::fs::read_link("/proc/self")
        .ok()
        .and_then(|link| link.to_str()?.parse().ok())
        .unwrap_or_else(std::process::id);
    let start_time = super::process::start_time(pid).unwrap_or_default();
    super::write_whole(&pid_file_of(exit_file), format!("{pid} {start_time}\n").as_bytes())
}

/// The announcement a shim left in its pid file, if any.
pub fn read_pid_record(pid_file: &Path) -> Option<PidRecord> {
    let text = std::fs::read_to_string(pid_file).ok()?;
    let mut fields = text.split_whitespace();
    Some(PidRecord { pid: fields.next()?.parse().ok()?, start_time: fields.next()?.parse().ok()? })
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
            shim_main(&file, &argv, &ShimOptions::default());
            read_exit_record(&file).unwrap()
        };
        assert_eq!(run(&["sh", "-c", "exit 3"]), ExitRecord { exit_code: 3, signal: None });
        assert_eq!(run(&["sh", "-c", "kill -TERM $$"]), ExitRecord { exit_code: 143, signal: Some(15) });
        assert_eq!(run(&["/no/such/program"]).exit_code, EXIT_CANNOT_START);
    }

    #[test]
    fn the_shim_announces_itself_before_the_replica_starts() {
        let dir = tempfile::tempdir().unwrap();
        let file = dir.path().join("replica-0.exit");
        let pid_file = pid_file_of(&file);
        // The replica checks that the pid file exists when it starts.
        let script = format!("test -s {}", pid_file.display());
        shim_main(&file, &["sh".into(), "-c".into(), script.into()], &ShimOptions::default());
        assert_eq!(read_exit_record(&file).unwrap().exit_code, 0, "the pid file existed when the replica ran");
        let record = read_pid_record(&pid_file).unwrap();
        assert_eq!(record.pid, std::process::id(), "the shim (here: this test process) wrote its own pid");
    }

    #[test]
    fn the_replica_gets_the_environment_file_and_the_file_is_gone() {
        let dir = tempfile::tempdir().unwrap();
        let file = dir.path().join("replica-0.exit");
        let env_file = dir.path().join("replica-0.env");
        std::fs::write(&env_file, r#"{"PATH": "/usr/bin:/bin", "SECRET": "s3"}"#).unwrap();
        let options = ShimOptions { env_file: Some(env_file.clone()), run_as: None, ..Default::default() };
        // Exactly the given variables: SECRET set, HOME (of this test process) absent.
        let script = r#"test "$SECRET" = s3 && test -z "$HOME""#;
        shim_main(&file, &["sh".into(), "-c".into(), script.into()], &options);
        assert_eq!(read_exit_record(&file).unwrap().exit_code, 0);
        assert!(!env_file.exists(), "the environment file is removed once read");
    }
}
