//! [`KubernetesExecutor`]: the [`Executor`] that runs each attempt as an Indexed Job.
//!
//! Durable truth is in Postgres and in the cluster; this struct holds only caches:
//! - the watched pods, Jobs and nodes ([`Cache`]);
//! - the tenants whose namespace objects it applied since it started (so it applies them once
//!   per tenant and again only when the ceiling changes);
//! - attempts it launched or stopped recently, and replica ends it saw, so that a pod removed
//!   after its end still reports how it ended.
//!
//! After a restart all of that is rebuilt from labels: the watchers list every Trainyard object,
//! an attempt's Job is found by `trainyard.dev/job` and `trainyard.dev/attempt`, and a launch of
//! an attempt whose Job exists sends nothing.

use std::collections::{HashMap, HashSet};
use std::path::PathBuf;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use futures::TryFutureExt;
use k8s_openapi::api::batch::v1::Job;
use k8s_openapi::api::core::v1::{Event, Namespace, PersistentVolumeClaim, Pod};
use kube::api::{DeleteParams, ListParams, LogParams, Patch, PatchParams};
use kube::runtime::reflector::ObjectRef;
use kube::{Api, Client, Resource, ResourceExt};
use serde::Serialize;
use serde::de::DeserializeOwned;
use tokio::io::AsyncRead;
use tokio::sync::Notify;
use tokio_util::compat::FuturesAsyncReadCompatExt;
use trainyard_executor::{
    AttemptRef, Executor, ExecutorError, Inventory, LaunchRequest, NodeInventory, QuotaCeiling, ReplicaDetail,
    ReplicaPhase, ReplicaStatus, VolumeRequest,
};
use uuid::Uuid;

use crate::cache::Cache;
use crate::config::KubeConfig;
use crate::inventory;
use crate::manifests::{self, ManifestError};
use crate::names;
use crate::names::TenantRef;
use crate::status::{self, Context, Patience};

/// How long after launching an attempt its missing Job is put down to watch lag, not loss.
const WATCH_LAG: Duration = Duration::from_secs(120);
/// How long after asking an attempt to stop a replica that shows no pod, its Job gone, still
/// counts as stopping: a pod the Job controller made just before the Job's deletion may reach
/// this process's pod watch after the Job's removal reached its Job watch (two streams), and
/// such a pod may have run to its end.
const STOP_SETTLE: Duration = Duration::from_secs(5);
/// Jobs younger than this are never collected: their launch may not be recorded yet.
const GC_MIN_AGE: Duration = Duration::from_secs(300);
/// How long a call waits for the watchers' first list before answering without them.
const CACHE_WAIT: Duration = Duration::from_secs(30);
/// The container every replica runs in.
const CONTAINER: &str = "replica";

