//! End-to-end tests: the real binaries against a real Postgres, through real HTTP.

mod api;
mod authz;
mod chaos;
mod compare;
mod control;
mod dashboard;
mod dashboard_usage;
mod data;
mod dev;
mod fuzz;
mod input;
mod jobs;
mod lineage;
mod operations;
mod records;
mod recovery;
mod replay;
mod reruns;
mod scheduling;
mod schema;
mod sso;
mod storage;
mod templates;
mod tenancy;
mod tour;
mod training;
