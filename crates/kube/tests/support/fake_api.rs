//! An in-memory stand-in for the Kubernetes API server, used because no API server can run on
//! the build machines (see `docs/kubernetes.md`). It is a stateful `tower::Service`, not a
//! script of canned answers: it stores objects, answers server-side apply (PATCH), GET, LIST
//! (with equality label selectors), WATCH (from a resource version, streaming new events),
//! DELETE (with the garbage collector's background propagation to owned objects) and pod logs,
//! and records every request so tests can assert what was sent.
//!
//! It plays the kubelet, the Job controller and the node lifecycle too, through its helper
//! methods (`pod_create`, `pod_status_set`, `node_put`, ...), as the real suite does by patching
//! pod status.

#![allow(dead_code)]

use std::collections::BTreeMap;
use std::convert::Infallible;
use std::pin::Pin;
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll};

use bytes::Bytes;
use http::{Method, Request, Response, StatusCode};
use http_body_util::combinators::BoxBody;
use http_body_util::{BodyExt, Full, StreamBody};
use serde_json::{Value, json};

/// (resource plural, namespace or "", name)
type Key = (String, String, String);

/// One request as the fake received it.
#[derive(Debug, Clone)]
pub struct Recorded {
    pub method: Method,
    pub path: String,
    pub query: BTreeMap<String, String>,
    pub body: Option<Value>,
}

impl Recorded {
    /// Watches and lists come from the watchers, not from launching or stopping jobs.
    pub fn is_watch_or_list(&self) -> bool {
        self.method == Method::GET && (self.query.contains_key("watch") || !self.is_single_object())
    }

    fn is_single_object(&self) -> bool {
        let parsed = parse_path(&self.path);
        parsed.is_some_and(|p| p.name.is_some())
    }

    pub fn kind(&self) -> String {
        self.body.as_ref().and_then(|b| b["kind"].as_str()).unwrap_or_default().to_string()
    }
}

/// Events kept for watches to resume from (at least; at most twice as many).
const EVENTS_KEPT: usize = 100_000;

