//! The executor against a real Kubernetes API server, when `TRAINYARD_TEST_KUBECONFIG` names a
//! kubeconfig for one (a throwaway cluster: the suite creates and deletes tenant namespaces).
//! That identity plays the kubelet (it patches pod status) and checks what is left; the executor
//! itself runs as `TRAINYARD_TEST_KUBECONFIG_EXECUTOR` when set: Trainyard's service account with
//! `deploy/kubernetes/rbac.yaml` and `policy.yaml` applied, as an operator would install it.
//! No kubelet is needed; the suite creates the Job's pods itself when no Job controller does (an
//! API server run alone, as with envtest). CI has no cluster: every test is `#[ignore]`d, and runs
//! by name with the variable set (`cargo nextest run -p trainyard-kube --test cluster
//! --run-ignored only`); without the variable an ignored test run by name fails and says why.

mod support;

use std::time::Duration;

use k8s_openapi::api::batch::v1::Job;
use k8s_openapi::api::core::v1::{Namespace, Pod};
use kube::api::{DeleteParams, ListParams, Patch, PatchParams, PostParams};
use kube::{Api, Client};
use serde_json::json;
use support::examples;
use trainyard_executor::{AttemptRef, Executor, LaunchRequest, ReplicaPhase};
use trainyard_kube::{KubernetesExecutor, names};
use uuid::Uuid;

const VARIABLE: &str = "TRAINYARD_TEST_KUBECONFIG";
const EXECUTOR_VARIABLE: &str = "TRAINYARD_TEST_KUBECONFIG_EXECUTOR";

/// The suite's two identities: the cluster's admin, and the one the executor runs as.
struct Cluster {
    admin: Client,
    executor: Client,
    /// Whether the executor runs as Trainyard's service account (not the admin).
    as_service_account: bool,
}

async fn client_from(path: &std::ffi::OsStr) -> Client {
    let kubeconfig = kube::config::Kubeconfig::read_from(path).expect("the kubeconfig reads");
    let config =
        kube::Config::from_custom_kubeconfig(kubeconfig, &Default::default()).await.expect("a usable kubeconfig");
    trainyard_kube::client_for(config, &examples::config()).expect("a client")
}

async fn cluster() -> Cluster {
    let Some(path) = std::env::var_os(VARIABLE) else {
        panic!("{VARIABLE} is not set: it names an admin's kubeconfig for a throwaway cluster (docs/kubernetes.md)");
    };
    let admin = client_from(&path).await;
    let (executor, as_service_account) = match std::env::var_os(EXECUTOR_VARIABLE) {
        Some(path) => (client_from(&path).await, true),
        None => (admin.clone(), false),
    };
    Cluster { admin, executor, as_service_account }
}

/// A fresh tenant's launch request (its own namespace) and that namespace's name.
fn fresh_request(replicas: u32) -> (trainyard_executor::LaunchRequest, String) {
    let mut request = examples::data_pack();
    request.tenant_id = Uuid::new_v4();
    request.tenant = format!("it-{}", &request.tenant_id.simple().to_string()[..8]);
    request.job_id = Uuid::new_v4();
    request.spec.replicas = replicas;
    let namespace = names::namespace(&examples::config().namespace_prefix, &request.tenant, request.tenant_id);
    (request, namespace)
}

async fn executor_for(cluster: &Cluster, logs: &tempfile::TempDir) -> KubernetesExecutor {
    let mut config = examples::config();
    config.log_dir = logs.path().to_path_buf();
    let executor = KubernetesExecutor::with_client(cluster.executor.clone(), config);
    executor.ready().await;
    executor
}

async fn namespace_delete(cluster: &Cluster, namespace: &str) {
    let namespaces: Api<Namespace> = Api::all(cluster.admin.clone());
    let _ = namespaces.delete(namespace, &DeleteParams::background()).await;
}

/// Waits until the Job is gone or being deleted.
async fn job_goes(cluster: &Cluster, namespace: &str, name: &str) {
    let jobs: Api<Job> = Api::namespaced(cluster.admin.clone(), namespace);
    eventually(30, || async {
        match jobs.get_opt(name).await.unwrap() {
            None => Some(()),
            Some(job) => job.metadata.deletion_timestamp.map(|_| ()),
        }
    })
    .await;
}

