//! The read model of scheduling, shared by the control loop (which writes it) and the operations
//! and handlers (which read it); neither side imports the other:
//!
//! - [`snapshot`]: store rows and the executor's inventory -> the scheduler's `Snapshot`, and the
//!   views built the same way (node usage, quota ceilings, demands);
//! - [`board`]: every queued job's reason, position and estimate, computed once for all readers;
//! - [`history`]: each job's run-time guess from past runs of its kind, for the estimates;
//! - [`health`]: how the loop is doing, for `/readyz`.

pub mod board;
pub mod health;
pub mod history;
pub mod snapshot;
