//! Scheduling that prefers warm nodes (issue 23): on a cluster of two GPU nodes (the in-memory
//! API server plays them and runs the pods), a job whose dataset one node's shard cache holds is
//! placed there while that node has room, even where best fit alone would choose the other
//! node; with that node full it starts on the other at once, unless it asked to wait for the
//! warm node (`cache_wait_seconds`), which it then does. The cache reports come from a
//! job's engine with its job token, here sent by the test as the engine sends them (the engine's
//! side: templates/pytorch-ddp/tests/test_remote.py); a report naming a node the job does not
//! run on, or a version it does not read, is refused. The dataset's page in the API, the job's
//! page and the what-if answer say "cached on N of M nodes".

use std::time::Duration;

use base64::Engine;
use serde_json::{Value, json};
use trainyard_tests::web::WebClient;
use trainyard_tests::{FakeApiServer, StatusCode, TestEnv};

const GPU: &str = "sim-gpu";

/// The nodes the pods of `job` landed on, as the API server has them.
async fn pod_nodes(fake: &FakeApiServer, job: &str) -> Vec<String> {
    let pods: Value = reqwest::get(format!("{}/api/v1/pods?labelSelector=trainyard.dev/job={job}", fake.url))
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    pods["items"].as_array().unwrap().iter().map(|p| p["spec"]["nodeName"].as_str().unwrap().to_string()).collect()
}

/// The job token Trainyard gave the job's pods (its Secret), as the engine reads it.
async fn job_token(fake: &FakeApiServer, job: &str) -> String {
    let secrets: Value = reqwest::get(format!("{}/api/v1/secrets", fake.url)).await.unwrap().json().await.unwrap();
    let secret = secrets["items"]
        .as_array()
        .unwrap()
        .iter()
        .find(|s| s["metadata"]["labels"]["trainyard.dev/job"] == job)
        .unwrap_or_else(|| panic!("no Secret for job {job}: {secrets}"));
    let token = secret["data"]["TRAINYARD_TOKEN"].as_str().unwrap();
    String::from_utf8(base64::engine::general_purpose::STANDARD.decode(token).unwrap()).unwrap()
}

async fn running_on(env: &TestEnv, fake: &FakeApiServer, job: &str) -> Vec<String> {
    env.wait_job(job, Duration::from_secs(30), |j| j["state"] == "running").await;
    pod_nodes(fake, job).await
}

/// A pytorch-ddp job of `gpus` GPUs reading digits@1 (what the scheduler sees of it; on the
/// in-memory API server its pod just runs).
async fn reader(env: &TestEnv, name: &str, gpus: u32) -> String {
    let body = json!({"name": name, "params": {"data": "digits@1", "gpus": gpus, "gpu_type": GPU, "cpu": 1,
        "memory": "1Gi", "checkpoint_volume": ""}});
    let (status, job) = env.post("/api/v1/templates/pytorch-ddp/jobs", &env.admin_token, &body).await;
    assert_eq!(status, StatusCode::CREATED, "{job}");
    job["id"].as_str().unwrap().to_string()
}

async fn holder(env: &TestEnv, name: &str, gpus: u32) -> String {
    env.submit(json!({"name": name, "command": ["sleep", "3600"],
        "resources": {"gpus": gpus, "gpu_type": GPU, "cpu": 1, "memory": "1Gi"}}))
        .await
}

async fn cancel_and_wait(env: &TestEnv, job: &str) {
    let (status, body) = env.post(&format!("/api/v1/jobs/{job}/cancel"), &env.admin_token, &json!({})).await;
    assert!(status.is_success(), "{body}");
    env.wait_job(job, Duration::from_secs(30), |j| j["state"] == "cancelled").await;
}