/// Waits up to `seconds` for `check` to return something.
async fn eventually<T, F: std::future::Future<Output = Option<T>>>(seconds: u64, mut check: impl FnMut() -> F) -> T {
    for _ in 0..seconds * 10 {
        if let Some(value) = check().await {
            return value;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    panic!("not reached within {seconds} s");
}

/// The attempt's pods: made by the Job controller if the cluster runs one, else by us from the
/// Job's template, as the Job controller would.
async fn pods_of(client: &Client, namespace: &str, job: &Job, replicas: u32) -> Vec<String> {
    let pods: Api<Pod> = Api::namespaced(client.clone(), namespace);
    let selector = format!("{}={}", names::LABEL_JOB, job.metadata.labels.as_ref().unwrap()[names::LABEL_JOB]);
    for _ in 0..50 {
        let found = pods.list(&ListParams::default().labels(&selector)).await.unwrap();
        if found.items.len() as u32 == replicas {
            return found.items.into_iter().map(|p| p.metadata.name.unwrap()).collect();
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let template = job.spec.as_ref().unwrap().template.clone();
    let mut names = Vec::new();
    for index in 0..replicas {
        let name = format!("{}-{index}", job.metadata.name.as_ref().unwrap());
        let mut labels = template.metadata.as_ref().unwrap().labels.clone().unwrap();
        labels.insert(names::COMPLETION_INDEX.into(), index.to_string());
        let pod: Pod = serde_json::from_value(json!({
            "metadata": { "name": name, "labels": labels, "annotations": { names::COMPLETION_INDEX: index.to_string() },
                "ownerReferences": [{ "apiVersion": "batch/v1", "kind": "Job", "name": job.metadata.name, "uid": job.metadata.uid, "controller": true }] },
            "spec": template.spec,
        }))
        .unwrap();
        pods.create(&PostParams::default(), &pod).await.expect("the pod is created");
        names.push(name);
    }
    names
}

async fn pod_status_set(client: &Client, namespace: &str, pod: &str, status: serde_json::Value) {
    let pods: Api<Pod> = Api::namespaced(client.clone(), namespace);
    let patch = json!({ "status": status });
    pods.patch_status(pod, &PatchParams::default(), &Patch::Merge(&patch)).await.expect("status patched");
}

fn container(state: serde_json::Value) -> serde_json::Value {
    json!([{ "name": "replica", "image": "ghcr.io/trainyard/runtime:1.0.0",
        "imageID": "ghcr.io/trainyard/runtime@sha256:2222222222222222222222222222222222222222222222222222222222222222",
        "ready": true, "restartCount": 0, "state": state }])
}

/// A rerun pinned to its original's image digest: the real API server takes the digest
/// reference, and the Job's pods run it (not the configured tag).
/// An attempt of two replicas launched by `executor`, its pods Running (played by the admin) and
/// seen running by the executor.
struct Running {
    namespace: String,
    name: String,
    attempt: AttemptRef,
    pods: Vec<String>,
    request: trainyard_executor::LaunchRequest,
}

async fn launched_and_running(cluster: &Cluster, executor: &KubernetesExecutor) -> Running {
    let (request, namespace) = fresh_request(2);
    executor.launch(&request).await.expect("launch on a real API server");
    let jobs: Api<Job> = Api::namespaced(cluster.admin.clone(), &namespace);
    let name = names::attempt_object(request.job_id, request.attempt);
    let job = jobs.get(&name).await.expect("the Job exists");
    let attempt = AttemptRef { job_id: request.job_id, attempt: request.attempt, replicas: 2, placement: None };
    let pods = pods_of(&cluster.admin, &namespace, &job, 2).await;
    for pod in &pods {
        let running = json!({ "phase": "Running", "containerStatuses": container(json!({ "running": {} })) });
        pod_status_set(&cluster.admin, &namespace, pod, running).await;
    }
    eventually(10, || async {
        let details = executor.replica_details(&attempt).await;
        details.iter().all(|d| d.phase == ReplicaPhase::Running).then_some(())
    })
    .await;
    Running { namespace, name, attempt, pods, request }
}

/// Plays the kubelet for pods whose replica exited 0.
async fn succeed(cluster: &Cluster, namespace: &str, pods: &[String]) {
    for pod in pods {
        let terminated = json!({ "terminated": { "exitCode": 0, "reason": "Completed" } });
        let succeeded = json!({ "phase": "Succeeded", "containerStatuses": container(terminated) });
        pod_status_set(&cluster.admin, namespace, pod, succeeded).await;
    }
}

/// Launches a one-replica request and returns its pod, as the Job controller made it.
async fn launched_pod(
    cluster: &Cluster,
    executor: &KubernetesExecutor,
    request: &LaunchRequest,
    namespace: &str,
) -> Pod {
    executor.launch(request).await.expect("launch on a real API server");
    let jobs: Api<Job> = Api::namespaced(cluster.admin.clone(), namespace);
    let job = jobs.get(&names::attempt_object(request.job_id, request.attempt)).await.expect("the Job exists");
    let pods = pods_of(&cluster.admin, namespace, &job, 1).await;
    Api::namespaced(cluster.admin.clone(), namespace).get(&pods[0]).await.expect("its pod")
}

#[tokio::test]
#[ignore = "needs a real API server: TRAINYARD_TEST_KUBECONFIG (docs/kubernetes.md)"]
async fn a_rerun_pinned_to_a_digest_runs_it_on_a_real_api_server() {
    let cluster = cluster().await;
    let logs = tempfile::tempdir().unwrap();
    let executor = executor_for(&cluster, &logs).await;
    let (mut request, namespace) = fresh_request(1);
    let digest = format!("ghcr.io/trainyard/runtime@sha256:{}", "2".repeat(64));
    request.spec.image = Some(digest.clone());
    let pod = launched_pod(&cluster, &executor, &request, &namespace).await;
    let images: Vec<String> = pod.spec.unwrap().containers.into_iter().filter_map(|c| c.image).collect();
    assert_eq!(images, [digest], "the pod runs the pinned digest");
}

/// The placement Trainyard's scheduler chose reaches the pods as a preferred node affinity on
/// the nodes' names, and each replica's node as `TRAINYARD_NODE` from the downward API: the real
/// API server takes both as written.
#[tokio::test]
#[ignore = "needs a real API server: TRAINYARD_TEST_KUBECONFIG (docs/kubernetes.md)"]
async fn the_scheduler_s_placement_reaches_the_pods_on_a_real_api_server() {
    let cluster = cluster().await;
    let logs = tempfile::tempdir().unwrap();
    let executor = executor_for(&cluster, &logs).await;
    // Two replicas on two nodes: the API server takes a node field selector of one value only,
    // so each node is a term of its own (one term naming both was refused).
    let (mut request, namespace) = fresh_request(2);
    request.nodes = vec!["gpu-node-7".into(), "gpu-node-3".into()];
    let pod = launched_pod(&cluster, &executor, &request, &namespace).await;
    let spec = pod.spec.unwrap();
    let terms = spec
        .affinity
        .and_then(|a| a.node_affinity)
        .and_then(|n| n.preferred_during_scheduling_ignored_during_execution)
        .expect("a preferred node affinity");
    let named: Vec<(i32, String, Vec<String>)> = terms
        .iter()
        .flat_map(|term| {
            let fields = term.preference.match_fields.clone().unwrap_or_default();
            fields.into_iter().map(move |f| (term.weight, f.key, f.values.unwrap_or_default()))
        })
        .collect();
    assert_eq!(
        named,
        [
            (100, "metadata.name".to_string(), vec!["gpu-node-3".to_string()]),
            (100, "metadata.name".to_string(), vec!["gpu-node-7".to_string()])
        ]
    );
    let env = spec.containers[0].env.clone().unwrap();
    let node = env.iter().find(|e| e.name == "TRAINYARD_NODE").expect("TRAINYARD_NODE");
    let field = node.value_from.as_ref().and_then(|v| v.field_ref.as_ref()).expect("from the downward API");
    assert_eq!(field.field_path, "spec.nodeName");
    namespace_delete(&cluster, &namespace).await;
}

#[tokio::test]
#[ignore = "needs a real API server: TRAINYARD_TEST_KUBECONFIG (docs/kubernetes.md)"]
async fn an_attempt_runs_succeeds_and_is_cleaned_up_on_a_real_api_server() {
    let cluster = cluster().await;
    let logs = tempfile::tempdir().unwrap();
    let executor = executor_for(&cluster, &logs).await;
    let Running { namespace, name, attempt, pods, request } = launched_and_running(&cluster, &executor).await;
    executor.launch(&request).await.expect("a repeated launch is harmless");
    succeed(&cluster, &namespace, &pods).await;
    let details = eventually(10, || async {
        let details = executor.replica_details(&attempt).await;
        details.iter().all(|d| d.phase == ReplicaPhase::Succeeded).then_some(details)
    })
    .await;
    assert!(details[0].image_digest.as_deref().unwrap().ends_with("2222"));

    executor.release(&attempt).await;
    job_goes(&cluster, &namespace, &name).await;
    namespace_delete(&cluster, &namespace).await;
}

/// Replicas that ran to their end just before their Job was deleted (a stop crossing their own
/// end, as a preemption can) are gone with it, but the watch's delete events show how they
/// ended: the attempt succeeded, it was not stopped.
#[tokio::test]
#[ignore = "needs a real API server: TRAINYARD_TEST_KUBECONFIG (docs/kubernetes.md)"]
async fn replicas_that_ended_before_their_job_was_deleted_succeeded_on_a_real_api_server() {
    let cluster = cluster().await;
    let logs = tempfile::tempdir().unwrap();
    let executor = executor_for(&cluster, &logs).await;
    let Running { namespace, name, attempt, pods, request } = launched_and_running(&cluster, &executor).await;
    succeed(&cluster, &namespace, &pods).await;
    // Stopped before the executor is asked about the attempt again; asked once the pods are gone.
    executor.terminate(&attempt, Duration::from_secs(1)).await;
    job_goes(&cluster, &namespace, &name).await;
    let pod_api: Api<Pod> = Api::namespaced(cluster.admin.clone(), &namespace);
    let of_the_job = ListParams::default().labels(&format!("{}={}", names::LABEL_JOB, request.job_id));
    eventually(30, || async { pod_api.list(&of_the_job).await.unwrap().items.is_empty().then_some(()) }).await;
    tokio::time::sleep(Duration::from_millis(500)).await; // the executor's watch takes in the deletions
    let details = executor.replica_details(&attempt).await;
    assert!(details.iter().all(|d| d.phase == ReplicaPhase::Succeeded), "they ended by themselves: {details:#?}");
    namespace_delete(&cluster, &namespace).await;
}

/// A launch the API server refuses part-way (here an admission policy the cluster's admin put on
/// the tenant's namespace refuses its ConfigMap, after the Job was made) removes what it applied
/// at once, and the next launch of that attempt applies everything afresh.
#[tokio::test]
#[ignore = "needs a real API server: TRAINYARD_TEST_KUBECONFIG (docs/kubernetes.md)"]
async fn a_launch_refused_part_way_leaves_nothing_behind() {
    use k8s_openapi::api::admissionregistration::v1::{ValidatingAdmissionPolicy, ValidatingAdmissionPolicyBinding};
    let cluster = cluster().await;
    let logs = tempfile::tempdir().unwrap();
    let executor = executor_for(&cluster, &logs).await;
    let (first, namespace) = fresh_request(1);
    executor.launch(&first).await.expect("the first launch makes the namespace");

    let label = "trainyard.dev/test-refuse-configmaps";
    let policy_name = format!("refuse-configmaps-{}", &first.tenant_id.simple().to_string()[..8]);
    let policies: Api<ValidatingAdmissionPolicy> = Api::all(cluster.admin.clone());
    let bindings: Api<ValidatingAdmissionPolicyBinding> = Api::all(cluster.admin.clone());
    let policy = serde_json::from_value(json!({
        "metadata": { "name": policy_name },
        "spec": {
            "failurePolicy": "Fail",
            "matchConstraints": { "resourceRules": [{ "apiGroups": [""], "apiVersions": ["v1"],
                "operations": ["CREATE", "UPDATE"], "resources": ["configmaps"] }] },
            "validations": [{ "expression": format!("!(has(namespaceObject.metadata.labels) && '{label}' in namespaceObject.metadata.labels)"),
                "message": "this namespace takes no ConfigMaps (test)" }],
        },
    }))
    .unwrap();
    policies.create(&PostParams::default(), &policy).await.expect("the policy is made");
    let binding = serde_json::from_value(
        json!({ "metadata": { "name": policy_name }, "spec": { "policyName": policy_name, "validationActions": ["Deny"] } }),
    )
    .unwrap();
    bindings.create(&PostParams::default(), &binding).await.expect("the binding is made");
    let namespaces: Api<Namespace> = Api::all(cluster.admin.clone());
    let mark = json!({ "metadata": { "labels": { label: "true" } } });
    namespaces.patch(&namespace, &PatchParams::default(), &Patch::Merge(&mark)).await.expect("labelled");
    // Admission sees a new policy after a moment: wait until a dry-run ConfigMap is refused.
    let config_maps: Api<k8s_openapi::api::core::v1::ConfigMap> = Api::namespaced(cluster.admin.clone(), &namespace);
    let probe = serde_json::from_value(json!({ "metadata": { "name": "probe" } })).unwrap();
    let dry_run = PostParams { dry_run: true, ..PostParams::default() };
    eventually(30, || async { config_maps.create(&dry_run, &probe).await.err().map(|_| ()) }).await;

    let mut second = first.clone();
    second.job_id = Uuid::new_v4();
    let err = executor.launch(&second).await.expect_err("the ConfigMap is refused");
    println!("refused as expected: {err}");
    let name = names::attempt_object(second.job_id, second.attempt);
    job_goes(&cluster, &namespace, &name).await;
    let pods: Api<Pod> = Api::namespaced(cluster.admin.clone(), &namespace);
    let selector = format!("{}={}", names::LABEL_JOB, second.job_id);
    eventually(30, || async {
        let left = pods.list(&ListParams::default().labels(&selector)).await.unwrap().items;
        left.iter().all(|p| p.metadata.deletion_timestamp.is_some()).then_some(())
    })
    .await;

    let _ = bindings.delete(&policy_name, &DeleteParams::default()).await;
    let _ = policies.delete(&policy_name, &DeleteParams::default()).await;
    eventually(30, || async { executor.launch(&second).await.ok() }).await;
    let jobs: Api<Job> = Api::namespaced(cluster.admin.clone(), &namespace);
    eventually(30, || async { jobs.get_opt(&name).await.unwrap().filter(|j| j.metadata.deletion_timestamp.is_none()) })
        .await;
    namespace_delete(&cluster, &namespace).await;
}

/// A new executor (a restarted control plane) finds the attempt by its labels, makes no second
/// Job, applies again what the Job owns (here the ConfigMap was lost, as when the first launch
/// was cut short after its Job), observes it, and stops it.
#[tokio::test]
#[ignore = "needs a real API server: TRAINYARD_TEST_KUBECONFIG (docs/kubernetes.md)"]
async fn a_restarted_executor_adopts_the_attempt_and_can_stop_it() {
    let cluster = cluster().await;
    let logs = tempfile::tempdir().unwrap();
    let (request, namespace) = fresh_request(1);
    let name = names::attempt_object(request.job_id, request.attempt);
    let jobs: Api<Job> = Api::namespaced(cluster.admin.clone(), &namespace);
    {
        let first = executor_for(&cluster, &logs).await;
        first.launch(&request).await.expect("launch");
    }
    let uid = jobs.get(&name).await.unwrap().metadata.uid;
    let job = jobs.get(&name).await.unwrap();
    let pods = pods_of(&cluster.admin, &namespace, &job, 1).await;
    pod_status_set(
        &cluster.admin,
        &namespace,
        &pods[0],
        json!({ "phase": "Running", "containerStatuses": container(json!({ "running": {} })) }),
    )
    .await;

    let config_maps: Api<k8s_openapi::api::core::v1::ConfigMap> = Api::namespaced(cluster.admin.clone(), &namespace);
    config_maps.delete(&name, &DeleteParams::default()).await.expect("the ConfigMap goes");

    let second = executor_for(&cluster, &logs).await;
    second.launch(&request).await.expect("a launch of an adopted attempt");
    assert_eq!(jobs.get(&name).await.unwrap().metadata.uid, uid, "the same Job, not a second one");
    let config_map = config_maps.get(&name).await.expect("the ConfigMap is back");
    let owner = config_map.metadata.owner_references.unwrap_or_default();
    assert_eq!(owner.first().map(|o| Some(o.uid.clone())), Some(uid.clone()), "owned by the Job");
    let attempt = AttemptRef { job_id: request.job_id, attempt: request.attempt, replicas: 1, placement: None };
    eventually(10, || async {
        let details = second.replica_details(&attempt).await;
        (details[0].phase == ReplicaPhase::Running).then_some(())
    })
    .await;
    second.terminate(&attempt, Duration::from_secs(1)).await;
    job_goes(&cluster, &namespace, &name).await;
    namespace_delete(&cluster, &namespace).await;
}

/// A claim no storage class can bind shows why, in the cluster's words.
#[tokio::test]
#[ignore = "needs a real API server: TRAINYARD_TEST_KUBECONFIG (docs/kubernetes.md)"]
async fn a_volume_no_storage_binds_says_why() {
    let cluster = cluster().await;
    let logs = tempfile::tempdir().unwrap();
    let executor = executor_for(&cluster, &logs).await;
    let (request, namespace) = fresh_request(1);
    let volume = trainyard_executor::VolumeRequest {
        tenant_id: request.tenant_id,
        tenant: request.tenant.clone(),
        name: "scratch".into(),
        size_bytes: 1 << 30,
        access_mode: "ReadWriteOnce".into(),
        storage_class: None,
    };
    executor.volume_ensure(&volume).await.expect("the claim is applied");
    let reason = eventually(30, || async {
        let reason = executor.volume_pending_reason(request.tenant_id, &request.tenant, "scratch").await;
        reason.filter(|r| !r.contains("has not said why"))
    })
    .await;
    println!("pending reason: {reason}");
    assert!(reason.starts_with("its claim is pending: "), "{reason}");
    executor.volume_remove(request.tenant_id, &request.tenant, "scratch").await.unwrap();
    namespace_delete(&cluster, &namespace).await;
}

/// With the shipped RBAC and admission policy, Trainyard's service account writes only in the
/// namespaces it manages: not in `default`, not on a namespace it did not make, and never a
/// namespace without the managed label or with a weaker Pod Security level.
#[tokio::test]
#[ignore = "needs a real API server: TRAINYARD_TEST_KUBECONFIG (docs/kubernetes.md)"]
async fn the_service_account_cannot_write_outside_the_namespaces_it_manages() {
    let cluster = cluster().await;
    assert!(
        cluster.as_service_account,
        "{EXECUTOR_VARIABLE} is not set: this test needs the executor to run as Trainyard's service account"
    );
    let refused = |result: Result<serde_json::Value, kube::Error>| match result {
        Err(kube::Error::Api(status)) if status.code == 403 || status.code == 422 => status.message,
        other => panic!("expected a refusal, got {other:?}"),
    };
    let config_maps: Api<k8s_openapi::api::core::v1::ConfigMap> = Api::namespaced(cluster.executor.clone(), "default");
    let config_map =
        serde_json::from_value(json!({ "metadata": { "name": "not-ours" }, "data": { "a": "b" } })).unwrap();
    let message = refused(config_maps.create(&PostParams::default(), &config_map).await.map(|_| json!({})));
    println!("ConfigMap in default: {message}");
    assert!(message.contains("only in namespaces it manages"), "{message}");

    let namespaces: Api<Namespace> = Api::all(cluster.executor.clone());
    let relabel = json!({ "metadata": { "labels": { "app.kubernetes.io/managed-by": "trainyard",
        "pod-security.kubernetes.io/enforce": "restricted" } } });
    let message =
        refused(namespaces.patch("default", &PatchParams::default(), &Patch::Merge(&relabel)).await.map(|_| json!({})));
    println!("adopting default: {message}");
    assert!(message.contains("not managed by Trainyard"), "{message}");

    let unlabelled = serde_json::from_value(
        json!({ "metadata": { "name": format!("it-free-{}", &Uuid::new_v4().simple().to_string()[..8]) } }),
    )
    .unwrap();
    let message = refused(namespaces.create(&PostParams::default(), &unlabelled).await.map(|_| json!({})));
    println!("an unlabelled namespace: {message}");
    assert!(message.contains("must be labelled"), "{message}");

    // Its own namespace, with Pod Security weakened: refused too.
    let logs = tempfile::tempdir().unwrap();
    let executor = executor_for(&cluster, &logs).await;
    let (request, namespace) = fresh_request(1);
    executor.launch(&request).await.expect("a launch in its own namespace");
    let weaken = json!({ "metadata": { "labels": { "pod-security.kubernetes.io/enforce": "privileged" } } });
    let message =
        refused(namespaces.patch(&namespace, &PatchParams::default(), &Patch::Merge(&weaken)).await.map(|_| json!({})));
    println!("weakening its own namespace: {message}");
    namespace_delete(&cluster, &namespace).await;
}

#[tokio::test]
#[ignore = "needs a real API server: TRAINYARD_TEST_KUBECONFIG (docs/kubernetes.md)"]
async fn removing_a_tenant_deletes_its_namespace_and_nothing_else() {
    let cluster = cluster().await;
    let logs = tempfile::tempdir().unwrap();
    let executor = executor_for(&cluster, &logs).await;
    let (request, namespace) = fresh_request(1);
    executor.launch(&request).await.expect("a launch in the tenant's namespace");
    let jobs: Api<Job> = Api::namespaced(cluster.admin.clone(), &namespace);
    assert_eq!(jobs.list(&ListParams::default()).await.unwrap().items.len(), 1);

    executor.tenant_remove(request.tenant_id, &request.tenant).await.expect("the namespace is deleted");
    // The namespace controller empties it, then it goes (or stays Terminating while it does,
    // where no controller manager runs).
    let namespaces: Api<Namespace> = Api::all(cluster.admin.clone());
    eventually(60, || async {
        match namespaces.get_opt(&namespace).await.unwrap() {
            None => Some(()),
            Some(ns) => ns.metadata.deletion_timestamp.map(|_| ()),
        }
    })
    .await;
    executor.tenant_remove(request.tenant_id, &request.tenant).await.expect("removing it again is harmless");

    if cluster.as_service_account {
        // Another team's namespace: the policy refuses Trainyard's service account its deletion.
        let theirs = format!("it-theirs-{}", &Uuid::new_v4().simple().to_string()[..8]);
        let namespace_object = serde_json::from_value(json!({ "metadata": { "name": theirs } })).unwrap();
        namespaces.create(&PostParams::default(), &namespace_object).await.expect("the admin makes a namespace");
        let as_trainyard: Api<Namespace> = Api::all(cluster.executor.clone());
        match as_trainyard.delete(&theirs, &DeleteParams::background()).await {
            Err(kube::Error::Api(status)) if status.code == 403 => {
                println!("deleting another team's namespace: {}", status.message);
                assert!(status.message.contains("not managed by Trainyard"), "{}", status.message);
            }
            other => panic!("deleting {theirs} must be refused, got {other:?}"),
        }
        assert!(namespaces.get_opt(&theirs).await.unwrap().is_some_and(|ns| ns.metadata.deletion_timestamp.is_none()));
        namespace_delete(&cluster, &theirs).await;
    }
}

/// A pod that mounts the node's cache folder, as the cache agent's DaemonSet does, and is
/// otherwise what Pod Security "restricted" asks: the hostPath is its one violation.
fn host_path_pod(name: &str) -> Pod {
    serde_json::from_value(json!({
        "metadata": { "name": name },
        "spec": {
            "securityContext": { "runAsNonRoot": true, "runAsUser": 1000, "seccompProfile": { "type": "RuntimeDefault" } },
            "containers": [{ "name": "c", "image": "registry.example/agent:1",
                "securityContext": { "allowPrivilegeEscalation": false, "capabilities": { "drop": ["ALL"] } },
                "volumeMounts": [{ "name": "cache", "mountPath": "/cache" }] }],
            "volumes": [{ "name": "cache", "hostPath": { "path": "/var/lib/trainyard/shard-cache" } }],
        },
    }))
    .unwrap()
}

/// `kubectl <args>` as the suite's admin (the operator installing the agent).
fn kubectl(args: &[&str]) -> std::process::Output {
    let kubectl = std::env::var_os("TRAINYARD_TEST_KUBECTL").unwrap_or_else(|| "kubectl".into());
    let kubeconfig = std::env::var_os(VARIABLE).expect("the suite's kubeconfig");
    std::process::Command::new(kubectl).arg("--kubeconfig").arg(kubeconfig).args(args).output().expect("kubectl runs")
}

#[tokio::test]
#[ignore = "needs a real API server: TRAINYARD_TEST_KUBECONFIG (docs/kubernetes.md)"]
async fn the_cache_agent_installs_and_only_its_namespace_may_mount_the_nodes_cache() {
    let cluster = cluster().await;
    let folder = examples::workspace_root().join("deploy/kubernetes/cache-agent");
    let applied = kubectl(&["apply", "--server-side", "-k", folder.to_str().unwrap()]);
    assert!(applied.status.success(), "{}", String::from_utf8_lossy(&applied.stderr));
    let daemon_sets: Api<k8s_openapi::api::apps::v1::DaemonSet> =
        Api::namespaced(cluster.admin.clone(), "trainyard-cache");
    assert!(daemon_sets.get_opt("trainyard-cache-agent").await.unwrap().is_some());
    let services: Api<k8s_openapi::api::core::v1::Service> = Api::namespaced(cluster.admin.clone(), "trainyard-cache");
    let service = services.get("trainyard-cache-agent").await.unwrap();
    assert_eq!(service.spec.unwrap().internal_traffic_policy.as_deref(), Some("Local"));

    // Pod Security as the API server enforces it: the agent's namespace admits the hostPath...
    let name = format!("it-agent-{}", &Uuid::new_v4().simple().to_string()[..8]);
    let agent_pods: Api<Pod> = Api::namespaced(cluster.admin.clone(), "trainyard-cache");
    agent_pods.create(&PostParams::default(), &host_path_pod(&name)).await.expect("the agent's namespace admits it");
    agent_pods.delete(&name, &DeleteParams::default()).await.unwrap();
    // ... a tenant's namespace refuses it, even to the cluster's admin.
    let logs = tempfile::tempdir().unwrap();
    let executor = executor_for(&cluster, &logs).await;
    let (request, namespace) = fresh_request(1);
    executor.launch(&request).await.expect("a launch makes the tenant's namespace");
    let tenant_pods: Api<Pod> = Api::namespaced(cluster.admin.clone(), &namespace);
    match tenant_pods.create(&PostParams::default(), &host_path_pod(&name)).await {
        Err(kube::Error::Api(status)) if status.code == 403 => {
            println!("a hostPath in a tenant namespace: {}", status.message);
            assert!(status.message.contains(r#"restricted volume type "hostPath""#), "{}", status.message);
            assert!(!status.message.contains("securityContext"), "the hostPath alone: {}", status.message);
        }
        other => panic!("a tenant namespace must refuse a hostPath, got {other:?}"),
    }
    namespace_delete(&cluster, &namespace).await;
    let removed = kubectl(&["delete", "-k", folder.to_str().unwrap(), "--wait=false"]);
    assert!(removed.status.success(), "{}", String::from_utf8_lossy(&removed.stderr));
}
