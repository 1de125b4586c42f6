//! The searcher's cost per event at scale: an experiment of 10,000 trials answered one event at
//! a time (the goal: under 1 ms a decision). `cargo bench -p trainyard-searcher --bench decide`
use criterion::{Criterion, criterion_group, criterion_main};
use trainyard_searcher::{Event, Search, SearcherSpec, Space};

fn ten_thousand_trials(c: &mut Criterion) {
    let spec: SearcherSpec = serde_json::from_value(serde_json::json!({
        "metric": "loss", "max_length": 256, "max_trials": 10000, "max_concurrent_trials": 64,
        "divisor": 4, "max_rungs": 4, "seed": 1,
    }))
    .unwrap();
    let space: Space =
        serde_json::from_value(serde_json::json!({"lr": {"type": "float", "min": 1e-5, "max": 1.0, "log": true}}))
            .unwrap();
    let mut group = c.benchmark_group("searcher");
    group.sample_size(10);
    group.bench_function("10k trials, every event (asha)", |b| {
        b.iter(|| {
            let mut search = Search::new(spec.clone(), space.clone());
            let mut answered = 0;
            while answered < search.runs().len() {
                let run = search.runs()[answered].clone();
                let value = ((run.trial as u64 * 2_654_435_761) % 1000) as f64 - run.rung as f64;
                search.apply(&Event::Reported { trial: run.trial, rung: run.rung, value }).unwrap();
                answered += 1;
            }
            answered
        })
    });
    group.finish();
}

criterion_group!(benches, ten_thousand_trials);
criterion_main!(benches);
