//! Times single admission cycles at growing queue lengths (a quick look; the criterion benchmark
//! `benches/cycle.rs` is the measurement). `cargo run --release -p trainyard-scheduler --example cycle_timing`.

#[path = "../benches/cluster.rs"]
mod cluster;

fn main() {
    let sizes: Vec<usize> = match std::env::args().nth(1) {
        Some(n) => vec![n.parse().expect("a number of pending jobs")],
        None => vec![1_000, 10_000, 100_000],
    };
    for pending in sizes {
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
