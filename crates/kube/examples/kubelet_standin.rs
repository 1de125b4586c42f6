//! The scheduler and the kubelets of a real API server whose cluster has no machines: the
//! counterpart of `fake_apiserver` for Kueue's replay on the Kubernetes executor
//! (`tests/e2e/replay.rs`) against a real kube-apiserver and kube-controller-manager. The real
//! Job controller makes the pods; this stand-in registers nodes, binds each new pod to one (among
//! those its preferred node affinity names, when it names some: Trainyard's placement), reports
//! it Running, and, when its command sleeps (`sleep SECONDS` in its container's command line, as
//! the replay's jobs do), Succeeded after that long unless it was deleted first. A pod being
//! deleted is killed and removed as a kubelet would, since no other kubelet will. A stand-in
//! only: no container runs anywhere.
//!
//! Usage: kubelet_standin --kubeconfig PATH NODES [--gpus N] [--gpu-product NAME[,NAME...]] [--markers DIR]
//! (prints `ready: N nodes` once its nodes exist and it watches pods, then runs until killed).
//! `--kubeconfig`: an admin's, as it plays cluster components. `--gpus`: GPU nodes with N GPUs
//! each, tainted `nvidia.com/gpu` (default: CPU nodes), of product NAME; several names split the
//! nodes among them in equal consecutive blocks, as `fake_apiserver` does. `--markers`: for each pod
//! the file `DIR/<job>.<attempt>.<rank>`, made when it starts, with `end` in it once it has
//! succeeded: what the replay's replicas write on the local executor.

use std::collections::HashMap;
use std::future::Future;
use std::path::{Path, PathBuf};
use std::time::Duration;

use futures::StreamExt;
use k8s_openapi::api::coordination::v1::Lease;
use k8s_openapi::api::core::v1::{Container, Node, Pod};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{MicroTime, Time};
use k8s_openapi::jiff::Timestamp;
use kube::api::{DeleteParams, Patch, PatchParams, PostParams, Preconditions};
use kube::runtime::WatchStreamExt;
use kube::runtime::utils::Backoff;
use kube::runtime::watcher::{self, Event};
use kube::{Api, Client, ResourceExt};
use serde_json::{Value, json};

/// Who this stand-in's writes are recorded as, in each object's managed fields.
const FIELD_MANAGER: &str = "kubelet-standin";

/// The kubelet's own numbers: a node lease lasts 40 s and is renewed every quarter of that. The
/// node lifecycle controller counts a node as alive while either its lease or its Ready
/// heartbeat moves; one silent for its grace period (50 s) becomes NotReady and, a while later,
/// loses its pods.
const LEASE_SECONDS: i32 = 40;
const LEASE_RENEWAL: Duration = Duration::from_secs(10);

/// Requests in flight at once: a burst of thousands of new pods waits its turn on a few
/// connections instead of opening a TLS connection each, which on a 2-core machine would starve
/// the API server it shares the machine with.
const CALLS_IN_FLIGHT: usize = 64;

/// The exit code a container killed by SIGKILL reports.
const KILLED: i32 = 137;

/// What the command line asks for.
struct Options {
    kubeconfig: PathBuf,
    nodes: usize,
    gpus: u32,
    gpu_products: Vec<String>,
    markers: Option<PathBuf>,
}

impl Options {
    fn parse() -> Options {
        let mut kubeconfig = None;
        let mut options = Options {
            kubeconfig: PathBuf::new(),
            nodes: 16,
            gpus: 0,
            gpu_products: vec!["sim-gpu".into()],
            markers: None,
        };
        let mut args = std::env::args().skip(1);
        while let Some(arg) = args.next() {
            let mut value = || args.next().unwrap_or_else(|| panic!("{arg} needs a value"));
            match arg.as_str() {
                "--kubeconfig" => kubeconfig = Some(PathBuf::from(value())),
                "--gpus" => options.gpus = value().parse().expect("--gpus takes a number"),
                "--gpu-product" => options.gpu_products = value().split(',').map(str::to_string).collect(),
                "--markers" => options.markers = Some(PathBuf::from(value())),
                nodes => options.nodes = nodes.parse().expect("NODES is a number"),
            }
        }
        options.kubeconfig = kubeconfig
            .expect("usage: kubelet_standin --kubeconfig PATH NODES [--gpus N] [--gpu-product NAME] [--markers DIR]");
        options
    }
}

