//! What confining a replica costs the local executor (issue 37): the cgroup set-up and removal
//! alone, and a whole launch of one replica (`true`) to its end and release, unconfined, in a
//! cgroup, and in a cgroup and a PID namespace of its own, side by side in one run. Needs root and cgroups (as tests/run has them); without,
//! the cgroup rows say they are skipped.
//!
//! `cargo bench -p trainyard-executor --bench confinement`

use std::time::Duration;

use criterion::{Criterion, criterion_group, criterion_main};
use trainyard_executor::local::cgroup::{Cgroups, Limits};
use trainyard_executor::local::{DEFAULT_PIDS_LIMIT, LocalConfig, LocalExecutor};
use trainyard_executor::{AttemptRef, Executor, LaunchRequest, ReplicaStatus};
use uuid::Uuid;

fn limits() -> Limits {
    Limits {
        memory_bytes: 1 << 30,
        cpu_millis: 1000,
        cpu_hard_limit: false,
        pids_max: DEFAULT_PIDS_LIMIT,
        devices: vec![],
    }
}

fn cgroup_set_up(c: &mut Criterion) {
    let cgroups = match Cgroups::detect() {
        Ok(cgroups) => cgroups,
        Err(why) => {
            eprintln!("SKIPPED cgroup set-up: {why}");
            return;
        }
    };
    let mut group = c.benchmark_group("replica cgroup");
    group.bench_function("create with limits, then remove", |b| {
        b.iter(|| {
            let name = format!("bench-{}", Uuid::new_v4());
            cgroups.create(&name, &limits()).unwrap_or_else(|err| panic!("{err}"));
            cgroups.remove(&name).unwrap_or_else(|err| panic!("{err}"));
        })
    });
    group.finish();
}

fn launch(c: &mut Criterion) {
    let runtime = tokio::runtime::Runtime::new().unwrap_or_else(|err| panic!("{err}"));
    let mut group = c.benchmark_group("local launch of one replica, to its end and release");
    group.sample_size(30).measurement_time(Duration::from_secs(10));
    for (confined, pid_namespace) in [(false, false), (true, false), (true, true)] {
        let dir = tempfile::tempdir().unwrap_or_else(|err| panic!("{err}"));
        let executor = LocalExecutor::new(LocalConfig {
            data_dir: dir.path().to_path_buf(),
            supervisor: env!("CARGO_BIN_EXE_trainyard-shim").into(),
            cpus: Some(2.0),
            memory_bytes: None,
            simulated_gpus: None,
            shard_cache_bytes: None,
            shard_cache_tenant_bytes: Some(1 << 30),
            pids_limit: DEFAULT_PIDS_LIMIT,
            cpu_hard_limit: false,
            cgroups: confined,
            pid_namespace,
        })
        .unwrap_or_else(|err| panic!("{err}"));
        let name = match (confined, pid_namespace) {
            (false, _) => "without cgroups",
            (true, false) => "in a cgroup",
            (true, true) => "in a cgroup and a PID namespace",
        };
        let warnings = executor.node_warnings();
        if confined && warnings.iter().any(|w| w.contains("cgroups")) {
            eprintln!("SKIPPED {name}: {warnings:?}");
            continue;
        }
        group.bench_function(name, |b| {
            b.iter(|| runtime.block_on(launch_to_end(&executor)));
        });
    }
    group.finish();
}

async fn launch_to_end(executor: &LocalExecutor) {
    let spec = serde_json::from_value(serde_json::json!({"command": ["true"], "args": [], "env": {},
        "resources": {"cpu": 0.5, "memory": "256Mi"}, "replicas": 1}))
    .unwrap_or_else(|err| panic!("{err}"));
    let request = LaunchRequest {
        job_id: Uuid::new_v4(),
        tenant_id: Uuid::from_u128(1),
        tenant: "bench".into(),
        attempt: 1,
        spec,
        files: Default::default(),
        env: Default::default(),
        env_by_rank: Vec::new(),
        code: Vec::new(),
        nodes: Vec::new(),
    };
    let placement = executor.launch(&request).await.unwrap_or_else(|err| panic!("{err}"));
    let attempt = AttemptRef { job_id: request.job_id, attempt: 1, replicas: 1, placement: Some(placement) };
    while executor.observe(&attempt).await == [ReplicaStatus::Running] {
        tokio::time::sleep(Duration::from_micros(200)).await;
    }
    executor.release(&attempt).await;
}

criterion_group!(benches, cgroup_set_up, launch);
criterion_main!(benches);
