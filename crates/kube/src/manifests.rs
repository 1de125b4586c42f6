//! Pure functions that build every object Trainyard puts into a cluster. No I/O: the same
//! request and settings always give the same objects, which the golden files under
//! `docs/examples/` hold and a test checks.
//!
//! Per tenant: [`tenant_objects`] (namespace, quota, limit range, network policy, service
//! account). Per attempt: [`attempt_objects`] (Indexed Job, headless Service, ConfigMap with the
//! template's files, Secret with the attempt's variables).

use std::collections::BTreeMap;

use k8s_openapi::ByteString;
use k8s_openapi::api::batch::v1::Job;
use k8s_openapi::api::core::v1::{
    ConfigMap, LimitRange, Namespace, PersistentVolumeClaim, ResourceQuota, Secret, Service, ServiceAccount,
};
use k8s_openapi::api::networking::v1::NetworkPolicy;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::OwnerReference;
use serde::de::DeserializeOwned;
use serde_json::{Value, json};
use trainyard_core::resources::Memory;
use trainyard_executor::{LaunchRequest, QuotaCeiling, VolumeRequest};

use crate::names::TenantRef;

use crate::config::KubeConfig;
use crate::names::{self, COMPLETION_INDEX, GPU_RESOURCE, JOB_SERVICE_ACCOUNT};

/// ConfigMaps hold at most 1 MiB; keep room for keys and metadata.
pub const MAX_TEMPLATE_BYTES: usize = 1000 * 1024;

#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum ManifestError {
    #[error("template file {0:?} has a name Kubernetes cannot hold (letters, digits, '.', '_', '-' and '/')")]
    FileName(String),
    #[error("template files {0:?} and {1:?} map to the same ConfigMap key")]
    FileCollision(String, String),
    #[error(
        "the template's files and the job's code take {0} bytes, more than a ConfigMap holds ({MAX_TEMPLATE_BYTES}); ship bigger code in the image or a volume"
    )]
    FilesTooLarge(usize),
    #[error("the job's code cannot be packed for the pod: {0}")]
    Code(String),
}

/// What a tenant's namespace holds before any of its jobs runs.
#[derive(Debug, Clone, PartialEq)]
pub struct TenantObjects {
    pub namespace: Namespace,
    /// Absent until the tenant's ceiling is known.
    pub quota: Option<ResourceQuota>,
    pub limit_range: LimitRange,
    pub network_policy: NetworkPolicy,
    pub service_account: ServiceAccount,
}

/// What one attempt consists of. The Job owns the rest (see [`attempt_owned_by`]). Its `Debug`
/// shows the Secret's name and keys, not its values (the job token is one).
#[derive(Clone, PartialEq)]
pub struct AttemptObjects {
    pub job: Job,
    pub service: Service,
    pub config_map: ConfigMap,
    pub secret: Secret,
}

impl std::fmt::Debug for AttemptObjects {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let keys: Vec<&String> = self.secret.data.iter().flat_map(|data| data.keys()).collect();
        f.debug_struct("AttemptObjects")
            .field("job", &self.job)
            .field("service", &self.service)
            .field("config_map", &self.config_map)
            .field(
                "secret",
                &format_args!("Secret {{ name: {:?}, keys: {keys:?}, values: <redacted> }}", self.secret.metadata.name),
            )
            .finish()
    }
}

/// Converts a manifest written as JSON into its typed form. The JSON is ours, so a mismatch is
/// a bug that the golden tests catch, not an input error.
fn typed<T: DeserializeOwned>(value: Value) -> T {
    serde_json::from_value(value).expect("manifest matches its Kubernetes type")
}

fn metadata(name: &str, namespace: Option<&str>, labels: &BTreeMap<String, String>) -> Value {
    let mut meta = json!({ "name": name, "labels": labels });
    if let Some(namespace) = namespace {
        meta["namespace"] = json!(namespace);
    }
    meta
}

