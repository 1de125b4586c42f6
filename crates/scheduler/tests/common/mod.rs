//! Builders for scheduler snapshots in tests: short names for tenants, jobs and nodes.
#![allow(dead_code)]

use std::collections::BTreeMap;

use trainyard_scheduler::{Demand, Node, PendingJob, Quota, RunningJob, Settings, Snapshot, TenantPolicy};
use uuid::Uuid;

pub const A100: &str = "nvidia-a100-40gb";
pub const H100: &str = "nvidia-h100-80gb";

/// A stable id from a short name, so that tests can say `id("a1")`.
pub fn id(name: &str) -> Uuid {
    let mut bytes = [0u8; 16];
    for (i, b) in name.bytes().enumerate().take(16) {
        bytes[i] = b;
    }
    Uuid::from_bytes(bytes)
}

pub fn name_of(uuid: Uuid) -> String {
    String::from_utf8_lossy(uuid.as_bytes()).trim_end_matches('\0').to_string()
}

pub fn node(name: &str, rack: &str, flavor: &str, gpus: u32) -> Node {
    Node {
        name: name.into(),
        rack: Some(rack.into()),
        gpu_type: Some(flavor.into()),
        gpus,
        cpu_millis: 64_000,
        memory_bytes: 512 << 30,
        drained: None,
    }
}

pub fn quota(nominal: u64, borrow: Option<u64>, lend: Option<u64>) -> Quota {
    Quota { nominal, borrowing_limit: borrow, lending_limit: lend }
}

pub fn tenant(name: &str, cohort: Option<&str>, quotas: &[(&str, Quota)]) -> TenantPolicy {
    TenantPolicy {
        id: id(name),
        name: name.into(),
        cohort: cohort.map(str::to_string),
        weight: 1.0,
        quotas: quotas.iter().map(|(f, q)| (f.to_string(), *q)).collect::<BTreeMap<_, _>>(),
        preempt_lower_priority: false,
    }
}

pub fn demand(replicas: u32, gpus: u32, flavor: Option<&str>) -> Demand {
    Demand { replicas, gpus, gpu_type: flavor.map(str::to_string), cpu_millis: 1000, memory_bytes: 1 << 30 }
}

pub fn pending(name: &str, tenant: &str, priority: i32, seq: u64, demand: Demand) -> PendingJob {
    PendingJob {
        id: id(name),
        tenant: id(tenant),
        priority,
        seq,
        submitted_at: 1_000_000 + seq as i64,
        demand,
        expected_runtime: Some(600),
        warm_nodes: Vec::new(),
        cache_wait_secs: 0,
        spare: false,
    }
}

pub fn running(
    name: &str,
    tenant: &str,
    priority: i32,
    flavor: &str,
    nodes: &[&str],
    gpus: u32,
    started: i64,
) -> RunningJob {
    RunningJob {
        id: id(name),
        tenant: id(tenant),
        priority,
        demand: demand(nodes.len() as u32, gpus, Some(flavor)),
        flavor: Some(flavor.into()),
        nodes: nodes.iter().map(|n| n.to_string()).collect(),
        started_at: started,
        expected_runtime: Some(600),
        stopping: false,
        stopping_for: None,
        spare: false,
        saved_at: None,
    }
}

pub fn snapshot(
    nodes: Vec<Node>,
    tenants: Vec<TenantPolicy>,
    running: Vec<RunningJob>,
    pending: Vec<PendingJob>,
) -> Snapshot {
    Snapshot {
        now: 1_000_100,
        nodes,
        tenants,
        running,
        pending,
        settings: Settings::default(),
        nominated: Vec::new(),
        held: Vec::new(),
        arrays: Vec::new(),
    }
}
