//! Task templates end to end: the built-in `shell` from the CLI, tenant templates published and
//! run, immutability, tenancy, and the metrics API with job tokens.

use std::time::Duration;

use reqwest::Method;
use serde_json::{Value, json};
use trainyard_tests::{StatusCode, TestEnv, stderr, stdout};

#[tokio::test(flavor = "multi_thread")]
async fn shell_from_the_cli_runs_and_records_the_spec_the_dry_run_showed() {
    let env = TestEnv::start().await;
    let token = &env.admin_token;
    let command = r#"--set=command=["sh", "-c", "echo hello from $RANK of $WORLD_SIZE"]"#;
    let dry = env.yard(token, &["run", "shell", command, "--set", "replicas=2", "--set", "cpu=0.5", "--dry-run"]);
    assert!(dry.status.success(), "{}", stderr(&dry));
    let dry: Value = serde_json::from_slice(&dry.stdout).expect("the dry run prints JSON");
    assert_eq!(dry["spec"]["replicas"], 2);
    assert_eq!(dry["spec"]["command"], json!(["sh", "-c", "echo hello from $RANK of $WORLD_SIZE"]));
    assert_eq!(env.jobs_in_db().await, 0, "a dry run queues nothing");

    let ran =
        env.yard(token, &["run", "shell", command, "--set", "replicas=2", "--set", "cpu=0.5", "--wait", "-o", "json"]);
    assert!(ran.status.success(), "{} {}", stdout(&ran), stderr(&ran));
    let job: Value = serde_json::from_slice(&ran.stdout).unwrap();
    assert_eq!(job["state"], "succeeded");
    assert_eq!(job["spec"], dry["spec"], "the job records exactly the spec the dry run showed");
    assert_eq!(job["spec"]["template"]["name"], "shell");
    assert_eq!(job["params"]["replicas"], "2", "the parameters as given are recorded");
    let id = job["id"].as_str().unwrap();
    let logs = env.yard(token, &["logs", id, "--replica", "1"]);
    assert_eq!(stdout(&logs), "hello from 1 of 2\n");
}