#[derive(Default)]
struct State {
    objects: BTreeMap<Key, Value>,
    /// (resource version, plural, namespace, event type, object)
    events: Vec<(u64, String, String, &'static str, Value)>,
    version: u64,
    requests: Vec<Recorded>,
    logs: BTreeMap<(String, String), String>,
    /// Pods whose log the API server cannot fetch from the node (as for a node with no address).
    logs_unreachable: std::collections::BTreeSet<(String, String)>,
    uids: u64,
    /// Status codes to answer the next writes (PATCH) with, in order, instead of applying them:
    /// an API server failing (5xx), overloaded (429) or refusing (4xx).
    failing_writes: std::collections::VecDeque<u16>,
    /// The objects each object owns (by its uid), as the garbage collector's graph: deleting a
    /// Job finds its pods without going over every object.
    dependents: std::collections::HashMap<String, Vec<Key>>,
    /// Requests are not kept (`FakeApi::unrecorded`: a long benchmark run).
    unrecorded: bool,
    /// A deleted pod that still runs is stopped first, as its kubelet stops its containers
    /// (`FakeApi::kubelet_stops_deleted_pods`): its last state, in the watch's events, is Failed.
    kubelet_stops_deleted_pods: bool,
}

#[derive(Clone)]
pub struct FakeApi {
    state: Arc<Mutex<State>>,
    changed: Arc<tokio::sync::watch::Sender<u64>>,
}

impl Default for FakeApi {
    fn default() -> Self {
        FakeApi { state: Arc::default(), changed: Arc::new(tokio::sync::watch::channel(0).0) }
    }
}

struct ParsedPath {
    plural: String,
    namespace: Option<String>,
    name: Option<String>,
    subresource: Option<String>,
}

fn parse_path(path: &str) -> Option<ParsedPath> {
    let segments: Vec<&str> = path.trim_matches('/').split('/').collect();
    let rest = match *segments.first()? {
        "api" => segments.get(2..)?,
        "apis" => segments.get(3..)?,
        _ => return None,
    };
    let owned = |s: Option<&&str>| s.map(|s| s.to_string());
    Some(match rest {
        ["namespaces", ns, plural, tail @ ..] => ParsedPath {
            plural: plural.to_string(),
            namespace: Some(ns.to_string()),
            name: owned(tail.first()),
            subresource: owned(tail.get(1)),
        },
        [plural, tail @ ..] => ParsedPath {
            plural: plural.to_string(),
            namespace: None,
            name: owned(tail.first()),
            subresource: owned(tail.get(1)),
        },
        [] => return None,
    })
}

fn labels_match(object: &Value, selector: Option<&String>) -> bool {
    let Some(selector) = selector.filter(|s| !s.is_empty()) else { return true };
    selector.split(',').all(|term| {
        let (key, value) = term.split_once('=').unwrap_or((term, ""));
        object["metadata"]["labels"][key].as_str() == Some(value)
    })
}

/// A pod whose phase says it ran to its end or failed.
fn pod_has_ended(pod: &Value) -> bool {
    matches!(pod["status"]["phase"].as_str(), Some("Succeeded" | "Failed"))
}

fn status(code: u16, reason: &str, message: String) -> Value {
    json!({ "kind": "Status", "apiVersion": "v1", "status": "Failure", "reason": reason, "code": code, "message": message })
}

type Body = BoxBody<Bytes, Infallible>;

fn reply(code: StatusCode, value: &Value) -> Response<Body> {
    Response::builder()
        .status(code)
        .header("content-type", "application/json")
        .body(Full::new(Bytes::from(value.to_string())).boxed())
        .expect("response")
}

impl FakeApi {
    /// Deleted pods that still run end as a kubelet ends them (Failed, exit 137) before they go,
    /// instead of vanishing in their last running state: the served fake, which plays the
    /// kubelet (`examples/fake_apiserver.rs`). The executor's tests keep the vanishing pod, the
    /// harder case (a node gone, a forced deletion).
    pub fn kubelet_stops_deleted_pods(self) -> FakeApi {
        self.state.lock().unwrap().kubelet_stops_deleted_pods = true;
        self
    }

    /// A fake that keeps no record of the requests it answers (`writes_and_reads` stays empty):
    /// for long benchmark runs served over HTTP.
    pub fn unrecorded() -> FakeApi {
        let fake = FakeApi::default();
        fake.state.lock().unwrap().unrecorded = true;
        fake
    }

    pub fn client(&self) -> kube::Client {
        kube::Client::new(self.clone(), "default")
    }

    /// Every request so far that is not a watcher's list or watch.
    pub fn writes_and_reads(&self) -> Vec<Recorded> {
        self.state.lock().unwrap().requests.iter().filter(|r| !r.is_watch_or_list()).cloned().collect()
    }

    /// Makes the next writes fail with these status codes, one each (0: that write goes through).
    pub fn fail_next_writes(&self, codes: &[u16]) {
        self.state.lock().unwrap().failing_writes.extend(codes);
    }

    /// Lets `n` writes through, then fails the next one with `code`.
    pub fn fail_nth_write(&self, n: usize, code: u16) {
        let mut codes = vec![0; n];
        codes.push(code);
        self.fail_next_writes(&codes);
    }

    pub fn requests_clear(&self) {
        self.state.lock().unwrap().requests.clear();
    }

    pub fn get(&self, plural: &str, namespace: &str, name: &str) -> Option<Value> {
        self.state.lock().unwrap().objects.get(&(plural.into(), namespace.into(), name.into())).cloned()
    }

    pub fn list(&self, plural: &str) -> Vec<Value> {
        self.state.lock().unwrap().objects.iter().filter(|(k, _)| k.0 == plural).map(|(_, v)| v.clone()).collect()
    }