#[derive(Debug, thiserror::Error)]
pub enum KubeError {
    #[error("cannot reach Kubernetes: {0}")]
    Config(String),
    #[error("Kubernetes refused {what}: {message}", message = api_message(.source))]
    Api {
        what: String,
        #[source]
        source: kube::Error,
    },
    #[error(transparent)]
    Manifest(#[from] ManifestError),
    #[error("Kubernetes returned the Job {0} without a uid")]
    NoUid(String),
    #[error("the cluster has not been listed yet (is the API server reachable?)")]
    NotObserved,
}

impl KubeError {
    /// Whether the error says nothing about the job: the cluster is unreachable, not listed yet,
    /// overloaded (429) or failing (5xx). Those are retried by the control plane; a refusal of
    /// the request itself (403, 422, ...) or a bad manifest ends the attempt.
    pub fn is_transient(&self) -> bool {
        match self {
            KubeError::Config(_) | KubeError::NotObserved => true,
            KubeError::Api { source, .. } => match source {
                kube::Error::Api(status) => status.code == 429 || status.code >= 500,
                kube::Error::HyperError(_) | kube::Error::Service(_) => true,
                _ => false,
            },
            KubeError::Manifest(_) | KubeError::NoUid(_) => false,
        }
    }
}

impl From<KubeError> for ExecutorError {
    fn from(err: KubeError) -> ExecutorError {
        if err.is_transient() {
            ExecutorError::Unavailable(err.to_string())
        } else {
            ExecutorError::Launch(err.to_string())
        }
    }
}

/// Where an attempt runs, as stored in Postgres.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, serde::Deserialize)]
pub struct KubePlacement {
    pub executor: String,
    pub namespace: String,
    pub job: String,
    pub master_addr: String,
}

pub struct KubernetesExecutor {
    client: Client,
    config: KubeConfig,
    cache: Cache,
    changes: Arc<Notify>,
    /// Ceilings the server set, by tenant.
    ceilings: Mutex<HashMap<Uuid, QuotaCeiling>>,
    /// Tenants whose namespace objects were applied, with the ceiling applied.
    tenants_applied: tokio::sync::Mutex<HashMap<Uuid, (TenantRef, Option<QuotaCeiling>)>>,
    launched: Mutex<HashMap<(Uuid, i32), Instant>>,
    /// Attempts asked to stop, and when.
    stopped: Mutex<HashMap<(Uuid, i32), Instant>>,
    ended: Mutex<HashMap<(Uuid, i32, u32), ReplicaDetail>>,
    /// Attempts whose launch failed and was cleaned up: the next launch applies them afresh.
    relaunch: Mutex<HashSet<(Uuid, i32)>>,
}

/// A client for the API server `kube_config` names, rate-limited by `config`'s qps and burst.
/// kube's TLS is rustls with no crypto provider chosen by features: this names ring, once per
/// process (harmless when something else installed one first), so that any binary or test
/// linking this crate can reach an `https` API server.
pub fn client_for(kube_config: kube::Config, config: &KubeConfig) -> Result<Client, KubeError> {
    let _ = rustls::crypto::ring::default_provider().install_default();
    let burst = u64::from(config.client_burst.max(1));
    let window = Duration::from_secs_f64(burst as f64 / f64::from(config.client_qps.max(1)));
    Ok(kube::client::ClientBuilder::try_from(kube_config)
        .map_err(|e| KubeError::Config(e.to_string()))?
        .with_layer(&tower::limit::RateLimitLayer::new(burst, window))
        .build())
}

impl KubernetesExecutor {
    /// Connects with in-cluster config or `KUBECONFIG` (as kubectl does), behind a client-side
    /// rate limit of `client_burst` requests per `client_burst / client_qps` seconds.
    pub async fn connect(config: KubeConfig) -> Result<KubernetesExecutor, KubeError> {
        let kube_config = kube::Config::infer().await.map_err(|e| KubeError::Config(e.to_string()))?;
        let client = client_for(kube_config, &config)?;
        Ok(KubernetesExecutor::with_client(client, config))
    }

    /// Uses a client made elsewhere (tests pass one over a scripted API server). Starts the
    /// watchers at once.
    pub fn with_client(client: Client, config: KubeConfig) -> KubernetesExecutor {
        let changes = Arc::new(Notify::new());
        let cache = Cache::start(&client, Arc::clone(&changes));
        KubernetesExecutor {
            client,
            config,
            cache,
            changes,
            ceilings: Mutex::new(HashMap::new()),
            tenants_applied: tokio::sync::Mutex::new(HashMap::new()),
            launched: Mutex::new(HashMap::new()),
            stopped: Mutex::new(HashMap::new()),
            ended: Mutex::new(HashMap::new()),
            relaunch: Mutex::new(HashSet::new()),
        }
    }

    pub fn config(&self) -> &KubeConfig {
        &self.config
    }

    /// Waits until the watchers have listed the cluster once.
    pub async fn ready(&self) {
        self.cache.ready().await;
    }

    /// Waits (a bounded time) for the watchers' first list; false if it has not come, so that
    /// a call never acts on an incomplete picture nor hangs while the API server is away.
    async fn ready_soon(&self) -> bool {
        tokio::time::timeout(CACHE_WAIT, self.cache.ready()).await.is_ok()
    }

    /// Server-side apply with our one field manager, forcing ownership of our fields.
    async fn apply<K>(&self, object: &K) -> Result<K, KubeError>
    where
        K: Resource<DynamicType = ()> + Clone + DeserializeOwned + Serialize + std::fmt::Debug,
        K::Scope: ApiScope,
    {
        let name = object.meta().name.clone().unwrap_or_default();
        let api: Api<K> = K::Scope::api(self.client.clone(), object.meta().namespace.as_deref());
        let params = PatchParams::apply(&self.config.field_manager).force();
        api.patch(&name, &params, &Patch::Apply(object))
            .await
            .map_err(|source| KubeError::Api { what: format!("applying {} {name}", K::kind(&())), source })
    }

