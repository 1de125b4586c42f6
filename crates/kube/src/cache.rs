//! What the executor knows of the cluster, kept current by kube-runtime watchers: Trainyard's
//! pods and Jobs (label-selected `app.kubernetes.io/managed-by=trainyard`) and every node.
//! In memory only; after a restart the watchers list everything again, which is how running
//! attempts are adopted.
//!
//! Pods and Jobs are also indexed by attempt (their `trainyard.dev/job` and `trainyard.dev/attempt`
//! labels), so that observing one attempt looks up its own objects instead of scanning every
//! object in the cluster: its cost does not grow with the number of other jobs.
//!
//! The watchers wake the reconciler ([`trainyard_executor::Executor::changes`]) only when an
//! object's status changes or an object goes away. Our own writes (applying a Job, which
//! changes its spec and metadata) therefore wake nobody: no echo loop.

use std::collections::HashMap;
use std::hash::{DefaultHasher, Hash, Hasher};
use std::sync::{Arc, Mutex};

use futures::StreamExt;
use k8s_openapi::api::batch::v1::Job;
use k8s_openapi::api::core::v1::{Node, Pod};
use kube::runtime::reflector::{self, ObjectRef, Store};
use kube::runtime::{WatchStreamExt, watcher};
use kube::{Api, Client, Resource, ResourceExt};
use serde::Serialize;
use serde::de::DeserializeOwned;
use tokio::sync::Notify;
use tokio::task::JoinHandle;
use uuid::Uuid;

use crate::names::{self, COMPLETION_INDEX, MANAGED_SELECTOR};

/// The watched objects, and the tasks that watch them (stopped when the cache is dropped).
pub struct Cache {
    pub pods: Store<Pod>,
    pub jobs: Store<Job>,
    pub nodes: Store<Node>,
    pods_by_attempt: Arc<AttemptIndex<Pod>>,
    jobs_by_attempt: Arc<AttemptIndex<Job>>,
    tasks: Vec<JoinHandle<()>>,
}

/// The objects of each attempt (job id, attempt number), by their keys in the store.
type ByAttempt<K> = HashMap<(Uuid, i32), Vec<ObjectRef<K>>>;

/// How many deleted objects an index remembers (the oldest forgotten first): far more than can
/// be deleted between two observations of their attempts.
const GONE_KEPT: usize = 20_000;

/// Which watched objects belong to each attempt, kept by the watcher beside its store, and the
/// last state of those deleted lately.
pub struct AttemptIndex<K: Resource<DynamicType = ()>> {
    refs: Mutex<ByAttempt<K>>,
    /// Kept only where something reads it (pods).
    gone: Option<Mutex<Gone<K>>>,
}

/// Objects deleted lately, as the watch's delete event last showed them, by attempt, with the
/// order they went in (to forget the oldest).
struct Gone<K> {
    by_attempt: HashMap<(Uuid, i32), Vec<Arc<K>>>,
    order: std::collections::VecDeque<(Uuid, i32)>,
}

