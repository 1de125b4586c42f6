//! Experiments: hyperparameter searches whose trials are jobs of pytorch-ddp, trained for real
//! on CPU. Successive halving pauses trials at their rung with a checkpoint and resumes the best
//! from it; bad searches are refused naming every field; another tenant sees nothing.

use std::time::{Duration, Instant};

use serde_json::{Value, json};
use trainyard_tests::{StatusCode, TestEnv, stderr, stdout};

/// A search whose one trial fails at once (its data does not exist): for tests that need an
/// experiment to exist, not to train.
pub(crate) fn failing_search(name: &str) -> Value {
    json!({
        "name": name,
        "template": "pytorch-ddp",
        "params": {"data": "/no/such/shards", "cpu": 0.5, "memory": "1Gi"},
        "space": {"lr": {"type": "float", "min": 0.001, "max": 0.1, "log": true}},
        "searcher": {"method": "random", "metric": "loss", "max_length": 4, "max_trials": 1, "max_concurrent_trials": 1},
    })
}

/// The search the training tests run: pytorch-ddp's example on the packed toy images, one
/// replica on half a core, 4 trials over the learning rate, rungs at 8 and 16 steps.
fn asha_search(data: &str, metric: &str) -> Value {
    let python = std::env::var("TRAINYARD_TEST_PYTHON").expect("TRAINYARD_TEST_PYTHON: run through tests/run");
    json!({
        "name": "lr-search",
        "template": "pytorch-ddp",
        "params": {"data": data, "python": python, "cpu": 0.5, "memory": "1Gi", "batch_size": 32, "workers": "1",
                   "precision": "fp32", "epochs": 100, "warmup_steps": 2, "checkpoint_every": 1000,
                   "deterministic": true},
        "space": {"lr": {"type": "float", "min": 0.0003, "max": 0.3, "log": true}},
        "searcher": {"method": "asha", "metric": metric, "goal": "minimize", "max_length": 16, "max_trials": 4,
                     "divisor": 2, "max_rungs": 2, "max_concurrent_trials": 2, "seed": 11},
    })
}