    /// The objects of one kind added after resource version `after`, and the newest version:
    /// what a controller's watch would hand it, without going over every stored object.
    pub fn added_since(&self, plural: &str, after: u64) -> (Vec<Value>, u64) {
        let state = self.state.lock().unwrap();
        if state.events.first().is_some_and(|e| e.0 > after + 1) {
            // Events since `after` were dropped: every stored one, which the caller dedups.
            let all = state.objects.iter().filter(|(k, _)| k.0 == plural).map(|(_, v)| v.clone()).collect();
            return (all, state.version);
        }
        let start = state.events.partition_point(|e| e.0 <= after);
        let added = state.events[start..]
            .iter()
            .filter(|(_, p, _, kind, _)| p == plural && *kind == "ADDED")
            .map(|(_, _, _, _, object)| object.clone())
            .collect();
        (added, state.version)
    }

    fn record_event(&self, state: &mut State, key: &Key, kind: &'static str, object: Value) {
        state.events.push((state.version, key.0.clone(), key.1.clone(), kind, object));
        // As etcd compacts: the oldest events go, and a watch from before them is told its
        // version expired (410), so it lists again. Keeps a long benchmark's memory bounded.
        if state.events.len() > 2 * EVENTS_KEPT {
            state.events.drain(..EVENTS_KEPT);
        }
        let _ = self.changed.send(state.version);
    }

    /// Replaces a stored object, unless it is gone (deleted meanwhile): a controller's update
    /// never brings back what was deleted. False when it was gone.
    pub fn replace_if_present(&self, plural: &str, object: Value) -> bool {
        let mut state = self.state.lock().unwrap();
        let namespace = object["metadata"]["namespace"].as_str().unwrap_or_default().to_string();
        let name = object["metadata"]["name"].as_str().unwrap_or_default().to_string();
        if !state.objects.contains_key(&(plural.to_string(), namespace, name)) {
            return false;
        }
        self.put_locked(&mut state, plural, object);
        true
    }

    /// Stores an object as the API server would: a uid and creation time on first write, a new
    /// resource version on each.
    pub fn put(&self, plural: &str, object: Value) -> Value {
        let mut state = self.state.lock().unwrap();
        self.put_locked(&mut state, plural, object)
    }

    fn put_locked(&self, state: &mut State, plural: &str, mut object: Value) -> Value {
        let namespace = object["metadata"]["namespace"].as_str().unwrap_or_default().to_string();
        let name = object["metadata"]["name"].as_str().expect("object has a name").to_string();
        let key = (plural.to_string(), namespace, name);
        state.version += 1;
        let previous = state.objects.get(&key).cloned();
        let meta = &mut object["metadata"];
        match &previous {
            Some(old) => {
                meta["uid"] = old["metadata"]["uid"].clone();
                meta["creationTimestamp"] = old["metadata"]["creationTimestamp"].clone();
            }
            None => {
                state.uids += 1;
                if meta["uid"].is_null() {
                    meta["uid"] = json!(format!("uid-{}", state.uids));
                }
                if meta["creationTimestamp"].is_null() {
                    meta["creationTimestamp"] = json!(k8s_openapi::jiff::Timestamp::now().to_string());
                }
            }
        }
        meta["resourceVersion"] = json!(state.version.to_string());
        if previous.is_none() {
            for owner in object["metadata"]["ownerReferences"].as_array().into_iter().flatten() {
                if let Some(uid) = owner["uid"].as_str() {
                    state.dependents.entry(uid.to_string()).or_default().push(key.clone());
                }
            }
        }
        state.objects.insert(key.clone(), object.clone());
        let kind = if previous.is_some() { "MODIFIED" } else { "ADDED" };
        self.record_event(state, &key, kind, object.clone());
        object
    }

    /// Removes an object and, as the garbage collector does, every object it owns (a namespace:
    /// every object in it).
    pub fn delete(&self, plural: &str, namespace: &str, name: &str) -> Option<Value> {
        let mut state = self.state.lock().unwrap();
        self.delete_locked(&mut state, &(plural.into(), namespace.into(), name.into()))
    }