#[tokio::main]
async fn main() {
    let options = Options::parse();
    let client = client_from(&options.kubeconfig).await;
    let names: Vec<String> = (0..options.nodes).map(|i| format!("standin-node-{i}")).collect();
    let per_product = options.nodes.div_ceil(options.gpu_products.len()).max(1);
    let machine = Machine { gpus: options.gpus, ready_since: Time(Timestamp::now()) };
    for (i, name) in names.iter().enumerate() {
        let uid = machine.node_register(&client, name, &options.gpu_products[i / per_product]).await;
        // Renewals spread over the interval rather than all at once.
        let offset = LEASE_RENEWAL.mul_f64(i as f64 / names.len() as f64);
        tokio::spawn(node_lease_keep(client.clone(), name.clone(), uid, offset));
    }
    tokio::spawn(machine.nodes_keep_ready(client.clone(), names.clone()));
    let kubelet = Kubelet { client, nodes: names, next_node: 0, markers: options.markers, played: HashMap::new() };
    kubelet.serve().await;
}

/// A client for the API server the kubeconfig names, with at most `CALLS_IN_FLIGHT` requests
/// under way. kube's rustls has no crypto provider chosen by features: this names ring.
async fn client_from(path: &Path) -> Client {
    let _ = rustls::crypto::ring::default_provider().install_default();
    let kubeconfig = kube::config::Kubeconfig::read_from(path).expect("a readable kubeconfig");
    let config =
        kube::Config::from_custom_kubeconfig(kubeconfig, &Default::default()).await.expect("a usable kubeconfig");
    kube::client::ClientBuilder::try_from(config)
        .expect("a client for the kubeconfig")
        .with_layer(&tower::limit::ConcurrencyLimitLayer::new(CALLS_IN_FLIGHT))
        .build()
}

/// What every node of this stand-in is: the shape `FakeApi::node_put` (or `cpu_node_put`
/// without `--gpus`) gives its nodes.
struct Machine {
    gpus: u32,
    ready_since: Time,
}

impl Machine {
    /// Creates the node, or makes an existing one of that name look as this stand-in's nodes do,
    /// and returns its uid (its lease names it as owner). Keeps trying until the API server takes
    /// it.
    async fn node_register(&self, client: &Client, name: &str, gpu_product: &str) -> String {
        let nodes = Api::<Node>::all(client.clone());
        let (apply, node) = (PatchParams::apply(FIELD_MANAGER).force(), Patch::Apply(self.node(name, gpu_product)));
        loop {
            // A create keeps the status sent with it (the kubelet registers its node that way);
            // an existing node takes a new status only through the status subresource.
            let registered = match nodes.patch(name, &apply, &node).await {
                Ok(_) => nodes.patch_status(name, &apply, &node).await,
                Err(error) => Err(error),
            };
            match registered {
                Ok(node) => return node.uid().unwrap_or_default(),
                Err(error) => eprintln!("registering node {name}: {error}; trying again"),
            }
            tokio::time::sleep(Duration::from_secs(1)).await;
        }
    }

    /// Puts a node of this stand-in back to Ready as soon as something else says otherwise, as
    /// its kubelet would at its next status update (every 10 s). The node lifecycle controller
    /// marks a node Unknown, and taints it unreachable (which takes it out of Trainyard's
    /// inventory), when its lease looks stale; that happens even with every renewal made, when
    /// the API server was away for a while and the controller manager's own watches lag behind.
    async fn nodes_keep_ready(self, client: Client, names: Vec<String>) {
        let nodes = Api::<Node>::all(client);
        let mut changes = watcher::watcher(nodes.clone(), watcher::Config::default())
            .backoff(WatchRetry::default())
            .applied_objects()
            .boxed();
        while let Some(change) = changes.next().await {
            let node = match change {
                Ok(node) => node,
                Err(error) => {
                    eprintln!("watching nodes: {error}");
                    continue;
                }
            };
            let name = node.name_any();
            if names.contains(&name) && !is_ready(&node) {
                let status = json!({ "apiVersion": "v1", "kind": "Node", "status": self.status() });
                let (apply, patch) = (PatchParams::apply(FIELD_MANAGER).force(), Patch::Apply(status));
                let posted = persist("posting a node's status", || nodes.patch_status(&name, &apply, &patch)).await;
                log_unless_gone(&format!("posting the status of node {name}"), posted);
            }
        }
    }

