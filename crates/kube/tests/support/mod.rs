//! Shared by the test files: the in-memory API server and the template examples.

pub mod examples;
pub mod fake_api;