    fn delete_locked(&self, state: &mut State, key: &Key) -> Option<Value> {
        let mut object = state.objects.remove(key)?;
        if key.0 == "pods" && state.kubelet_stops_deleted_pods && !pod_has_ended(&object) {
            // The kubelet stops the containers (the stand-in of the real suite reports the same)
            // and reports how the pod ended before the API server lets it go.
            object["status"] = json!({ "phase": "Failed", "containerStatuses": [{
                "name": "replica", "ready": false, "restartCount": 0,
                "image": object["status"]["containerStatuses"][0]["image"].clone(),
                "imageID": object["status"]["containerStatuses"][0]["imageID"].clone(),
                "state": { "terminated": { "exitCode": 137, "reason": "Error" } } }] });
            state.version += 1;
            object["metadata"]["resourceVersion"] = json!(state.version.to_string());
            self.record_event(state, key, "MODIFIED", object.clone());
        }
        state.version += 1;
        self.record_event(state, key, "DELETED", object.clone());
        let owned = object["metadata"]["uid"].as_str().and_then(|uid| state.dependents.remove(uid)).unwrap_or_default();
        // As the namespace controller does: a namespace takes everything in it along.
        let contained: Vec<Key> = if key.0 == "namespaces" {
            state.objects.keys().filter(|k| k.1 == key.2).cloned().collect()
        } else {
            Vec::new()
        };
        for dependent in owned.into_iter().chain(contained) {
            self.delete_locked(state, &dependent);
        }
        Some(object)
    }

    /// Plays the Job controller (and the scheduler, when `node` is not empty): creates the pod of
    /// replica `index` of a stored Job.
    pub fn pod_create(&self, namespace: &str, job: &str, index: u32, node: &str, status: Value) -> String {
        let job_object = self.get("jobs", namespace, job).expect("the Job exists");
        self.pod_create_of(&job_object, index, node, status)
    }

    /// As `pod_create`, for a Job as it was (it may be gone since: a pod the Job controller made
    /// just before the Job's deletion, which a watch shows late).
    pub fn pod_create_of(&self, job_object: &Value, index: u32, node: &str, status: Value) -> String {
        let namespace = job_object["metadata"]["namespace"].as_str().unwrap_or_default();
        let job = job_object["metadata"]["name"].as_str().unwrap_or_default();
        let template = &job_object["spec"]["template"];
        let mut labels = template["metadata"]["labels"].clone();
        labels["batch.kubernetes.io/job-completion-index"] = json!(index.to_string());
        let name = format!("{job}-{index}-abcde");
        let mut spec = template["spec"].clone();
        if !node.is_empty() {
            spec["nodeName"] = json!(node);
        }
        spec["hostname"] = json!(format!("{job}-{index}"));
        self.put(
            "pods",
            json!({
                "apiVersion": "v1", "kind": "Pod",
                "metadata": {
                    "name": name, "namespace": namespace, "labels": labels,
                    "annotations": { "batch.kubernetes.io/job-completion-index": index.to_string() },
                    "ownerReferences": [{ "apiVersion": "batch/v1", "kind": "Job", "name": job, "uid": job_object["metadata"]["uid"], "controller": true }],
                },
                "spec": spec,
                "status": status,
            }),
        );
        name
    }

    /// Plays the kubelet: replaces a pod's status.
    pub fn pod_status_set(&self, namespace: &str, name: &str, status: Value) {
        let mut pod = self.get("pods", namespace, name).expect("the pod exists");
        pod["status"] = status;
        self.put("pods", pod);
    }

    pub fn job_status_set(&self, namespace: &str, name: &str, status: Value) {
        let mut job = self.get("jobs", namespace, name).expect("the Job exists");
        job["status"] = status;
        self.put("jobs", job);
    }

    pub fn log_set(&self, namespace: &str, pod: &str, text: &str) {
        self.state.lock().unwrap().logs.insert((namespace.into(), pod.into()), text.into());
        // Followers of the log see it now.
        self.changed.send_modify(|_| {});
    }

