//! `trainyard-shim`: the supervisor the local executor puts in front of each replica
//! ([`trainyard_executor::local::shim`]). Not for people: the server starts it.
//!
//! A binary of its own, beside `trainyard`, because one starts with every replica: the server's
//! 50 MB binary took 2.2 ms of CPU to start and supervise a replica that does nothing, this one
//! 1.2 ms (docs/PERFORMANCE.md).

use std::ffi::OsString;
use std::path::PathBuf;

use clap::Parser;
use trainyard_executor::local::shim::{ShimOptions, shim_main};

/// Starts a replica, waits for it and records how it ended.
#[derive(Parser)]
#[command(version)]
struct Args {
    /// Where the exit record goes (its pid file is written beside it first).
    #[arg(long)]
    exit_file: PathBuf,
    /// The replica's environment as a JSON file (removed once read).
    #[arg(long)]
    env_file: Option<PathBuf>,
    /// Run the replica as this user id (with --gid).
    #[arg(long, requires = "gid")]
    uid: Option<u32>,
    #[arg(long, requires = "uid")]
    gid: Option<u32>,
    /// A cgroup folder to join before the replica starts (one per controller on cgroup v1).
    #[arg(long)]
    cgroup: Vec<PathBuf>,
    /// This process is PID 1 of a new PID and mount namespace: mount its own /proc there.
    #[arg(long)]
    pid_namespace: bool,
    /// FOLDER=PATH: bind FOLDER at PATH in that namespace (a tenant's volume), before the
    /// replica starts.
    #[arg(long, value_parser = bind_of, requires = "pid_namespace")]
    bind: Vec<(PathBuf, PathBuf)>,
    /// The replica's command.
    #[arg(last = true, required = true)]
    argv: Vec<OsString>,
}

fn bind_of(text: &str) -> Result<(PathBuf, PathBuf), String> {
    let (from, to) = text.split_once('=').ok_or("expected FOLDER=PATH")?;
    Ok((from.into(), to.into()))
}

fn main() {
    let args = Args::parse();
    let options = ShimOptions {
        env_file: args.env_file,
        run_as: args.uid.zip(args.gid),
        reap_orphans: true,
        cgroups: args.cgroup,
        pid_namespace: args.pid_namespace,
        binds: args.bind,
    };
    std::process::exit(shim_main(&args.exit_file, &args.argv, &options));
}