    /// Applies a tenant's namespace objects unless this process applied them already with the
    /// same ceiling. The namespace goes first; the rest go together.
    async fn tenant_ensure(&self, tenant: &TenantRef) -> Result<(), KubeError> {
        let ceiling = self.ceilings.lock().expect("ceilings poisoned").get(&tenant.id).cloned();
        let mut applied = self.tenants_applied.lock().await;
        if applied.get(&tenant.id).is_some_and(|(known, applied)| known == tenant && *applied == ceiling) {
            return Ok(());
        }
        let objects = manifests::tenant_objects(&self.config, tenant, ceiling.as_ref());
        self.apply(&objects.namespace).await?;
        let quota = async {
            match &objects.quota {
                Some(quota) => self.apply(quota).await.map(|_| ()),
                None => Ok(()),
            }
        };
        futures::try_join!(
            quota,
            self.apply(&objects.limit_range).map_ok(|_| ()),
            self.apply(&objects.network_policy).map_ok(|_| ()),
            self.apply(&objects.service_account).map_ok(|_| ()),
        )?;
        applied.insert(tenant.id, (tenant.clone(), ceiling));
        Ok(())
    }

    fn placement(&self, request: &LaunchRequest) -> KubePlacement {
        let namespace = names::namespace(&self.config.namespace_prefix, &request.tenant, request.tenant_id);
        KubePlacement {
            executor: "kubernetes".into(),
            job: names::attempt_object(request.job_id, request.attempt),
            master_addr: names::master_addr(request.job_id, request.attempt, &namespace),
            namespace,
        }
    }

    /// Applies the attempt's objects: the Job first (the others need its uid as their owner),
    /// then its Service, ConfigMap and Secret together. Four requests.
    async fn attempt_apply(&self, request: &LaunchRequest) -> Result<(), KubeError> {
        let gpu_label = request.spec.resources.gpu_type.as_deref().map(|gpu_type| {
            inventory::gpu_label_value(&self.cache.nodes.state(), &self.config.gpu_label_key, gpu_type)
        });
        let mut objects = manifests::attempt_objects(&self.config, request, gpu_label.as_deref())?;
        let applied = async {
            let job = self.apply(&objects.job).await?;
            let uid = job.uid().ok_or_else(|| KubeError::NoUid(job.name_any()))?;
            self.attempt_apply_owned(&mut objects, &uid).await
        }
        .await;
        if let Err(err) = &applied {
            // A launch that fails removes what it applied at once: deleting the Job takes its
            // pods and the objects it owns with it (a Job that was never made answers 404).
            let namespace = objects.job.namespace().unwrap_or_default();
            let name = objects.job.name_any();
            tracing::warn!(%err, job = %request.job_id, attempt = request.attempt, "launch failed; removing what it applied");
            self.job_delete(&namespace, &name, Some(Duration::ZERO), DeleteParams::background()).await;
            self.relaunch
                .lock()
                .unwrap_or_else(std::sync::PoisonError::into_inner)
                .insert((request.job_id, request.attempt));
        }
        applied
    }

    /// Applies the attempt's Service, ConfigMap and Secret, owned by its Job (`uid`).
    async fn attempt_apply_owned(&self, objects: &mut manifests::AttemptObjects, uid: &str) -> Result<(), KubeError> {
        manifests::attempt_owned_by(objects, uid);
        // All three to the end, so that none is still in flight when a failure cleans up.
        let (service, config_map, secret) =
            futures::join!(self.apply(&objects.service), self.apply(&objects.config_map), self.apply(&objects.secret),);
        service.and(config_map).and(secret).map(|_| ())
    }

    /// Finishes a launch cut short after its Job was applied (a crash, or lost leadership,
    /// between the Job and the objects it owns): applies the Service, ConfigMap and Secret
    /// again (applying is idempotent), owned by the Job there is. Without them the Job's pods
    /// wait for their ConfigMap forever, holding the job's quota and nodes.
    async fn attempt_apply_rest(&self, request: &LaunchRequest, job: &Job) -> Result<(), KubeError> {
        let gpu_label = request.spec.resources.gpu_type.as_deref().map(|gpu_type| {
            inventory::gpu_label_value(&self.cache.nodes.state(), &self.config.gpu_label_key, gpu_type)
        });
        let mut objects = manifests::attempt_objects(&self.config, request, gpu_label.as_deref())?;
        let uid = job.uid().ok_or_else(|| KubeError::NoUid(job.name_any()))?;
        self.attempt_apply_owned(&mut objects, &uid).await
    }

