//! One admission cycle at scale: 5,000 nodes x 8 GPUs of 3 types (in racks of 20), 1,000
//! tenants in 10 cohorts, half the cluster busy, and 1,000 to 100,000 pending jobs of mixed
//! shapes. `cargo bench -p trainyard-scheduler --bench cycle`.

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

criterion_group!(benches, cycle);
criterion_main!(benches);
