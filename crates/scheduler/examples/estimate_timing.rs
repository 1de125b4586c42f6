//! Times start-time estimates (the forward simulation behind "when will my job start") on the
//! benchmark cluster at growing queue lengths. A quick look, one run each:
//! `cargo run --release -p trainyard-scheduler --example estimate_timing`.

#[path = "../benches/cluster.rs"]
mod cluster;

fn main() {
    for pending in [1_000usize, 10_000, 100_000] {
        let snap = cluster::cluster(pending);
        let started = std::time::Instant::now();
        let starts = trainyard_scheduler::estimate_starts(&snap);
        let estimated = starts.values().filter(|s| s.is_some()).count();
        println!(
            "{pending:>7} pending: estimates in {:>8.1} ms, {estimated} jobs with an estimate",
            started.elapsed().as_secs_f64() * 1000.0
        );
    }
}
