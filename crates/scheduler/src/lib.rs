//! Admission: which queued jobs start now, where, which running jobs make way, and why the
//! others wait, with their positions and estimated start times.
//!
//! Pure and synchronous: a [`Snapshot`] in, a [`CycleResult`] out; no clock (the snapshot
//! carries `now`), no I/O, no randomness, no hash-map iteration order. The same snapshot always
//! gives the same decisions, which is what makes the property tests, the golden traces and the
//! simulator meaningful.
//!
//! - [`model`]: nodes, tenants with quotas per GPU type and cohorts, pending and running jobs.
//! - [`cycle`]: one admission cycle: fair-share order, quotas with borrowing and lending, gang
//!   placement, preemption, the starvation rule, reasons.
//! - [`estimate`]: start-time estimates by simulating forward, and what-if answers.
//! - [`history`]: expected run times from recent runs, and what each assumes.
//! - [`decision`]: what a cycle returns.

pub mod cycle;
pub mod decision;
pub mod estimate;
pub mod fit;
pub mod history;
pub mod model;
mod state;
pub mod usage;

pub use cycle::{CycleOptions, admission_cycle, run_cycle};
pub use decision::{Admission, CycleResult, Pending, PendingReason, Preemption, PreemptionKind};
pub use estimate::{Estimate, ExpectedStart, estimate_starts, estimate_starts_explained, what_if, what_if_after};
pub use fit::{Unfit, never_fits};
pub use history::{RuntimeBasis, RuntimeFacts, RuntimeGuess, guess_runtime};
pub use model::{
    ArrayWindow, Demand, Flavor, HeldJob, Node, PendingJob, Quota, RunningJob, Settings, Snapshot, TenantPolicy,
};