    fn node(&self, name: &str, gpu_product: &str) -> Value {
        let mut node = json!({
            "apiVersion": "v1", "kind": "Node",
            "metadata": { "name": name },
            "status": self.status(),
        });
        if self.gpus > 0 {
            node["metadata"]["labels"] = json!({ "nvidia.com/gpu.product": gpu_product });
            node["spec"] = json!({ "taints": [{ "key": "nvidia.com/gpu", "effect": "NoSchedule" }] });
        }
        node
    }

    /// Room for 64 CPUs, 512 GiB, 1000 pods and the GPUs; Ready, under no pressure, as of now.
    fn status(&self) -> Value {
        let mut room = json!({ "cpu": "64", "memory": "512Gi", "pods": "1000" });
        if self.gpus > 0 {
            room["nvidia.com/gpu"] = json!(self.gpus.to_string());
        }
        let now = Time(Timestamp::now());
        let condition = |kind: &str, status: &str, reason: &str| {
            json!({ "type": kind, "status": status, "reason": reason,
                    "lastHeartbeatTime": now, "lastTransitionTime": self.ready_since })
        };
        json!({
            "capacity": room, "allocatable": room,
            "conditions": [
                condition("Ready", "True", "KubeletReady"),
                condition("MemoryPressure", "False", "KubeletHasSufficientMemory"),
                condition("DiskPressure", "False", "KubeletHasNoDiskPressure"),
                condition("PIDPressure", "False", "KubeletHasSufficientPID"),
            ],
        })
    }
}

fn is_ready(node: &Node) -> bool {
    let conditions = node.status.as_ref().and_then(|s| s.conditions.as_deref()).unwrap_or_default();
    conditions.iter().any(|c| c.type_ == "Ready" && c.status == "True")
}

/// Renews the node's lease every `LEASE_RENEWAL`, starting after `offset`, as its kubelet does:
/// the heartbeat the node lifecycle controller reads. A failed renewal is only logged: the next
/// comes soon enough, well within the controller's grace period.
async fn node_lease_keep(client: Client, node: String, uid: String, offset: Duration) {
    let leases = Api::<Lease>::namespaced(client, "kube-node-lease");
    let apply = PatchParams::apply(FIELD_MANAGER).force();
    tokio::time::sleep(offset).await;
    let mut renewals = tokio::time::interval(LEASE_RENEWAL);
    renewals.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        renewals.tick().await;
        if let Err(error) = leases.patch(&node, &apply, &Patch::Apply(node_lease(&node, &uid))).await {
            eprintln!("renewing the lease of node {node}: {error}");
        }
    }
}

/// The node's lease, renewed now: held by the node, owned by it (so it goes with it).
fn node_lease(node: &str, uid: &str) -> Value {
    json!({
        "apiVersion": "coordination.k8s.io/v1", "kind": "Lease",
        "metadata": {
            "name": node, "namespace": "kube-node-lease",
            "ownerReferences": [{ "apiVersion": "v1", "kind": "Node", "name": node, "uid": uid }],
        },
        "spec": {
            "holderIdentity": node, "leaseDurationSeconds": LEASE_SECONDS,
            "renewTime": MicroTime(Timestamp::now()),
        },
    })
}

/// How far this stand-in has taken a pod, so that a pod seen again (each change of it comes back
/// through the watch, and all of them after the watch restarts) is not acted on twice.
#[derive(Clone, Copy, PartialEq)]
enum Step {
    Binding,
    Running,
    Killing,
}

/// The scheduler and the kubelets of all the nodes, driven by one watch on every pod. Each pod's
/// requests run in a task of their own, so a slow answer holds up no other pod.
struct Kubelet {
    client: Client,
    nodes: Vec<String>,
    next_node: usize,
    markers: Option<PathBuf>,
    /// By pod uid; forgotten when the pod is.
    played: HashMap<String, Step>,
}

