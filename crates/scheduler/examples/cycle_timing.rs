//! Times single admission cycles at growing queue lengths (a quick look; the criterion benchmark
//! `benches/cycle.rs` is the measurement). `cargo run --release -p trainyard-scheduler --example cycle_timing`.

#[path = "../benches/cluster.rs"]
mod cluster;

/// Cycles timed per queue length.
const RUNS: usize = 15;

fn main() {
    // CYCLE_RUNS=N times N cycles instead (for counting work with `perf stat`).
    let runs: usize = std::env::var("CYCLE_RUNS").ok().and_then(|r| r.parse().ok()).unwrap_or(RUNS);
    let sizes: Vec<usize> = match std::env::args().nth(1) {
        Some(n) => vec![n.parse().expect("a number of pending jobs")],
        None => vec![1_000, 10_000, 100_000],
    };
    for pending in sizes {
        let snap = cluster::cluster(pending);
        // Several cycles; the minimum and the median are steadier than one run on a shared machine.
        let mut times = Vec::new();
        let mut result = trainyard_scheduler::admission_cycle(&snap);
        for _ in 0..runs {
            let started = std::time::Instant::now();
            result = trainyard_scheduler::admission_cycle(&snap);
            times.push(started.elapsed().as_secs_f64() * 1000.0);
        }
        times.sort_by(f64::total_cmp);
        let (min, median) = (times[0], times[runs / 2]);
        println!(
            "{pending:>7} pending: {:>6} admitted, {:>4} preemptions, {:>6} waiting; min {min:>7.2} ms, median {median:>7.2} ms ({:.0} decisions/s at the median)",
            result.admissions.len(),
            result.preemptions.len(),
            result.pending.len(),
            pending as f64 / (median / 1000.0)
        );
    }
}