#[tokio::test(flavor = "multi_thread")]
async fn a_bad_set_prints_the_servers_own_message() {
    let env = TestEnv::start().await;
    let cli = env.yard(&env.admin_token, &["run", "shell", "--set", r#"command=["true"]"#, "--set", "replicas=many"]);
    assert!(!cli.status.success());
    let (status, body) = env
        .post(
            "/api/v1/templates/shell/jobs",
            &env.admin_token,
            &json!({"params": {"command": ["true"], "replicas": "many"}}),
        )
        .await;
    assert_eq!(status, StatusCode::UNPROCESSABLE_ENTITY);
    assert_eq!(body["error"]["field"], "params.replicas");
    let message = body["error"]["message"].as_str().unwrap();
    assert_eq!(stderr(&cli).trim(), format!("error: {message}"));
    assert!(message.contains("whole number"), "{message}");

    for (params, field) in [
        (json!({}), "params.command"),
        (json!({"command": ["true"], "replicas": 5000}), "params.replicas"),
        (json!({"command": ["true"], "colour": "red"}), "params.colour"),
        (json!({"command": "true"}), "params.command"),
        (json!({"command": []}), "params.command"),
    ] {
        let (status, body) =
            env.post("/api/v1/templates/shell/jobs", &env.admin_token, &json!({"params": params})).await;
        assert_eq!(status, StatusCode::UNPROCESSABLE_ENTITY, "{params}: {body}");
        assert_eq!(body["error"]["field"], field, "{params}: {body}");
    }
    let (status, _) = env.post("/api/v1/templates/no-such/jobs", &env.admin_token, &json!({"params": {}})).await;
    assert_eq!(status, StatusCode::NOT_FOUND);
    assert_eq!(env.jobs_in_db().await, 0);
}

#[tokio::test(flavor = "multi_thread")]
async fn a_published_version_is_immutable_and_private_to_its_tenant() {
    let env = TestEnv::start().await;
    let token = &env.admin_token;
    let folder = env.dir.path().join("tiny-train");
    let init = std::process::Command::new(trainyard_tests::bin("yard"))
        .args(["templates", "init", "tiny-train"])
        .current_dir(env.dir.path())
        .output()
        .unwrap();
    assert!(init.status.success(), "{}", stderr(&init));
    let pushed = env.yard(token, &["templates", "push", folder.to_str().unwrap(), "-o", "json"]);
    assert!(pushed.status.success(), "{}", stderr(&pushed));
    let published: Value = serde_json::from_slice(&pushed.stdout).unwrap();
    let digest = published["digest"].as_str().unwrap().to_string();
    assert_eq!(published["files"], json!(["engine/main.py"]));

    let listed = env.yard(token, &["templates", "ls"]);
    assert!(stdout(&listed).contains("tiny-train") && stdout(&listed).contains("shell"), "{}", stdout(&listed));
    let shown = env.yard(token, &["templates", "show", "tiny-train@0.1.0"]);
    assert!(stdout(&shown).contains("Learning rate."), "parameters with help: {}", stdout(&shown));

    let ran = env.yard(token, &["run", "tiny-train", "--set", "epochs=2", "--wait", "-o", "json"]);
    assert!(ran.status.success(), "{} {}", stdout(&ran), stderr(&ran));
    let job: Value = serde_json::from_slice(&ran.stdout).unwrap();
    assert_eq!(job["spec"]["template"]["digest"], digest.as_str());
    let logs = env.yard(token, &["logs", job["id"].as_str().unwrap()]);
    assert!(stdout(&logs).contains("epoch 1 loss"), "the engine file was delivered and ran: {}", stdout(&logs));
    let metrics = env.yard(token, &["metrics", job["id"].as_str().unwrap(), "-o", "json"]);
    let metrics: Value = serde_json::from_slice(&metrics.stdout).unwrap();
    assert_eq!(metrics["series"][0]["steps"], json!([0, 1]), "the scaffold's engine reports its loss");

    // The same version again: harmless when identical, refused when the content differs.
    let again = env.yard(token, &["templates", "push", folder.to_str().unwrap()]);
    assert!(again.status.success(), "{}", stderr(&again));
    let engine = folder.join("engine/main.py");
    std::fs::write(&engine, std::fs::read_to_string(&engine).unwrap().replace("epoch {epoch}", "EPOCH {epoch}"))
        .unwrap();
    let changed = env.yard(token, &["templates", "push", folder.to_str().unwrap()]);
    assert!(!changed.status.success());
    assert!(stderr(&changed).contains("already published with other content"), "{}", stderr(&changed));
    let (_, job_now) = env.get(&format!("/api/v1/jobs/{}", job["id"].as_str().unwrap()), token).await;
    assert_eq!(job_now["spec"]["template"]["digest"], digest.as_str(), "the first job keeps the original digest");
    let (_, detail) = env.get("/api/v1/templates/tiny-train", token).await;
    assert_eq!(detail["digest"], digest.as_str());

    // Nobody rewrites history behind the API either.
    let err = sqlx::query("UPDATE templates SET manifest = 'x'").execute(&env.db.pool).await.unwrap_err();
    assert!(err.to_string().contains("immutable"), "{err}");

    // Built-in names are reserved.
    let shell_clone =
        std::fs::read_to_string(folder.join("template.yaml")).unwrap().replace("name: tiny-train", "name: shell");
    let files = json!({"engine/main.py": "cHJpbnQoKQ=="});
    let (status, body) = env.post("/api/v1/templates", token, &json!({"manifest": shell_clone, "files": files})).await;
    assert_eq!(status, StatusCode::CONFLICT, "{body}");
    assert!(body["error"]["message"].as_str().unwrap().contains("built-in"), "{body}");

    // Another tenant sees and runs none of it.
    env.post("/api/v1/admin/tenants", token, &json!({"name": "team-b"})).await;
    let bob = env.member("team-b", "bob", "member").await;
    let (_, list) = env.get("/api/v1/templates", &bob).await;
    let names: Vec<&str> = list.as_array().unwrap().iter().map(|t| t["name"].as_str().unwrap()).collect();
    assert!(names.contains(&"shell") && !names.contains(&"tiny-train"), "{names:?}");
    assert!(list.as_array().unwrap().iter().all(|t| t["source"] == "builtin"), "bob sees built-ins only: {list}");
    assert_eq!(env.get("/api/v1/templates/tiny-train", &bob).await.0, StatusCode::NOT_FOUND);
    let (status, _) = env.post("/api/v1/templates/tiny-train/jobs", &bob, &json!({"params": {}})).await;
    assert_eq!(status, StatusCode::NOT_FOUND);
}

#[tokio::test(flavor = "multi_thread")]
async fn a_broken_upload_names_the_file_and_the_field() {
    let env = TestEnv::start().await;
    let manifest = "name: bad\nversion: 1.0.0\ndescription: x\nparameters:\n  lr: {type: float, min: 2, max: 1}\ncommand: [python]\n";
    let (status, body) = env.post("/api/v1/templates", &env.admin_token, &json!({"manifest": manifest})).await;
    assert_eq!(status, StatusCode::UNPROCESSABLE_ENTITY);
    assert_eq!(body["error"]["field"], "parameters.lr.min");
    assert!(body["error"]["message"].as_str().unwrap().contains("template.yaml"), "{body}");
    let (status, body) = env
        .post("/api/v1/templates", &env.admin_token, &json!({"manifest": "name: x\nversion: 1.0.0\ndescription: x\ncommand: [a]\nfiles: [a.py]\n", "files": {"../a.py": "eA=="}}))
        .await;
    assert_eq!(status, StatusCode::UNPROCESSABLE_ENTITY, "{body}");
    assert!(body["error"]["message"].as_str().unwrap().contains("../a.py"), "{body}");
    let (_, list) = env.get("/api/v1/templates", &env.admin_token).await;
    assert!(list.as_array().unwrap().iter().all(|t| t["source"] == "builtin"), "nothing was published: {list}");
}

/// A job that posts 10,000 points in one request with its job token, leaves the token where the
/// test can read it, and waits for the test's go-ahead to end.
const REPORTER: &str = r#"
import json, os, sys, time, urllib.request
url, token, job = os.environ["TRAINYARD_URL"], os.environ["TRAINYARD_TOKEN"], os.environ["TRAINYARD_JOB_ID"]
points = [{"step": i, "name": "loss", "value": 1.0 / (i + 1)} for i in range(10000)]
request = urllib.request.Request(f"{url}/api/v1/jobs/{job}/metrics", data=json.dumps({"points": points}).encode(),
    headers={"Authorization": "Bearer " + token, "Content-Type": "application/json"})
print(urllib.request.urlopen(request).read().decode(), flush=True)
open(sys.argv[1] + ".tmp", "w").write(token)
os.rename(sys.argv[1] + ".tmp", sys.argv[1])
while not os.path.exists(sys.argv[2]):
    time.sleep(0.05)
"#;

#[tokio::test(flavor = "multi_thread")]
async fn a_job_token_posts_ten_thousand_points_and_nothing_else() {
    let env = TestEnv::start().await;
    let token_file = env.dir.path().join("job-token");
    let done = env.dir.path().join("done");
    let params = json!({"command": ["python3", "-c", REPORTER, token_file, done]});
    let (status, job) = env.post("/api/v1/templates/shell/jobs", &env.admin_token, &json!({"params": params})).await;
    assert_eq!(status, StatusCode::CREATED, "{job}");
    let id = job["id"].as_str().unwrap().to_string();
    let deadline = std::time::Instant::now() + Duration::from_secs(60);
    while !token_file.exists() {
        assert!(
            std::time::Instant::now() < deadline,
            "the job never reported: {:?}",
            env.get(&format!("/api/v1/jobs/{id}/logs"), &env.admin_token).await
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let job_token = std::fs::read_to_string(&token_file).unwrap();
    let (_, log) = env.get(&format!("/api/v1/jobs/{id}/logs"), &env.admin_token).await;
    assert_eq!(log, json!({"accepted": 10000}), "the engine was told all 10,000 points were taken");

    let summary = env.yard(&env.admin_token, &["metrics", &id]);
    assert!(summary.status.success(), "{}", stderr(&summary));
    assert!(stdout(&summary).contains("10000"), "{}", stdout(&summary));
    let points = env.yard(&env.admin_token, &["metrics", &id, "--name", "loss"]);
    assert_eq!(stdout(&points).lines().count(), 1 + 10_000);
    let (_, metrics) = env.get(&format!("/api/v1/jobs/{id}/metrics?name=loss"), &env.admin_token).await;
    assert_eq!(metrics["series"][0]["values"][9999], 1.0 / 10000.0);

    // The job token works for its own job's metrics and nowhere else.
    let one_point = json!({"points": [{"step": 10000, "name": "loss", "value": 0.0}]});
    assert_eq!(env.post(&format!("/api/v1/jobs/{id}/metrics"), &job_token, &one_point).await.0, StatusCode::OK);
    let other = env.submit(json!({"command": ["true"], "resources": {"gpus": 64}})).await;
    assert_eq!(
        env.post(&format!("/api/v1/jobs/{other}/metrics"), &job_token, &one_point).await.0,
        StatusCode::NOT_FOUND
    );
    for (method, path) in [
        (Method::GET, "/api/v1/me".to_string()),
        (Method::GET, "/api/v1/jobs".to_string()),
        (Method::GET, format!("/api/v1/jobs/{id}")),
        (Method::GET, format!("/api/v1/jobs/{id}/metrics")),
        (Method::GET, format!("/api/v1/jobs/{id}/logs")),
        (Method::POST, format!("/api/v1/jobs/{id}/cancel")),
        (Method::POST, "/api/v1/jobs".to_string()),
        (Method::GET, "/api/v1/templates".to_string()),
        (Method::POST, "/api/v1/tokens".to_string()),
        (Method::GET, "/api/v1/admin/tenants".to_string()),
    ] {
        let (status, body) = env.call(method.clone(), &path, Some(&job_token), Some(&json!({}))).await;
        assert_eq!(status, StatusCode::UNAUTHORIZED, "{method} {path}: {body}");
    }
    // A user token cannot post metrics.
    assert_eq!(
        env.post(&format!("/api/v1/jobs/{id}/metrics"), &env.admin_token, &one_point).await.0,
        StatusCode::UNAUTHORIZED
    );

    std::fs::write(&done, "").unwrap();
    env.wait_state(&id, "succeeded", Duration::from_secs(30)).await;
    let (status, _) = env.post(&format!("/api/v1/jobs/{id}/metrics"), &job_token, &one_point).await;
    assert_eq!(status, StatusCode::UNAUTHORIZED, "the token dies with the job");
    let stored: i64 = sqlx::query_scalar("SELECT count(*) FROM job_tokens").fetch_one(&env.db.pool).await.unwrap();
    assert_eq!(stored, 0);
}

/// pytorch-ddp's checkpoints outlive its pods and working folders by default: the run names the
/// tenant's `checkpoints` volume (a dry run creates nothing and shows where it would be); the
/// first real run makes it, charged to the storage quota, and a quota too small for it refuses
/// the run naming the parameter. On Kubernetes the same spec mounts the volume's claim into
/// every replica (docs/examples/pytorch-ddp.yaml, checked by crates/kube/tests/golden.rs).
#[tokio::test(flavor = "multi_thread")]
async fn pytorch_ddp_checkpoints_go_to_a_volume_made_at_the_first_run() {
    let env = TestEnv::start().await;
    let run = json!({"params": {"data": "/data/shards", "cpu": 0.5, "memory": "1Gi"}});
    let (status, dry) = env.post("/api/v1/templates/pytorch-ddp/jobs?dry_run=true", &env.admin_token, &run).await;
    assert_eq!(status, StatusCode::OK, "{dry}");
    let volumes = dry["spec"]["volumes"].as_array().unwrap();
    assert_eq!(volumes.len(), 1, "{dry}");
    assert_eq!(volumes[0]["name"], "checkpoints");
    let path = volumes[0]["path"].as_str().unwrap().to_string();
    let args: Vec<&str> = dry["spec"]["args"].as_array().unwrap().iter().map(|a| a.as_str().unwrap()).collect();
    assert!(args.contains(&format!("--checkpoint-volume={path}").as_str()), "{args:?}");
    let (_, listed) = env.get("/api/v1/volumes", &env.admin_token).await;
    assert_eq!(listed, json!([]), "a dry run creates nothing");

    // A storage quota too small for the 20Gi volume: refused, naming the parameter and the way out.
    let policy = json!({"storage_quota_bytes": 10u64 << 30});
    let (status, body) =
        env.call(Method::PUT, "/api/v1/admin/tenants/default/storage", Some(&env.admin_token), Some(&policy)).await;
    assert!(status.is_success(), "{body}");
    let (status, body) = env.post("/api/v1/templates/pytorch-ddp/jobs", &env.admin_token, &run).await;
    assert_eq!(status, StatusCode::UNPROCESSABLE_ENTITY, "{body}");
    assert_eq!(body["error"]["field"], "params.checkpoint_volume", "{body}");
    assert!(body["error"]["message"].as_str().unwrap().contains("yard volumes create checkpoints"), "{body}");
    assert_eq!(env.jobs_in_db().await, 0);

    // With room, a run refused for anything else makes no volume either: one whose job-level
    // fields fail the checks a direct submit passes (refused before the submit), and one whose
    // idempotency key was used for another request (refused by the submit itself: the volume
    // made goes again).
    let policy = json!({"storage_quota_bytes": 100u64 << 30});
    env.call(Method::PUT, "/api/v1/admin/tenants/default/storage", Some(&env.admin_token), Some(&policy)).await;
    let refused = json!({"params": {"data": "/data/shards", "cpu": 0.5, "memory": "1Gi"}, "max_restarts": 1000});
    let (status, body) = env.post("/api/v1/templates/pytorch-ddp/jobs", &env.admin_token, &refused).await;
    assert_eq!(status, StatusCode::UNPROCESSABLE_ENTITY, "{body}");
    assert_eq!(body["error"]["field"], "max_restarts", "{body}");
    let keyed = |volume: &str| {
        json!({"params": {"data": "/data/shards", "cpu": 0.5, "memory": "1Gi", "checkpoint_volume": volume},
               "idempotency_key": "first-run"})
    };
    let (status, body) = env.post("/api/v1/templates/pytorch-ddp/jobs", &env.admin_token, &keyed("")).await;
    assert_eq!(status, StatusCode::CREATED, "{body}");
    let (status, body) = env.post("/api/v1/templates/pytorch-ddp/jobs", &env.admin_token, &keyed("checkpoints")).await;
    assert_eq!(status, StatusCode::CONFLICT, "the key names another request: {body}");
    let (_, listed) = env.get("/api/v1/volumes", &env.admin_token).await;
    assert_eq!(listed, json!([]), "a refused run leaves no volume");

    // The run makes it; an empty value opts out (the working folder).
    let (status, body) = env.post("/api/v1/templates/pytorch-ddp/jobs", &env.admin_token, &run).await;
    assert_eq!(status, StatusCode::CREATED, "{body}");
    let (_, listed) = env.get("/api/v1/volumes", &env.admin_token).await;
    assert_eq!(listed[0]["name"], "checkpoints", "{listed}");
    assert_eq!(listed[0]["size_bytes"], 20u64 << 30);
    let opt_out = json!({"params": {"data": "/data/shards", "checkpoint_volume": ""}});
    let (status, dry) = env.post("/api/v1/templates/pytorch-ddp/jobs?dry_run=true", &env.admin_token, &opt_out).await;
    assert_eq!(status, StatusCode::OK, "{dry}");
    assert!(dry["spec"]["volumes"].as_array().is_none_or(|v| v.is_empty()), "{dry}");
}

/// pytorch-ddp runs the Python the run names (`python`): one that is not there fails the job at
/// once, with its restarts unused and the reason naming it.
#[tokio::test(flavor = "multi_thread")]
async fn pytorch_ddp_runs_the_python_it_is_given_and_a_missing_one_fails_at_once() {
    let env = TestEnv::start().await;
    let run = json!({"params": {"data": "/data/shards", "cpu": 0.5, "memory": "1Gi", "python": "/no/such/venv/bin/python",
                                "checkpoint_volume": ""},
                     "max_restarts": 3});
    let (status, job) = env.post("/api/v1/templates/pytorch-ddp/jobs", &env.admin_token, &run).await;
    assert_eq!(status, StatusCode::CREATED, "{job}");
    assert_eq!(job["spec"]["command"][0], "/no/such/venv/bin/python", "{job}");
    let id = job["id"].as_str().unwrap();
    let job = env.wait_job(id, Duration::from_secs(30), |j| j["finished_at"].is_string()).await;
    assert_eq!(job["state"], "failed", "{job}");
    assert_eq!(job["restart_count"], 0, "{job}");
    let reason = job["reason"].as_str().unwrap();
    assert!(reason.contains("/no/such/venv/bin/python") && reason.contains("not restarted"), "{reason}");
}
