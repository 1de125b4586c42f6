//! The supervisor collects its replica's orphans: a process the replica left that ends with it
//! (as a stop's signal to the whole group ends both) is reaped by `trainyard-shim` before it
//! exits, so that an ended replica's process group is empty and nothing is left to init.
//!
//! Its own test binary: this process makes itself a subreaper, which would take the children
//! of any other test running beside it.

use std::os::unix::process::CommandExt;
use std::process::Command;

use nix::sys::wait::{WaitPidFlag, WaitStatus, waitpid};

#[test]
fn the_shim_reaps_what_its_replica_left_ending_behind_it() {
    // Orphans the shim does not collect come here (not to init), where this test sees them.
    nix::sys::prctl::set_child_subreaper(true).unwrap();
    let dir = tempfile::tempdir().unwrap();
    let exit_file = dir.path().join("replica-0.exit");
    // The replica ends at once; the process it started in the background ends 5 ms later.
    let status = Command::new(env!("CARGO_BIN_EXE_trainyard-shim"))
        .arg("--exit-file")
        .arg(&exit_file)
        .args(["--", "sh", "-c", "sleep 0.005 & exit 0"])
        .process_group(0)
        .status()
        .unwrap();
    assert!(status.success());
    assert_eq!(trainyard_executor::local::shim::read_exit_record(&exit_file).unwrap().exit_code, 0);
    std::thread::sleep(std::time::Duration::from_millis(200));
    match waitpid(None, Some(WaitPidFlag::WNOHANG)) {
        Err(nix::errno::Errno::ECHILD) => {} // nothing came here: the shim reaped it
        other => panic!("the replica's orphan was left to the shim's parent: {other:?}"),
    }
    assert_ne!(waitpid(None, Some(WaitPidFlag::WNOHANG)), Ok(WaitStatus::StillAlive));
}