/// The namespace of a tenant and what guards it.
pub fn tenant_objects(config: &KubeConfig, tenant: &TenantRef, ceiling: Option<&QuotaCeiling>) -> TenantObjects {
    let tenant_id = tenant.id;
    let ns = names::namespace(&config.namespace_prefix, &tenant.slug, tenant.id);
    let labels = names::tenant_labels(tenant_id);
    let mut ns_labels = labels.clone();
    // Replicas already run restricted; let the cluster refuse anything that is not.
    ns_labels.insert("pod-security.kubernetes.io/enforce".into(), "restricted".into());
    TenantObjects {
        namespace: typed(json!({
            "apiVersion": "v1", "kind": "Namespace",
            "metadata": metadata(&ns, None, &ns_labels),
        })),
        quota: ceiling.map(|ceiling| {
            // Only the amounts the ceiling names: a missing one is no limit, never zero.
            let mut hard = BTreeMap::new();
            if let Some(cpu) = ceiling.cpu_millis {
                hard.insert("requests.cpu".to_string(), format!("{cpu}m"));
            }
            if let Some(memory) = ceiling.memory_bytes {
                hard.insert("requests.memory".to_string(), Memory(memory).to_string());
            }
            if let Some(gpus) = ceiling.gpus {
                hard.insert(format!("requests.{GPU_RESOURCE}"), gpus.to_string());
            }
            typed(json!({
                "apiVersion": "v1", "kind": "ResourceQuota",
                "metadata": metadata("trainyard-ceiling", Some(&ns), &labels),
                "spec": { "hard": hard },
            }))
        }),
        limit_range: typed(json!({
            "apiVersion": "v1", "kind": "LimitRange",
            "metadata": metadata("trainyard-defaults", Some(&ns), &labels),
            "spec": { "limits": [{
                "type": "Container",
                "defaultRequest": { "cpu": "100m", "memory": "128Mi" },
                "default": { "cpu": "1", "memory": "1Gi" },
            }]},
        })),
        network_policy: typed(json!({
            "apiVersion": "networking.k8s.io/v1", "kind": "NetworkPolicy",
            "metadata": metadata("trainyard-same-namespace", Some(&ns), &labels),
            "spec": {
                "podSelector": {},
                "policyTypes": ["Ingress"],
                // Only pods of this namespace may connect: a job's replicas reach each other,
                // other tenants reach nothing.
                "ingress": [{ "from": [{ "podSelector": {} }] }],
            },
        })),
        service_account: typed(json!({
            "apiVersion": "v1", "kind": "ServiceAccount",
            "metadata": metadata(JOB_SERVICE_ACCOUNT, Some(&ns), &labels),
            "automountServiceAccountToken": false,
        })),
    }
}

/// The objects of one attempt. The Job carries no owner; the others get theirs from
/// [`attempt_owned_by`] once the Job's uid is known.
///
/// `gpu_label` is the value of the GPU label to select nodes by (the cluster's own spelling of
/// the job's GPU type); the GPU type itself when `None`.
pub fn attempt_objects(
    config: &KubeConfig,
    request: &LaunchRequest,
    gpu_label: Option<&str>,
) -> Result<AttemptObjects, ManifestError> {
    let ns = names::namespace(&config.namespace_prefix, &request.tenant, request.tenant_id);
    let name = names::attempt_object(request.job_id, request.attempt);
    let mut labels = names::attempt_labels(request.tenant_id, request.job_id, request.attempt);
    if let Some(installation) = &config.installation {
        labels.insert(names::LABEL_INSTALLATION.to_string(), installation.clone());
    }
    Ok(AttemptObjects {
        job: job(config, request, gpu_label, &ns, &name, &labels),
        service: typed(json!({
            "apiVersion": "v1", "kind": "Service",
            "metadata": metadata(&name, Some(&ns), &labels),
            "spec": {
                // Headless: each replica gets a stable DNS name, `<job>-<rank>.<service>`.
                "clusterIP": "None",
                "selector": selector(&labels),
                // Replicas rendezvous before they are ready.
                "publishNotReadyAddresses": true,
                "ports": [{ "name": "rendezvous", "port": config.master_port, "protocol": "TCP" }],
            },
        })),
        config_map: template_config_map(&ns, &name, &labels, &request.files, &request.code)?,
        secret: secret(&ns, &name, &labels, &request.env),
    })
}

