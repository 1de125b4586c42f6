//! Hyperparameter search for Trainyard's experiments, pure: no clock, no I/O, no randomness
//! but the seeded one.
//!
//! - [`spec`]: what a user writes (the space over a template's parameters, the searcher's
//!   settings) and its rules, every broken one named by field.
//! - [`machine`]: the searcher as a state machine over stored events; its decisions are the
//!   runs it asked for, the same after any replay.
//! - [`preview`]: the rung ladder and the most steps a search trains, before it starts.

pub mod machine;
pub mod preview;
pub mod spec;

pub use machine::{Best, Event, Outcome, Params, Run, Search, TrialState};
pub use preview::{Ladder, RungPlan, ladder};
pub use spec::{Dimension, Goal, Method, Problems, SearcherSpec, Space};
