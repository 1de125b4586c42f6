//! One admission cycle at scale: 5,000 nodes x 8 GPUs of 3 types (in racks of 20), 1,000
//! tenants in 10 cohorts, half the cluster busy, and 1,000 to 100,000 pending jobs of mixed
//! shapes. `cargo bench -p trainyard-scheduler --bench cycle`.
//!
//! `with_experiment`: 10,000 pending jobs alone, then the same queue with an experiment's trials
//! on spare room beside it (issue 40: within 10% of the queue without them): its runs under way
//! (256 single-GPU trials queued, 256 running; and the same 512 as plain jobs), and a queue where
//! half of the 10,000 are trials.

use criterion::{BenchmarkId, Criterion, criterion_group, criterion_main};
use trainyard_scheduler::admission_cycle;

mod cluster;

use cluster::cluster;

fn cycle(c: &mut Criterion) {
    let mut group = c.benchmark_group("admission_cycle");
    group.sample_size(10);
    for pending in [1_000, 10_000, 100_000] {
        let snap = cluster(pending);
        let result = admission_cycle(&snap);
        eprintln!(
            "{pending} pending: {} admitted, {} preemptions, {} waiting",
            result.admissions.len(),
            result.preemptions.len(),
            result.pending.len()
        );
        group.bench_with_input(BenchmarkId::from_parameter(pending), &snap, |b, snap| b.iter(|| admission_cycle(snap)));
    }
    group.finish();
}

/// Trials of one experiment (one tenant), single-GPU, on spare room.
fn trial(i: usize, tenant: uuid::Uuid) -> trainyard_scheduler::PendingJob {
    trainyard_scheduler::PendingJob {
        id: uuid::Uuid::from_u128(90_000_000 + i as u128),
        tenant,
        priority: 0,
        seq: 50_000 + i as u64,
        submitted_at: 1_500,
        demand: trainyard_scheduler::Demand {
            replicas: 1,
            gpus: 1,
            gpu_type: None,
            cpu_millis: 2000,
            memory_bytes: 8 << 30,
        },
        expected_runtime: Some(600),
        warm_nodes: Vec::new(),
        cache_wait_secs: 0,
        spare: true,
    }
}

fn with_experiment(c: &mut Criterion) {
    let mut group = c.benchmark_group("with_experiment");
    group.sample_size(10);
    let alone = cluster(10_000);
    let owner = alone.tenants[7].id;
    let mut beside = alone.clone();
    beside.pending.extend((0..256).map(|i| trial(i, owner)));
    // Running trials sit on the busy nodes' free halves: one GPU each, on spare room.
    for (i, node) in alone.nodes.iter().take(256).enumerate() {
        let job = trial(10_000 + i, owner);
        beside.running.push(trainyard_scheduler::RunningJob {
            id: job.id,
            tenant: owner,
            priority: 0,
            demand: job.demand,
            flavor: node.gpu_type.clone(),
            nodes: vec![node.name.clone()],
            started_at: 1_900,
            expected_runtime: Some(600),
            stopping: false,
            stopping_for: None,
            spare: true,
            saved_at: Some(1_950),
        });
    }
    // The same jobs, not on spare room: what they cost as any job would.
    let mut as_jobs = beside.clone();
    as_jobs.pending.iter_mut().for_each(|j| j.spare = false);
    as_jobs.running.iter_mut().for_each(|r| r.spare = false);
    let mut half = alone.clone();
    for (i, job) in half.pending.iter_mut().enumerate().filter(|(i, _)| i % 2 == 0) {
        *job = trial(20_000 + i, owner);
    }
    let cases = [
        ("alone", &alone),
        ("beside_512_trials", &beside),
        ("beside_512_plain_jobs", &as_jobs),
        ("half_trials", &half),
    ];
    for (name, snap) in cases {
        let result = admission_cycle(snap);
        eprintln!(
            "{name}: {} admitted, {} preemptions, {} waiting",
            result.admissions.len(),
            result.preemptions.len(),
            result.pending.len()
        );
        group.bench_with_input(BenchmarkId::from_parameter(name), snap, |b, snap| b.iter(|| admission_cycle(snap)));
    }
    group.finish();
}

criterion_group!(benches, cycle, with_experiment);
criterion_main!(benches);