/// A tenant's shared volume: a PersistentVolumeClaim in its namespace.
pub fn volume_claim(config: &KubeConfig, tenant: &TenantRef, volume: &VolumeRequest) -> PersistentVolumeClaim {
    let ns = names::namespace(&config.namespace_prefix, &tenant.slug, tenant.id);
    let mut labels = names::tenant_labels(tenant.id);
    labels.insert(names::LABEL_VOLUME.to_string(), volume.name.clone());
    let mut claim = json!({
        "apiVersion": "v1", "kind": "PersistentVolumeClaim",
        "metadata": metadata(&names::volume_claim(&volume.name), Some(&ns), &labels),
        "spec": {
            "accessModes": [volume.access_mode],
            "resources": { "requests": { "storage": volume.size_bytes.to_string() } },
        },
    });
    // No class named: the operator's, else none at all, so that the cluster's default class
    // provisions it (naming a class the cluster lacks leaves the claim Pending forever).
    if let Some(class) = volume.storage_class.as_ref().or(config.storage_class.as_ref()) {
        claim["spec"]["storageClassName"] = json!(class);
    }
    typed(claim)
}

/// The labels a Service selects on: the job and attempt, nothing that could change.
fn selector(labels: &BTreeMap<String, String>) -> BTreeMap<String, String> {
    labels
        .iter()
        .filter(|(k, _)| *k == names::LABEL_JOB || *k == names::LABEL_ATTEMPT)
        .map(|(k, v)| (k.clone(), v.clone()))
        .collect()
}

/// Sets the Job as the owner of the attempt's other objects, so that deleting the Job deletes
/// them too.
pub fn attempt_owned_by(objects: &mut AttemptObjects, job_uid: &str) {
    let owner = OwnerReference {
        api_version: "batch/v1".into(),
        kind: "Job".into(),
        name: objects.job.metadata.name.clone().unwrap_or_default(),
        uid: job_uid.into(),
        controller: Some(true),
        block_owner_deletion: Some(true),
    };
    objects.service.metadata.owner_references = Some(vec![owner.clone()]);
    objects.config_map.metadata.owner_references = Some(vec![owner.clone()]);
    objects.secret.metadata.owner_references = Some(vec![owner]);
}

/// The ConfigMap key of a template file: `engine/train.py` becomes `engine__train.py`.
fn config_map_key(path: &str) -> Result<String, ManifestError> {
    let ok = !path.is_empty()
        && !path.starts_with('/')
        && !path.split('/').any(|part| part.is_empty() || part == "." || part == "..")
        && path.chars().all(|c| c.is_ascii_alphanumeric() || "._-/".contains(c));
    if !ok {
        return Err(ManifestError::FileName(path.into()));
    }
    Ok(path.replace('/', "__"))
}

/// The ConfigMap key of the job's code, packed as one tar archive (see [`code_archive`]).
const CODE_KEY: &str = "trainyard-code.tar";
/// Where the init container finds the code archive.
const CODE_MOUNT: &str = "/trainyard-code";

/// The job's code as one tar archive, deterministic (sorted as given, no times or owners): an
/// init container unpacks it into the working directory, modes kept.
fn code_archive(code: &[trainyard_executor::CodeFile]) -> Result<Vec<u8>, ManifestError> {
    let mut builder = tar::Builder::new(Vec::new());
    for file in code {
        let mut header = tar::Header::new_ustar();
        header.set_size(file.content.len() as u64);
        header.set_mode(if file.executable { 0o755 } else { 0o644 });
        header.set_mtime(0);
        header.set_cksum();
        // Paths were checked at upload (relative, no '..'); long ones get the GNU extension.
        builder
            .append_data(&mut header, &file.path, file.content.as_slice())
            .map_err(|err| ManifestError::Code(format!("{}: {err}", file.path)))?;
    }
    builder.into_inner().map_err(|err| ManifestError::Code(err.to_string()))
}

