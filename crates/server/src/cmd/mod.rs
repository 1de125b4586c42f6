//! The commands' wiring: how `trainyard` assembles a [`crate::Server`] for each way it runs.
//!
//! - [`dev`]: `trainyard dev` (everything on one machine, a private Postgres), and local_server:
//!   the wiring of `serve --executor local` too;
//! - [`cluster`]: kube_server, the wiring of `serve --executor kubernetes`.

pub mod cluster;
pub mod dev;
