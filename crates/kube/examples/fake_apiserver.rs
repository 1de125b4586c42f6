//! The in-memory API server of the executor's tests (`tests/support/fake_api.rs`) served over
//! plain HTTP on loopback, so that the real `trainyard serve --executor kubernetes` can run
//! against it: the benchmark of the reconciler's whole launch path without an API server's own
//! cost (`tests/bench/kube_launch.sh` with `TRAINYARD_BENCH_FAKE=1`), and Kueue's replay on the
//! Kubernetes executor (`tests/e2e/replay.rs`). It also plays the Job controller, the scheduler
//! and the kubelet: each new Job gets its pods, placed on stand-in nodes (among those its
//! preferred node affinity names, when it names some) and Running at once; a pod whose command sleeps (`sleep
//! SECONDS` in its container's command line, as the replay's jobs do) succeeds after that long
//! unless it was deleted first, and a pod deleted while it runs ends Failed (exit 137) before it
//! goes, as a kubelet stops it (and as the real suite's stand-in reports). A stand-in only; nothing here
//! is a Kubernetes.
//!
//! Usage: fake_apiserver NODES [--gpus N] [--gpu-product NAME[,NAME...]] [--markers DIR]
//! [--cpu-free MILLICORES]
//! (prints `listening on http://127.0.0.1:PORT`, then serves). `--gpus`: GPU nodes with N GPUs
//! each (default: CPU nodes), of product NAME; several names split the nodes among them in
//! equal consecutive blocks (the replay gives each cohort a GPU type of its own). `--markers`: for each pod, the file
//! `DIR/<job>.<attempt>.<rank>`, made when it starts, with `end` appended when it succeeds: what
//! the replay's replicas write on the local executor. `--cpu-free`: the CPU each node has left
//! beside pods Trainyard does not know (DaemonSets, other installations): a pod asking for more
//! stays Pending, as the kube-scheduler leaves it, with its `Insufficient cpu` condition.

#[path = "../tests/support/fake_api.rs"]
mod fake_api;

use std::collections::BTreeSet;
use std::io::Write;
use std::path::PathBuf;
use std::time::Duration;

use fake_api::FakeApi;
use serde_json::{Value, json};

/// What the command line asks for.
struct Options {
    nodes: usize,
    gpus: u32,
    gpu_products: Vec<String>,
    markers: Option<PathBuf>,
    cpu_free_millis: Option<u64>,
}

impl Options {
    fn parse() -> Options {
        let mut options =
            Options { nodes: 16, gpus: 0, gpu_products: vec!["sim-gpu".into()], markers: None, cpu_free_millis: None };
        let mut args = std::env::args().skip(1);
        while let Some(arg) = args.next() {
            let mut value = || args.next().unwrap_or_else(|| panic!("{arg} needs a value"));
            match arg.as_str() {
                "--gpus" => options.gpus = value().parse().expect("--gpus takes a number"),
                "--gpu-product" => options.gpu_products = value().split(',').map(str::to_string).collect(),
                "--markers" => options.markers = Some(PathBuf::from(value())),
                "--cpu-free" => options.cpu_free_millis = Some(value().parse().expect("--cpu-free takes millicores")),
                nodes => options.nodes = nodes.parse().expect("NODES is a number"),
            }
        }
        options
    }
}