fn template_config_map(
    ns: &str,
    name: &str,
    labels: &BTreeMap<String, String>,
    files: &BTreeMap<String, Vec<u8>>,
    code: &[trainyard_executor::CodeFile],
) -> Result<ConfigMap, ManifestError> {
    let code = if code.is_empty() { None } else { Some(code_archive(code)?) };
    let total: usize = files.iter().map(|(path, content)| path.len() + content.len()).sum::<usize>()
        + code.as_ref().map_or(0, Vec::len);
    if total > MAX_TEMPLATE_BYTES {
        return Err(ManifestError::FilesTooLarge(total));
    }
    let mut data = BTreeMap::new();
    let mut binary_data = BTreeMap::new();
    if let Some(code) = code {
        binary_data.insert(CODE_KEY.to_string(), ByteString(code));
    }
    let mut seen: BTreeMap<String, &str> = BTreeMap::new();
    for (path, content) in files {
        let key = config_map_key(path)?;
        if let Some(other) = seen.insert(key.clone(), path) {
            return Err(ManifestError::FileCollision(other.into(), path.clone()));
        }
        if key == CODE_KEY {
            return Err(ManifestError::FileCollision("the job's code".into(), path.clone()));
        }
        match std::str::from_utf8(content) {
            Ok(text) => data.insert(key, text.to_string()),
            Err(_) => binary_data.insert(key, ByteString(content.clone())).map(|_| String::new()),
        };
    }
    let mut config_map: ConfigMap = typed(json!({
        "apiVersion": "v1", "kind": "ConfigMap",
        "metadata": metadata(name, Some(ns), labels),
        "immutable": true,
    }));
    config_map.data = Some(data);
    config_map.binary_data = (!binary_data.is_empty()).then_some(binary_data);
    Ok(config_map)
}

/// The attempt's own variables (the job token, the API URL): kept in a Secret so that they
/// never appear in the Job's spec.
fn secret(ns: &str, name: &str, labels: &BTreeMap<String, String>, env: &BTreeMap<String, String>) -> Secret {
    let mut secret: Secret = typed(json!({
        "apiVersion": "v1", "kind": "Secret",
        "metadata": metadata(name, Some(ns), labels),
        "type": "Opaque",
        "immutable": true,
    }));
    secret.data = Some(env.iter().map(|(k, v)| (k.clone(), ByteString(v.as_bytes().to_vec()))).collect());
    secret
}