impl<K: Resource<DynamicType = ()> + Clone> AttemptIndex<K> {
    /// `keep_gone`: whether to keep the last state of deleted objects ([`AttemptIndex::gone`]).
    fn new(keep_gone: bool) -> Self {
        AttemptIndex {
            refs: Mutex::new(HashMap::new()),
            gone: keep_gone.then(|| Mutex::new(Gone { by_attempt: HashMap::new(), order: Default::default() })),
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, ByAttempt<K>> {
        self.refs.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    /// Notes an object the watcher saw (objects without attempt labels are not indexed).
    fn add(&self, object: &K) {
        let Some(key) = names::attempt_of(object.labels()) else { return };
        let reference = ObjectRef::from_obj(object);
        let mut refs = self.lock();
        let entry = refs.entry(key).or_default();
        if !entry.contains(&reference) {
            entry.push(reference);
        }
    }

    /// Forgets an object that went away, keeping its last state (see [`AttemptIndex::gone`]).
    fn remove(&self, object: &K) {
        let Some(key) = names::attempt_of(object.labels()) else { return };
        let reference = ObjectRef::from_obj(object);
        {
            let mut refs = self.lock();
            if let Some(entry) = refs.get_mut(&key) {
                entry.retain(|r| *r != reference);
                if entry.is_empty() {
                    refs.remove(&key);
                }
            }
        }
        let Some(gone) = &self.gone else { return };
        let mut gone = gone.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
        gone.by_attempt.entry(key).or_default().push(Arc::new(object.clone()));
        gone.order.push_back(key);
        while gone.order.len() > GONE_KEPT {
            let oldest = gone.order.pop_front().expect("not empty");
            if let Some(entry) = gone.by_attempt.get_mut(&oldest) {
                entry.remove(0);
                if entry.is_empty() {
                    gone.by_attempt.remove(&oldest);
                }
            }
        }
    }

    /// The attempt's objects deleted lately, in their last state as the delete event showed it.
    fn gone(&self, job_id: Uuid, attempt: i32) -> Vec<Arc<K>> {
        let Some(gone) = &self.gone else { return Vec::new() };
        let gone = gone.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
        gone.by_attempt.get(&(job_id, attempt)).cloned().unwrap_or_default()
    }

    /// Whether one of the attempt's objects is being taken out: the store no longer has it and
    /// the watcher has not yet noted it gone (the reflector applies a deletion to the store
    /// before the watcher's loop sees the event).
    fn in_flux(&self, store: &Store<K>, job_id: Uuid, attempt: i32) -> bool {
        let refs = self.lock();
        refs.get(&(job_id, attempt)).is_some_and(|entry| entry.iter().any(|r| store.get(r).is_none()))
    }

    /// After a relist: forgets what the store no longer holds (deleted while the watch was down).
    fn prune(&self, store: &Store<K>) {
        let mut refs = self.lock();
        refs.retain(|_, entry| {
            entry.retain(|r| store.get(r).is_some());
            !entry.is_empty()
        });
    }

    /// The attempt's objects as the store holds them now.
    fn get(&self, store: &Store<K>, job_id: Uuid, attempt: i32) -> Vec<Arc<K>> {
        let refs = self.lock();
        refs.get(&(job_id, attempt))
            .map(|entry| entry.iter().filter_map(|r| store.get(r)).collect())
            .unwrap_or_default()
    }
}

impl Drop for Cache {
    fn drop(&mut self) {
        for task in &self.tasks {
            task.abort();
        }
    }
}

impl Cache {
    /// Starts the three watchers. They retry with backoff on errors, forever.
    pub fn start(client: &Client, changes: Arc<Notify>) -> Cache {
        let managed = watcher::Config::default().labels(MANAGED_SELECTOR);
        let pods_by_attempt = Arc::new(AttemptIndex::new(true));
        let jobs_by_attempt = Arc::new(AttemptIndex::new(false));
        let (pods, pods_task) = watch(
            Api::<Pod>::all(client.clone()),
            managed.clone(),
            Arc::clone(&changes),
            |p| fingerprint(&p.status),
            Some(Arc::clone(&pods_by_attempt)),
        );
        let (jobs, jobs_task) = watch(
            Api::<Job>::all(client.clone()),
            managed,
            Arc::clone(&changes),
            |j| fingerprint(&j.status),
            Some(Arc::clone(&jobs_by_attempt)),
        );
        let (nodes, nodes_task) = watch(
            Api::<Node>::all(client.clone()),
            watcher::Config::default(),
            changes,
            |n| fingerprint(&(&n.spec, &n.status, &n.metadata.labels)),
            None,
        );
        Cache { pods, jobs, nodes, pods_by_attempt, jobs_by_attempt, tasks: vec![pods_task, jobs_task, nodes_task] }
    }

    /// Waits until the pod and Job watchers have listed once, so that an absent object really
    /// is absent. Nodes are not waited for: without the right to list them, jobs still run.
    pub async fn ready(&self) {
        // An error means the watcher task ended (the cache is being dropped): nothing to wait for.
        let _ = tokio::join!(self.pods.wait_until_ready(), self.jobs.wait_until_ready());
    }

    /// Whether the node watcher has listed the nodes (so a node missing from it is gone).
    pub fn nodes_listed(&self) -> bool {
        matches!(futures::FutureExt::now_or_never(self.nodes.wait_until_ready()), Some(Ok(())))
    }

    /// The Job of an attempt, found by its labels wherever it lives.
    pub fn job_of(&self, job_id: Uuid, attempt: i32) -> Option<Arc<Job>> {
        self.jobs_by_attempt.get(&self.jobs, job_id, attempt).into_iter().next()
    }

    /// The pods of an attempt, with the rank each runs (its completion index).
    pub fn pods_of(&self, job_id: Uuid, attempt: i32) -> Vec<(u32, Arc<Pod>)> {
        self.pods_by_attempt
            .get(&self.pods, job_id, attempt)
            .into_iter()
            .filter_map(|pod| Some((rank_of(&pod)?, pod)))
            .collect()
    }

    /// The pods of an attempt deleted lately, with their rank, in their last state: a pod that
    /// ran to its end just before a deletion (a stop that crossed its exit) is not there any
    /// more, but how it ended is.
    pub fn pods_gone_of(&self, job_id: Uuid, attempt: i32) -> Vec<(u32, Arc<Pod>)> {
        self.pods_by_attempt.gone(job_id, attempt).into_iter().filter_map(|pod| Some((rank_of(&pod)?, pod))).collect()
    }

    /// Whether a pod of the attempt is being taken out of the cache right now (see
    /// [`AttemptIndex::in_flux`]): until it is, how it ended is not known yet.
    pub fn pods_in_flux(&self, job_id: Uuid, attempt: i32) -> bool {
        self.pods_by_attempt.in_flux(&self.pods, job_id, attempt)
    }

    /// Whether the node watcher holds a node of this name.
    pub fn node_exists(&self, name: &str) -> bool {
        self.nodes.get(&ObjectRef::new(name)).is_some()
    }
}

/// The completion index Kubernetes gave a pod of an Indexed Job.
pub fn rank_of(pod: &Pod) -> Option<u32> {
    pod.labels().get(COMPLETION_INDEX).or_else(|| pod.annotations().get(COMPLETION_INDEX))?.parse().ok()
}

/// Runs one reflector: keeps a store of every object the watcher sees (and, given an index, which
/// attempt each belongs to), and notifies `changes` when the fingerprint `watched` takes of an
/// object changes, or an object goes away.
fn watch<K>(
    api: Api<K>,
    config: watcher::Config,
    changes: Arc<Notify>,
    watched: fn(&K) -> u64,
    index: Option<Arc<AttemptIndex<K>>>,
) -> (Store<K>, JoinHandle<()>)
where
    K: Resource<DynamicType = ()> + Clone + DeserializeOwned + std::fmt::Debug + Send + Sync + 'static,
{
    let (store, writer) = reflector::store();
    let reader = store.clone();
    let seen: Mutex<HashMap<String, u64>> = Mutex::new(HashMap::new());
    let task = tokio::spawn(async move {
        // The reflector has applied each event to the store before it comes out here.
        let events = watcher(api, config).default_backoff().reflect(writer);
        futures::pin_mut!(events);
        while let Some(event) = events.next().await {
            let changed = match event {
                Ok(watcher::Event::Apply(object) | watcher::Event::InitApply(object)) => {
                    if let Some(index) = &index {
                        index.add(&object);
                    }
                    let hash = watched(&object);
                    let key = object.uid().unwrap_or_default();
                    seen.lock().expect("fingerprints poisoned").insert(key, hash) != Some(hash)
                }
                Ok(watcher::Event::Delete(object)) => {
                    if let Some(index) = &index {
                        index.remove(&object);
                    }
                    seen.lock().expect("fingerprints poisoned").remove(&object.uid().unwrap_or_default());
                    true
                }
                Ok(watcher::Event::InitDone) => {
                    if let Some(index) = &index {
                        index.prune(&reader);
                    }
                    true
                }
                Ok(watcher::Event::Init) => false,
                Err(err) => {
                    tracing::warn!(%err, "kubernetes watch failed; retrying");
                    false
                }
            };
            if changed {
                changes.notify_one();
            }
        }
    });
    (store, task)
}

fn fingerprint<W: Serialize>(value: &W) -> u64 {
    let mut hasher = DefaultHasher::new();
    serde_json::to_string(value).unwrap_or_default().hash(&mut hasher);
    hasher.finish()
}