    /// Each replica's detail, from the watched pods, what this process saw end, and the Job.
    fn details_now(&self, attempt: &AttemptRef) -> Vec<ReplicaDetail> {
        let key = (attempt.job_id, attempt.attempt);
        let pods: HashMap<u32, Arc<Pod>> = newest_by_rank(self.cache.pods_of(attempt.job_id, attempt.attempt));
        let in_flux = self.cache.pods_in_flux(attempt.job_id, attempt.attempt);
        // Pods deleted once they had ended (succeeded or failed): how they ended.
        let ended_then_gone: HashMap<u32, Arc<Pod>> = newest_by_rank(
            self.cache
                .pods_gone_of(attempt.job_id, attempt.attempt)
                .into_iter()
                .filter(|(_, pod)| {
                    pod.status
                        .as_ref()
                        .and_then(|s| s.phase.as_deref())
                        .is_some_and(|p| p == "Succeeded" || p == "Failed")
                })
                .collect(),
        );
        let job = self.cache.job_of(attempt.job_id, attempt.attempt);
        let launched_recently =
            self.launched.lock().expect("launched poisoned").get(&key).is_some_and(|at| at.elapsed() < WATCH_LAG);
        let stopped = self.stopped.lock().expect("stopped poisoned").get(&key).map(Instant::elapsed);
        let node_exists = |name: &str| self.cache.node_exists(name);
        let ctx = Context {
            now: k8s_openapi::jiff::Timestamp::now(),
            patience: Patience {
                unschedulable: self.config.unschedulable_timeout,
                image_pull: self.config.image_pull_timeout,
            },
            // Until the node watcher has listed the nodes (it may lack the rights, or be behind),
            // no pod is declared lost for its node.
            node_exists: self.cache.nodes_listed().then_some(&node_exists as &dyn Fn(&str) -> bool),
        };
        let mut ended = self.ended.lock().expect("ended poisoned");
        (0..attempt.replicas)
            .map(|rank| {
                if let Some(detail) = ended.get(&(attempt.job_id, attempt.attempt, rank)) {
                    return detail.clone();
                }
                let detail = match pods.get(&rank).or_else(|| ended_then_gone.get(&rank)) {
                    Some(pod) => status::replica_from_pod(rank, pod, &ctx),
                    // A deletion half taken in: how the pod ended shows at the next look.
                    None if in_flux => return ReplicaDetail::from_status(rank, ReplicaStatus::Running),
                    None => without_pod(rank, job.as_deref(), launched_recently, stopped),
                };
                if matches!(detail.phase, ReplicaPhase::Succeeded | ReplicaPhase::Failed) {
                    ended.insert((attempt.job_id, attempt.attempt, rank), detail.clone());
                }
                detail
            })
            .collect()
    }

    fn log_path(&self, job_id: Uuid, attempt: i32, replica: u32) -> PathBuf {
        self.config.log_dir.join(job_id.to_string()).join(attempt.to_string()).join(format!("{replica}.log"))
    }

    /// Copies each replica's pod log into the log folder, so that it outlives the pod.
    async fn logs_archive(&self, attempt: &AttemptRef) {
        for (rank, pod) in newest_by_rank(self.cache.pods_of(attempt.job_id, attempt.attempt)) {
            let path = self.log_path(attempt.job_id, attempt.attempt, rank);
            if path.exists() {
                continue;
            }
            let api: Api<Pod> = Api::namespaced(self.client.clone(), &pod.namespace().unwrap_or_default());
            let params = LogParams { container: Some(CONTAINER.into()), ..LogParams::default() };
            match api.logs(&pod.name_any(), &params).await {
                Ok(text) => {
                    if let Err(err) = write_log(&path, text.as_bytes()).await {
                        tracing::warn!(%err, path = %path.display(), "cannot keep a replica's log");
                    }
                }
                Err(err) => tracing::warn!(%err, pod = %pod.name_any(), "cannot read a replica's log to keep it"),
            }
        }
    }

    /// Follows each running replica's log to its end in the background, into the log folder:
    /// a stopped pod is removed soon after it exits, and its last words with it.
    fn logs_follow(&self, attempt: &AttemptRef) {
        for (rank, pod) in newest_by_rank(self.cache.pods_of(attempt.job_id, attempt.attempt)) {
            let path = self.log_path(attempt.job_id, attempt.attempt, rank);
            let api: Api<Pod> = Api::namespaced(self.client.clone(), &pod.namespace().unwrap_or_default());
            let name = pod.name_any();
            tokio::spawn(async move {
                let params = LogParams { container: Some(CONTAINER.into()), follow: true, ..LogParams::default() };
                let text = match api.log_stream(&name, &params).await {
                    Ok(stream) => {
                        let mut text = Vec::new();
                        let _ = tokio::io::AsyncReadExt::read_to_end(&mut stream.compat(), &mut text).await;
                        text
                    }
                    Err(err) => {
                        tracing::debug!(%err, pod = %name, "no log to follow");
                        return;
                    }
                };
                if let Err(err) = write_log(&path, &text).await {
                    tracing::warn!(%err, path = %path.display(), "cannot keep a replica's log");
                }
            });
        }
    }