fn job(
    config: &KubeConfig,
    request: &LaunchRequest,
    gpu_label: Option<&str>,
    ns: &str,
    name: &str,
    labels: &BTreeMap<String, String>,
) -> Job {
    let spec = &request.spec;
    // A rerun's image by digest (the one its original ran), else the configured one.
    let image = spec.image.as_deref().unwrap_or(&config.image);
    let resources = &spec.resources;
    let mut limits = BTreeMap::from([
        ("cpu".to_string(), format!("{}m", resources.cpu.millis())),
        ("memory".to_string(), resources.memory.to_string()),
    ]);
    if resources.gpus > 0 {
        limits.insert(GPU_RESOURCE.to_string(), resources.gpus.to_string());
    }
    let node_selector: BTreeMap<String, String> = resources
        .gpu_type
        .iter()
        .map(|gpu_type| (config.gpu_label_key.clone(), gpu_label.unwrap_or(gpu_type).to_string()))
        .collect();
    let tolerations = if resources.gpus > 0 {
        json!([{ "key": GPU_RESOURCE, "operator": "Exists", "effect": "NoSchedule" }])
    } else {
        json!([])
    };
    let workdir = &config.working_dir;
    let mut mounts = vec![
        json!({ "name": "workspace", "mountPath": workdir }),
        json!({ "name": "template", "mountPath": format!("{workdir}/{}", trainyard_core::job::TEMPLATE_FILES_DIR), "readOnly": true }),
        json!({ "name": "shm", "mountPath": "/dev/shm" }),
    ];
    let mut volumes = vec![
        json!({ "name": "workspace", "emptyDir": {} }),
        json!({ "name": "template", "configMap": { "name": name, "items": template_items(&request.files) } }),
        // PyTorch's data loader workers share tensors through /dev/shm; the container runtime's
        // 64 MiB default is far too small.
        json!({ "name": "shm", "emptyDir": { "medium": "Memory", "sizeLimit": resources.memory.to_string() } }),
    ];
    // The tenant's volumes the job uses: each one's claim, mounted at the path the job was given.
    for (i, volume) in spec.volumes.iter().enumerate() {
        let pod_name = format!("shared-{i}");
        mounts.push(json!({ "name": pod_name, "mountPath": volume.path }));
        volumes.push(
            json!({ "name": pod_name, "persistentVolumeClaim": { "claimName": names::volume_claim(&volume.name) } }),
        );
    }
    let container_security = json!({
        "allowPrivilegeEscalation": false,
        "capabilities": { "drop": ["ALL"] },
        "runAsNonRoot": true,
        "seccompProfile": { "type": "RuntimeDefault" },
    });
    // The job's code, when it shipped any: unpacked into the working directory before the
    // replica starts, by the same image (which must have `tar`).
    let mut init_containers = Vec::new();
    if !request.code.is_empty() {
        volumes.push(json!({ "name": "code", "configMap": { "name": name, "items": [{ "key": CODE_KEY, "path": "code.tar" }] } }));
        init_containers.push(json!({
            "name": "code",
            "image": image,
            "imagePullPolicy": config.image_pull_policy,
            "command": ["tar", "-x", "-f", format!("{CODE_MOUNT}/code.tar"), "-C", workdir],
            "resources": { "requests": limits, "limits": limits },
            "securityContext": container_security,
            "volumeMounts": [
                { "name": "workspace", "mountPath": workdir },
                { "name": "code", "mountPath": CODE_MOUNT, "readOnly": true },
            ],
        }));
    }
    let mut job: Job = typed(json!({
        "apiVersion": "batch/v1", "kind": "Job",
        "metadata": metadata(name, Some(ns), labels),
        "spec": {
            "completionMode": "Indexed",
            "completions": spec.replicas,
            "parallelism": spec.replicas,
            // A gang: one failed replica fails the attempt; Trainyard decides about restarts.
            "backoffLimit": 0,
            "ttlSecondsAfterFinished": config.job_ttl_after_finished.as_secs(),
            "template": {
                "metadata": { "labels": labels },
                "spec": {
                    "restartPolicy": "Never",
                    // With the headless Service of the same name, replica r is reachable as
                    // `<name>-<r>.<name>`.
                    "subdomain": name,
                    "serviceAccountName": JOB_SERVICE_ACCOUNT,
                    "automountServiceAccountToken": false,
                    "enableServiceLinks": false,
                    "terminationGracePeriodSeconds": config.termination_grace.as_secs(),
                    "nodeSelector": node_selector,
                    "affinity": placement_affinity(&request.nodes),
                    "tolerations": tolerations,
                    "securityContext": {
                        "runAsNonRoot": true,
                        "runAsUser": config.run_as_user,
                        "runAsGroup": config.run_as_user,
                        "fsGroup": config.run_as_user,
                        "seccompProfile": { "type": "RuntimeDefault" },
                    },
                    "containers": [{
                        "name": "replica",
                        "image": image,
                        "imagePullPolicy": config.image_pull_policy,
                        // An argv, never a shell line.
                        "command": spec.argv(),
                        "workingDir": workdir,
                        "env": replica_env(config, request, ns),
                        "envFrom": [{ "secretRef": { "name": name } }],
                        "resources": { "requests": limits, "limits": limits },
                        "securityContext": container_security,
                        "volumeMounts": mounts,
                    }],
                    "volumes": volumes,
                },
            },
        },
    }));
    if !init_containers.is_empty()
        && let Some(pod) = job.spec.as_mut().and_then(|s| s.template.spec.as_mut())
    {
        pod.init_containers = Some(typed(json!(init_containers)));
    }
    job
}