    /// A ready node with `gpus` GPUs of the given label value.
    /// The pod's log answers 500 as a real API server does when it cannot reach the node.
    pub fn log_unreachable(&self, namespace: &str, pod: &str) {
        self.state.lock().unwrap().logs_unreachable.insert((namespace.into(), pod.into()));
    }

    pub fn node_put(&self, name: &str, gpu_product: &str, gpus: u32) {
        self.put(
            "nodes",
            json!({
                "apiVersion": "v1", "kind": "Node",
                "metadata": { "name": name, "labels": { "nvidia.com/gpu.product": gpu_product } },
                "spec": { "taints": [{ "key": "nvidia.com/gpu", "effect": "NoSchedule" }] },
                "status": {
                    "allocatable": { "cpu": "64", "memory": "512Gi", "nvidia.com/gpu": gpus.to_string() },
                    "conditions": [{ "type": "Ready", "status": "True" }],
                },
            }),
        );
    }

    /// A CPU node (no GPUs, no taint).
    pub fn cpu_node_put(&self, name: &str) {
        self.put(
            "nodes",
            json!({
                "apiVersion": "v1", "kind": "Node",
                "metadata": { "name": name },
                "status": {
                    "allocatable": { "cpu": "64", "memory": "512Gi" },
                    "conditions": [{ "type": "Ready", "status": "True" }],
                },
            }),
        );
    }

    /// Told of every change to the stored objects.
    pub fn subscribe(&self) -> tokio::sync::watch::Receiver<u64> {
        self.changed.subscribe()
    }

    async fn handle(self, request: Request<kube::client::Body>) -> Response<Body> {
        let (parts, body) = request.into_parts();
        let bytes = body.collect_bytes().await.unwrap_or_default();
        self.respond(parts, bytes)
    }

    /// Answers one request, given its head and its whole body (how an HTTP server in front of
    /// the fake hands it over: `crates/kube/examples/fake_apiserver.rs`).
    pub fn respond(&self, parts: http::request::Parts, bytes: Bytes) -> Response<Body> {
        let body: Option<Value> = serde_json::from_slice(&bytes).ok();
        let query: BTreeMap<String, String> =
            form_urlencoded::parse(parts.uri.query().unwrap_or_default().as_bytes()).into_owned().collect();
        let path = parts.uri.path().to_string();
        {
            let mut state = self.state.lock().unwrap();
            if !state.unrecorded {
                state.requests.push(Recorded {
                    method: parts.method.clone(),
                    path: path.clone(),
                    query: query.clone(),
                    body: body.clone(),
                });
            }
        }
        let Some(target) = parse_path(&path) else {
            return reply(StatusCode::NOT_FOUND, &status(404, "NotFound", format!("no route {path}")));
        };
        let namespace = target.namespace.clone().unwrap_or_default();
        if parts.method == Method::PATCH
            && let Some(code) = self.state.lock().unwrap().failing_writes.pop_front()
            && code != 0
        {
            let code = StatusCode::from_u16(code).expect("a status code");
            return reply(code, &status(code.as_u16(), "Failure", format!("injected failure of {path}")));
        }
        match (&parts.method, &target.name, target.subresource.as_deref()) {
            (&Method::PATCH, Some(name), None) => {
                let Some(mut object) = body else {
                    return reply(StatusCode::BAD_REQUEST, &status(400, "BadRequest", "no body".into()));
                };
                if let Some(problem) = node_field_selector_problem(&object) {
                    return reply(StatusCode::UNPROCESSABLE_ENTITY, &status(422, "Invalid", problem));
                }
                if let Some(old) = self.get(&target.plural, &namespace, name) {
                    // Apply keeps what others own, such as the status the kubelet wrote.
                    object["status"] = old["status"].clone();
                }
                reply(StatusCode::OK, &self.put(&target.plural, object))
            }
            (&Method::DELETE, Some(name), None) => match self.delete(&target.plural, &namespace, name) {
                Some(object) => reply(StatusCode::OK, &object),
                None => reply(StatusCode::NOT_FOUND, &status(404, "NotFound", format!("{name} not found"))),
            },
            (&Method::GET, Some(name), Some("log")) => {
                if self.get("pods", &namespace, name).is_none() {
                    return reply(StatusCode::NOT_FOUND, &status(404, "NotFound", format!("pod {name} not found")));
                }
                if self.state.lock().unwrap().logs_unreachable.contains(&(namespace.clone(), name.clone())) {
                    let message = "no preferred addresses found; known addresses: []".to_string();
                    return reply(StatusCode::INTERNAL_SERVER_ERROR, &status(500, "InternalError", message));
                }
                if query.get("follow").is_some_and(|f| f == "true" || f == "1") {
                    return self.log_follow(namespace, name.clone());
                }
                let text = self.state.lock().unwrap().logs.get(&(namespace, name.clone())).cloned().unwrap_or_default();
                Response::builder().status(200).body(Full::new(Bytes::from(text)).boxed()).expect("response")
            }
            (&Method::GET, Some(name), None) => match self.get(&target.plural, &namespace, name) {
                Some(object) => reply(StatusCode::OK, &object),
                None => reply(StatusCode::NOT_FOUND, &status(404, "NotFound", format!("{name} not found"))),
            },
            (&Method::GET, None, None) if query.get("watch").is_some_and(|w| w == "true" || w == "1") => {
                self.watch(target, query)
            }
            (&Method::GET, None, None) => {
                self.list_reply(&target, query.get("labelSelector"), query.get("fieldSelector"))
            }
            _ => reply(
                StatusCode::METHOD_NOT_ALLOWED,
                &status(405, "MethodNotAllowed", format!("{} {path}", parts.method)),
            ),
        }
    }

