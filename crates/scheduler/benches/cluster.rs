//! The benchmark cluster: 5,000 nodes x 8 GPUs of 3 types (in racks of 20), 1,000 tenants in 10
//! cohorts, half the cluster busy, and `pending` jobs of mixed shapes. Deterministic.

use std::collections::BTreeMap;

use trainyard_scheduler::{Demand, Node, PendingJob, Quota, RunningJob, Settings, Snapshot, TenantPolicy};
use uuid::Uuid;

const FLAVORS: [&str; 3] = ["nvidia-h100-80gb", "nvidia-a100-80gb", "nvidia-l40s"];

/// A small deterministic generator (xorshift), so every run sees the same cluster.
struct Rng(u64);
impl Rng {
    fn next(&mut self, n: u64) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0 % n
    }
}

pub fn cluster(pending: usize) -> Snapshot {
    let mut rng = Rng(0x9E37_79B9_7F4A_7C15);
    let nodes: Vec<Node> = (0..5000)
        .map(|i| Node {
            name: format!("node-{i:05}"),
            rack: Some(format!("rack-{:03}", i / 20)),
            gpu_type: Some(FLAVORS[i % 3].to_string()),
            gpus: 8,
            cpu_millis: 192_000,
            memory_bytes: 2 << 40,
            drained: None,
        })
        .collect();
    // 40,000 GPUs, about 13,333 per type; nominal quotas add up to that per type.
    let tenants: Vec<TenantPolicy> = (0..1000)
        .map(|i| TenantPolicy {
            id: Uuid::from_u128(i as u128 + 1),
            name: format!("tenant-{i:04}"),
            cohort: Some(format!("cohort-{}", i % 10)),
            weight: 1.0,
            quotas: FLAVORS
                .iter()
                .map(|f| (f.to_string(), Quota { nominal: 13, borrowing_limit: Some(64), lending_limit: None }))
                .collect::<BTreeMap<_, _>>(),
            preempt_lower_priority: i % 2 == 0,
        })
        .collect();
    // Half of every node busy with single-replica jobs of 4 GPUs.
    let running: Vec<RunningJob> = nodes
        .iter()
        .enumerate()
        .map(|(i, node)| RunningJob {
            id: Uuid::from_u128(1_000_000 + i as u128),
            tenant: tenants[i % 1000].id,
            priority: 0,
            demand: Demand {
                replicas: 1,
                gpus: 4,
                gpu_type: node.gpu_type.clone(),
                cpu_millis: 8000,
                memory_bytes: 64 << 30,
            },
            flavor: node.gpu_type.clone(),
            nodes: vec![node.name.clone()],
            started_at: 0,
            expected_runtime: Some(3600),
            stopping: false,
            stopping_for: None,
            spare: false,
            saved_at: None,
        })
        .collect();
    let pending = (0..pending)
        .map(|i| {
            let replicas = [1, 1, 1, 1, 2, 4][rng.next(6) as usize];
            let gpus = [1, 2, 4, 8][rng.next(4) as usize];
            PendingJob {
                id: Uuid::from_u128(10_000_000 + i as u128),
                tenant: tenants[rng.next(1000) as usize].id,
                priority: rng.next(3) as i32,
                seq: i as u64,
                submitted_at: 1_000 + i as i64,
                demand: Demand {
                    replicas,
                    gpus,
                    gpu_type: if rng.next(4) == 0 { None } else { Some(FLAVORS[rng.next(3) as usize].to_string()) },
                    cpu_millis: 4000,
                    memory_bytes: 32 << 30,
                },
                expected_runtime: Some(1800),
                warm_nodes: Vec::new(),
                cache_wait_secs: 0,
                spare: false,
            }
        })
        .collect();
    Snapshot {
        now: 2_000,
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