/// Where each ConfigMap key lands under `template/`: back at its original path.
fn template_items(files: &BTreeMap<String, Vec<u8>>) -> Vec<Value> {
    files.keys().filter_map(|path| config_map_key(path).ok().map(|key| json!({ "key": key, "path": path }))).collect()
}

/// Steers the replicas to the nodes Trainyard's scheduler chose for them (its accounting of
/// each node's room assumes them there, and it may have chosen nodes whose shard cache holds the
/// job's data): a preferred node affinity, so that a node gone or full since (a restart after
/// its node was drained, ranks the kube-scheduler packed otherwise) never leaves a pod pending.
/// None when it named no node. One term per node, each naming one: the API server refuses a
/// node field selector (`matchFields`) with more than one value.
fn placement_affinity(nodes: &[String]) -> Option<Value> {
    let mut nodes: Vec<&str> = nodes.iter().map(String::as_str).collect();
    nodes.sort_unstable();
    nodes.dedup();
    let terms: Vec<Value> = nodes
        .iter()
        .map(|node| {
            json!({
                "weight": 100,
                "preference": { "matchFields": [{ "key": "metadata.name", "operator": "In", "values": [node] }] },
            })
        })
        .collect();
    (!terms.is_empty()).then(|| json!({ "nodeAffinity": { "preferredDuringSchedulingIgnoredDuringExecution": terms } }))
}

/// The variables every replica gets. Secrets come from the Secret (`envFrom`), the rank from
/// the completion index Kubernetes gives each pod of an Indexed Job.
fn replica_env(config: &KubeConfig, request: &LaunchRequest, ns: &str) -> Vec<Value> {
    let mut env: Vec<Value> =
        request.spec.env.iter().map(|(name, value)| json!({ "name": name, "value": value })).collect();
    let fixed = [
        ("WORLD_SIZE", request.spec.replicas.to_string()),
        // One replica per pod: each pod's local world is itself.
        ("LOCAL_RANK", "0".to_string()),
        ("LOCAL_WORLD_SIZE", "1".to_string()),
        ("MASTER_ADDR", names::master_addr(request.job_id, request.attempt, ns)),
        ("MASTER_PORT", config.master_port.to_string()),
        ("HOME", config.working_dir.clone()),
        ("LANG", "C.UTF-8".to_string()),
        ("PYTHONUNBUFFERED", "1".to_string()),
        ("TRAINYARD_JOB_ID", request.job_id.to_string()),
        ("TRAINYARD_ATTEMPT", request.attempt.to_string()),
    ];
    env.push(json!({
        "name": "RANK",
        "valueFrom": { "fieldRef": { "fieldPath": format!("metadata.annotations['{COMPLETION_INDEX}']") } },
    }));
    // The node the pod landed on: the engine's shard cache reports name it.
    env.push(json!({ "name": "TRAINYARD_NODE", "valueFrom": { "fieldRef": { "fieldPath": "spec.nodeName" } } }));
    env.extend(fixed.into_iter().map(|(name, value)| json!({ "name": name, "value": value })));
    // Datasets on the object store come through the node's cache agent.
    if let Some(url) = &config.cache_agent_url {
        env.push(json!({ "name": "TRAINYARD_DATASET_URL", "value": url }));
    }
    env
}