    fn list_reply(&self, target: &ParsedPath, selector: Option<&String>, fields: Option<&String>) -> Response<Body> {
        let state = self.state.lock().unwrap();
        let items: Vec<Value> = state
            .objects
            .iter()
            .filter(|(k, o)| {
                k.0 == target.plural
                    && target.namespace.as_ref().is_none_or(|ns| *ns == k.1)
                    && labels_match(o, selector)
                    && fields_match(o, fields)
            })
            .map(|(_, o)| o.clone())
            .collect();
        reply(
            StatusCode::OK,
            &json!({ "apiVersion": "v1", "kind": "List", "metadata": { "resourceVersion": state.version.to_string() }, "items": items }),
        )
    }

    /// Streams every matching event after the given resource version, then new ones as they come.
    /// A followed log, as the kubelet streams it: what the pod wrote, then each addition, until
    /// the pod no longer runs (or is gone). A quiet running pod's stream stays open, sending
    /// nothing.
    fn log_follow(&self, namespace: String, pod: String) -> Response<Body> {
        let this = self.clone();
        let changed = self.changed.subscribe();
        let stream = futures::stream::unfold((0usize, changed), move |(sent, mut changed)| {
            let this = this.clone();
            let (namespace, pod) = (namespace.clone(), pod.clone());
            async move {
                loop {
                    let text = this.state.lock().unwrap().logs.get(&(namespace.clone(), pod.clone())).cloned();
                    let text = text.unwrap_or_default();
                    if text.len() > sent {
                        let frame = http_body::Frame::data(Bytes::from(text[sent..].to_string()));
                        return Some((Ok::<_, Infallible>(frame), (text.len(), changed)));
                    }
                    let running = this.get("pods", &namespace, &pod).is_some_and(|p| {
                        p["status"]["phase"].as_str().is_none_or(|phase| phase == "Running" || phase == "Pending")
                    });
                    if !running || changed.changed().await.is_err() {
                        return None;
                    }
                }
            }
        });
        Response::builder().status(200).body(StreamBody::new(stream).boxed()).expect("response")
    }