impl Kubelet {
    /// Watches pods in all namespaces until killed; the watch starts again by itself after an
    /// error, so an API server that goes away is waited for.
    async fn serve(mut self) {
        let pods = Api::<Pod>::all(self.client.clone());
        let mut events = watcher::watcher(pods, watcher::Config::default()).backoff(WatchRetry::default()).boxed();
        let mut announced = false;
        while let Some(event) = events.next().await {
            match event {
                Ok(Event::Apply(pod) | Event::InitApply(pod)) => self.pod_seen(pod),
                Ok(Event::Delete(pod)) => {
                    self.played.remove(&pod.uid().unwrap_or_default());
                }
                Ok(Event::InitDone) if !announced => {
                    println!("ready: {} nodes", self.nodes.len());
                    announced = true;
                }
                Ok(_) => {}
                Err(error) => eprintln!("watching pods: {error}"),
            }
        }
    }

    /// Takes the pod one step further, if it has one left here: a pod waiting for a node gets
    /// one, a pod on one of these nodes starts, a pod being deleted there is killed.
    fn pod_seen(&mut self, pod: Pod) {
        let Some(uid) = pod.uid() else { return };
        if is_terminal(&pod) {
            return;
        }
        let step = self.played.get(&uid).copied();
        let deleting = pod.metadata.deletion_timestamp.is_some();
        let spec = pod.spec.as_ref();
        let node = spec.and_then(|s| s.node_name.as_deref()).filter(|n| !n.is_empty());
        let (client, markers) = (self.client.clone(), self.markers.clone());
        match node {
            Some(node) if !self.nodes.iter().any(|n| n == node) => {}
            Some(_) if deleting => {
                if step != Some(Step::Killing) {
                    self.played.insert(uid, Step::Killing);
                    tokio::spawn(pod_kill(client, pod));
                }
            }
            Some(_) => {
                if matches!(step, None | Some(Step::Binding)) {
                    self.played.insert(uid, Step::Running);
                    tokio::spawn(pod_run(client, pod, markers));
                }
            }
            // Never placed: the API server removes it without a kubelet.
            None if deleting => {}
            None => {
                let ours = spec.and_then(|s| s.scheduler_name.as_deref()).is_none_or(|s| s == "default-scheduler");
                if step.is_none() && ours {
                    self.played.insert(uid, Step::Binding);
                    let node = self.node_for(&pod);
                    tokio::spawn(pod_bind(client, pod, node));
                }
            }
        }
    }

    /// Where the pod goes: the node its preferred node affinity names for its rank, if it names
    /// some of these (Trainyard's placement; this stand-in always has room there), otherwise the
    /// next node in turn.
    fn node_for(&mut self, pod: &Pod) -> String {
        let allowed: Vec<String> = nodes_preferred(pod).into_iter().filter(|n| self.nodes.contains(n)).collect();
        if !allowed.is_empty() {
            return allowed[rank_of(pod).unwrap_or(0) as usize % allowed.len()].clone();
        }
        self.next_node += 1;
        self.nodes[(self.next_node - 1) % self.nodes.len()].clone()
    }
}

/// Plays the scheduler's last step: binds the pod to `node`. Refused when the pod is gone or
/// already bound, and then there is nothing to do.
async fn pod_bind(client: Client, pod: Pod, node: String) {
    let pods = Api::<Pod>::namespaced(client, &pod.namespace().unwrap_or_default());
    let name = pod.name_any();
    let binding = json!({
        "apiVersion": "v1", "kind": "Binding",
        "metadata": { "name": name, "namespace": pod.namespace(), "uid": pod.uid() },
        "target": { "apiVersion": "v1", "kind": "Node", "name": node },
    });
    let params = PostParams::default();
    let bound =
        persist("binding a pod", || pods.create_subresource::<_, Value>("binding", &name, &params, &binding)).await;
    log_unless_gone(&format!("binding pod {name} to {node}"), bound);
}

