//! Launch throughput of the Kubernetes executor, and API requests per launched job, against the
//! in-memory API server of the tests (no API server can run here; see docs/PERFORMANCE.md for
//! what this does and does not measure).
//!
//! `cargo bench -p trainyard-kube --bench launch`

#[path = "../tests/support/mod.rs"]
mod support;

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use criterion::{Criterion, Throughput, criterion_group, criterion_main};
use futures::StreamExt;
use support::examples;
use support::fake_api::FakeApi;
use trainyard_executor::{Executor, LaunchRequest};
use trainyard_kube::KubernetesExecutor;
use uuid::Uuid;

/// Launches in flight at once, as a reconciler launching an admitted batch would.
const CONCURRENCY: usize = 64;
const TENANTS: u128 = 10;

fn request(n: u128) -> LaunchRequest {
    let mut request = examples::pytorch_ddp();
    request.job_id = Uuid::from_u128(0x1000_0000 + n);
    request.tenant_id = Uuid::from_u128(0xaa00 + n % TENANTS);
    request.tenant = format!("team-{}", n % TENANTS);
    request.env = BTreeMap::from([("TRAINYARD_TOKEN".into(), format!("tyj_{n}"))]);
    request
}

async fn launch_many(executor: &KubernetesExecutor, from: u128, count: u128) {
    futures::stream::iter(from..from + count)
        .map(|n| async move { executor.launch(&request(n)).await.expect("launch") })
        .buffer_unordered(CONCURRENCY)
        .collect::<Vec<_>>()
        .await;
}

fn launches(c: &mut Criterion) {
    let runtime = tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_all().build().unwrap();
    let fake = FakeApi::default();
    let executor = runtime.block_on(async {
        let executor = KubernetesExecutor::with_client(fake.client(), examples::config());
        executor.ready().await;
        executor
    });

    // Requests per job, over 1000 jobs of 10 tenants (tenant objects are applied once each).
    fake.requests_clear();
    let started = Instant::now();
    runtime.block_on(launch_many(&executor, 0, 1000));
    let elapsed = started.elapsed();
    let requests = fake.writes_and_reads().len();
    println!(
        "1000 launches: {:.0} launches/s, {:.2} API requests per job ({requests} requests)",
        1000.0 / elapsed.as_secs_f64(),
        requests as f64 / 1000.0
    );

    let mut group = c.benchmark_group("kubernetes");
    group.throughput(Throughput::Elements(1));
    group.measurement_time(Duration::from_secs(10));
    let mut next: u128 = 1_000_000;
    group.bench_function("launch", |b| {
        b.iter_custom(|iters| {
            let from = next;
            next += u128::from(iters);
            let started = Instant::now();
            runtime.block_on(launch_many(&executor, from, u128::from(iters)));
            started.elapsed()
        })
    });
    group.finish();
}

criterion_group!(benches, launches);
criterion_main!(benches);
