//! The control loops, run by the leader among server replicas:
//!
//! - [`reconciler`]: the loop itself (observe attempts, admit, launch), with every job's step
//!   isolated so that no single job can stop it;
//! - [`launcher`]: launches, run beside the passes, a bounded number at once;
//! - [`gather`]: the writes launches running side by side make together, in one statement;
//! - [`outcome`]: what an attempt's observed replicas mean, as a pure decision table;
//! - [`board`]: every queued job's reason, position and estimate, shared by readers;
//! - [`health`]: how the loop is doing, for `/readyz`.
//!
//! - [`archiving`]: copying ended attempts' logs to the object store, and the retention sweep.

pub mod archiving;
pub mod board;
pub(crate) mod gather;
pub mod health;
pub mod launcher;
pub mod outcome;
pub mod reconciler;