#[tokio::main]
async fn main() {
    let options = Options::parse();
    let fake = FakeApi::unrecorded().kubelet_stops_deleted_pods();
    let node_names: Vec<String> = (0..options.nodes).map(|i| format!("fake-node-{i}")).collect();
    let per_product = options.nodes.div_ceil(options.gpu_products.len()).max(1);
    for (i, name) in node_names.iter().enumerate() {
        if options.gpus > 0 {
            fake.node_put(name, &options.gpu_products[i / per_product], options.gpus);
        } else {
            // CPU nodes, 64 CPUs and 512 GiB each: the benchmark's jobs ask for 1 CPU.
            fake.cpu_node_put(name);
        }
    }
    tokio::spawn(play_the_controllers(fake.clone(), node_names, options.markers, options.cpu_free_millis));

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
/// turn, as soon as it is seen. Reads only the Jobs added since the last look (as a controller's
/// watch does): listing every Job at each change made the fake, not the server measured, the
/// benchmark's bottleneck (it used more than a core of this 2-core machine for 500 jobs).
async fn play_the_controllers(fake: FakeApi, nodes: Vec<String>, markers: Option<PathBuf>, cpu_free: Option<u64>) {
    let mut seen: BTreeSet<(String, String)> = BTreeSet::new();
    let mut next_node = 0;
    let mut changes = fake.subscribe();
    let mut version = 0;
    loop {
        let (added, newest) = fake.added_since("jobs", version);
        version = newest;
        for job in added {
            let (namespace, name) = (
                job["metadata"]["namespace"].as_str().unwrap_or_default().to_string(),
                job["metadata"]["name"].as_str().unwrap_or_default().to_string(),
            );
            if !seen.insert((namespace.clone(), name.clone())) {
                continue;
            }
            let completions = job["spec"]["completions"].as_u64().unwrap_or(1) as u32;
            let runtime = sleep_seconds(&job["spec"]["template"]["spec"]["containers"][0]);
            let allowed = nodes_allowed(&job["spec"]["template"]["spec"]);
            let asked = cpu_millis(&job["spec"]["template"]["spec"]["containers"][0]["resources"]["requests"]["cpu"]);
            if let Some(free) = cpu_free.filter(|free| asked > *free) {
                for index in 0..completions {
                    let status = json!({ "phase": "Pending", "conditions": [{ "type": "PodScheduled", "status": "False",
                        "reason": "Unschedulable", "lastTransitionTime": chrono_now(),
                        "message": format!("0/{} nodes are available: {} Insufficient cpu. ({free}m free, {asked}m asked)",
                            nodes.len(), nodes.len()) }] });
                    fake.pod_create(&namespace, &name, index, "", status);
                }
                continue;
            }
            for index in 0..completions {
                // Where the Job's node affinity names nodes (Trainyard's placement), one of
                // them; otherwise the next node in turn.
                let node = match &allowed {
                    Some(allowed) if !allowed.is_empty() => &allowed[index as usize % allowed.len()],
                    _ => {
                        next_node += 1;
                        &nodes[(next_node - 1) % nodes.len()]
                    }
                };
                let pod = fake.pod_create(&namespace, &name, index, node, container_status("running"));
                let marker = markers.as_ref().and_then(|dir| marker_of(dir, &job, index));
                if let Some(marker) = &marker {
                    std::fs::File::create(marker).expect("the marker");
                }
                if let Some(runtime) = runtime {
                    let (fake, namespace) = (fake.clone(), namespace.clone());
                    tokio::spawn(async move {
                        tokio::time::sleep(runtime).await;
                        run_to_its_end(&fake, &namespace, &pod, marker);
                    });
                }
            }
        }
        if changes.changed().await.is_err() {
            return;
        }
    }
}

/// A CPU quantity (`"2"`, `"500m"`) in millicores; 0 when absent or unreadable.
fn cpu_millis(quantity: &Value) -> u64 {
    let text = quantity.as_str().map(str::to_string).or_else(|| quantity.as_u64().map(|n| n.to_string()));
    let Some(text) = text else { return 0 };
    match text.strip_suffix('m') {
        Some(millis) => millis.parse().unwrap_or(0),
        None => text.parse::<f64>().map(|cores| (cores * 1000.0) as u64).unwrap_or(0),
    }
}

/// Now, as Kubernetes writes times (RFC 3339, seconds).
fn chrono_now() -> String {
    let secs = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map(|d| d.as_secs()).unwrap_or(0);
    k8s_openapi::jiff::Timestamp::from_second(secs as i64).map(|t| t.to_string()).unwrap_or_default()
}

/// The node names a pod spec's preferred node affinity names (`matchFields` on
/// `metadata.name`, as Trainyard writes it), if it has one: this stand-in always has room there.
fn nodes_allowed(pod_spec: &Value) -> Option<Vec<String>> {
    let terms = pod_spec["affinity"]["nodeAffinity"]["preferredDuringSchedulingIgnoredDuringExecution"].as_array()?;
    Some(
        terms
            .iter()
            .flat_map(|term| term["preference"]["matchFields"].as_array().into_iter().flatten())
            .filter(|field| field["key"] == "metadata.name" && field["operator"] == "In")
            .flat_map(|field| field["values"].as_array().into_iter().flatten())
            .filter_map(|v| v.as_str().map(str::to_string))
            .collect(),
    )
}

/// The pod's status with its one container in `state` ("running", or "terminated" with exit 0).
fn container_status(state: &str) -> Value {
    let (phase, container_state) = match state {
        "running" => ("Running", json!({ "running": { "startedAt": "2026-01-01T00:00:00Z" } })),
        _ => ("Succeeded", json!({ "terminated": { "exitCode": 0, "reason": "Completed" } })),
    };
    json!({ "phase": phase, "containerStatuses": [{
        "name": "replica", "image": "registry.example/runtime:1", "ready": state == "running", "restartCount": 0,
        "imageID": format!("registry.example/runtime@sha256:{}", "3".repeat(64)),
        "state": container_state }] })
}

/// Plays the kubelet for a pod whose command ran to its end (exit 0), unless it was deleted
/// meanwhile (its attempt was stopped): then nothing, and its marker gets no `end`.
fn run_to_its_end(fake: &FakeApi, namespace: &str, pod: &str, marker: Option<PathBuf>) {
    let Some(mut object) = fake.get("pods", namespace, pod) else { return };
    object["status"] = container_status("terminated");
    // `end` first, as a replica writes it before it exits: the control plane sees the exit after.
    if let Some(marker) = &marker {
        let mut file = std::fs::OpenOptions::new().append(true).open(marker).expect("the marker");
        writeln!(file, "end").expect("the marker");
    }
    if !fake.replace_if_present("pods", object) {
        // Deleted between the look and the update: it never ended, so its marker must not say so.
        if let Some(marker) = &marker {
            let text = std::fs::read_to_string(marker).unwrap_or_default();
            std::fs::write(marker, text.trim_end_matches("end\n")).expect("the marker");
        }
    }
}

/// `<job>.<attempt>.<rank>` from the Job's labels, in `dir`.
fn marker_of(dir: &std::path::Path, job: &Value, index: u32) -> Option<PathBuf> {
    let labels = &job["metadata"]["labels"];
    let (id, attempt) = (labels["trainyard.dev/job"].as_str()?, labels["trainyard.dev/attempt"].as_str()?);
    Some(dir.join(format!("{id}.{attempt}.{index}")))
}

/// How long a container's command sleeps: the number after the first `sleep` in its command and
/// arguments (`sh -c "...; sleep 0.2; ..."`), if any.
fn sleep_seconds(container: &Value) -> Option<Duration> {
    let words: Vec<&str> = ["command", "args"]
        .iter()
        .filter_map(|field| container[field].as_array())
        .flatten()
        .filter_map(Value::as_str)
        .flat_map(|part| part.split(|c: char| c.is_whitespace() || c == ';'))
        .collect();
    let at = words.iter().position(|w| *w == "sleep")?;
    words.get(at + 1)?.parse::<f64>().ok().map(Duration::from_secs_f64)
}
