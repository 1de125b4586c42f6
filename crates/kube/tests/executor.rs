//! The Kubernetes executor against the in-memory API server of `support/fake_api.rs` (a
//! stateful fake, not a script: no API server can run here, and a fake that stores objects and
//! streams watch events lets the real kube-runtime watchers run unchanged). The tests play the
//! kubelet and the Job controller by writing pod and Job status, as the integration suite does
//! against a real API server.

mod support;

use std::time::Duration;

use http::Method;
use serde_json::{Value, json};
use support::examples::{self, JOB, JOB_UID, TENANT};
use support::fake_api::FakeApi;
use trainyard_executor::{
    AttemptRef, Executor, ExecutorError, FailureReason, ReplicaDetail, ReplicaPhase, ReplicaStatus,
};
use trainyard_kube::{KubeConfig, KubernetesExecutor};

const NS: &str = "trainyard-vision-team";
const JOB_NAME: &str = "ty-01990000-0000-7000-8000-000000000b01-1";

fn config(logs: &tempfile::TempDir) -> KubeConfig {
    let mut config = examples::config();
    config.log_dir = logs.path().to_path_buf();
    config
}

async fn executor(fake: &FakeApi, config: KubeConfig) -> KubernetesExecutor {
    let executor = KubernetesExecutor::with_client(fake.client(), config);
    tokio::time::timeout(Duration::from_secs(5), executor.ready()).await.expect("watchers list the fake cluster");
    executor
}

fn attempt(replicas: u32) -> AttemptRef {
    AttemptRef { job_id: JOB, attempt: 1, replicas, placement: None }
}

