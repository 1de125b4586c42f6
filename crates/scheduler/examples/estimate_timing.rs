#[path = "../benches/cluster.rs"]
mod cluster;
fn main() {
    for n in [1_000usize, 10_000, 100_000] {
        let snap = cluster::cluster(n);
        let t = std::time::Instant::now();
        let starts = trainyard_scheduler::estimate_starts(&snap);
        let known = starts.values().filter(|s| s.is_some()).count();
        println!("{n}: {:.1} ms, {known} estimated", t.elapsed().as_secs_f64() * 1000.0);
    }
}