/// Plays the kubelet for a pod placed on one of its nodes: starts it (its marker made first, as
/// the replica makes it once it runs; the control plane learns of the start after), and, when
/// its command sleeps, ends it that much later. A pod already running (this stand-in restarted)
/// only has its end played, at the time it was due.
async fn pod_run(client: Client, pod: Pod, markers: Option<PathBuf>) {
    let pods = Api::<Pod>::namespaced(client, &pod.namespace().unwrap_or_default());
    let name = pod.name_any();
    let marker = markers.as_deref().and_then(|dir| marker_of(dir, &pod));
    let runtime = pod.spec.as_ref().and_then(|s| s.containers.first()).and_then(sleep_seconds);
    let (started, version) = match running_since(&pod) {
        Some(started) => (started, pod.resource_version().unwrap_or_default()),
        None => {
            marker_write(marker.as_deref(), false);
            let started = Time(Timestamp::now());
            let running = status_patch(&pods, &name, "starting a pod", pod_running(&pod, &started)).await;
            let Ok(running) = running else { return log_unless_gone(&format!("starting pod {name}"), running) };
            (started, running.resource_version().unwrap_or_default())
        }
    };
    let Some(runtime) = runtime else { return };
    tokio::time::sleep(runtime.saturating_sub(elapsed_since(&started))).await;
    pod_succeed(&pods, &pod, marker.as_deref(), &started, version).await;
}

/// Reports the pod Succeeded, its marker saying `end` first as a replica writes it before it
/// exits; unless the pod was deleted meanwhile (its attempt was stopped), and then its marker
/// must not say it ended. The report is made only on the version of the pod last known not to
/// be deleted (`version`): a deletion in between makes the API server refuse it (409), and the
/// pod is looked at again.
async fn pod_succeed(pods: &Api<Pod>, pod: &Pod, marker: Option<&Path>, started: &Time, mut version: String) {
    let name = pod.name_any();
    loop {
        marker_write(marker, true);
        let succeeded = pod_succeeded(pod, &version, started);
        let refused = match status_patch(pods, &name, "ending a pod", succeeded).await {
            Ok(_) => return,
            Err(error) => error,
        };
        // Refused as the pod changed since `version` (409): it is looked at again.
        let refused_as_changed = matches!(&refused, kube::Error::Api(status) if status.is_conflict());
        let current = if refused_as_changed {
            persist("looking at a pod", || pods.get_opt(&name)).await.ok().flatten()
        } else {
            log_unless_gone(&format!("ending pod {name}"), Err::<(), _>(refused));
            None
        };
        match current.filter(|current| current.uid() == pod.uid()) {
            // An earlier try went through after all.
            Some(current) if phase_of(&current) == "Succeeded" => return,
            Some(current) if current.metadata.deletion_timestamp.is_none() && !is_terminal(&current) => {
                version = current.resource_version().unwrap_or_default();
            }
            _ => return marker_write(marker, false),
        }
    }
}

/// Plays the kubelet for a pod deleted while on one of its nodes (its Job deleted): kills its
/// containers, reports it Failed, and confirms the deletion with no grace period, which only a
/// kubelet does; without it the pod would stay Terminating for good. Its marker gets no `end`.
async fn pod_kill(client: Client, pod: Pod) {
    let pods = Api::<Pod>::namespaced(client, &pod.namespace().unwrap_or_default());
    let name = pod.name_any();
    let killed = status_patch(&pods, &name, "killing a pod", pod_killed(&pod)).await;
    log_unless_gone(&format!("killing pod {name}"), killed);
    let at_once = DeleteParams {
        grace_period_seconds: Some(0),
        preconditions: Some(Preconditions { uid: pod.uid(), resource_version: None }),
        ..DeleteParams::default()
    };
    let deleted = persist("removing a pod", || pods.delete(&name, &at_once)).await;
    log_unless_gone(&format!("removing pod {name}"), deleted);
}

/// Patches the pod's status as the kubelet does (a strategic merge: conditions merge by type).
async fn status_patch(pods: &Api<Pod>, name: &str, what: &str, status: Value) -> kube::Result<Pod> {
    let (params, patch) = (PatchParams::default(), Patch::Strategic(status));
    persist(what, || pods.patch_status(name, &params, &patch)).await
}

/// The status patch of a pod whose containers all started at `started` and are ready.
fn pod_running(pod: &Pod, started: &Time) -> Value {
    let conditions: Vec<Value> = ["PodReadyToStartContainers", "Initialized", "ContainersReady", "Ready"]
        .iter()
        .map(|kind| json!({ "type": kind, "status": "True", "lastTransitionTime": started }))
        .collect();
    json!({
        "metadata": { "uid": pod.uid() },
        "status": {
            "phase": "Running", "startTime": started, "conditions": conditions,
            "containerStatuses": container_statuses(pod, json!({ "running": { "startedAt": started } }), true),
        },
    })
}