    fn watch(&self, target: ParsedPath, query: BTreeMap<String, String>) -> Response<Body> {
        let from: u64 = query.get("resourceVersion").and_then(|v| v.parse().ok()).unwrap_or(0);
        let selector = query.get("labelSelector").cloned();
        let state = Arc::clone(&self.state);
        let changed = self.changed.subscribe();
        let plural = target.plural;
        let namespace = target.namespace;
        // Each frame carries every matching event since the last one, a line each.
        let stream = futures::stream::unfold((Some(from), changed), move |(seen, mut changed)| {
            let state = Arc::clone(&state);
            let selector = selector.clone();
            let plural = plural.clone();
            let namespace = namespace.clone();
            async move {
                // `None`: the stream ended after telling the watcher its version expired.
                let mut seen = seen?;
                loop {
                    let mut lines = String::new();
                    {
                        let state = state.lock().unwrap();
                        if seen > 0 && state.events.first().is_some_and(|e| e.0 > seen + 1) {
                            let expired = status(410, "Expired", format!("too old resource version: {seen}"));
                            let line = json!({ "type": "ERROR", "object": expired }).to_string() + "\n";
                            let frame = http_body::Frame::data(Bytes::from(line));
                            return Some((Ok::<_, Infallible>(frame), (None, changed)));
                        }
                        // Events are in version order: start after the last one seen.
                        let start = state.events.partition_point(|e| e.0 <= seen);
                        for (version, p, ns, kind, object) in &state.events[start..] {
                            seen = *version;
                            let matches = *p == plural
                                && namespace.as_ref().is_none_or(|n| n == ns)
                                && labels_match(object, selector.as_ref());
                            if matches {
                                lines.push_str(&json!({ "type": kind, "object": object }).to_string());
                                lines.push('\n');
                            }
                        }
                    }
                    if !lines.is_empty() {
                        let frame = http_body::Frame::data(Bytes::from(lines));
                        return Some((Ok::<_, Infallible>(frame), (Some(seen), changed)));
                    }
                    if changed.changed().await.is_err() {
                        return None;
                    }
                }
            }
        });
        Response::builder().status(200).body(StreamBody::new(stream).boxed()).expect("response")
    }
}

impl tower::Service<Request<kube::client::Body>> for FakeApi {
    type Response = Response<Body>;
    type Error = Infallible;
    type Future = Pin<Box<dyn std::future::Future<Output = Result<Self::Response, Infallible>> + Send>>;

    fn poll_ready(&mut self, _cx: &mut Context<'_>) -> Poll<Result<(), Infallible>> {
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, request: Request<kube::client::Body>) -> Self::Future {
        let this = self.clone();
        Box::pin(async move { Ok(this.handle(request).await) })
    }
}

/// Field selectors of the form `a.b=value,c=value` (equality only), on any field path.
fn fields_match(object: &Value, selector: Option<&String>) -> bool {
    let Some(selector) = selector.filter(|s| !s.is_empty()) else { return true };
    selector.split(',').all(|term| {
        let Some((path, wanted)) = term.split_once('=') else { return false };
        let found = path.split('.').try_fold(object, |value, key| value.get(key));
        found.and_then(Value::as_str) == Some(wanted)
    })
}

/// What the API server's validation says of a pod template's node affinity: a node field
/// selector (`matchFields`) with `In` or `NotIn` takes exactly one value (a Job placed on two
/// nodes with one requirement naming both is refused by a real API server).
fn node_field_selector_problem(object: &Value) -> Option<String> {
    let affinity = &object["spec"]["template"]["spec"]["affinity"]["nodeAffinity"];
    let preferred = affinity["preferredDuringSchedulingIgnoredDuringExecution"].as_array().into_iter().flatten();
    let required = affinity["requiredDuringSchedulingIgnoredDuringExecution"]["nodeSelectorTerms"].as_array();
    let terms = preferred.map(|t| &t["preference"]).chain(required.into_iter().flatten());
    terms.flat_map(|term| term["matchFields"].as_array().into_iter().flatten()).find_map(|requirement| {
        let one = requirement["values"].as_array().is_some_and(|values| values.len() == 1);
        (matches!(requirement["operator"].as_str(), Some("In" | "NotIn")) && !one)
            .then(|| "must be only one value when `operator` is 'In' or 'NotIn' for node field selector".to_string())
    })
}
