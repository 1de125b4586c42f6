//! The control loops, run by the leader among server replicas:
//!
//! - [`reconciler`]: the loop itself (observe attempts, admit, launch), with every job's step
//!   isolated so that no single job can stop it;
//! - [`launcher`]: launches, run beside the passes, a bounded number at once;
//! - [`gather`]: the writes launches running side by side make together, in one statement;
//! - [`outcome`]: what an attempt's observed replicas mean, as a pure decision table.
//!
//! - [`archiving`]: copying ended attempts' logs to the object store, and the retention sweep.
//!
//! What the loop publishes for requests to read (the schedule board, its own health) is in
//! [`crate::scheduling`], below both the loop and the operations.

pub mod archiving;
pub(crate) mod gather;
pub mod launcher;
pub mod outcome;
pub mod reconciler;