async fn wait_over(env: &TestEnv, id: &str, timeout: Duration) -> Value {
    let deadline = Instant::now() + timeout;
    loop {
        let (status, detail) = env.get(&format!("/api/v1/experiments/{id}"), &env.admin_token).await;
        assert_eq!(status, StatusCode::OK, "{detail}");
        if ["completed", "failed", "cancelled"].contains(&detail["experiment"]["state"].as_str().unwrap()) {
            return detail;
        }
        assert!(Instant::now() < deadline, "the experiment did not end: {detail:#}");
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
}

fn log_of(env: &TestEnv, job: &str) -> String {
    let path = env.data_dir().join("jobs").join(job).join("attempt-1/replica-0.log");
    std::fs::read_to_string(path).unwrap_or_default()
}

/// The steps of a job's `loss` series, as stored.
async fn loss_steps(env: &TestEnv, job: &str) -> Vec<u64> {
    let (_, metrics) = env.get(&format!("/api/v1/jobs/{job}/metrics"), &env.admin_token).await;
    metrics["series"]
        .as_array()
        .unwrap()
        .iter()
        .find(|s| s["name"] == "loss")
        .map(|s| s["steps"].as_array().unwrap().iter().map(|v| v.as_u64().unwrap()).collect())
        .unwrap_or_default()
}

#[tokio::test(flavor = "multi_thread")]
async fn an_asha_search_pauses_trials_at_rungs_and_resumes_the_best_from_their_checkpoints() {
    let env = TestEnv::start().await;
    let (data, _) = crate::training::packed_dataset_by(&env).await;
    let search_file = env.dir.path().join("search.yaml");
    std::fs::write(&search_file, serde_yaml_ng::to_string(&asha_search(data.to_str().unwrap(), "loss")).unwrap())
        .unwrap();

    // Before it starts: the ladder (4 trials to step 8, typically the best 2 on to step 16, at
    // most 3 when later trials keep beating earlier ones).
    let preview = env.yard(&env.admin_token, &["experiment", "preview", "-f", search_file.to_str().unwrap()]);
    assert!(preview.status.success(), "{}", stderr(&preview));
    let text = stdout(&preview);
    assert!(text.contains("4 trials, 48 training steps typically, 56 at most"), "{text}");

    let created =
        env.yard(&env.admin_token, &["experiment", "create", "-f", search_file.to_str().unwrap(), "-o", "json"]);
    assert!(created.status.success(), "{}", stderr(&created));
    let id = serde_json::from_slice::<Value>(&created.stdout).unwrap()["id"].as_str().unwrap().to_string();
    let detail = wait_over(&env, &id, Duration::from_secs(420)).await;
    assert_eq!(detail["experiment"]["state"], "completed", "{detail:#}");

    let trials = detail["trials"].as_array().unwrap();
    assert_eq!(trials.len(), 4, "{detail:#}");
    let promoted: Vec<&Value> = trials.iter().filter(|t| t["runs"].as_array().unwrap().len() == 2).collect();
    // Asynchronous halving promotes a trial when it ranks in the best half of the results in so
    // far; once every trial reported, the best half of all of them have been promoted.
    assert!((2..=3).contains(&promoted.len()), "the best half, or one more, reach the top rung: {detail:#}");
    let rung0 = |t: &Value| t["runs"][0]["value"].as_f64().unwrap();
    let mut at_rung0: Vec<f64> = trials.iter().map(rung0).collect();
    at_rung0.sort_by(f64::total_cmp);
    for t in trials.iter().filter(|t| rung0(t) <= at_rung0[1]) {
        assert_eq!(t["runs"].as_array().unwrap().len(), 2, "the best 2 at rung 0 went on: {detail:#}");
    }
    for t in &promoted {
        assert_eq!(t["status"], "completed");
        // The promoted run resumed the trial's checkpoint: it went on from step 8, not from 0.
        let job = t["runs"][1]["job_id"].as_str().unwrap();
        assert!(log_of(&env, job).contains("resuming from step 8 "), "{}", log_of(&env, job));
        let steps = loss_steps(&env, job).await;
        assert!(steps.first().is_some_and(|s| *s > 8) && steps.last() == Some(&16), "{steps:?}");
    }
    for t in trials.iter().filter(|t| t["runs"].as_array().unwrap().len() == 1) {
        assert_eq!(t["status"], "paused", "a trial not promoted stays paused at its rung: {t}");
        let job = t["runs"][0]["job_id"].as_str().unwrap();
        assert_eq!(loss_steps(&env, job).await.last(), Some(&8), "it stopped at its rung's step");
    }
    // The best is the best value at the top rung.
    let best = &detail["experiment"]["best"];
    let top: Vec<f64> = promoted.iter().map(|t| t["runs"][1]["value"].as_f64().unwrap()).collect();
    assert_eq!(best["rung"], 1);
    assert_eq!(best["value"].as_f64().unwrap(), top.iter().copied().fold(f64::INFINITY, f64::min), "{detail:#}");
    // Trials are jobs of the tenant, named after the experiment, trial and rung.
    let (_, jobs) = env.get("/api/v1/jobs?limit=50", &env.admin_token).await;
    let names: Vec<&str> = jobs["items"].as_array().unwrap().iter().filter_map(|j| j["name"].as_str()).collect();
    let runs = names.iter().filter(|n| n.starts_with("lr-search-t")).count();
    assert_eq!(runs, 4 + promoted.len(), "a job per trial and rung: {names:?}");

    let shown = env.yard(&env.admin_token, &["experiment", "show", &id]);
    assert!(stdout(&shown).contains("best: trial"), "{}", stdout(&shown));
}

#[tokio::test(flavor = "multi_thread")]
async fn a_metric_the_engine_never_reports_fails_the_search_at_the_first_rung_saying_so() {
    let env = TestEnv::start().await;
    let (data, _) = crate::training::packed_dataset_by(&env).await;
    let mut search = asha_search(data.to_str().unwrap(), "accuracy");
    search["searcher"]["max_trials"] = json!(2);
    let (status, body) = env.post("/api/v1/experiments", &env.admin_token, &search).await;
    assert_eq!(status, StatusCode::CREATED, "{body}");
    let detail = wait_over(&env, body["id"].as_str().unwrap(), Duration::from_secs(240)).await;
    assert_eq!(detail["experiment"]["state"], "failed", "{detail:#}");
    let reason = detail["experiment"]["reason"].as_str().unwrap();
    assert!(
        reason.contains("no `accuracy`") && reason.contains("loss"),
        "names the metric and what was reported: {reason}"
    );
    // Nothing is left running.
    for trial in detail["trials"].as_array().unwrap() {
        for run in trial["runs"].as_array().unwrap() {
            if let Some(job) = run["job_id"].as_str() {
                let job = env.wait_job(job, Duration::from_secs(60), |j| !j["finished_at"].is_null()).await;
                assert!(["succeeded", "cancelled"].contains(&job["state"].as_str().unwrap()), "{job}");
            }
        }
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn a_bad_search_is_refused_naming_every_field_and_nothing_is_made() {
    let env = TestEnv::start().await;
    let search = json!({
        "name": "bad search",
        "template": "pytorch-ddp",
        "params": {"data": "/d", "max_steps": 10},
        "space": {
            "lrr": {"type": "float", "min": 0.1, "max": 1.0},
            "lr": {"type": "float", "min": 0.001, "max": 50.0},
            "precision": {"type": "categorical", "values": ["fp8"]},
        },
        "searcher": {"method": "asha", "metric": "loss", "max_length": 16, "max_trials": 0, "divisor": 1},
        "budget_gpu_hours": 0,
    });
    for path in ["/api/v1/experiments", "/api/v1/experiments/preview"] {
        let (status, body) = env.post(path, &env.admin_token, &search).await;
        assert_eq!(status, StatusCode::UNPROCESSABLE_ENTITY, "{body}");
        let fields: Vec<&str> =
            body["error"]["errors"].as_array().unwrap().iter().map(|e| e["field"].as_str().unwrap()).collect();
        for field in [
            "name",
            "budget_gpu_hours",
            "searcher.max_trials",
            "searcher.divisor",
            "space.lrr",
            "space.lr.max",
            "space.precision.values",
            "params.max_steps",
        ] {
            assert!(fields.contains(&field), "{field} missing from {body}");
        }
    }
    let (status, body) = env
        .post("/api/v1/experiments", &env.admin_token, &json!({"name": "x", "template": "no-such", "searcher": {"metric": "loss", "max_length": 4, "max_trials": 1}}))
        .await;
    assert_eq!(status, StatusCode::UNPROCESSABLE_ENTITY, "{body}");
    assert!(body.to_string().contains("no template no-such"), "{body}");
    let (_, list) = env.get("/api/v1/experiments", &env.admin_token).await;
    assert_eq!(list, json!([]), "nothing half-made");
    // The CLI prints each problem on its own line.
    let file = env.dir.path().join("bad.yaml");
    std::fs::write(&file, serde_yaml_ng::to_string(&search).unwrap()).unwrap();
    let out = env.yard(&env.admin_token, &["experiment", "create", "-f", file.to_str().unwrap()]);
    assert!(!out.status.success());
    assert!(stderr(&out).contains("space.lr.max") && stderr(&out).contains("searcher.divisor"), "{}", stderr(&out));
}

#[tokio::test(flavor = "multi_thread")]
async fn another_tenant_cannot_see_steer_or_cancel_an_experiment() {
    let env = TestEnv::start().await;
    let (status, body) = env.post("/api/v1/experiments", &env.admin_token, &failing_search("mine")).await;
    assert_eq!(status, StatusCode::CREATED, "{body}");
    let id = body["id"].as_str().unwrap();
    let (status, _) = env.post("/api/v1/admin/tenants", &env.admin_token, &json!({"name": "team-b"})).await;
    assert_eq!(status, StatusCode::CREATED);
    let other = env.member("team-b", "bob", "admin").await;
    let (_, list) = env.get("/api/v1/experiments", &other).await;
    assert_eq!(list, json!([]));
    let (status, _) = env.get(&format!("/api/v1/experiments/{id}"), &other).await;
    assert_eq!(status, StatusCode::NOT_FOUND);
    for verb in ["pause", "resume", "cancel"] {
        let (status, _) = env.post(&format!("/api/v1/experiments/{id}/{verb}"), &other, &json!({})).await;
        assert_eq!(status, StatusCode::NOT_FOUND, "{verb}");
    }
    // Its one trial fails (no such data): the search fails and says why.
    let detail = wait_over(&env, id, Duration::from_secs(120)).await;
    assert_eq!(detail["experiment"]["state"], "failed", "{detail:#}");
    assert_eq!(detail["experiment"]["reason"], "every trial failed");
    assert_eq!(detail["trials"][0]["status"], "failed");
    let (status, body) = env.post(&format!("/api/v1/experiments/{id}/cancel"), &env.admin_token, &json!({})).await;
    assert_eq!(status, StatusCode::CONFLICT, "an ended experiment: {body}");
}