    /// Deletes an attempt's Job; Kubernetes deletes its pods, Service, ConfigMap and Secret.
    async fn job_delete(&self, namespace: &str, name: &str, grace: Option<Duration>, mut params: DeleteParams) {
        let api: Api<Job> = Api::namespaced(self.client.clone(), namespace);
        params.grace_period_seconds = grace.map(|g| g.as_secs() as u32);
        match api.delete(name, &params).await {
            Ok(_) => {}
            Err(kube::Error::Api(status)) if status.code == 404 => {}
            Err(err) => tracing::warn!(%err, namespace, name, "cannot delete a Job"),
        }
    }

    /// Where an attempt's Job lives: from the cache, else from its placement.
    fn job_location(&self, attempt: &AttemptRef) -> Option<(String, String)> {
        if let Some(job) = self.cache.job_of(attempt.job_id, attempt.attempt) {
            return Some((job.namespace().unwrap_or_default(), job.name_any()));
        }
        let placement: KubePlacement = serde_json::from_value(attempt.placement.clone()?).ok()?;
        Some((placement.namespace, placement.job))
    }

    /// The garbage collection of [`Executor::garbage_collect`], callable without the trait.
    pub async fn jobs_collect(&self, live: &[(Uuid, i32)]) -> usize {
        if !self.ready_soon().await {
            return 0; // never delete on an incomplete picture
        }
        let live: HashSet<(Uuid, i32)> = live.iter().copied().collect();
        let now = k8s_openapi::jiff::Timestamp::now();
        let doomed: Vec<Arc<Job>> = self.cache.jobs.state_filter(|job| {
            let Some(key) = names::attempt_of(job.labels()) else { return false };
            if !names::made_by(job.labels(), self.config.installation.as_deref()) {
                return false; // another installation's, whatever its database says
            }
            let age = job.creation_timestamp().map(|t| now.duration_since(t.0).unsigned_abs()).unwrap_or_default();
            !live.contains(&key)
                && age >= GC_MIN_AGE
                && !self.launched.lock().expect("launched poisoned").contains_key(&key)
        });
        for job in &doomed {
            tracing::info!(namespace = ?job.namespace(), job = %job.name_any(), "collecting the Job of an ended or unknown attempt");
            self.job_delete(&job.namespace().unwrap_or_default(), &job.name_any(), None, DeleteParams::background())
                .await;
        }
        doomed.len()
    }
}

/// A replica whose pod is not (or no longer) there.
/// `stopped`: how long ago the attempt was asked to stop, if it was.
fn without_pod(rank: u32, job: Option<&Job>, launched_recently: bool, stopped: Option<Duration>) -> ReplicaDetail {
    let mut detail = ReplicaDetail::from_status(rank, ReplicaStatus::Running);
    if let Some(since) = stopped {
        if job.is_some() || since < STOP_SETTLE {
            // Its Job, deleted in the foreground, goes only once its pods have: until then (and
            // for the watches to settle after) a pod not seen yet may be running, or may have
            // run to its end, which would make the attempt a success.
            detail.phase = ReplicaPhase::Pending;
            detail.message = Some("being stopped".into());
            return detail;
        }
        // We deleted it and it is gone: it ended as a stopped process does.
        detail.phase = ReplicaPhase::Failed;
        detail.exit_code = Some(143);
        detail.message = Some("stopped".into());
        return detail;
    }
    let job_failed = job
        .and_then(|j| j.status.as_ref()?.conditions.as_ref())
        .is_some_and(|c| c.iter().any(|c| c.type_ == "Failed" && c.status == "True"));
    if job.is_some() && !job_failed || (job.is_none() && launched_recently) {
        detail.phase = ReplicaPhase::Pending;
        detail.message = Some("waiting for its pod".into());
        return detail;
    }
    let mut lost = ReplicaDetail::from_status(rank, ReplicaStatus::Lost);
    lost.message = Some(if job_failed { "stopped because another replica failed" } else { "its pod vanished" }.into());
    lost
}

/// When an event last happened, by whichever field its reporter filled.
fn event_time(event: &Event) -> Option<k8s_openapi::jiff::Timestamp> {
    event
        .last_timestamp
        .as_ref()
        .or(event.first_timestamp.as_ref())
        .map(|t| t.0)
        .or_else(|| event.event_time.as_ref().map(|t| t.0))
        .or_else(|| event.metadata.creation_timestamp.as_ref().map(|t| t.0))
}

/// What the API server said, without kube's wrapping.
fn api_message(err: &kube::Error) -> String {
    match err {
        kube::Error::Api(status) => format!("{} ({})", status.message, status.code),
        other => other.to_string(),
    }
}

/// One pod per rank: the newest, since an Indexed Job may have replaced one.
fn newest_by_rank(pods: Vec<(u32, Arc<Pod>)>) -> HashMap<u32, Arc<Pod>> {
    let mut by_rank: HashMap<u32, Arc<Pod>> = HashMap::new();
    for (rank, pod) in pods {
        let newer = by_rank.get(&rank).is_none_or(|other| other.creation_timestamp() < pod.creation_timestamp());
        if newer {
            by_rank.insert(rank, pod);
        }
    }
    by_rank
}

async fn write_log(path: &std::path::Path, text: &[u8]) -> std::io::Result<()> {
    if let Some(parent) = path.parent() {
        tokio::fs::create_dir_all(parent).await?;
    }
    // Written aside and renamed, so a reader never sees half a log as the whole.
    let partial = path.with_extension("log.partial");
    tokio::fs::write(&partial, text).await?;
    tokio::fs::rename(&partial, path).await
}

/// Namespaced and cluster-scoped objects get their `Api` differently.
pub trait ApiScope {
    fn api<K: Resource<Scope = Self, DynamicType = ()>>(client: Client, namespace: Option<&str>) -> Api<K>;
}

impl ApiScope for k8s_openapi::NamespaceResourceScope {
    fn api<K: Resource<Scope = Self, DynamicType = ()>>(client: Client, namespace: Option<&str>) -> Api<K> {
        Api::namespaced(client, namespace.unwrap_or("default"))
    }
}

impl ApiScope for k8s_openapi::ClusterResourceScope {
    fn api<K: Resource<Scope = Self, DynamicType = ()>>(client: Client, _namespace: Option<&str>) -> Api<K> {
        Api::all(client)
    }
}

#[async_trait::async_trait]
impl Executor for KubernetesExecutor {
    fn name(&self) -> &'static str {
        "kubernetes"
    }

