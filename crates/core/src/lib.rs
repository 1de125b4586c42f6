//! Trainyard's domain: the types every other crate speaks, and the rules that hold no matter
//! where a request came from. Nothing here does I/O.
//!
//! - [`error`]: the one transport-agnostic error type; the HTTP layer maps it to status codes.
//! - [`auth`]: roles within a tenant and what each may do.
//! - [`resources`]: per-replica resource requests (cpu, memory, GPUs) and their parsing.
//! - [`job`]: the job spec a user submits, its validation, and the job state machine.
//! - [`api`]: request and response bodies of the REST API, shared by the server and the CLI.
//! - [`record`]: the run record of an attempt (what exactly ran), its canonical JSON and hashes.
//! - [`compare`]: runs compared field by field, in sections (`yard diff`, the compare page).
//! - [`rerun`]: what a rerun cannot pin (a file on the machine, an image tag), named.
//! - [`lineage`]: which jobs read and wrote which datasets and artefacts, walked both ways.

pub mod api;
pub mod auth;
pub mod compare;
pub mod error;
pub mod experiments;
pub mod job;
pub mod lineage;
pub mod names;
pub mod notifications;
pub mod record;
pub mod rerun;
pub mod resources;
pub mod tracking;

pub use error::{Error, Result};
