//! The executor against a real Kubernetes API server, when `TRAINYARD_TEST_KUBECONFIG` names a
//! kubeconfig for one (a throwaway cluster: the suite creates and deletes a tenant namespace).
//! No kubelet is needed: the suite patches pod status itself, and creates the Job's pods itself
//! when no Job controller does (an API server run alone, as with envtest). Without the variable
//! every test prints that it was skipped and passes.

mod support;

use std::time::Duration;

use k8s_openapi::api::batch::v1::Job;
use k8s_openapi::api::core::v1::{Namespace, Pod};
use kube::api::{DeleteParams, ListParams, Patch, PatchParams, PostParams};
use kube::{Api, Client};
use serde_json::json;
use support::examples;
use trainyard_executor::{AttemptRef, Executor, ReplicaPhase};
use trainyard_kube::{KubernetesExecutor, names};
use uuid::Uuid;

const VARIABLE: &str = "TRAINYARD_TEST_KUBECONFIG";

async fn cluster_client() -> Option<Client> {
    let Some(path) = std::env::var_os(VARIABLE) else {
        println!("skipped: {VARIABLE} not set");
        return None;
    };
    let kubeconfig = kube::config::Kubeconfig::read_from(&path).expect("the kubeconfig reads");
    let config =
        kube::Config::from_custom_kubeconfig(kubeconfig, &Default::default()).await.expect("a usable kubeconfig");
    Some(trainyard_kube::client_for(config, &examples::config()).expect("a client"))
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

#[tokio::test]
async fn an_attempt_runs_succeeds_and_is_cleaned_up_on_a_real_api_server() {
    let Some(client) = cluster_client().await else { return };
    let logs = tempfile::tempdir().unwrap();
    let mut config = examples::config();
    config.log_dir = logs.path().to_path_buf();
    let executor = KubernetesExecutor::with_client(client.clone(), config.clone());
    executor.ready().await;

    let mut request = examples::data_pack();
    request.tenant_id = Uuid::new_v4();
    request.tenant = format!("it-{}", &request.tenant_id.simple().to_string()[..8]);
    request.job_id = Uuid::new_v4();
    request.spec.replicas = 2;
    let namespace = names::namespace(&config.namespace_prefix, &request.tenant, request.tenant_id);
    executor.launch(&request).await.expect("launch on a real API server");
    executor.launch(&request).await.expect("a repeated launch is harmless");

    let jobs: Api<Job> = Api::namespaced(client.clone(), &namespace);
    let name = names::attempt_object(request.job_id, request.attempt);
    let job = jobs.get(&name).await.expect("the Job exists");
    let attempt = AttemptRef { job_id: request.job_id, attempt: request.attempt, replicas: 2, placement: None };

    let pods = pods_of(&client, &namespace, &job, 2).await;
    for pod in &pods {
        pod_status_set(
            &client,
            &namespace,
            pod,
            json!({ "phase": "Running", "containerStatuses": container(json!({ "running": {} })) }),
        )
        .await;
    }
    eventually(10, || async {
        let details = executor.replica_details(&attempt).await;
        details.iter().all(|d| d.phase == ReplicaPhase::Running).then_some(())
    })
    .await;
    for pod in &pods {
        let terminated = json!({ "terminated": { "exitCode": 0, "reason": "Completed" } });
        pod_status_set(
            &client,
            &namespace,
            pod,
            json!({ "phase": "Succeeded", "containerStatuses": container(terminated) }),
        )
        .await;
    }
    let details = eventually(10, || async {
        let details = executor.replica_details(&attempt).await;
        details.iter().all(|d| d.phase == ReplicaPhase::Succeeded).then_some(details)
    })
    .await;
    assert!(details[0].image_digest.as_deref().unwrap().ends_with("2222"));

    executor.release(&attempt).await;
    eventually(30, || async {
        match jobs.get_opt(&name).await.unwrap() {
            None => Some(()),
            Some(job) => job.metadata.deletion_timestamp.map(|_| ()),
        }
    })
    .await;
    let namespaces: Api<Namespace> = Api::all(client);
    let _ = namespaces.delete(&namespace, &DeleteParams::background()).await;
}