    fn image(&self) -> Option<String> {
        Some(self.config.image.clone())
    }

    fn inventory(&self) -> Inventory {
        inventory::total(&self.nodes().unwrap_or_default())
    }

    /// Applies the tenant's objects (once per tenant) and the attempt's four. An attempt this
    /// process launched is left as it is: a repeated launch sends nothing and returns the same
    /// placement. One whose Job exists but which this process did not launch (a launch resumed
    /// after a crash or lost leadership) gets the Job's other objects applied again, in case
    /// the launch was cut short between them.
    async fn launch(&self, request: &LaunchRequest) -> Result<serde_json::Value, ExecutorError> {
        if !self.ready_soon().await {
            return Err(KubeError::NotObserved.into());
        }
        let key = (request.job_id, request.attempt);
        let placement = serde_json::to_value(self.placement(request)).expect("placement serialises");
        let job_ref = ObjectRef::new(&names::attempt_object(request.job_id, request.attempt))
            .within(&names::namespace(&self.config.namespace_prefix, &request.tenant, request.tenant_id));
        // A launch that failed and was cleaned up is made afresh, whatever the watch still shows.
        let relaunch = self.relaunch.lock().unwrap_or_else(std::sync::PoisonError::into_inner).remove(&key);
        if !relaunch && self.launched.lock().expect("launched poisoned").contains_key(&key) {
            tracing::info!(job = %request.job_id, attempt = request.attempt, "attempt launched already; launching nothing");
            return Ok(placement);
        }
        if !relaunch && let Some(job) = self.cache.jobs.get(&job_ref) {
            // Its namespace and the tenant's objects are there: the Job is in it.
            tracing::info!(job = %request.job_id, attempt = request.attempt, "attempt's Job exists; applying what it owns");
            self.attempt_apply_rest(request, &job).await?;
            self.launched.lock().expect("launched poisoned").insert(key, Instant::now());
            return Ok(placement);
        }
        self.tenant_ensure(&TenantRef { id: request.tenant_id, slug: request.tenant.clone() }).await?;
        self.attempt_apply(request).await?;
        self.launched.lock().expect("launched poisoned").insert(key, Instant::now());
        Ok(placement)
    }

    async fn observe(&self, attempt: &AttemptRef) -> Vec<ReplicaStatus> {
        self.replica_details(attempt).await.iter().map(ReplicaDetail::status).collect()
    }

    /// Deletes the attempt's Job in the foreground: its pods get SIGTERM, then SIGKILL after
    /// the pod's grace period, and the Job goes only once they have (so that a Job gone means no
    /// pod of it runs: see `without_pod`). Logs are kept first by following each pod's log to its
    /// end.
    async fn terminate(&self, attempt: &AttemptRef, grace: Duration) {
        self.stopped
            .lock()
            .expect("stopped poisoned")
            .entry((attempt.job_id, attempt.attempt))
            .or_insert_with(Instant::now);
        let Some((namespace, name)) = self.job_location(attempt) else {
            return;
        };
        self.logs_follow(attempt);
        self.job_delete(&namespace, &name, Some(grace), DeleteParams::foreground()).await;
        self.changes.notify_one();
    }

