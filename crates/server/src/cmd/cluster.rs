//! `trainyard serve --executor kubernetes`: the settings of the Kubernetes executor and a server
//! that runs jobs on the cluster it finds (in-cluster service account, else `KUBECONFIG`).

use std::path::Path;
use std::sync::Arc;

use anyhow::Context;
use trainyard_kube::{KubeConfig, KubernetesExecutor};
use trainyard_store::Store;

use crate::Server;
use crate::control::reconciler::ReconcilerSettings;
use crate::storage::StorageArgs;

/// Which backend runs the jobs.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, clap::ValueEnum)]
pub enum ExecutorKind {
    /// Child processes on this machine.
    #[default]
    Local,
    /// Indexed Jobs on a Kubernetes cluster.
    Kubernetes,
}

/// Settings of the Kubernetes executor (see docs/kubernetes.md).
#[derive(Debug, Clone, clap::Args)]
pub struct KubeExecutorArgs {
    /// The image every replica runs; required with `--executor kubernetes`.
    #[arg(long)]
    pub kube_image: Option<String>,
    /// Tenant namespaces are this prefix and the tenant's name.
    #[arg(long, default_value = "trainyard-")]
    pub kube_namespace_prefix: String,
    /// The node label whose value is the node's GPU type.
    #[arg(long, default_value = "nvidia.com/gpu.product")]
    pub kube_gpu_label: String,
    /// Always, IfNotPresent or Never.
    #[arg(long, default_value = "IfNotPresent")]
    pub kube_image_pull_policy: String,
    /// Client-side limit on requests per second to the API server.
    #[arg(long, default_value_t = 1000)]
    pub kube_qps: u32,
    /// Requests allowed at once above that rate.
    #[arg(long, default_value_t = 2000)]
    pub kube_burst: u32,
    /// The storage class of volumes that name none (default: the cluster's default class).
    #[arg(long)]
    pub kube_storage_class: Option<String>,
    /// The node cache agent's URL as pods reach it, e.g.
    /// `http://trainyard-cache-agent.trainyard-cache.svc:8470` (deploy/kubernetes/cache-agent):
    /// jobs read datasets pushed to the object store through their node's cache. Without it they
    /// read from the server, and only the pod keeps what it read.
    #[arg(long, env = "TRAINYARD_KUBE_CACHE_AGENT_URL")]
    pub kube_cache_agent_url: Option<String>,
}

/// A server whose jobs run on Kubernetes; kept logs of ended attempts go under `data_dir/logs`.
pub async fn kube_server(
    store: Store,
    data_dir: &Path,
    args: &KubeExecutorArgs,
    storage: &StorageArgs,
    settings: ReconcilerSettings,
) -> anyhow::Result<Server> {
    let image = args.kube_image.clone().context("--kube-image is required with --executor kubernetes")?;
    let mut config = KubeConfig::new(image, data_dir.join("logs"));
    config.namespace_prefix = args.kube_namespace_prefix.clone();
    config.gpu_label_key = args.kube_gpu_label.clone();
    config.image_pull_policy = args.kube_image_pull_policy.clone();
    config.client_qps = args.kube_qps;
    config.client_burst = args.kube_burst;
    config.storage_class = args.kube_storage_class.clone();
    config.cache_agent_url = args.kube_cache_agent_url.clone();
    config.termination_grace = settings.grace;
    config.installation = Some(store.installation_id().await.context("reading this installation's id")?.to_string());
    let executor = KubernetesExecutor::connect(config).await.context("connecting to Kubernetes")?;
    let storage = storage.open(data_dir).context("opening the object store")?;
    Server::new(store, Arc::new(executor), storage, settings).map_err(anyhow::Error::msg)
}