#[tokio::test(flavor = "multi_thread")]
async fn a_job_starts_on_the_node_that_caches_its_data_and_waits_for_it_only_when_asked() {
    let scratch = tempfile::tempdir().unwrap();
    let fake = FakeApiServer::start(scratch.path(), &["2", "--gpus", "4", "--gpu-product", GPU]);
    let env = TestEnv::start_with_env(
        &["--executor", "kubernetes", "--kube-image", "registry.example/runtime:1", "--retention-sweep-seconds", "1"],
        &[("KUBECONFIG".to_string(), fake.kubeconfig.display().to_string())],
    )
    .await;
    let admin = env.admin_token.clone();
    let (status, body) = env
        .call(
            reqwest::Method::PUT,
            &format!("/api/v1/admin/tenants/default/quotas/{GPU}"),
            Some(&admin),
            Some(&json!({"nominal": 8})),
        )
        .await;
    assert!(status.is_success(), "{body}");
    let content_hash = format!("sha256:{}", "ab".repeat(32));
    let (status, body) = env
        .post(
            "/api/v1/datasets",
            &admin,
            &json!({"name": "digits", "version": "1", "uri": "/data/digits", "content_hash": content_hash}),
        )
        .await;
    assert_eq!(status, StatusCode::CREATED, "{body}");

    // The first reader runs somewhere (A); its engine reports that A's cache holds digits@1.
    let first = reader(&env, "first", 2).await;
    let a = running_on(&env, &fake, &first).await.remove(0);
    let token = job_token(&fake, &first).await;
    let report =
        |node: &str, version: &str| json!({"node": node, "name": "digits", "version": version, "bytes": 123_456});
    let path = format!("/api/v1/jobs/{first}/cached-datasets");
    let other = if a == "fake-node-0" { "fake-node-1" } else { "fake-node-0" }.to_string();
    let (status, body) = env.post(&path, &token, &report(&other, "1")).await;
    assert_eq!(status, StatusCode::UNPROCESSABLE_ENTITY, "not its node: {body}");
    assert_eq!(body["error"]["field"], "node", "{body}");
    let (status, body) = env.post(&path, &token, &report(&a, "2")).await;
    assert_eq!(status, StatusCode::NOT_FOUND, "a version it does not read: {body}");
    let (status, body) = env.post(&path, &admin, &report(&a, "1")).await;
    assert_eq!(status, StatusCode::UNAUTHORIZED, "a member's token is no job token: {body}");
    let (status, body) = env.post(&path, &token, &report(&a, "1")).await;
    assert_eq!(status, StatusCode::NO_CONTENT, "{body}");
    let (_, dataset) = env.get("/api/v1/datasets/digits/1", &admin).await;
    assert_eq!(dataset["cached_on"], json!([a]), "{dataset}");
    // Each node says which of the tenant's versions it caches.
    let (_, nodes) = env.get("/api/v1/nodes", &admin).await;
    let cached = |name: &str| {
        nodes["items"].as_array().unwrap().iter().find(|n| n["name"] == name).unwrap()["cached_datasets"].clone()
    };
    assert_eq!((cached(&a), cached(&other)), (json!(["digits@1"]), json!([])), "{nodes}");
    let listed = env.yard(&admin, &["nodes"]);
    let listed = String::from_utf8_lossy(&listed.stdout);
    assert!(listed.lines().any(|l| l.contains(a.as_str()) && l.contains("digits@1")), "{listed}");
    // Another tenant sees the nodes, never what they cache of this one.
    let (status, _) = env.post("/api/v1/admin/tenants", &admin, &json!({"name": "team-b"})).await;
    assert_eq!(status, StatusCode::CREATED);
    let bob = env.member("team-b", "bob", "viewer").await;
    let (_, theirs) = env.get("/api/v1/nodes", &bob).await;
    assert!(theirs["items"].as_array().unwrap().iter().all(|n| n["cached_datasets"] == json!([])), "{theirs}");

    // A 3-GPU holder goes to B (A has 2 free); the first reader ends: A has 4 free, B 1.
    let three = holder(&env, "three", 3).await;
    assert_eq!(running_on(&env, &fake, &three).await, [other.as_str()]);
    cancel_and_wait(&env, &first).await;
    // Best fit alone would put a 1-GPU job on B (the fullest node it fits); its data is on A.
    let (status, what_if) = env
        .post(
            "/api/v1/templates/pytorch-ddp/jobs?what_if=true",
            &admin,
            &json!({"params": {"data": "digits@1", "gpus": 1, "gpu_type": GPU, "checkpoint_volume": ""}}),
        )
        .await;
    assert_eq!(status, StatusCode::OK, "{what_if}");
    assert_eq!(what_if["admitted_now"], true, "{what_if}");
    assert_eq!(what_if["cached_on"], json!({"nodes": 1, "of": 2}), "{what_if}");
    let second = reader(&env, "second", 1).await;
    assert_eq!(running_on(&env, &fake, &second).await, [a.as_str()], "placed where its data is");
    // A job reading nothing registered takes the fullest node, as before.
    let plain = holder(&env, "plain", 1).await;
    assert_eq!(running_on(&env, &fake, &plain).await, [other.as_str()]);
    cancel_and_wait(&env, &plain).await;

    // A full (the second reader and a 3-GPU holder there): the next reader starts on B at once.
    let fill = holder(&env, "fill", 3).await;
    assert_eq!(running_on(&env, &fake, &fill).await, [a.as_str()]);
    let third = reader(&env, "third", 1).await;
    assert_eq!(running_on(&env, &fake, &third).await, [other.as_str()], "never held back for its data");

    // Unless the job asks to wait for its data's node (`yard run --cache-wait`): with A full
    // and room on B it stays queued, saying why and until when, and starts on A once A frees.
    cancel_and_wait(&env, &third).await;
    let (status, body) = env
        .post(
            "/api/v1/templates/pytorch-ddp/jobs",
            &admin,
            &json!({"params": {"data": "digits@1", "gpus": 1, "gpu_type": GPU}, "cache_wait_seconds": 7200}),
        )
        .await;
    assert_eq!(status, StatusCode::UNPROCESSABLE_ENTITY, "{body}");
    assert_eq!(body["error"]["field"], "cache_wait_seconds", "{body}");
    let gpu_type = format!("gpu_type={GPU}");
    let mut args = vec!["run", "pytorch-ddp", "--name", "patient", "--cache-wait", "10m"];
    for set in [gpu_type.as_str(), "data=digits@1", "gpus=1", "cpu=1", "memory=1Gi", "checkpoint_volume="] {
        args.extend(["--set", set]);
    }
    let ran = env.yard(&admin, &args);
    assert!(ran.status.success(), "{}", String::from_utf8_lossy(&ran.stderr));
    let patient = String::from_utf8_lossy(&ran.stdout).trim().lines().last().unwrap().to_string();
    let waiting_for_a = |job: &Value| {
        job["state"] == "queued"
            && job["reason"].as_str().is_some_and(|r| {
                r.starts_with("waiting for room on the node that caches its data, as the job asked, until ")
            })
    };
    env.wait_job(&patient, Duration::from_secs(15), waiting_for_a).await;
    tokio::time::sleep(Duration::from_secs(3)).await; // passes go by; B's free GPU stays free
    let (_, job) = env.get(&format!("/api/v1/jobs/{patient}"), &admin).await;
    assert!(waiting_for_a(&job), "{job}");
    cancel_and_wait(&env, &fill).await;
    assert_eq!(running_on(&env, &fake, &patient).await, [a.as_str()], "started where its data is");

    // A reader that must wait says where its data is, on its page and in `yard jobs show`.
    let waiting = reader(&env, "waiting", 4).await;
    let (_, schedule) = env.get(&format!("/api/v1/jobs/{waiting}/schedule"), &admin).await;
    assert_eq!(schedule["cached_on"], json!({"nodes": 1, "of": 2}), "{schedule}");
    let web = WebClient::signed_in(&env.server.url, &admin).await;
    let (_, page) = web.get(&format!("/jobs/{waiting}")).await;
    assert!(page.contains("Its data is cached on 1 of 2 nodes."), "{page}");
    let shown = env.yard(&admin, &["jobs", "show", &waiting]);
    let shown = String::from_utf8_lossy(&shown.stdout);
    assert!(shown.contains("cached on 1 of 2 nodes"), "{shown}");

    // A report older than a day is not trusted, and the retention sweep forgets it.
    sqlx::query("UPDATE node_datasets SET reported_at = now() - interval '25 hours'")
        .execute(&env.db.pool)
        .await
        .unwrap();
    let (_, dataset) = env.get("/api/v1/datasets/digits/1", &admin).await;
    assert_eq!(dataset["cached_on"], json!([]), "{dataset}");
    let (_, schedule) = env.get(&format!("/api/v1/jobs/{waiting}/schedule"), &admin).await;
    assert_eq!(schedule["cached_on"], json!({"nodes": 0, "of": 2}), "{schedule}");
    let deadline = std::time::Instant::now() + Duration::from_secs(15);
    loop {
        let left: i64 = sqlx::query_scalar("SELECT count(*) FROM node_datasets").fetch_one(&env.db.pool).await.unwrap();
        if left == 0 {
            break;
        }
        assert!(std::time::Instant::now() < deadline, "the stale report was never forgotten");
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}