    /// Keeps the attempt's logs, then deletes its Job and everything it owns.
    async fn release(&self, attempt: &AttemptRef) {
        self.logs_archive(attempt).await;
        if let Some((namespace, name)) = self.job_location(attempt) {
            self.job_delete(&namespace, &name, None, DeleteParams::background()).await;
        }
        let key = (attempt.job_id, attempt.attempt);
        self.launched.lock().expect("launched poisoned").remove(&key);
        self.stopped.lock().expect("stopped poisoned").remove(&key);
        self.ended.lock().expect("ended poisoned").retain(|(job, n, _), _| (*job, *n) != key);
    }

    async fn replica_details(&self, attempt: &AttemptRef) -> Vec<ReplicaDetail> {
        if !self.ready_soon().await {
            // Not seen is not ended: report every replica as waiting rather than lost.
            return (0..attempt.replicas)
                .map(|rank| ReplicaDetail {
                    phase: ReplicaPhase::Pending,
                    message: Some(KubeError::NotObserved.to_string()),
                    ..ReplicaDetail::from_status(rank, ReplicaStatus::Running)
                })
                .collect();
        }
        self.details_now(attempt)
    }

    /// Deletes the Jobs (and so everything else) of attempts that are not in `live`: finished,
    /// cancelled, or unknown to Trainyard; only Jobs this installation made
    /// ([`names::made_by`]). Jobs younger than a few minutes are spared, since
    /// their launch may not be recorded yet. Returns how many it deleted.
    async fn garbage_collect(&self, live: &[(Uuid, i32)]) -> usize {
        self.jobs_collect(live).await
    }

    fn nodes(&self) -> Option<Vec<NodeInventory>> {
        let mut nodes: Vec<NodeInventory> =
            self.cache.nodes.state().iter().map(|n| inventory::node_inventory(n, &self.config.gpu_label_key)).collect();
        nodes.sort_by(|a, b| a.name.cmp(&b.name));
        Some(nodes)
    }

    async fn tenant_ceiling_set(&self, tenant_id: Uuid, ceiling: &QuotaCeiling) -> Result<(), ExecutorError> {
        let changed = self.ceilings.lock().expect("ceilings poisoned").insert(tenant_id, ceiling.clone()).as_ref()
            != Some(ceiling);
        let known = self.tenants_applied.lock().await.get(&tenant_id).map(|(tenant, _)| tenant.clone());
        if changed && let Some(tenant) = known {
            // The namespace exists: bring its quota up to date now, not at the next launch.
            self.tenant_ensure(&tenant).await?;
        }
        Ok(())
    }

    /// Deletes the tenant's namespace; the namespace controller deletes everything in it (its
    /// claims, and with them the volumes' data as their storage class's reclaim policy says).
    /// The call returns once the API server accepted the deletion; a namespace already gone, or
    /// never made, is fine.
    async fn tenant_remove(&self, tenant_id: Uuid, tenant: &str) -> Result<(), ExecutorError> {
        let namespace = names::namespace(&self.config.namespace_prefix, tenant, tenant_id);
        self.tenants_applied.lock().await.remove(&tenant_id);
        self.ceilings.lock().expect("ceilings poisoned").remove(&tenant_id);
        let api: Api<Namespace> = Api::all(self.client.clone());
        match api.delete(&namespace, &DeleteParams::background()).await {
            Ok(_) => Ok(()),
            Err(kube::Error::Api(status)) if status.code == 404 => Ok(()),
            Err(source) => Err(KubeError::Api { what: format!("deleting namespace {namespace}"), source }.into()),
        }
    }

    /// A tenant's volumes are PersistentVolumeClaims, mounted under `/volumes/<name>`.
    fn volume_path(&self, name: &str) -> Option<String> {
        Some(format!("{}/{name}", names::VOLUMES_DIR))
    }

    fn provisions_volumes(&self) -> bool {
        true
    }

    /// The code shares the attempt's ConfigMap with the template's files, which are small.
    fn code_bytes_max(&self) -> Option<u64> {
        Some(crate::manifests::MAX_TEMPLATE_BYTES as u64)
    }

    /// Applies the volume's claim in the tenant's namespace (made first if new).
    async fn volume_ensure(&self, volume: &VolumeRequest) -> Result<(), ExecutorError> {
        let tenant = TenantRef { id: volume.tenant_id, slug: volume.tenant.clone() };
        self.tenant_ensure(&tenant).await?;
        self.apply(&manifests::volume_claim(&self.config, &tenant, volume)).await?;
        Ok(())
    }