/// Waits (up to 5 s) until the executor's view of the attempt satisfies `done`.
async fn until(
    executor: &KubernetesExecutor,
    replicas: u32,
    done: impl Fn(&[ReplicaDetail]) -> bool,
) -> Vec<ReplicaDetail> {
    // Longer than a stop takes to settle (`STOP_SETTLE`, 5 s) when no pod shows.
    let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
    loop {
        let details = executor.replica_details(&attempt(replicas)).await;
        if done(&details) {
            return details;
        }
        assert!(tokio::time::Instant::now() < deadline, "the executor never saw the expected state: {details:#?}");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

fn phases(details: &[ReplicaDetail]) -> Vec<ReplicaPhase> {
    details.iter().map(|d| d.phase).collect()
}

fn container(state: Value) -> Value {
    json!([{
        "name": "replica", "image": "ghcr.io/trainyard/runtime:1.0.0",
        "imageID": "ghcr.io/trainyard/runtime@sha256:1111111111111111111111111111111111111111111111111111111111111111",
        "ready": state.get("running").is_some(), "restartCount": 0, "state": state,
    }])
}

fn running() -> Value {
    json!({ "phase": "Running", "containerStatuses": container(json!({ "running": { "startedAt": "2026-01-01T00:00:00Z" } })) })
}

fn exited(code: i32, reason: &str) -> Value {
    let phase = if code == 0 { "Succeeded" } else { "Failed" };
    json!({ "phase": phase, "containerStatuses": container(json!({ "terminated": { "exitCode": code, "reason": reason } })) })
}

/// Launches the pytorch-ddp example (2 replicas x 8 GPUs) on a fake cluster with one GPU node.
async fn launched(logs: &tempfile::TempDir) -> (FakeApi, KubernetesExecutor) {
    let fake = FakeApi::default();
    fake.node_put("gpu-1", "nvidia-h100-80gb-hbm3", 8);
    fake.node_put("gpu-2", "nvidia-h100-80gb-hbm3", 8);
    let executor = executor(&fake, config(logs)).await;
    executor.tenant_ceiling_set(TENANT, &examples::ceiling()).await.unwrap();
    executor.launch(&examples::pytorch_ddp()).await.expect("launch");
    (fake, executor)
}

fn golden(name: &str) -> Vec<Value> {
    let text = std::fs::read_to_string(examples::workspace_root().join(format!("docs/examples/{name}.yaml"))).unwrap();
    serde_yaml_ng::Deserializer::from_str(&text).map(|d| serde::Deserialize::deserialize(d).unwrap()).collect()
}

#[tokio::test]
async fn launching_a_two_replica_gpu_job_applies_exactly_the_golden_objects() {
    let logs = tempfile::tempdir().unwrap();
    let (fake, _executor) = launched(&logs).await;
    let sent = fake.writes_and_reads();

    for request in &sent {
        assert_eq!(request.method, Method::PATCH, "{request:?}");
        assert_eq!(request.query.get("fieldManager").map(String::as_str), Some("trainyard"), "one field manager");
        assert_eq!(request.query.get("force").map(String::as_str), Some("true"), "server-side apply, forced");
    }
    let kinds: Vec<String> = sent.iter().map(|r| r.kind()).collect();
    assert_eq!(kinds[0], "Namespace", "the namespace comes first: {kinds:?}");
    assert_eq!(kinds[5], "Job", "then the Job, whose uid the others need: {kinds:?}");

    // What was sent, with the uid the fake gave the Job put back to the golden placeholder.
    let job_uid = fake.get("jobs", NS, JOB_NAME).unwrap()["metadata"]["uid"].clone();
    let mut bodies: Vec<Value> = sent.iter().map(|r| r.body.clone().unwrap()).collect();
    for body in &mut bodies {
        if let Some(owner) = body.pointer_mut("/metadata/ownerReferences/0") {
            assert_eq!(owner["uid"], job_uid);
            owner["uid"] = json!(JOB_UID);
        }
    }
    let key = |v: &Value| format!("{}/{}", v["kind"], v["metadata"]["name"]);
    bodies.sort_by_key(key);
    let mut expected = golden("pytorch-ddp");
    expected.sort_by_key(key);
    assert_eq!(bodies.len(), 9);
    assert_eq!(bodies, expected, "the objects sent are the golden docs/examples/pytorch-ddp.yaml");

    let job_text = fake.get("jobs", NS, JOB_NAME).unwrap().to_string();
    assert!(!job_text.contains("tyj_"), "the job token is never in the Job's spec");
    let secret = fake.get("secrets", NS, JOB_NAME).unwrap();
    assert!(secret["data"]["TRAINYARD_TOKEN"].is_string(), "the token is in the attempt's Secret");
}

/// Code shipped with a job reaches the working directory: one tar archive in the attempt's
/// ConfigMap, unpacked by an init container of the same image before the replica starts.
#[tokio::test]
async fn a_jobs_code_is_unpacked_into_the_working_directory_before_the_replica_starts() {
    use base64::Engine;
    let logs = tempfile::tempdir().unwrap();
    let fake = FakeApi::default();
    let executor = executor(&fake, config(&logs)).await;
    let mut request = examples::shell();
    request.code = vec![
        trainyard_executor::CodeFile { path: "train.py".into(), executable: false, content: b"print('hi')\n".to_vec() },
        trainyard_executor::CodeFile { path: "bin/run.sh".into(), executable: true, content: b"#!/bin/sh\n".to_vec() },
        // Longer than a ustar header's 100-byte name field.
        trainyard_executor::CodeFile {
            path: format!("{}x.py", "deep/".repeat(30)),
            executable: false,
            content: b"x".to_vec(),
        },
    ];
    executor.launch(&request).await.unwrap();
    let name = trainyard_kube::names::attempt_object(request.job_id, request.attempt);

    let config_map = fake.get("configmaps", NS, &name).unwrap();
    let archive = base64::engine::general_purpose::STANDARD
        .decode(config_map["binaryData"]["trainyard-code.tar"].as_str().expect("the code archive"))
        .unwrap();
    let mut unpacked = Vec::new();
    for entry in tar::Archive::new(archive.as_slice()).entries().unwrap() {
        let mut entry = entry.unwrap();
        let mut content = String::new();
        std::io::Read::read_to_string(&mut entry, &mut content).unwrap();
        let mode = entry.header().mode().unwrap();
        unpacked.push((entry.path().unwrap().display().to_string(), mode, content));
    }
    assert_eq!(
        unpacked,
        [
            ("train.py".to_string(), 0o644, "print('hi')\n".to_string()),
            ("bin/run.sh".to_string(), 0o755, "#!/bin/sh\n".to_string()),
            (format!("{}x.py", "deep/".repeat(30)), 0o644, "x".to_string()),
        ]
    );

    let job = fake.get("jobs", NS, &name).unwrap();
    let pod = &job["spec"]["template"]["spec"];
    let init = &pod["initContainers"][0];
    assert_eq!(init["command"], json!(["tar", "-x", "-f", "/trainyard-code/code.tar", "-C", "/workspace"]));
    assert_eq!(init["image"], pod["containers"][0]["image"], "the job's own image unpacks it");
    assert_eq!(pod["containers"][0]["workingDir"], "/workspace");
    assert!(pod["volumes"].as_array().unwrap().iter().any(|v| v["name"] == "code"), "{pod}");
}

/// A rerun pinned to the image its original ran (`spec.image`, a digest) runs that image in
/// every container, whatever the executor's configured image is now; without a pin, the
/// configured one.
#[tokio::test]
async fn a_rerun_pinned_to_a_digest_runs_that_image_not_the_configured_tag() {
    let logs = tempfile::tempdir().unwrap();
    let fake = FakeApi::default();
    let executor = executor(&fake, config(&logs)).await;
    let digest = format!("ghcr.io/trainyard/runtime@sha256:{}", "2".repeat(64));
    let mut request = examples::shell();
    request.spec.image = Some(digest.clone());
    request.code =
        vec![trainyard_executor::CodeFile { path: "a.py".into(), executable: false, content: b"1".to_vec() }];
    executor.launch(&request).await.unwrap();
    let job = fake.get("jobs", NS, &trainyard_kube::names::attempt_object(request.job_id, request.attempt)).unwrap();
    let pod = &job["spec"]["template"]["spec"];
    assert_eq!(pod["containers"][0]["image"], digest.as_str());
    assert_eq!(pod["initContainers"][0]["image"], digest.as_str(), "the code is unpacked by the same image");

    let mut unpinned = examples::shell();
    unpinned.job_id = uuid::Uuid::from_u128(77);
    executor.launch(&unpinned).await.unwrap();
    let job = fake.get("jobs", NS, &trainyard_kube::names::attempt_object(unpinned.job_id, unpinned.attempt)).unwrap();
    assert_eq!(job["spec"]["template"]["spec"]["containers"][0]["image"], config(&logs).image.as_str());
}

/// An API server that fails (503) or is overloaded (429) says nothing about the job: the launch
/// reports the executor unavailable, which the control plane retries without charging the job;
/// one that refuses the request (422) fails the launch. A retried launch then goes through.
#[tokio::test]
async fn api_server_errors_are_transient_and_refusals_are_not() {
    let logs = tempfile::tempdir().unwrap();
    let fake = FakeApi::default();
    fake.node_put("gpu-1", "nvidia-h100-80gb-hbm3", 8);
    fake.node_put("gpu-2", "nvidia-h100-80gb-hbm3", 8);
    let executor = executor(&fake, config(&logs)).await;
    for code in [503, 500, 429] {
        fake.fail_next_writes(&[code]);
        let err = executor.launch(&examples::pytorch_ddp()).await.unwrap_err();
        assert!(matches!(err, ExecutorError::Unavailable(_)), "{code}: {err}");
    }
    fake.fail_next_writes(&[422]);
    let err = executor.launch(&examples::pytorch_ddp()).await.unwrap_err();
    assert!(matches!(err, ExecutorError::Launch(_)), "422: {err}");
    executor.launch(&examples::pytorch_ddp()).await.expect("the retried launch goes through");
    assert_eq!(fake.list("jobs").len(), 1, "one Job");
}

#[tokio::test]
async fn a_repeated_launch_sends_nothing_and_gives_the_same_placement() {
    let logs = tempfile::tempdir().unwrap();
    let (fake, executor) = launched(&logs).await;
    let first = executor.launch(&examples::pytorch_ddp()).await.unwrap();
    fake.requests_clear();
    let second = executor.launch(&examples::pytorch_ddp()).await.unwrap();
    assert_eq!(first, second);
    assert!(fake.writes_and_reads().is_empty(), "no request for an attempt that exists");
    assert_eq!(fake.list("jobs").len(), 1, "one Job");
    assert_eq!(second["master_addr"], format!("{JOB_NAME}-0.{JOB_NAME}.{NS}.svc"));
}

/// The three PATCHes of a resumed launch whose Job exists: its Service, ConfigMap and Secret.
fn only_the_jobs_objects_applied(requests: &[support::fake_api::Recorded]) -> bool {
    let mut kinds: Vec<&str> = requests
        .iter()
        .map(|r| {
            assert_eq!(r.method, http::Method::PATCH, "{} {}", r.method, r.path);
            ["/services/", "/configmaps/", "/secrets/"].into_iter().find(|k| r.path.contains(k)).unwrap_or(&r.path)
        })
        .collect();
    kinds.sort();
    kinds == ["/configmaps/", "/secrets/", "/services/"]
}

/// A launch cut short after its Job was applied (a crash, or lost leadership, before its
/// Service, ConfigMap and Secret) is finished by the next process's launch of the attempt: it
/// applies the three again, owned by the Job there is, and makes no second Job. (It launched
/// nothing before, and the pods waited for their ConfigMap forever.)
#[tokio::test]
async fn a_launch_cut_short_after_its_job_is_finished_by_the_next_process() {
    let logs = tempfile::tempdir().unwrap();
    let (fake, first) = launched(&logs).await;
    drop(first); // the control plane dies; say it had applied the Job only
    let job = fake.list("jobs").remove(0);
    for plural in ["services", "configmaps", "secrets"] {
        for object in fake.list(plural) {
            let meta = &object["metadata"];
            fake.delete(plural, meta["namespace"].as_str().unwrap(), meta["name"].as_str().unwrap());
        }
    }

    let restarted = executor(&fake, config(&logs)).await;
    fake.requests_clear();
    restarted.launch(&examples::pytorch_ddp()).await.unwrap();
    assert!(only_the_jobs_objects_applied(&fake.writes_and_reads()));
    assert_eq!(fake.list("jobs").len(), 1, "no second Job");
    for plural in ["services", "configmaps", "secrets"] {
        let objects = fake.list(plural);
        assert_eq!(objects.len(), 1, "{plural}: {objects:?}");
        assert_eq!(objects[0]["metadata"]["ownerReferences"][0]["uid"], job["metadata"]["uid"], "{plural}");
    }
    // Launched by this process now: again, nothing is sent.
    fake.requests_clear();
    restarted.launch(&examples::pytorch_ddp()).await.unwrap();
    assert!(fake.writes_and_reads().is_empty());
}

#[tokio::test]
async fn after_a_restart_a_new_executor_adopts_the_attempt_by_labels_and_launches_nothing() {
    let logs = tempfile::tempdir().unwrap();
    let (fake, first) = launched(&logs).await;
    for rank in 0..2 {
        fake.pod_create(NS, JOB_NAME, rank, "gpu-1", running());
    }
    until(&first, 2, |d| phases(d) == [ReplicaPhase::Running; 2]).await;
    drop(first); // the control plane dies

    let restarted = executor(&fake, config(&logs)).await;
    fake.requests_clear();
    restarted.launch(&examples::pytorch_ddp()).await.unwrap();
    // It found the Job, made no other, and applied again (unchanged) only what the Job owns.
    assert!(only_the_jobs_objects_applied(&fake.writes_and_reads()));
    assert_eq!(fake.list("jobs").len(), 1);
    let details = until(&restarted, 2, |d| phases(d) == [ReplicaPhase::Running; 2]).await;
    assert_eq!(restarted.observe(&attempt(2)).await, [ReplicaStatus::Running; 2]);
    assert!(details[0].image_digest.as_deref().unwrap().contains("@sha256:1111"), "{details:?}");
}

#[tokio::test]
async fn terminate_deletes_the_job_in_the_foreground_and_everything_goes_with_it() {
    let logs = tempfile::tempdir().unwrap();
    let (fake, executor) = launched(&logs).await;
    for rank in 0..2 {
        fake.pod_create(NS, JOB_NAME, rank, "gpu-1", running());
    }
    until(&executor, 2, |d| phases(d) == [ReplicaPhase::Running; 2]).await;
    fake.requests_clear();

    executor.terminate(&attempt(2), Duration::from_secs(10)).await;
    let deletes: Vec<_> = fake.writes_and_reads().into_iter().filter(|r| r.method == Method::DELETE).collect();
    assert_eq!(deletes.len(), 1, "{deletes:?}");
    assert!(deletes[0].path.ends_with(&format!("/namespaces/{NS}/jobs/{JOB_NAME}")));
    let body = deletes[0].body.clone().unwrap();
    // Foreground: the Job stays until its pods are gone, so that a Job gone means none runs.
    assert_eq!(body["propagationPolicy"], "Foreground");
    assert_eq!(body["gracePeriodSeconds"], 10);
    for plural in ["jobs", "services", "configmaps", "secrets", "pods"] {
        assert!(fake.list(plural).is_empty(), "owned {plural} are deleted with the Job");
    }
    until(&executor, 2, |d| phases(d) == [ReplicaPhase::Failed; 2]).await;
    assert_eq!(executor.observe(&attempt(2)).await, [ReplicaStatus::Exited(143); 2], "stopped as by SIGTERM");
}

/// A stop that came before any pod was seen (a preemption of a job just launched): on a real
/// cluster the Job controller may have made a pod just before the Job's deletion, which this
/// process's pod watch shows only after its Job watch showed the Job gone, and which may have run
/// to its end. Until the watches settle the replica is being stopped, not stopped; a pod that
/// shows then decides. Before, such a replica counted as stopped at once and its job ran again
/// (Kueue's replay against a real API server saw a job run to its end in two attempts).
#[tokio::test]
async fn a_stop_before_any_pod_was_seen_waits_for_a_late_pod_and_keeps_how_it_ended() {
    let logs = tempfile::tempdir().unwrap();
    let (fake, executor) = launched(&logs).await;
    let job = fake.get("jobs", NS, JOB_NAME).unwrap();
    executor.terminate(&attempt(2), Duration::from_secs(10)).await;
    assert!(fake.list("jobs").is_empty(), "the Job is deleted");
    let details = executor.replica_details(&attempt(2)).await;
    assert_eq!(phases(&details), [ReplicaPhase::Pending; 2], "not stopped yet: {details:#?}");
    assert_eq!(executor.observe(&attempt(2)).await, [ReplicaStatus::Running; 2], "being stopped has not ended");
    // The late pods: both ran to their end.
    for rank in 0..2 {
        fake.pod_create_of(&job, rank, "gpu-1", exited(0, "Completed"));
    }
    until(&executor, 2, |d| phases(d) == [ReplicaPhase::Succeeded; 2]).await;
    assert_eq!(executor.observe(&attempt(2)).await, [ReplicaStatus::Exited(0); 2], "they ended by themselves");
}

#[tokio::test]
async fn removing_a_tenant_deletes_its_namespace_once_and_a_later_launch_makes_it_afresh() {
    let logs = tempfile::tempdir().unwrap();
    let (fake, executor) = launched(&logs).await;
    for rank in 0..2 {
        fake.pod_create(NS, JOB_NAME, rank, "gpu-1", exited(0, "Completed"));
    }
    assert!(fake.get("namespaces", "", NS).is_some());
    fake.requests_clear();

    executor.tenant_remove(TENANT, "vision-team").await.expect("the namespace is deleted");
    let deletes: Vec<_> = fake.writes_and_reads().into_iter().filter(|r| r.method == Method::DELETE).collect();
    assert_eq!(deletes.len(), 1, "{deletes:?}");
    assert_eq!(deletes[0].path, format!("/api/v1/namespaces/{NS}"));
    assert_eq!(deletes[0].body.clone().unwrap()["propagationPolicy"], "Background");
    assert!(fake.get("namespaces", "", NS).is_none());
    for plural in ["jobs", "pods", "resourcequotas", "limitranges", "networkpolicies", "serviceaccounts", "configmaps"]
    {
        assert!(fake.list(plural).iter().all(|o| o["metadata"]["namespace"] != NS), "{plural} left in {NS}");
    }
    // Gone already: nothing to do, no error (a crash after the delete repeats it).
    executor.tenant_remove(TENANT, "vision-team").await.expect("a namespace that is gone is fine");
    // The executor forgot it had applied the namespace: a launch for the tenant makes it again.
    let mut next = examples::shell();
    next.job_id = uuid::Uuid::from_u128(0x0199_0000_0000_7000_8000_0000_0000_0b02);
    executor.launch(&next).await.expect("launch");
    assert!(fake.get("namespaces", "", NS).is_some(), "the namespace is applied again");
}

#[tokio::test]
async fn an_attempt_goes_from_pending_to_running_to_succeeded_and_wakes_the_reconciler() {
    let logs = tempfile::tempdir().unwrap();
    let (fake, executor) = launched(&logs).await;
    let changes = executor.changes();
    let details = executor.replica_details(&attempt(2)).await;
    assert_eq!(phases(&details), [ReplicaPhase::Pending; 2], "no pod yet: pending");
    assert_eq!(executor.observe(&attempt(2)).await, [ReplicaStatus::Running; 2], "a pending replica has not ended");

    let pods: Vec<String> =
        (0..2).map(|r| fake.pod_create(NS, JOB_NAME, r, "gpu-1", json!({ "phase": "Pending" }))).collect();
    until(&executor, 2, |d| phases(d) == [ReplicaPhase::Pending; 2]).await;
    let woken = changes.notified();
    fake.pod_status_set(NS, &pods[0], running());
    tokio::time::timeout(Duration::from_secs(5), woken).await.expect("a status change wakes the reconciler");
    until(&executor, 2, |d| phases(d) == [ReplicaPhase::Running, ReplicaPhase::Pending]).await;
    fake.pod_status_set(NS, &pods[1], running());
    until(&executor, 2, |d| phases(d) == [ReplicaPhase::Running; 2]).await;
    for pod in &pods {
        fake.pod_status_set(NS, pod, exited(0, "Completed"));
    }
    until(&executor, 2, |d| phases(d) == [ReplicaPhase::Succeeded; 2]).await;
    assert_eq!(executor.observe(&attempt(2)).await, [ReplicaStatus::Exited(0); 2]);
}

/// A stop that crosses the replicas' own end: both pods ran to their end (exit 0), and the
/// attempt's Job was deleted (a preemption's stop) before anyone looked at the attempt again.
/// The pods are gone, but the watch's delete events carried how they ended: the attempt
/// succeeded, it was not stopped (as on the local executor, where the exit records stay). Before,
/// such an attempt counted as stopped and its job ran again (Kueue's replay on Kubernetes saw a
/// job run to its end in two attempts).
#[tokio::test]
async fn replicas_that_ended_before_their_job_was_deleted_keep_how_they_ended() {
    let logs = tempfile::tempdir().unwrap();
    let (fake, executor) = launched(&logs).await;
    let pods: Vec<String> = (0..2).map(|r| fake.pod_create(NS, JOB_NAME, r, "gpu-1", running())).collect();
    until(&executor, 2, |d| phases(d) == [ReplicaPhase::Running; 2]).await;
    for pod in &pods {
        fake.pod_status_set(NS, pod, exited(0, "Completed"));
    }
    // Deleted at once, before the executor is asked about the attempt again; asked only once its
    // watch has taken in the deletions (they wake the reconciler; then a moment for the rest).
    let changes = executor.changes();
    let woken = changes.notified();
    executor.terminate(&attempt(2), Duration::from_secs(10)).await;
    assert!(fake.list("pods").is_empty(), "the pods went with their Job");
    tokio::time::timeout(Duration::from_secs(5), woken).await.expect("the deletions wake the reconciler");
    tokio::time::sleep(Duration::from_millis(300)).await;
    until(&executor, 2, |d| phases(d) == [ReplicaPhase::Succeeded; 2]).await;
    assert_eq!(executor.observe(&attempt(2)).await, [ReplicaStatus::Exited(0); 2], "they ended by themselves");
}

/// Launches, runs both replicas, then lets `fail` happen to replica 0; returns its detail.
async fn failure_of(config_change: impl FnOnce(&mut KubeConfig), fail: impl FnOnce(&FakeApi, &str)) -> ReplicaDetail {
    let logs = tempfile::tempdir().unwrap();
    let fake = FakeApi::default();
    fake.node_put("gpu-1", "nvidia-h100-80gb-hbm3", 8);
    let mut config = config(&logs);
    config_change(&mut config);
    let executor = executor(&fake, config).await;
    executor.launch(&examples::pytorch_ddp()).await.unwrap();
    let pod = fake.pod_create(NS, JOB_NAME, 0, "gpu-1", running());
    fake.pod_create(NS, JOB_NAME, 1, "gpu-1", running());
    until(&executor, 2, |d| phases(d) == [ReplicaPhase::Running; 2]).await;
    fail(&fake, &pod);
    let details = until(&executor, 2, |d| d[0].phase == ReplicaPhase::Failed).await;
    details[0].clone()
}

#[tokio::test]
async fn an_oom_killed_replica_fails_with_exit_137_and_says_so() {
    let detail = failure_of(|_| {}, |fake, pod| fake.pod_status_set(NS, pod, exited(137, "OOMKilled"))).await;
    assert_eq!((detail.reason, detail.exit_code), (Some(FailureReason::OomKilled), Some(137)));
}

/// containerd and runc's words, as a real kubelet (v1.36, containerd 1.6) reported them for
/// `yard submit -- no-such-program`: exit 128, which would read as a signal and be restarted.
#[tokio::test]
async fn a_program_missing_from_the_image_fails_with_exit_127_as_a_shell_says() {
    let message = "failed to create containerd task: failed to create shim task: OCI runtime create failed: \
        runc create failed: unable to start container process: exec: \"no-such-program\": executable file \
        not found in $PATH: unknown";
    let start_error = |code: i32, message: &str| {
        let end = json!({ "terminated": { "exitCode": code, "reason": "StartError", "message": message } });
        json!({ "phase": "Failed", "containerStatuses": container(end) })
    };
    let detail = failure_of(|_| {}, |fake, pod| fake.pod_status_set(NS, pod, start_error(128, message))).await;
    assert_eq!((detail.reason, detail.exit_code), (Some(FailureReason::Error), Some(127)));
    assert!(detail.message.as_deref().is_some_and(|m| m.contains("executable file not found")), "{detail:?}");
    let denied = "exec: \"/data/run.sh\": permission denied: unknown";
    let detail = failure_of(|_| {}, |fake, pod| fake.pod_status_set(NS, pod, start_error(128, denied))).await;
    assert_eq!(detail.exit_code, Some(126), "found but not executable");
}

#[tokio::test]
async fn a_program_error_keeps_its_exit_code() {
    let detail = failure_of(|_| {}, |fake, pod| fake.pod_status_set(NS, pod, exited(3, "Error"))).await;
    assert_eq!((detail.reason, detail.exit_code), (Some(FailureReason::Error), Some(3)));
}

#[tokio::test]
async fn an_evicted_replica_fails_as_evicted() {
    let detail = failure_of(
        |_| {},
        |fake, pod| {
            let status =
                json!({ "phase": "Failed", "reason": "Evicted", "message": "The node was low on resource: memory." });
            fake.pod_status_set(NS, pod, status)
        },
    )
    .await;
    assert_eq!(detail.reason, Some(FailureReason::Evicted));
    assert_eq!(detail.message.as_deref(), Some("The node was low on resource: memory."));
}

#[tokio::test]
async fn a_replica_whose_node_vanishes_fails_as_node_lost() {
    let detail = failure_of(
        |_| {},
        |fake, _| {
            fake.delete("nodes", "", "gpu-1");
        },
    )
    .await;
    assert_eq!(detail.reason, Some(FailureReason::NodeLost));
}

#[tokio::test]
async fn an_image_that_cannot_be_pulled_fails_the_attempt_only_once_it_persists() {
    let logs = tempfile::tempdir().unwrap();
    let fake = FakeApi::default();
    let mut config = config(&logs);
    config.image_pull_timeout = Duration::from_millis(1500);
    fake.node_put("cpu-1", "", 0);
    let executor = executor(&fake, config).await;
    executor.launch(&examples::shell()).await.unwrap();
    let shell_job = JOB_NAME;
    let waiting = json!({ "phase": "Pending", "containerStatuses": container(json!({ "waiting": { "reason": "ImagePullBackOff", "message": "Back-off pulling image \"ghcr.io/trainyard/runtime:1.0.0\"" } })) });
    fake.pod_create(NS, shell_job, 0, "cpu-1", waiting);
    let details = until(&executor, 1, |d| d[0].message.as_deref().is_some_and(|m| m.contains("Back-off"))).await;
    assert_eq!(details[0].phase, ReplicaPhase::Pending, "a pull that just failed may still succeed");
    let details = until(&executor, 1, |d| d[0].phase == ReplicaPhase::Failed).await;
    assert_eq!(details[0].reason, Some(FailureReason::ImagePullBackOff));
    assert_eq!(executor.observe(&attempt(1)).await, [ReplicaStatus::Lost]);
}

#[tokio::test]
async fn a_replica_no_node_can_take_fails_as_unschedulable_after_the_timeout() {
    let logs = tempfile::tempdir().unwrap();
    let fake = FakeApi::default();
    let mut config = config(&logs);
    config.unschedulable_timeout = Duration::from_secs(60);
    let executor = executor(&fake, config).await;
    executor.launch(&examples::shell()).await.unwrap();
    let blocked = |since: &str| {
        json!({ "phase": "Pending", "conditions": [{ "type": "PodScheduled", "status": "False", "reason": "Unschedulable",
            "message": "0/3 nodes are available: 3 Insufficient nvidia.com/gpu.", "lastTransitionTime": since }] })
    };
    let now = k8s_openapi::jiff::Timestamp::now();
    let pod = fake.pod_create(NS, JOB_NAME, 0, "", blocked(&now.to_string()));
    let details = until(&executor, 1, |d| d[0].message.as_deref().is_some_and(|m| m.contains("Insufficient"))).await;
    assert_eq!(details[0].phase, ReplicaPhase::Pending, "waiting a little for a node is normal");
    let long_ago = now - k8s_openapi::jiff::SignedDuration::from_secs(3600);
    fake.pod_status_set(NS, &pod, blocked(&long_ago.to_string()));
    let details = until(&executor, 1, |d| d[0].phase == ReplicaPhase::Failed).await;
    assert_eq!(details[0].reason, Some(FailureReason::Unschedulable));
    assert!(details[0].message.as_deref().unwrap().contains("Insufficient nvidia.com/gpu"));
}

#[tokio::test]
async fn garbage_collection_deletes_jobs_of_ended_or_unknown_attempts_only() {
    let logs = tempfile::tempdir().unwrap();
    let fake = FakeApi::default();
    let old = "2026-01-01T00:00:00Z";
    for (job, attempt) in [(JOB, 1), (uuid::Uuid::from_u128(7), 2)] {
        let name = trainyard_kube::names::attempt_object(job, attempt);
        let labels = trainyard_kube::names::attempt_labels(TENANT, job, attempt);
        fake.put("jobs", json!({ "apiVersion": "batch/v1", "kind": "Job",
            "metadata": { "name": name, "namespace": NS, "labels": labels, "creationTimestamp": old }, "spec": { "template": {} } }));
    }
    let executor = executor(&fake, config(&logs)).await;
    fake.requests_clear();
    let collected = executor.garbage_collect(&[(JOB, 1)]).await;
    assert_eq!(collected, 1);
    let deletes: Vec<_> = fake.writes_and_reads().into_iter().filter(|r| r.method == Method::DELETE).collect();
    assert_eq!(deletes.len(), 1);
    assert!(deletes[0].path.ends_with(&trainyard_kube::names::attempt_object(uuid::Uuid::from_u128(7), 2)));
    assert_eq!(deletes[0].body.as_ref().unwrap()["propagationPolicy"], "Background");
    assert_eq!(fake.list("jobs").len(), 1, "the live attempt's Job stays");
}

/// Two installations on one cluster (staging beside production): each collects only the Jobs
/// it made, though neither's database knows the other's attempts; a Job made before Jobs were
/// labelled is no one's to collect.
#[tokio::test]
async fn garbage_collection_takes_only_this_installations_jobs() {
    let logs = tempfile::tempdir().unwrap();
    let fake = FakeApi::default();
    let old = "2026-01-01T00:00:00Z";
    let jobs = [("staging", 11), ("production", 12), ("production", 13)]
        .map(|(installation, n)| (Some(installation), uuid::Uuid::from_u128(n)));
    for (installation, job) in jobs.into_iter().chain([(None, uuid::Uuid::from_u128(14))]) {
        let name = trainyard_kube::names::attempt_object(job, 1);
        let mut labels = trainyard_kube::names::attempt_labels(TENANT, job, 1);
        if let Some(installation) = installation {
            labels.insert(trainyard_kube::names::LABEL_INSTALLATION.to_string(), installation.to_string());
        }
        fake.put("jobs", json!({ "apiVersion": "batch/v1", "kind": "Job",
            "metadata": { "name": name, "namespace": NS, "labels": labels, "creationTimestamp": old }, "spec": { "template": {} } }));
    }
    let mut production = config(&logs);
    production.installation = Some("production".into());
    let executor = executor(&fake, production).await;
    // Production's database knows job 12's attempt only.
    assert_eq!(executor.garbage_collect(&[(uuid::Uuid::from_u128(12), 1)]).await, 1);
    let left: Vec<String> =
        fake.list("jobs").iter().map(|j| j["metadata"]["name"].as_str().unwrap().to_string()).collect();
    let name = |n| trainyard_kube::names::attempt_object(uuid::Uuid::from_u128(n), 1);
    assert!(!left.contains(&name(13)), "production's unknown attempt is collected: {left:?}");
    for kept in [11, 12, 14] {
        assert!(left.contains(&name(kept)), "job {kept} stays (staging's, live, or unlabelled): {left:?}");
    }
    // What it launches carries its label, Job and pods' template alike.
    fake.node_put("gpu-1", "nvidia-h100-80gb-hbm3", 8);
    fake.node_put("gpu-2", "nvidia-h100-80gb-hbm3", 8);
    executor.launch(&examples::pytorch_ddp()).await.expect("launch");
    let job = fake.get("jobs", NS, JOB_NAME).expect("the launched Job");
    assert_eq!(job["metadata"]["labels"][trainyard_kube::names::LABEL_INSTALLATION], "production");
    assert_eq!(job["spec"]["template"]["metadata"]["labels"][trainyard_kube::names::LABEL_INSTALLATION], "production");
}

#[tokio::test]
async fn logs_stream_from_the_pod_and_are_kept_when_the_attempt_is_released() {
    use tokio::io::AsyncReadExt;
    let logs = tempfile::tempdir().unwrap();
    let (fake, executor) = launched(&logs).await;
    let pods: Vec<String> = (0..2).map(|r| fake.pod_create(NS, JOB_NAME, r, "gpu-1", running())).collect();
    fake.log_set(NS, &pods[0], "epoch 1 loss 0.5\nepoch 2 loss 0.25\n");
    until(&executor, 2, |d| phases(d) == [ReplicaPhase::Running; 2]).await;

    let mut live = String::new();
    executor.log_reader(JOB, 1, 0, false).await.unwrap().expect("a log").read_to_string(&mut live).await.unwrap();
    assert_eq!(live, "epoch 1 loss 0.5\nepoch 2 loss 0.25\n", "streamed from the pod");

    for pod in &pods {
        fake.pod_status_set(NS, pod, exited(0, "Completed"));
    }
    until(&executor, 2, |d| phases(d) == [ReplicaPhase::Succeeded; 2]).await;
    executor.release(&attempt(2)).await;
    assert!(fake.list("pods").is_empty() && fake.list("jobs").is_empty(), "release removes the Job and its pods");
    let kept = logs.path().join(JOB.to_string()).join("1").join("0.log");
    assert_eq!(std::fs::read_to_string(&kept).unwrap(), live, "kept in the log folder");
    assert_eq!(
        executor.log_last_line(JOB, 1, 0).await.as_deref(),
        Some("epoch 2 loss 0.25"),
        "served after the pods are gone"
    );
    // Retention removes the kept copies; the job then has no log here.
    executor.logs_remove(JOB).await.unwrap();
    assert!(!kept.exists());
    assert!(executor.log_reader(JOB, 1, 0, false).await.unwrap().is_none(), "nothing left to serve");
}

#[tokio::test]
async fn a_log_the_api_server_cannot_fetch_is_unavailable_and_names_the_pod() {
    let logs = tempfile::tempdir().unwrap();
    let (fake, executor) = launched(&logs).await;
    let pods: Vec<String> = (0..2).map(|r| fake.pod_create(NS, JOB_NAME, r, "gpu-1", running())).collect();
    fake.log_unreachable(NS, &pods[1]);
    until(&executor, 2, |d| phases(d) == [ReplicaPhase::Running; 2]).await;
    match executor.log_reader(JOB, 1, 1, false).await {
        Err(ExecutorError::Unavailable(message)) => {
            assert!(message.contains(&pods[1]), "names the pod: {message}");
            assert!(message.contains("no preferred addresses found"), "says what the API server said: {message}");
        }
        Err(other) => panic!("expected unavailable, got {other:?}"),
        Ok(reader) => panic!("expected an error, got a reader: {}", reader.is_some()),
    }
}

#[tokio::test]
async fn an_attempt_sees_only_its_own_pods_among_many_and_forgets_deleted_ones() {
    let logs = tempfile::tempdir().unwrap();
    let (fake, executor) = launched(&logs).await;
    let pods: Vec<String> = (0..2).map(|r| fake.pod_create(NS, JOB_NAME, r, "gpu-1", running())).collect();
    // Pods of 200 other attempts of the same job beside this attempt's two, all running.
    let template = fake.get("pods", NS, &pods[1]).unwrap();
    for other in 2..202 {
        let mut pod = template.clone();
        pod["metadata"]["name"] = json!(format!("{JOB_NAME}-other-{other}"));
        pod["metadata"]["labels"]["trainyard.dev/attempt"] = json!(other.to_string());
        fake.put("pods", pod);
    }
    until(&executor, 2, |d| phases(d) == [ReplicaPhase::Running; 2]).await;
    fake.delete("pods", NS, &pods[1]);
    let details = until(&executor, 2, |d| d[1].phase != ReplicaPhase::Running).await;
    assert_eq!(details[0].phase, ReplicaPhase::Running, "rank 0 still runs: {details:#?}");
}

#[tokio::test]
async fn the_inventory_follows_nodes_appearing_draining_and_vanishing() {
    let logs = tempfile::tempdir().unwrap();
    let fake = FakeApi::default();
    let executor = executor(&fake, config(&logs)).await;
    let gpus = |e: &KubernetesExecutor| e.inventory().gpus.len();
    fake.node_put("gpu-1", "NVIDIA-H100-80GB-HBM3", 8);
    fake.node_put("gpu-2", "NVIDIA-H100-80GB-HBM3", 8);
    wait(|| gpus(&executor) == 16).await;
    assert_eq!(executor.inventory().gpu_types(), ["nvidia-h100-80gb-hbm3"]);
    let mut cordoned = fake.get("nodes", "", "gpu-2").unwrap();
    cordoned["spec"]["unschedulable"] = json!(true);
    fake.put("nodes", cordoned);
    wait(|| gpus(&executor) == 8).await;
    let nodes = executor.nodes().unwrap();
    assert_eq!(
        nodes.iter().map(|n| (n.name.as_str(), n.schedulable)).collect::<Vec<_>>(),
        [("gpu-1", true), ("gpu-2", false)]
    );
    fake.delete("nodes", "", "gpu-1");
    wait(|| gpus(&executor) == 0).await;

    // A job asking for the type in Trainyard's lower case selects the nodes by their own label.
    executor.launch(&examples::pytorch_ddp()).await.unwrap();
    let job = fake.get("jobs", NS, JOB_NAME).unwrap();
    assert_eq!(job["spec"]["template"]["spec"]["nodeSelector"]["nvidia.com/gpu.product"], "NVIDIA-H100-80GB-HBM3");
}

/// The replicas are steered to the nodes Trainyard's scheduler chose (a preferred node affinity
/// on the nodes' names: never a pod left pending for a node gone since), and each learns its node
/// from the downward API; without a placement the pod may go anywhere its GPU type allows.
#[tokio::test]
async fn replicas_are_kept_on_the_nodes_the_scheduler_chose() {
    let logs = tempfile::tempdir().unwrap();
    let fake = FakeApi::default();
    let placed = executor(&fake, config(&logs)).await;
    let mut request = examples::pytorch_ddp();
    request.nodes = vec!["gpu-7".into(), "gpu-3".into()];
    placed.launch(&request).await.unwrap();
    let pod = &fake.get("jobs", NS, JOB_NAME).unwrap()["spec"]["template"]["spec"];
    assert_eq!(
        pod["affinity"]["nodeAffinity"],
        json!({ "preferredDuringSchedulingIgnoredDuringExecution": [
            { "weight": 100, "preference": { "matchFields": [{ "key": "metadata.name", "operator": "In", "values": ["gpu-3"] }] } },
            { "weight": 100, "preference": { "matchFields": [{ "key": "metadata.name", "operator": "In", "values": ["gpu-7"] }] } },
        ] })
    );
    let env = pod["containers"][0]["env"].as_array().unwrap();
    let node_env = env.iter().find(|e| e["name"] == "TRAINYARD_NODE").expect("TRAINYARD_NODE is set");
    assert_eq!(node_env["valueFrom"]["fieldRef"]["fieldPath"], "spec.nodeName");

    let fake = FakeApi::default();
    let unplaced = executor(&fake, config(&logs)).await;
    unplaced.launch(&examples::pytorch_ddp()).await.unwrap();
    assert!(fake.get("jobs", NS, JOB_NAME).unwrap()["spec"]["template"]["spec"].get("affinity").is_none());
}

async fn wait(done: impl Fn() -> bool) {
    for _ in 0..250 {
        if done() {
            return;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    panic!("condition not reached in 5 s");
}

#[tokio::test]
async fn tenant_objects_are_applied_once_and_the_quota_again_only_when_the_ceiling_changes() {
    let logs = tempfile::tempdir().unwrap();
    let (fake, executor) = launched(&logs).await;
    fake.requests_clear();
    let mut second = examples::pytorch_ddp();
    second.job_id = uuid::Uuid::from_u128(99);
    executor.launch(&second).await.unwrap();
    let kinds: Vec<String> = fake.writes_and_reads().iter().map(|r| r.kind()).collect();
    assert_eq!(kinds.len(), 4, "a second job of the tenant costs 4 requests: {kinds:?}");
    assert!(!kinds.contains(&"Namespace".to_string()));

    fake.requests_clear();
    executor.tenant_ceiling_set(TENANT, &examples::ceiling()).await.unwrap();
    assert!(fake.writes_and_reads().is_empty(), "an unchanged ceiling is left alone");

    let mut raised = examples::ceiling();
    raised.gpus = Some(64);
    raised.cpu_millis = None;
    executor.tenant_ceiling_set(TENANT, &raised).await.unwrap();
    let quota = fake.get("resourcequotas", NS, "trainyard-ceiling").unwrap();
    assert_eq!(quota["spec"]["hard"]["requests.nvidia.com/gpu"], "64");
    assert!(quota["spec"]["hard"].get("requests.cpu").is_none(), "no cpu limit when the ceiling names none");
}

#[tokio::test]
async fn a_volume_is_a_claim_in_the_tenants_namespace_mounted_where_the_job_was_told() {
    let logs = tempfile::tempdir().unwrap();
    let fake = FakeApi::default();
    let executor = executor(&fake, config(&logs)).await;
    let volume = trainyard_executor::VolumeRequest {
        tenant_id: TENANT,
        tenant: "vision-team".into(),
        name: "checkpoints".into(),
        size_bytes: 10 << 30,
        access_mode: "ReadWriteMany".into(),
        storage_class: Some("fast-nfs".into()),
    };
    assert_eq!(executor.volume_path("checkpoints").as_deref(), Some("/volumes/checkpoints"));
    executor.volume_ensure(&volume).await.unwrap();
    executor.volume_ensure(&volume).await.expect("repeating is harmless");
    let claim =
        fake.get("persistentvolumeclaims", NS, "vol-checkpoints").expect("the claim, in the tenant's namespace");
    assert_eq!(claim["spec"]["accessModes"], json!(["ReadWriteMany"]));
    assert_eq!(claim["spec"]["storageClassName"], "fast-nfs");
    assert_eq!(claim["spec"]["resources"]["requests"]["storage"], (10u64 << 30).to_string());
    assert_eq!(claim["metadata"]["labels"]["trainyard.dev/volume"], "checkpoints");
    assert!(fake.get("namespaces", "", NS).is_some(), "the namespace was made first");

    // A job using it mounts the claim at the path its parameter resolved to.
    let mut request = examples::pytorch_ddp();
    request.spec.volumes =
        vec![trainyard_core::job::VolumeMount { name: "checkpoints".into(), path: "/volumes/checkpoints".into() }];
    executor.launch(&request).await.unwrap();
    let job = fake.get("jobs", NS, JOB_NAME).expect("the Job");
    let pod = &job["spec"]["template"]["spec"];
    let volume_spec = pod["volumes"].as_array().unwrap().iter().find(|v| v["name"] == "shared-0").expect("the volume");
    assert_eq!(volume_spec["persistentVolumeClaim"]["claimName"], "vol-checkpoints");
    let mounts = pod["containers"][0]["volumeMounts"].as_array().unwrap();
    assert!(mounts.iter().any(|m| m["name"] == "shared-0" && m["mountPath"] == "/volumes/checkpoints"), "{mounts:?}");

    executor.volume_remove(TENANT, "vision-team", "checkpoints").await.unwrap();
    assert!(fake.get("persistentvolumeclaims", NS, "vol-checkpoints").is_none());
    executor.volume_remove(TENANT, "vision-team", "checkpoints").await.expect("removing a gone volume is harmless");
}

/// A 1 GiB volume `scratch` of the example tenant that names no storage class.
fn scratch_volume() -> trainyard_executor::VolumeRequest {
    trainyard_executor::VolumeRequest {
        tenant_id: TENANT,
        tenant: "vision-team".into(),
        name: "scratch".into(),
        size_bytes: 1 << 30,
        access_mode: "ReadWriteOnce".into(),
        storage_class: None,
    }
}

/// A volume that names no storage class asks for none, so that the cluster's default class
/// provisions it (a class the cluster lacks would leave the claim Pending forever); the
/// operator's `--kube-storage-class` fills in when set.
#[tokio::test]
async fn a_volume_without_a_class_gets_the_clusters_default_or_the_operators() {
    let logs = tempfile::tempdir().unwrap();
    let volume = scratch_volume();
    let fake = FakeApi::default();
    executor(&fake, config(&logs)).await.volume_ensure(&volume).await.unwrap();
    let claim = fake.get("persistentvolumeclaims", NS, "vol-scratch").unwrap();
    assert!(claim["spec"].get("storageClassName").is_none(), "{claim}");

    let fake = FakeApi::default();
    let mut with_class = config(&logs);
    with_class.storage_class = Some("ceph-rbd".into());
    executor(&fake, with_class).await.volume_ensure(&volume).await.unwrap();
    let claim = fake.get("persistentvolumeclaims", NS, "vol-scratch").unwrap();
    assert_eq!(claim["spec"]["storageClassName"], "ceph-rbd");
}

/// A claim no storage binds says why, in the cluster's words (the newest event about it); a
/// bound one has nothing to say.
#[tokio::test]
async fn a_claim_left_pending_shows_the_clusters_reason_until_it_is_bound() {
    let logs = tempfile::tempdir().unwrap();
    let volume = scratch_volume();
    let fake = FakeApi::default();
    let executor = executor(&fake, config(&logs)).await;
    executor.volume_ensure(&volume).await.unwrap();
    let event = |name: &str, at: &str, message: &str, claim: &str| {
        json!({
            "apiVersion": "v1", "kind": "Event",
            "metadata": { "name": name, "namespace": NS },
            "involvedObject": { "kind": "PersistentVolumeClaim", "name": claim, "namespace": NS },
            "reason": "FailedBinding", "type": "Normal", "lastTimestamp": at, "message": message,
        })
    };
    fake.put("events", event("e1", "2026-01-01T00:00:00Z", "waiting for first consumer", "vol-scratch"));
    fake.put(
        "events",
        event(
            "e2",
            "2026-01-01T00:05:00Z",
            "no persistent volumes available for this claim and no storage class is set",
            "vol-scratch",
        ),
    );
    fake.put("events", event("e3", "2026-01-01T00:09:00Z", "about another claim", "vol-other"));
    let reason = executor.volume_pending_reason(TENANT, "vision-team", "scratch").await.expect("a reason");
    assert_eq!(
        reason,
        "its claim is pending: no persistent volumes available for this claim and no storage class is set"
    );

    let mut claim = fake.get("persistentvolumeclaims", NS, "vol-scratch").unwrap();
    claim["status"] = json!({ "phase": "Bound" });
    fake.put("persistentvolumeclaims", claim);
    assert_eq!(executor.volume_pending_reason(TENANT, "vision-team", "scratch").await, None);
    assert_eq!(executor.volume_pending_reason(TENANT, "vision-team", "absent").await, None, "no claim, no reason");
}

/// A client for an `https` API server builds in a binary that links only this crate: no panic
/// for want of a rustls crypto provider (the cluster suite hit it before its first request).
#[tokio::test]
async fn a_client_for_an_https_api_server_builds_without_a_tls_panic() {
    let config = kube::Config::new("https://127.0.0.1:1".parse().unwrap());
    let client = trainyard_kube::client_for(config, &examples::config()).expect("a client");
    // Nothing listens there: the request fails as a connection error, not a panic.
    let err = client.apiserver_version().await.unwrap_err();
    assert!(!err.to_string().contains("CryptoProvider"), "{err}");
}

/// A launch that fails at any of its requests removes what it applied at once: no Job, pod,
/// Service, ConfigMap or Secret of the attempt is left (the tenant's own objects may stay: the
/// next launch needs them); the launch after it makes the attempt afresh.
#[tokio::test]
async fn a_launch_failing_at_any_request_leaves_nothing_of_the_attempt_behind() {
    let logs = tempfile::tempdir().unwrap();
    let attempt_objects = ["jobs", "services", "configmaps", "secrets"];
    // How many writes a first launch into a tenant makes: the tenant's objects, then the attempt's.
    let writes = {
        let fake = FakeApi::default();
        fake.node_put("gpu-1", "nvidia-h100-80gb-hbm3", 8);
        let executor = executor(&fake, config(&logs)).await;
        executor.launch(&examples::pytorch_ddp()).await.unwrap();
        fake.writes_and_reads().iter().filter(|r| r.method == Method::PATCH).count()
    };
    assert!(writes >= 8, "{writes} writes");
    for failing in 0..writes {
        let fake = FakeApi::default();
        fake.node_put("gpu-1", "nvidia-h100-80gb-hbm3", 8);
        let executor = executor(&fake, config(&logs)).await;
        fake.fail_nth_write(failing, 403);
        executor
            .launch(&examples::pytorch_ddp())
            .await
            .expect_err(&format!("refusing write {failing} fails the launch"));
        for plural in attempt_objects {
            assert!(
                fake.list(plural).is_empty(),
                "write {failing} refused: {plural} left behind: {:?}",
                fake.list(plural)
            );
        }
        executor.launch(&examples::pytorch_ddp()).await.expect("the next launch goes through");
        for plural in attempt_objects {
            assert_eq!(fake.list(plural).len(), 1, "write {failing} refused, then launched again: one of {plural}");
        }
    }
}
