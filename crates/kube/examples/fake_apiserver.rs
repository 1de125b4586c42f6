//! The in-memory API server of the executor's tests (`tests/support/fake_api.rs`) served over
//! plain HTTP on loopback, so that the real `trainyard serve --executor kubernetes` can run
//! against it: the benchmark of the reconciler's whole launch path without an API server's own
//! cost (`tests/bench/kube_launch.sh` with `TRAINYARD_BENCH_FAKE=1`). It also plays the Job
//! controller, the scheduler and the kubelet: each new Job gets its pods, placed on stand-in
//! nodes and Running at once. A benchmark stand-in only; nothing here is a Kubernetes.
//!
//! Usage: fake_apiserver NODES  (prints `listening on http://127.0.0.1:PORT`, then serves)

#[path = "../tests/support/fake_api.rs"]
mod fake_api;

use std::collections::BTreeSet;

use fake_api::FakeApi;
use serde_json::json;

#[tokio::main]
async fn main() {
    let nodes: usize = std::env::args().nth(1).and_then(|n| n.parse().ok()).unwrap_or(16);
    let fake = FakeApi::default();
    let node_names: Vec<String> = (0..nodes).map(|i| format!("fake-node-{i}")).collect();
    for name in &node_names {
        // CPU nodes, 64 CPUs and 512 GiB each: the benchmark's jobs ask for 1 CPU.
        fake.cpu_node_put(name);
    }
    tokio::spawn(play_the_controllers(fake.clone(), node_names));

    let app = axum::Router::new().fallback(move |request: axum::extract::Request| {
        let fake = fake.clone();
        async move {
            let (parts, body) = request.into_parts();
            let bytes = axum::body::to_bytes(body, usize::MAX).await.unwrap_or_default();
            fake.respond(parts, bytes).map(axum::body::Body::new)
        }
    });
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.expect("a loopback port");
    println!("listening on http://{}", listener.local_addr().expect("its address"));
    axum::serve(listener, app).await.expect("serving");
}

/// Every Job the fake stores gets its pods, one per completion index, Running on the nodes in
/// turn, as soon as it is seen.
async fn play_the_controllers(fake: FakeApi, nodes: Vec<String>) {
    let mut seen: BTreeSet<(String, String)> = BTreeSet::new();
    let mut next_node = 0;
    let mut changes = fake.subscribe();
    loop {
        for job in fake.list("jobs") {
            let (namespace, name) = (
                job["metadata"]["namespace"].as_str().unwrap_or_default().to_string(),
                job["metadata"]["name"].as_str().unwrap_or_default().to_string(),
            );
            if !seen.insert((namespace.clone(), name.clone())) {
                continue;
            }
            let completions = job["spec"]["completions"].as_u64().unwrap_or(1) as u32;
            for index in 0..completions {
                let node = &nodes[next_node % nodes.len()];
                next_node += 1;
                let running = json!({ "phase": "Running", "containerStatuses": [{
                    "name": "replica", "image": "registry.example/runtime:1", "ready": true, "restartCount": 0,
                    "imageID": format!("registry.example/runtime@sha256:{}", "3".repeat(64)),
                    "state": { "running": { "startedAt": "2026-01-01T00:00:00Z" } } }] });
                fake.pod_create(&namespace, &name, index, node, running);
            }
        }
        if changes.changed().await.is_err() {
            return;
        }
    }
}