    /// A claim that is not bound yet: the newest event about it says why (no default storage
    /// class, no volume big enough, a provisioner failing). `None` when bound, or when the
    /// claim cannot be read (no answer is better than a wrong one on a listing).
    async fn volume_pending_reason(&self, tenant_id: Uuid, tenant: &str, name: &str) -> Option<String> {
        let namespace = names::namespace(&self.config.namespace_prefix, tenant, tenant_id);
        let claim = names::volume_claim(name);
        let claims: Api<PersistentVolumeClaim> = Api::namespaced(self.client.clone(), &namespace);
        let pvc = match claims.get_opt(&claim).await {
            Ok(pvc) => pvc?,
            Err(err) => {
                tracing::debug!(%err, claim, "cannot read a volume's claim");
                return None;
            }
        };
        let phase = pvc.status.as_ref().and_then(|s| s.phase.as_deref()).unwrap_or("Pending");
        if phase == "Bound" {
            return None;
        }
        let events: Api<Event> = Api::namespaced(self.client.clone(), &namespace);
        let selector = format!("involvedObject.kind=PersistentVolumeClaim,involvedObject.name={claim}");
        let newest = match events.list(&ListParams::default().fields(&selector)).await {
            Ok(list) => list.items.into_iter().max_by_key(event_time).and_then(|e| e.message),
            Err(err) => {
                tracing::debug!(%err, claim, "cannot read the events of a volume's claim");
                None
            }
        };
        Some(match newest {
            Some(message) => format!("its claim is {}: {message}", phase.to_lowercase()),
            None => format!("its claim is {} and the cluster has not said why", phase.to_lowercase()),
        })
    }

    /// Deletes the volume's claim; the storage class's reclaim policy decides about the data.
    async fn volume_remove(&self, tenant_id: Uuid, tenant: &str, name: &str) -> Result<(), ExecutorError> {
        let namespace = names::namespace(&self.config.namespace_prefix, tenant, tenant_id);
        let api: Api<PersistentVolumeClaim> = Api::namespaced(self.client.clone(), &namespace);
        match api.delete(&names::volume_claim(name), &DeleteParams::background()).await {
            Ok(_) => Ok(()),
            Err(kube::Error::Api(status)) if status.code == 404 => Ok(()),
            Err(source) => Err(KubeError::Api { what: format!("deleting the claim of volume {name}"), source }.into()),
        }
    }

    /// Retention: the copies kept after the pods went (the object store has its own).
    async fn logs_remove(&self, job_id: Uuid) -> Result<(), ExecutorError> {
        match tokio::fs::remove_dir_all(self.config.log_dir.join(job_id.to_string())).await {
            Err(err) if err.kind() != std::io::ErrorKind::NotFound => Err(err.into()),
            _ => Ok(()),
        }
    }

    async fn log_reader(
        &self,
        job_id: Uuid,
        attempt: i32,
        replica: u32,
        follow: bool,
    ) -> Result<Option<Box<dyn AsyncRead + Send + Unpin>>, ExecutorError> {
        // Kept after the attempt ended; else streamed from the pod.
        if let Some(kept) = trainyard_executor::log_file(&self.log_path(job_id, attempt, replica)).await? {
            return Ok(Some(kept));
        }
        self.ready_soon().await;
        let Some(pod) = newest_by_rank(self.cache.pods_of(job_id, attempt)).remove(&replica) else {
            return Ok(None);
        };
        let api: Api<Pod> = Api::namespaced(self.client.clone(), &pod.namespace().unwrap_or_default());
        // Followed, the kubelet's stream waits for the pod's next line until the pod ends; not
        // followed, it ends where the log ends now (a reader of a running pod's log would
        // otherwise wait for the pod to end).
        let params = LogParams { container: Some(CONTAINER.into()), follow, ..LogParams::default() };
        match api.log_stream(&pod.name_any(), &params).await {
            Ok(stream) => Ok(Some(Box::new(stream.compat()))),
            // A pod still waiting for its container has no log yet.
            Err(kube::Error::Api(status)) if status.code == 400 || status.code == 404 => Ok(None),
            // The API server could not reach the pod's node (no address, kubelet down, ...): say so
            // rather than fail as if Trainyard had broken; the caller sees it as unavailable.
            Err(err) => Err(ExecutorError::Unavailable(format!(
                "Kubernetes cannot serve the log of pod {} now: {}",
                pod.name_any(),
                api_message(&err)
            ))),
        }
    }

    fn changes(&self) -> Arc<Notify> {
        Arc::clone(&self.changes)
    }
}
