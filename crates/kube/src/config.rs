//! Settings of the Kubernetes executor, with defaults that suit a typical GPU cluster.

use std::path::PathBuf;
use std::time::Duration;

/// How the Kubernetes executor names, places and limits what it creates.
#[derive(Debug, Clone)]
pub struct KubeConfig {
    /// Tenant namespaces are `<prefix><tenant id>`. Default `trainyard-`.
    pub namespace_prefix: String,
    /// The node label whose value is a node's GPU type. Default `nvidia.com/gpu.product`.
    pub gpu_label_key: String,
    /// The image every replica runs (job specs name a program, not an image).
    pub image: String,
    /// `Always`, `IfNotPresent` or `Never`. Default `IfNotPresent`.
    pub image_pull_policy: String,
    /// The one field manager of every server-side apply. Default `trainyard`.
    pub field_manager: String,
    /// Where each replica starts and finds `template/`. Default `/workspace`.
    pub working_dir: String,
    /// The rendezvous port (MASTER_PORT). Default 29500, as torchrun.
    pub master_port: u16,
    /// The user and group replicas run as (never root). Default 1000.
    pub run_as_user: i64,
    /// Seconds a replica gets between SIGTERM and SIGKILL when its attempt is stopped.
    pub termination_grace: Duration,
    /// How long a replica may wait for a node before its attempt fails as unschedulable.
    pub unschedulable_timeout: Duration,
    /// How long an image may fail to pull before its attempt fails.
    pub image_pull_timeout: Duration,
    /// Finished Jobs are removed by Kubernetes after this long if Trainyard has not removed
    /// them first (a safety net; Trainyard releases attempts itself).
    pub job_ttl_after_finished: Duration,
    /// Client-side rate limit: requests per second sustained ...
    pub client_qps: u32,
    /// ... and how many may go at once above that rate.
    pub client_burst: u32,
    /// Where the logs of ended attempts are kept: `<log_dir>/<job>/<attempt>/<replica>.log`.
    pub log_dir: PathBuf,
    /// The storage class of volumes that name none; `None`: the cluster's default class.
    pub storage_class: Option<String>,
    /// The node cache agent's URL as pods reach it (its node-local Service,
    /// deploy/kubernetes/cache-agent): replicas read datasets on Trainyard's object store
    /// through it (`TRAINYARD_DATASET_URL`). `None`: from the server, with no cache beyond the pod.
    pub cache_agent_url: Option<String>,
    /// This installation's id (`trainyard.dev/installation` on every attempt's objects): garbage
    /// collection deletes only Jobs that carry it. `None`: no label, and only unlabelled Jobs
    /// are collected.
    pub installation: Option<String>,
}

impl KubeConfig {
    /// The defaults, with the image and the log folder that have none.
    pub fn new(image: impl Into<String>, log_dir: impl Into<PathBuf>) -> KubeConfig {
        KubeConfig {
            namespace_prefix: "trainyard-".into(),
            gpu_label_key: "nvidia.com/gpu.product".into(),
            image: image.into(),
            image_pull_policy: "IfNotPresent".into(),
            field_manager: "trainyard".into(),
            working_dir: "/workspace".into(),
            master_port: 29500,
            run_as_user: 1000,
            termination_grace: Duration::from_secs(30),
            unschedulable_timeout: Duration::from_secs(600),
            image_pull_timeout: Duration::from_secs(300),
            job_ttl_after_finished: Duration::from_secs(24 * 3600),
            // Four requests per attempt: 1000 requests/s sustain 250 launches/s. The API
            // server's priority and fairness still protects itself from us.
            client_qps: 1000,
            client_burst: 2000,
            log_dir: log_dir.into(),
            storage_class: None,
            cache_agent_url: None,
            installation: None,
        }
    }
}
