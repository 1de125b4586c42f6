//! The Kubernetes backend of the executor.
//!
//! - [`manifests`]: pure builders of every object (golden files in `docs/examples/`);
//! - [`names`]: deterministic names and the labels that tie objects to tenants, jobs, attempts;
//! - [`status`]: the pure mapping from pods and Jobs to replica phases and failure reasons;
//! - [`inventory`]: nodes to the scheduler's view of the cluster;
//! - [`cache`]: watchers that keep pods, Jobs and nodes in memory;
//! - [`executor`]: [`KubernetesExecutor`], the [`trainyard_executor::Executor`] over all of it.

#![deny(clippy::unwrap_used)]

pub mod cache;
pub mod config;
pub mod executor;
pub mod inventory;
pub mod manifests;
pub mod names;
pub mod status;

pub use config::KubeConfig;
pub use executor::{KubeError, KubernetesExecutor, client_for};