/// The status patch of a pod whose containers all exited 0, on the condition that the pod is
/// still at `version`.
fn pod_succeeded(pod: &Pod, version: &str, started: &Time) -> Value {
    let now = Time(Timestamp::now());
    let end = json!({ "terminated": {
        "exitCode": 0, "reason": "Completed", "startedAt": started, "finishedAt": now } });
    pod_ended(pod, "Succeeded", "PodCompleted", end, Some(version))
}

/// The status patch of a pod whose containers were killed.
fn pod_killed(pod: &Pod) -> Value {
    let now = Time(Timestamp::now());
    let started = running_since(pod).unwrap_or_else(|| now.clone());
    let end = json!({ "terminated": {
        "exitCode": KILLED, "reason": "Error", "startedAt": started, "finishedAt": now } });
    pod_ended(pod, "Failed", "PodFailed", end, None)
}

/// The status patch of a pod in the terminal `phase`, each container in the state `end`, no
/// longer ready for `reason`.
fn pod_ended(pod: &Pod, phase: &str, reason: &str, end: Value, version: Option<&str>) -> Value {
    let now = Time(Timestamp::now());
    let conditions: Vec<Value> = ["PodReadyToStartContainers", "ContainersReady", "Ready"]
        .iter()
        .map(|kind| json!({ "type": kind, "status": "False", "reason": reason, "lastTransitionTime": now }))
        .collect();
    let mut metadata = json!({ "uid": pod.uid() });
    if let Some(version) = version {
        metadata["resourceVersion"] = json!(version);
    }
    json!({
        "metadata": metadata,
        "status": { "phase": phase, "conditions": conditions, "containerStatuses": container_statuses(pod, end, false) },
    })
}

/// One status per container of the pod, each in `state`.
fn container_statuses(pod: &Pod, state: Value, ready: bool) -> Vec<Value> {
    let containers = pod.spec.as_ref().map(|s| s.containers.as_slice()).unwrap_or_default();
    containers
        .iter()
        .map(|container| {
            let image = container.image.clone().unwrap_or_default();
            json!({
                "name": container.name, "image": image, "imageID": image_digest(&image),
                "ready": ready, "started": ready, "restartCount": 0, "state": state,
            })
        })
        .collect()
}

/// The image's digest: the one it names, or else a made-up one (`fake_apiserver`'s) on its
/// repository, without its tag.
fn image_digest(image: &str) -> String {
    if image.contains('@') {
        return image.to_string();
    }
    let repository = match image.rsplit_once(':') {
        Some((name, tag)) if !tag.contains('/') => name,
        _ => image,
    };
    format!("{repository}@sha256:{}", "3".repeat(64))
}

/// When the pod's first container started running, if it runs.
fn running_since(pod: &Pod) -> Option<Time> {
    let statuses = pod.status.as_ref()?.container_statuses.as_ref()?;
    statuses.first()?.state.as_ref()?.running.as_ref()?.started_at.clone()
}

fn elapsed_since(time: &Time) -> Duration {
    Timestamp::now().duration_since(time.0).try_into().unwrap_or(Duration::ZERO)
}

fn phase_of(pod: &Pod) -> &str {
    pod.status.as_ref().and_then(|s| s.phase.as_deref()).unwrap_or("Pending")
}

/// Succeeded or Failed: nothing left for a kubelet to do.
fn is_terminal(pod: &Pod) -> bool {
    matches!(phase_of(pod), "Succeeded" | "Failed")
}

/// The node names a pod's preferred node affinity names (`matchFields` on `metadata.name`, `In`,
/// as Trainyard writes it).
fn nodes_preferred(pod: &Pod) -> Vec<String> {
    let affinity = pod.spec.as_ref().and_then(|s| s.affinity.as_ref()).and_then(|a| a.node_affinity.as_ref());
    let terms = affinity.and_then(|a| a.preferred_during_scheduling_ignored_during_execution.as_deref());
    terms
        .unwrap_or_default()
        .iter()
        .flat_map(|term| term.preference.match_fields.iter().flatten())
        .filter(|field| field.key == "metadata.name" && field.operator == "In")
        .flat_map(|field| field.values.iter().flatten().cloned())
        .collect()
}

