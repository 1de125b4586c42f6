//! Times single admission cycles at growing queue lengths (a quick look; the criterion benchmark
//! `benches/cycle.rs` is the measurement). `cargo run --release -p trainyard-scheduler --example cycle_timing`.

#[path = "../benches/cluster.rs"]
mod cluster;

fn main() {
    for pending in [1_000, 10_000, 100_000] {
        let snap = cluster::cluster(pending);
        let started = std::time::Instant::now();
        let result = trainyard_scheduler::admission_cycle(&snap);
        let took = started.elapsed();
        println!(
            "{pending:>7} pending: {:>6} admitted, {:>4} preemptions, {:>6} waiting in {:>8.2} ms ({:.0} decisions/s)",
            result.admissions.len(),
            result.preemptions.len(),
            result.pending.len(),
            took.as_secs_f64() * 1000.0,
            pending as f64 / took.as_secs_f64()
        );
    }
}