/// The pod's completion index (its rank), which the Job controller writes as an annotation and a
/// label.
fn rank_of(pod: &Pod) -> Option<u32> {
    const INDEX: &str = "batch.kubernetes.io/job-completion-index";
    let index = pod.annotations().get(INDEX).or_else(|| pod.labels().get(INDEX))?;
    index.parse().ok()
}

/// `DIR/<job>.<attempt>.<rank>` from the pod's labels (copied from its Job's template) and rank.
fn marker_of(dir: &Path, pod: &Pod) -> Option<PathBuf> {
    let labels = pod.labels();
    let (job, attempt) = (labels.get("trainyard.dev/job")?, labels.get("trainyard.dev/attempt")?);
    Some(dir.join(format!("{job}.{attempt}.{}", rank_of(pod)?)))
}

/// Writes the marker as the replica would: empty once it runs, `end` once it has ended.
fn marker_write(marker: Option<&Path>, ended: bool) {
    let Some(marker) = marker else { return };
    if let Err(error) = std::fs::write(marker, if ended { "end\n" } else { "" }) {
        eprintln!("writing the marker {}: {error}", marker.display());
    }
}

/// How long a container's command sleeps: the number after the first `sleep` in its command and
/// arguments (`sh -c "...; sleep 0.2; ..."`), if any; as `fake_apiserver` reads it.
fn sleep_seconds(container: &Container) -> Option<Duration> {
    let words: Vec<&str> = [&container.command, &container.args]
        .into_iter()
        .flatten()
        .flatten()
        .flat_map(|part| part.split(|c: char| c.is_whitespace() || c == ';'))
        .collect();
    let at = words.iter().position(|w| *w == "sleep")?;
    words.get(at + 1)?.parse::<f64>().ok().map(Duration::from_secs_f64)
}

/// How long a watch waits before it starts again after an error: from 0.1 s, doubling, at most
/// 2 s. kube's default backoff goes up to 30 s, kind to a struggling API server; but a kubelet
/// that long out of touch after its API server restarts leaves its nodes NotReady (tainted
/// unreachable) and Trainyard's pods unbound that much longer.
struct WatchRetry(Duration);

impl Default for WatchRetry {
    fn default() -> Self {
        WatchRetry(Duration::from_millis(100))
    }
}

impl Iterator for WatchRetry {
    type Item = Duration;

    fn next(&mut self) -> Option<Duration> {
        let wait = self.0;
        self.0 = (wait * 2).min(Duration::from_secs(2));
        Some(wait)
    }
}

impl Backoff for WatchRetry {
    fn reset(&mut self) {
        *self = WatchRetry::default();
    }
}

/// Repeats `call` while it fails in a way worth waiting out (the API server unreachable,
/// restarting, overloaded: a kubelet outlives all of those), a little longer after each failure.
/// Any other answer, such as the pod being gone, is the caller's.
async fn persist<T, F: Future<Output = kube::Result<T>>>(what: &str, mut call: impl FnMut() -> F) -> kube::Result<T> {
    let mut wait = Duration::from_millis(100);
    loop {
        match call().await {
            Err(error) if is_transient(&error) => {
                // Said once per call, so an API server away for a while floods nothing.
                if wait == Duration::from_millis(100) {
                    eprintln!("{what}: {error}; trying again until it answers");
                }
                tokio::time::sleep(wait).await;
                wait = (wait * 2).min(Duration::from_secs(2));
            }
            result => return result,
        }
    }
}

fn is_transient(error: &kube::Error) -> bool {
    match error {
        kube::Error::Api(status) => status.code == 429 || status.code >= 500,
        kube::Error::HyperError(_) | kube::Error::Service(_) | kube::Error::ReadEvents(_) => true,
        _ => false,
    }
}

/// Logs a refusal, unless it says the pod is gone (404) or was already taken care of (409, as
/// when another binding came first): both are a pod's ordinary end.
fn log_unless_gone<T>(what: &str, result: kube::Result<T>) {
    match result {
        Ok(_) => {}
        Err(kube::Error::Api(status)) if status.is_not_found() || status.is_conflict() => {}
        Err(error) => eprintln!("{what}: {error}"),
    }
}
