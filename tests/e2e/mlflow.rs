//! MLflow's tracking API (issue 42): the real `mlflow` client from PyPI (mlflow-skinny, pinned in
//! tests/python-requirements.txt), unmodified, logs into the real server with a user's API token
//! and reads back what it logged; another tenant's token sees none of it. Then MLflow's rules,
//! each with MLflow's error code: params write once, a batch over the limits, an unknown run.

use serde_json::{Value, json};
use trainyard_tests::{StatusCode, TestEnv};

/// Runs `script` with the test's Python and the MLflow client pointed at the server with
/// `token`; returns the JSON the script prints last.
fn mlflow_python(env: &TestEnv, token: &str, script: &str) -> Value {
    let python = std::env::var("TRAINYARD_TEST_PYTHON").expect(
        "TRAINYARD_TEST_PYTHON: a Python with mlflow-skinny (tests/python-requirements.txt; tests/run sets it)",
    );
    let output = std::process::Command::new(python)
        .args(["-c", script])
        .env("MLFLOW_TRACKING_URI", &env.server.url)
        .env("MLFLOW_TRACKING_TOKEN", token)
        // No retries: an error answer shows at once, not after MLflow's backoff.
        .env("MLFLOW_HTTP_REQUEST_MAX_RETRIES", "0")
        .env_remove("MLFLOW_EXPERIMENT_NAME")
        .env_remove("MLFLOW_EXPERIMENT_ID")
        .env_remove("MLFLOW_RUN_ID")
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&output.stdout);
    assert!(
        output.status.success(),
        "the mlflow script failed:\n{stdout}\n{}",
        String::from_utf8_lossy(&output.stderr)
    );
    serde_json::from_str(stdout.lines().last().unwrap_or_default()).unwrap_or_else(|err| panic!("{err}: {stdout}"))
}

const LOG_A_RUN: &str = r#"
import json, mlflow
from mlflow import MlflowClient
from mlflow.entities import Metric, Param, RunTag

mlflow.set_experiment("mnist")
with mlflow.start_run(run_name="laptop") as run:
    mlflow.log_param("lr", "0.1")
    for step in range(1000):
        mlflow.log_metric("loss", 1.0 / (step + 1), step=step)
    MlflowClient().log_batch(
        run.info.run_id,
        metrics=[Metric("accuracy", 0.5 + i / 100, 1700000000000 + i, i) for i in range(10)],
        params=[Param("batch_size", "64"), Param("optimizer", "adam")],
        tags=[RunTag("dataset", "mnist@1")],
    )
    mlflow.set_tag("team", "vision")
    mlflow.set_tag("team", "vision-2")  # tags overwrite
run_id = run.info.run_id
# A second run in the Default experiment, id 0, which every tenant has: another tenant's search of
# its own experiment 0 must not find it.
with mlflow.start_run(experiment_id="0") as default_run:
    mlflow.log_param("where", "default")
runs = mlflow.search_runs(experiment_names=["mnist"], output_format="list")
everywhere = mlflow.search_runs(search_all_experiments=True, output_format="list")
matching = mlflow.search_runs(
    experiment_names=["mnist"], filter_string="params.lr = '0.1' and tags.team = 'vision-2'", output_format="list")
not_matching = mlflow.search_runs(experiment_names=["mnist"], filter_string="params.lr = '0.2'", output_format="list")
client = MlflowClient()
history = client.get_metric_history(run_id, "loss")
got = client.get_run(run_id)
print(json.dumps({
    "run_id": run_id,
    "default_run_id": default_run.info.run_id,
    "runs": [r.info.run_id for r in runs],
    "everywhere": sorted(r.info.run_id for r in everywhere),
    "experiments": sorted(e.name for e in MlflowClient().search_experiments()),
    "matching": [r.info.run_id for r in matching],
    "not_matching": len(not_matching),
    "status": got.info.status,
    "name": got.info.run_name,
    "ended": got.info.end_time is not None,
    "params": got.data.params,
    "tags": {k: v for k, v in got.data.tags.items() if not k.startswith("mlflow.")},
    "latest": got.data.metrics,
    "history": [[m.step, m.value] for m in history],
}))
"#;

#[tokio::test(flavor = "multi_thread")]
async fn the_mlflow_client_logs_a_run_and_reads_it_back_and_another_tenant_sees_nothing() {
    let env = TestEnv::start().await;
    let member = env.member("default", "mia", "member").await;
    let (status, body) = env.post("/api/v1/admin/tenants", &env.admin_token, &json!({"name": "team-b"})).await;
    assert_eq!(status, StatusCode::CREATED, "{body}");
    let other = env.member("team-b", "bob", "admin").await;

    let logged = tokio::task::block_in_place(|| mlflow_python(&env, &member, LOG_A_RUN));
    let run_id = logged["run_id"].as_str().unwrap().to_string();
    assert_eq!(logged["runs"], json!([run_id]), "search_runs finds the run: {logged}");
    let default_run = logged["default_run_id"].as_str().unwrap().to_string();
    let mut both = vec![run_id.clone(), default_run.clone()];
    both.sort();
    assert_eq!(logged["everywhere"], json!(both), "both runs, in both experiments");
    assert_eq!(logged["experiments"], json!(["Default", "mnist"]));
    assert_eq!(logged["matching"], json!([run_id]), "the filter on a param and a tag matches it");
    assert_eq!(logged["not_matching"], 0, "another value of the param matches nothing");
    assert_eq!(logged["status"], "FINISHED", "end_run finished it");
    assert_eq!(logged["ended"], true);
    assert_eq!(logged["name"], "laptop");
    assert_eq!(logged["params"], json!({"lr": "0.1", "batch_size": "64", "optimizer": "adam"}));
    assert_eq!(logged["tags"], json!({"team": "vision-2", "dataset": "mnist@1"}));
    // The run's data holds each metric's latest point; the history every point, by step.
    assert_eq!(logged["latest"]["loss"], json!(1.0 / 1000.0));
    assert_eq!(logged["latest"]["accuracy"], json!(0.5 + 9.0 / 100.0));
    let history = logged["history"].as_array().unwrap();
    assert_eq!(history.len(), 1000, "every one of the 1,000 steps");
    for (i, point) in history.iter().enumerate() {
        assert_eq!(point, &json!([i, 1.0 / (i as f64 + 1.0)]), "step {i}");
    }

    // Tenant B's admin: no run in any search, the run and the experiment are unknown.
    let script = format!(
        r#"
import json, mlflow
from mlflow import MlflowClient
from mlflow.exceptions import MlflowException
client = MlflowClient()
runs = mlflow.search_runs(search_all_experiments=True, output_format="list")
in_default = mlflow.search_runs(experiment_ids=["0"], output_format="list")
try:
    client.get_run("{run_id}")
    code = None
except MlflowException as e:
    code = e.error_code
try:
    client.log_param("{run_id}", "lr", "0.9")
    write = None
except MlflowException as e:
    write = e.error_code
print(json.dumps({{"runs": len(runs), "in_default": len(in_default), "get_run": code, "log_param": write,
                   "experiments": [e.name for e in client.search_experiments()],
                   "experiment": client.get_experiment_by_name("mnist") is not None}}))
"#
    );
    let seen = tokio::task::block_in_place(|| mlflow_python(&env, &other, &script));
    assert_eq!(
        seen,
        json!({"runs": 0, "in_default": 0, "get_run": "RESOURCE_DOES_NOT_EXIST", "log_param": "RESOURCE_DOES_NOT_EXIST",
               "experiments": ["Default"], "experiment": false}),
        "another tenant sees nothing and writes nothing"
    );
    let (status, body) = env.get(&format!("/api/2.0/mlflow/runs/get?run_id={run_id}"), &member).await;
    assert_eq!(status, StatusCode::OK, "{body}");
    assert_eq!(body["run"]["data"]["params"].as_array().unwrap().len(), 3, "tenant B's write did not land: {body}");
}

/// A run of tenant "default" made with `token` through the API; its id.
async fn run_new(env: &TestEnv, token: &str) -> String {
    let (status, body) = env.post("/api/2.0/mlflow/runs/create", token, &json!({"start_time": 1})).await;
    assert_eq!(status, StatusCode::OK, "{body}");
    body["run"]["info"]["run_id"].as_str().unwrap().to_string()
}

fn assert_mlflow_error(status: StatusCode, body: &Value, want_status: StatusCode, code: &str) {
    assert_eq!(status, want_status, "{body}");
    assert_eq!(body["error_code"], code, "{body}");
    assert!(body["message"].as_str().is_some_and(|m| !m.is_empty()), "MLflow's error shape: {body}");
}

#[tokio::test(flavor = "multi_thread")]
async fn mlflow_rules_answer_with_mlflows_error_codes() {
    let env = TestEnv::start().await;
    let member = env.member("default", "mia", "member").await;
    let run = run_new(&env, &member).await;

    // Params are written once: the same value again is fine, another value is refused.
    let param = |value: &str| json!({"run_id": run, "key": "lr", "value": value});
    let (status, body) = env.post("/api/2.0/mlflow/runs/log-parameter", &member, &param("0.1")).await;
    assert_eq!(status, StatusCode::OK, "{body}");
    let (status, body) = env.post("/api/2.0/mlflow/runs/log-parameter", &member, &param("0.1")).await;
    assert_eq!(status, StatusCode::OK, "the same value again: {body}");
    let (status, body) = env.post("/api/2.0/mlflow/runs/log-parameter", &member, &param("0.2")).await;
    assert_mlflow_error(status, &body, StatusCode::BAD_REQUEST, "INVALID_PARAMETER_VALUE");
    assert!(body["message"].as_str().unwrap().contains("lr"), "names the param: {body}");
    // In a batch too, and the batch's other writes do not land (all or nothing).
    let batch = json!({"run_id": run, "params": [{"key": "lr", "value": "0.3"}],
                       "metrics": [{"key": "loss", "value": 1.0, "timestamp": 1, "step": 0}]});
    let (status, body) = env.post("/api/2.0/mlflow/runs/log-batch", &member, &batch).await;
    assert_mlflow_error(status, &body, StatusCode::BAD_REQUEST, "INVALID_PARAMETER_VALUE");

    // A batch over MLflow's limits: 1,000 metrics, 100 params, 100 tags.
    let metric = json!({"key": "loss", "value": 1.0, "timestamp": 1, "step": 0});
    let kv = |i: usize| json!({"key": format!("k{i}"), "value": "v"});
    for (field, items) in [
        ("metrics", vec![metric.clone(); 1001]),
        ("params", (0..101).map(kv).collect()),
        ("tags", (0..101).map(kv).collect()),
    ] {
        let (status, body) =
            env.post("/api/2.0/mlflow/runs/log-batch", &member, &json!({"run_id": run, field: items})).await;
        assert_mlflow_error(status, &body, StatusCode::BAD_REQUEST, "INVALID_PARAMETER_VALUE");
        assert!(body["message"].as_str().unwrap().contains(field), "{field}: {body}");
    }
    // At the limit it is taken.
    let (status, body) = env
        .post("/api/2.0/mlflow/runs/log-batch", &member, &json!({"run_id": run, "metrics": vec![metric; 1000]}))
        .await;
    assert_eq!(status, StatusCode::OK, "{body}");
    let (_, body) =
        env.get(&format!("/api/2.0/mlflow/metrics/get-history?run_id={run}&metric_key=loss"), &member).await;
    assert_eq!(body["metrics"].as_array().unwrap().len(), 1000, "only the batch at the limit landed");
    let (_, body) = env.get(&format!("/api/2.0/mlflow/runs/get?run_id={run}"), &member).await;
    assert_eq!(body["run"]["data"]["params"], json!([{"key": "lr", "value": "0.1"}]), "{body}");

    // An unknown run, a malformed id: MLflow's 404.
    let unknown = uuid::Uuid::from_u128(42).simple().to_string();
    for id in [unknown.as_str(), "not-a-run"] {
        let (status, body) = env.get(&format!("/api/2.0/mlflow/runs/get?run_id={id}"), &member).await;
        assert_mlflow_error(status, &body, StatusCode::NOT_FOUND, "RESOURCE_DOES_NOT_EXIST");
        let log = json!({"run_id": id, "key": "loss", "value": 1.0, "timestamp": 1});
        let (status, body) = env.post("/api/2.0/mlflow/runs/log-metric", &member, &log).await;
        assert_mlflow_error(status, &body, StatusCode::NOT_FOUND, "RESOURCE_DOES_NOT_EXIST");
    }
    let (status, body) = env.get("/api/2.0/mlflow/experiments/get?experiment_id=987654", &member).await;
    assert_mlflow_error(status, &body, StatusCode::NOT_FOUND, "RESOURCE_DOES_NOT_EXIST");

    // An experiment name is taken once per tenant.
    let (status, body) = env.post("/api/2.0/mlflow/experiments/create", &member, &json!({"name": "e"})).await;
    assert_eq!(status, StatusCode::OK, "{body}");
    let (status, body) = env.post("/api/2.0/mlflow/experiments/create", &member, &json!({"name": "e"})).await;
    assert_mlflow_error(status, &body, StatusCode::BAD_REQUEST, "RESOURCE_ALREADY_EXISTS");

    // Bad input is MLflow's 400, never a 500: a filter outside the subset, a bad status, a bad key.
    let search = json!({"experiment_ids": ["0"], "filter": "params.lr IN ('0.1')"});
    let (status, body) = env.post("/api/2.0/mlflow/runs/search", &member, &search).await;
    assert_mlflow_error(status, &body, StatusCode::BAD_REQUEST, "INVALID_PARAMETER_VALUE");
    let (status, body) =
        env.post("/api/2.0/mlflow/runs/update", &member, &json!({"run_id": run, "status": "DONE"})).await;
    assert_mlflow_error(status, &body, StatusCode::BAD_REQUEST, "INVALID_PARAMETER_VALUE");
    let (status, body) =
        env.post("/api/2.0/mlflow/runs/set-tag", &member, &json!({"run_id": run, "key": "a;b", "value": "x"})).await;
    assert_mlflow_error(status, &body, StatusCode::BAD_REQUEST, "INVALID_PARAMETER_VALUE");
    let (status, body) = env
        .call(
            reqwest::Method::POST,
            "/api/2.0/mlflow/runs/log-metric",
            Some(&member),
            Some(&json!({"run_id": run, "key": "x", "value": "abc", "timestamp": 1})),
        )
        .await;
    assert_mlflow_error(status, &body, StatusCode::BAD_REQUEST, "INVALID_PARAMETER_VALUE");

    // Text Postgres cannot store (NUL), in a body and in a query: MLflow's 400, not Trainyard's 422.
    let (status, body) = env
        .post("/api/2.0/mlflow/runs/set-tag", &member, &json!({"run_id": run, "key": "k", "value": "a\u{0}b"}))
        .await;
    assert_mlflow_error(status, &body, StatusCode::BAD_REQUEST, "INVALID_PARAMETER_VALUE");
    let (status, body) = env.get("/api/2.0/mlflow/experiments/get-by-name?experiment_name=a%00b", &member).await;
    assert_mlflow_error(status, &body, StatusCode::BAD_REQUEST, "INVALID_PARAMETER_VALUE");

    // NaN and infinities, which JSON lacks, in protobuf's spelling both ways.
    for value in ["NaN", "Infinity", "-Infinity"] {
        let log = json!({"run_id": run, "key": format!("odd{}", value.len()), "value": value, "timestamp": 1});
        let (status, body) = env.post("/api/2.0/mlflow/runs/log-metric", &member, &log).await;
        assert_eq!(status, StatusCode::OK, "{value}: {body}");
        let key = format!("odd{}", value.len());
        let (_, body) =
            env.get(&format!("/api/2.0/mlflow/metrics/get-history?run_id={run}&metric_key={key}"), &member).await;
        assert_eq!(body["metrics"][0]["value"], value, "{body}");
    }

    // Credentials, in MLflow's shape too: none is 401, a viewer may not write.
    let (status, body) =
        env.call(reqwest::Method::GET, &format!("/api/2.0/mlflow/runs/get?run_id={run}"), None, None).await;
    assert_mlflow_error(status, &body, StatusCode::UNAUTHORIZED, "UNAUTHENTICATED");
    let viewer = env.member("default", "vera", "viewer").await;
    let (status, body) = env.post("/api/2.0/mlflow/runs/log-parameter", &viewer, &param("0.1")).await;
    assert_mlflow_error(status, &body, StatusCode::FORBIDDEN, "PERMISSION_DENIED");
    let (status, _) = env.get(&format!("/api/2.0/mlflow/runs/get?run_id={run}"), &viewer).await;
    assert_eq!(status, StatusCode::OK, "a viewer reads");
    let (status, body) = env.post("/api/2.0/mlflow/runs/create", &viewer, &json!({})).await;
    assert_mlflow_error(status, &body, StatusCode::FORBIDDEN, "PERMISSION_DENIED");

    // Making experiments and runs is audited, refusals too (what is logged to a run is not).
    let (status, page) = env.get("/api/v1/audit?action=mlflow.&limit=100", &env.admin_token).await;
    assert_eq!(status, StatusCode::OK, "{page}");
    let entries: Vec<(String, String, String)> = page["items"]
        .as_array()
        .unwrap()
        .iter()
        .map(|e| {
            (
                e["action"].as_str().unwrap().into(),
                e["actor"].as_str().unwrap().into(),
                e["outcome"].as_str().unwrap().into(),
            )
        })
        .collect();
    for want in [
        ("mlflow.run.create", "user:mia", "ok"),
        ("mlflow.experiment.create", "user:mia", "ok"),
        ("mlflow.experiment.create", "user:mia", "conflict"),
        ("mlflow.run.create", "user:vera", "denied"),
    ] {
        let want = (want.0.to_string(), want.1.to_string(), want.2.to_string());
        assert!(entries.contains(&want), "{want:?} in {entries:?}");
    }
    assert_eq!(entries.len(), 4, "one entry per attempt to make something, none for logging: {entries:?}");
}

/// An unmodified MLflow script as a job runs it: no tracking URI, run id or token of its own
/// (the replica's `MLFLOW_*` variables say where), `$LR` its learning rate. It also tries what
/// its job token may not do and writes the error codes to `$OUT`.
const JOB_SCRIPT: &str = r#"
import json, os, mlflow
from mlflow import MlflowClient
from mlflow.entities import Metric, Param, RunTag
from mlflow.exceptions import MlflowException

lr = os.environ["LR"]
with mlflow.start_run() as run:
    mlflow.log_param("lr", lr)
    for step in range(1000):
        mlflow.log_metric("loss", float(lr) / (step + 1), step=step)
    MlflowClient().log_batch(
        run.info.run_id,
        metrics=[Metric("accuracy", 0.5 + i / 100, 1700000000000 + i, i) for i in range(10)],
        params=[Param("batch_size", "64")],
        tags=[RunTag("dataset", "mnist@1")],
    )
    mlflow.set_tag("team", "vision")
    model = os.path.join(os.environ["HOME"], "model.txt")
    with open(model, "w") as f:
        f.write("weights for lr " + lr)
    mlflow.log_artifact(model, artifact_path="checkpoints")
refused = {}
for name, call in [
    ("create_run", lambda: MlflowClient().create_run("0")),
    ("search_runs", lambda: mlflow.search_runs(experiment_ids=["0"])),
    ("other_run", lambda: MlflowClient().get_run(os.environ["OTHER_RUN"])),
]:
    try:
        call()
        refused[name] = None
    except MlflowException as e:
        refused[name] = e.error_code
with open(os.environ["OUT"], "w") as out:
    json.dump({"run_id": run.info.run_id, "refused": refused}, out)
"#;

/// An engine's own reporting: three `loss` points posted with the job token to Trainyard's
/// metrics API, as the pytorch-ddp engine reports.
const ENGINE_REPORTER: &str = r#"
import json, os, urllib.request
url, token, job = os.environ["TRAINYARD_URL"], os.environ["TRAINYARD_TOKEN"], os.environ["TRAINYARD_JOB_ID"]
points = [{"step": i, "name": "loss", "value": 1.0 / (i + 1)} for i in range(3)]
request = urllib.request.Request(f"{url}/api/v1/jobs/{job}/metrics", data=json.dumps({"points": points}).encode(),
    headers={"Authorization": "Bearer " + token, "Content-Type": "application/json"})
urllib.request.urlopen(request).read()
"#;

#[tokio::test(flavor = "multi_thread")]
async fn a_jobs_mlflow_script_logs_into_the_jobs_own_record_and_yard_diff_shows_its_params() {
    let env = TestEnv::start().await;
    let member = env.member("default", "mia", "member").await;
    let other_run = run_new(&env, &member).await;
    let mut jobs = Vec::new();
    for lr in ["0.1", "0.01"] {
        let out = env.dir.path().join(format!("job-{lr}.json"));
        let body = json!({"name": "mlflow-train", "command": ["python3", "-c", JOB_SCRIPT],
                          "env": {"LR": lr, "OUT": out.display().to_string(), "OTHER_RUN": other_run}});
        let (status, job) = env.post("/api/v1/jobs", &member, &body).await;
        assert_eq!(status, StatusCode::CREATED, "{job}");
        jobs.push((job["id"].as_str().unwrap().to_string(), out));
    }
    for (id, out) in &jobs {
        let job = env.wait_job_as(&member, id, std::time::Duration::from_secs(180), |j| {
            ["succeeded", "failed", "cancelled"].contains(&j["state"].as_str().unwrap_or_default())
        });
        let job = job.await;
        let (_, logs) = env.get(&format!("/api/v1/jobs/{id}/logs"), &member).await;
        assert_eq!(job["state"], "succeeded", "{job}\n{logs}");
        let seen: Value = serde_json::from_str(&std::fs::read_to_string(out).unwrap()).unwrap();
        let simple = uuid::Uuid::parse_str(id).unwrap().simple().to_string();
        assert_eq!(seen["run_id"], simple.as_str(), "start_run() took the job's run (MLFLOW_RUN_ID)");
        assert_eq!(
            seen["refused"],
            json!({"create_run": "PERMISSION_DENIED", "search_runs": "PERMISSION_DENIED",
                   "other_run": "RESOURCE_DOES_NOT_EXIST"}),
            "the job token reaches its own run only"
        );
    }
    let (a, b) = (&jobs[0].0, &jobs[1].0);

    // The job's own metrics: what its charts, `yard diff` and the compare page read.
    let (status, metrics) = env.get(&format!("/api/v1/jobs/{a}/metrics"), &member).await;
    assert_eq!(status, StatusCode::OK, "{metrics}");
    let series = |name: &str| {
        metrics["series"].as_array().unwrap().iter().find(|s| s["name"] == name).cloned().unwrap_or_else(|| {
            panic!("no {name} series in the job's metrics: {metrics}");
        })
    };
    let loss = series("loss");
    assert_eq!(loss["steps"].as_array().unwrap().len(), 1000, "every step logged through MLflow");
    assert_eq!(loss["values"][999], json!(0.1 / 1000.0));
    assert_eq!(series("accuracy")["values"].as_array().unwrap().len(), 10);

    // From outside, with the member's API token: the job's run as MLflow shows it.
    let simple = uuid::Uuid::parse_str(a).unwrap().simple().to_string();
    let script = format!(
        r#"
import json, mlflow
from mlflow import MlflowClient
client = MlflowClient()
run = client.get_run("{simple}")
history = client.get_metric_history("{simple}", "loss")
found = mlflow.search_runs(experiment_ids=["0"], filter_string="params.lr = '0.1'", output_format="list")
import tempfile
downloaded = mlflow.artifacts.download_artifacts(
    run_id="{simple}", artifact_path="checkpoints/model.txt", dst_path=tempfile.mkdtemp())
whole = mlflow.artifacts.download_artifacts(run_id="{simple}", dst_path=tempfile.mkdtemp())
print(json.dumps({{"artifact": open(downloaded).read(),
                   "whole": open(whole + "/checkpoints/model.txt").read(),
                   "root": [(f.path, f.is_dir) for f in client.list_artifacts("{simple}")],
                   "folder": [(f.path, f.file_size) for f in client.list_artifacts("{simple}", "checkpoints")],
                   "status": run.info.status, "name": run.info.run_name, "params": run.data.params,
                   "tags": {{k: v for k, v in run.data.tags.items() if not k.startswith("mlflow.")}},
                   "latest_accuracy": run.data.metrics.get("accuracy"),
                   "history": [[m.step, m.value] for m in history], "found": [r.info.run_id for r in found]}}))
"#
    );
    let outside = tokio::task::block_in_place(|| mlflow_python(&env, &member, &script));
    assert_eq!(outside["status"], "FINISHED");
    assert_eq!(outside["name"], "mlflow-train", "the run is named after its job");
    assert_eq!(outside["params"], json!({"lr": "0.1", "batch_size": "64"}));
    assert_eq!(outside["tags"], json!({"team": "vision", "dataset": "mnist@1"}));
    assert_eq!(outside["latest_accuracy"], json!(0.5 + 9.0 / 100.0));
    assert_eq!(outside["found"], json!([simple]), "the filter finds the job's run, not the other");
    assert_eq!(outside["artifact"], "weights for lr 0.1", "download_artifacts of the file");
    assert_eq!(outside["whole"], "weights for lr 0.1", "download_artifacts of the run's whole root");
    assert_eq!(outside["root"], json!([["checkpoints", true]]));
    assert_eq!(outside["folder"], json!([["checkpoints/model.txt", 18]]));
    let history = outside["history"].as_array().unwrap();
    assert_eq!(history.len(), 1000);
    for (i, point) in history.iter().enumerate() {
        assert_eq!(point, &json!([i, 0.1 / (i as f64 + 1.0)]), "step {i}");
    }

    // The job's page: the logged params beside the (absent) template parameters, the artefact
    // among its downloads.
    let web = trainyard_tests::web::WebClient::signed_in(&env.server.url, &member).await;
    let (status, page) = web.get(&format!("/jobs/{a}")).await;
    assert_eq!(status, StatusCode::OK);
    let logged = page.split("id=\"logged-params\"").nth(1).unwrap_or_else(|| panic!("no logged params: {page}"));
    let logged = logged.split("</table>").next().unwrap();
    assert!(logged.contains("<td>lr</td><td><code>0.1</code>") && logged.contains("batch_size"), "{logged}");
    assert!(page.contains("checkpoints/model.txt"), "the artefact is offered for download");
    // Its charts: the page draws what metrics.json serves, the points logged through MLflow.
    assert!(page.contains(&format!("data-metrics=\"/jobs/{a}/metrics.json\"")), "the job page has its charts");
    let (status, charted) = web.get(&format!("/jobs/{a}/metrics.json")).await;
    assert_eq!(status, StatusCode::OK);
    let charted: Value = serde_json::from_str(&charted).unwrap();
    let names: Vec<&str> = charted["series"].as_array().unwrap().iter().filter_map(|s| s["name"].as_str()).collect();
    assert_eq!(names, ["accuracy", "loss"], "{charted}");

    // The artefact is the job's: the job page's downloads list it.
    let (status, artifacts) = env.get(&format!("/api/v1/jobs/{a}/artifacts"), &member).await;
    assert_eq!(status, StatusCode::OK, "{artifacts}");
    let paths: Vec<&str> = artifacts.as_array().unwrap().iter().filter_map(|x| x["path"].as_str()).collect();
    assert_eq!(paths, ["checkpoints/model.txt"], "{artifacts}");

    // Another tenant's token: no run, no artefact, nothing listed.
    let (status, body) = env.post("/api/v1/admin/tenants", &env.admin_token, &json!({"name": "team-b"})).await;
    assert_eq!(status, StatusCode::CREATED, "{body}");
    let other = env.member("team-b", "bob", "admin").await;
    let script = format!(
        r#"
import json, tempfile, mlflow
from mlflow.exceptions import MlflowException
try:
    mlflow.artifacts.download_artifacts(run_id="{simple}", dst_path=tempfile.mkdtemp())
    code = None
except MlflowException as e:
    code = e.error_code
print(json.dumps({{"download": code}}))
"#
    );
    let seen = tokio::task::block_in_place(|| mlflow_python(&env, &other, &script));
    assert_eq!(seen, json!({"download": "RESOURCE_DOES_NOT_EXIST"}));
    for path in [
        format!("/api/2.0/mlflow-artifacts/artifacts/{simple}/checkpoints/model.txt"),
        format!("/api/2.0/mlflow-artifacts/artifacts?path={simple}/checkpoints"),
        format!("/api/2.0/mlflow/artifacts/list?run_id={simple}"),
    ] {
        let (status, body) = env.get(&path, &other).await;
        assert_eq!(
            (status, body["error_code"].clone()),
            (StatusCode::NOT_FOUND, json!("RESOURCE_DOES_NOT_EXIST")),
            "{path}: {body}"
        );
    }

    // Beside a run whose engine reports through Trainyard's own metrics API (as the pytorch-ddp
    // engine does): one store, so the compare page charts both runs' loss on one chart.
    let engine = env.submit(json!({"name": "engine-train", "command": ["python3", "-c", ENGINE_REPORTER]})).await;
    env.wait_state(&engine, "succeeded", std::time::Duration::from_secs(60)).await;
    let (_, side_by_side) = env.get(&format!("/api/v1/compare?jobs={a},{engine}"), &env.admin_token).await;
    assert_eq!(side_by_side["metrics"], json!(["accuracy", "loss"]), "{side_by_side}");
    let points = side_by_side["sections"]
        .as_array()
        .unwrap()
        .iter()
        .flat_map(|s| s["fields"].as_array().unwrap().iter())
        .find(|f| f["field"] == "metrics.loss.points")
        .cloned();
    assert_eq!(points.map(|f| f["values"].clone()), Some(json!([1000, 3])), "{side_by_side}");
    // The compare page: one loss chart with both runs' lines.
    let (status, page) = web.get(&format!("/compare?jobs={a},{engine}&metric=loss")).await;
    assert_eq!(status, StatusCode::OK);
    let chart = trainyard_tests::web::compare_chart_of(&page).unwrap_or_else(|| panic!("no chart: {page}"));
    assert!(trainyard_tests::web::chart_points_of(&chart, a) > 0, "the MLflow-logged loss: {chart}");
    assert!(trainyard_tests::web::chart_points_of(&chart, &engine) > 0, "the engine's loss: {chart}");

    // `yard diff`: the logged params that differ, in a section of their own (the jobs have no
    // template parameters), and the loss they led to.
    let (status, comparison) = env.get(&format!("/api/v1/compare?jobs={a},{b}"), &member).await;
    assert_eq!(status, StatusCode::OK, "{comparison}");
    let section = comparison["sections"].as_array().unwrap().iter().find(|s| s["name"] == "logged params").cloned();
    let fields = section.map(|s| s["fields"].clone()).unwrap_or_default();
    assert_eq!(
        fields,
        json!([{"field": "logged_params.lr", "values": ["0.1", "0.01"], "differs": true}]),
        "{comparison}"
    );
    let diff = env.yard(&member, &["diff", a, b]);
    let text = String::from_utf8_lossy(&diff.stdout);
    assert!(diff.status.success(), "{text}{}", String::from_utf8_lossy(&diff.stderr));
    let line = text.lines().find(|l| l.contains("logged_params.lr")).unwrap_or_else(|| panic!("{text}"));
    assert!(line.contains("0.1") && line.contains("0.01"), "{text}");
    assert!(!text.contains("logged_params.batch_size"), "the same in both: not shown\n{text}");
}

const SEARCH_DELETE_RESTORE: &str = r#"
import json, mlflow
from mlflow import MlflowClient
from mlflow.entities import ViewType
from mlflow.exceptions import MlflowException

client = MlflowClient()
experiment = client.create_experiment("sweep")
ids = {}
for name, loss, lr in [("a", 0.9, "0.1"), ("b", 0.3, "0.01"), ("c", 0.1, "0.001")]:
    with mlflow.start_run(experiment_id=experiment, run_name=name) as run:
        mlflow.log_metric("loss", 2.0, step=0)
        mlflow.log_metric("loss", loss, step=1)  # the latest point is what filters and order see
        mlflow.log_param("lr", lr)
        mlflow.set_tag("keep", "yes")
    ids[run.info.run_id] = name
def names(**kwargs):
    return [ids[r.info.run_id] for r in mlflow.search_runs(experiment_ids=[experiment], output_format="list", **kwargs)]
def code(call):
    try:
        call()
    except MlflowException as e:
        return e.error_code
out = {
    "below": names(filter_string="metrics.loss < 0.5", order_by=["metrics.loss ASC"]),
    "ordered": names(order_by=["metrics.loss DESC"]),
    "by_name": names(order_by=["attributes.run_name ASC"]),
    "combined": names(filter_string="metrics.loss >= 0.3 and params.lr = '0.01' and attributes.status = 'FINISHED'"),
    "unsupported_filter": code(lambda: names(filter_string="params.lr = '0.1' OR params.lr = '0.01'")),
    "unsupported_order": code(lambda: names(order_by=["attributes.user_id ASC"])),
}
b = next(i for i, n in ids.items() if n == "b")
client.delete_tag(b, "keep")
out["tag_after_delete"] = client.get_run(b).data.tags.get("keep")
out["delete_tag_again"] = code(lambda: client.delete_tag(b, "keep"))
client.delete_run(b)
out["deleted_stage"] = client.get_run(b).info.lifecycle_stage
out["active"] = names()
out["deleted_only"] = names(run_view_type=ViewType.DELETED_ONLY)
out["all"] = sorted(names(run_view_type=ViewType.ALL))
out["log_to_deleted"] = code(lambda: client.log_metric(b, "loss", 0.2, step=2))
client.restore_run(b)
client.log_metric(b, "loss", 0.2, step=2)
out["restored"] = names(filter_string="metrics.loss < 0.25", order_by=["metrics.loss ASC"])
out["unknown_run"] = code(lambda: client.delete_run("0" * 32))
print(json.dumps(out))
"#;

#[tokio::test(flavor = "multi_thread")]
async fn the_mlflow_client_searches_by_metric_orders_deletes_and_restores_runs() {
    let env = TestEnv::start().await;
    let member = env.member("default", "mia", "member").await;
    let out = tokio::task::block_in_place(|| mlflow_python(&env, &member, SEARCH_DELETE_RESTORE));
    assert_eq!(out["below"], json!(["c", "b"]), "latest loss under 0.5, lowest first: {out}");
    assert_eq!(out["ordered"], json!(["a", "b", "c"]));
    assert_eq!(out["by_name"], json!(["a", "b", "c"]));
    assert_eq!(out["combined"], json!(["b"]));
    assert_eq!(out["unsupported_filter"], "INVALID_PARAMETER_VALUE", "never silently ignored");
    assert_eq!(out["unsupported_order"], "INVALID_PARAMETER_VALUE");
    assert_eq!(out["tag_after_delete"], Value::Null, "delete_tag removed it");
    assert_eq!(out["delete_tag_again"], "RESOURCE_DOES_NOT_EXIST");
    assert_eq!(out["deleted_stage"], "deleted");
    assert_eq!(out["active"].as_array().unwrap().len(), 2, "a deleted run is out of searches: {out}");
    assert!(!out["active"].as_array().unwrap().contains(&json!("b")));
    assert_eq!(out["deleted_only"], json!(["b"]));
    assert_eq!(out["all"], json!(["a", "b", "c"]));
    assert_eq!(out["log_to_deleted"], "INVALID_PARAMETER_VALUE", "a deleted run takes no logging");
    assert_eq!(out["restored"], json!(["c", "b"]), "restored, it logs and is found again: {out}");
    assert_eq!(out["unknown_run"], "RESOURCE_DOES_NOT_EXIST");
}

/// One unmodified MLflow script that every rank of a job runs: each logs a param, 100 steps of
/// `loss` (rank * 1000 + step, so that a point says which rank wrote it), a tag and an artefact,
/// and writes what it saw to `$OUT.<rank>`. Rank 1 also tries its token with a forged proof.
const EVERY_RANK_SCRIPT: &str = r#"
import json, os, urllib.error, urllib.request, mlflow
rank = int(os.environ["RANK"])
with mlflow.start_run() as run:
    mlflow.log_param("rank", str(rank))
    for step in range(100):
        mlflow.log_metric("loss", rank * 1000 + step, step=step)
    mlflow.set_tag("writer", str(rank))
    path = os.path.join(os.environ["HOME"], "rank.txt")
    with open(path, "w") as f:
        f.write("written by rank %d" % rank)
    mlflow.log_artifact(path)
token = os.environ["MLFLOW_TRACKING_TOKEN"]
forged = None
if rank == 1:
    bad = token.rsplit(".", 1)[0] + "." + "0" * 64
    request = urllib.request.Request(
        os.environ["MLFLOW_TRACKING_URI"] + "/api/2.0/mlflow/runs/get?run_id=" + run.info.run_id,
        headers={"Authorization": "Bearer " + bad})
    try:
        urllib.request.urlopen(request)
    except urllib.error.HTTPError as e:
        forged = [e.code, json.loads(e.read())["error_code"]]
with open("%s.%d" % (os.environ["OUT"], rank), "w") as out:
    json.dump({"run_id": run.info.run_id, "job_token": token == os.environ["TRAINYARD_TOKEN"], "forged": forged}, out)
"#;

#[tokio::test(flavor = "multi_thread")]
async fn every_rank_of_a_job_logs_with_mlflow_unmodified_and_its_run_keeps_rank_0s_writes_once() {
    let env = TestEnv::start().await;
    let member = env.member("default", "mia", "member").await;
    let out = env.dir.path().join("rank");
    let body = json!({"name": "ddp-mlflow", "command": ["python3", "-c", EVERY_RANK_SCRIPT], "replicas": 2,
                      "resources": {"cpu": 0.5, "memory": "1Gi"}, "env": {"OUT": out.display().to_string()}});
    let (status, job) = env.post("/api/v1/jobs", &member, &body).await;
    assert_eq!(status, StatusCode::CREATED, "{job}");
    let id = job["id"].as_str().unwrap().to_string();
    let job = env.wait_job_as(&member, &id, std::time::Duration::from_secs(180), |j| {
        ["succeeded", "failed", "cancelled"].contains(&j["state"].as_str().unwrap_or_default())
    });
    let job = job.await;
    let (_, logs) = env.get(&format!("/api/v1/jobs/{id}/logs"), &member).await;
    assert_eq!(job["state"], "succeeded", "both ranks' MLflow calls succeeded: {job}\n{logs}");
    let simple = uuid::Uuid::parse_str(&id).unwrap().simple().to_string();
    let seen = |rank: u32| -> Value {
        let text = std::fs::read_to_string(format!("{}.{rank}", out.display())).unwrap();
        serde_json::from_str(&text).unwrap()
    };
    let (rank0, rank1) = (seen(0), seen(1));
    assert_eq!((&rank0["run_id"], &rank1["run_id"]), (&json!(simple), &json!(simple)), "both in the job's run");
    assert_eq!(rank0["job_token"], true, "rank 0 logs with the job token");
    assert_eq!(rank1["job_token"], false, "rank 1 has a token of its own");
    assert_eq!(rank1["forged"], json!([401, "UNAUTHENTICATED"]), "a replica token with another proof is refused");

    // The job's metrics: each of the 100 steps once, with rank 0's values.
    let (status, metrics) = env.get(&format!("/api/v1/jobs/{id}/metrics"), &member).await;
    assert_eq!(status, StatusCode::OK, "{metrics}");
    let loss = metrics["series"].as_array().unwrap().iter().find(|s| s["name"] == "loss").cloned().unwrap();
    let steps: Vec<i64> = loss["steps"].as_array().unwrap().iter().map(|s| s.as_i64().unwrap()).collect();
    assert_eq!(steps, (0..100).collect::<Vec<_>>(), "each step once: {loss}");
    let values: Vec<f64> = loss["values"].as_array().unwrap().iter().map(|v| v.as_f64().unwrap()).collect();
    assert_eq!(values, (0..100).map(f64::from).collect::<Vec<_>>(), "rank 0's values");

    // From outside: rank 0's param, tag and artefact; the run finished once.
    let script = format!(
        r#"
import json, tempfile, mlflow
from mlflow import MlflowClient
client = MlflowClient()
run = client.get_run("{simple}")
got = mlflow.artifacts.download_artifacts(run_id="{simple}", artifact_path="rank.txt", dst_path=tempfile.mkdtemp())
print(json.dumps({{"params": run.data.params, "writer": run.data.tags.get("writer"), "status": run.info.status,
                   "history": len(client.get_metric_history("{simple}", "loss")),
                   "artifacts": [f.path for f in client.list_artifacts("{simple}")], "artifact": open(got).read()}}))
"#
    );
    let outside = tokio::task::block_in_place(|| mlflow_python(&env, &member, &script));
    assert_eq!(
        outside,
        json!({"params": {"rank": "0"}, "writer": "0", "status": "FINISHED", "history": 100,
               "artifacts": ["rank.txt"], "artifact": "written by rank 0"})
    );
}

#[tokio::test(flavor = "multi_thread")]
async fn a_jobs_mlflow_run_ends_with_its_job_when_its_script_never_ends_it() {
    let env = TestEnv::start().await;
    let member = env.member("default", "mia", "member").await;
    let mut jobs = Vec::new();
    for (name, command) in [
        ("no-mlflow", json!(["python3", "-c", "print('training without MLflow')"])),
        ("crashes", json!(["python3", "-c", "import sys; sys.exit(3)"])),
        ("sleeps", json!(["sleep", "300"])),
    ] {
        let (status, job) = env.post("/api/v1/jobs", &member, &json!({"name": name, "command": command})).await;
        assert_eq!(status, StatusCode::CREATED, "{job}");
        jobs.push(job["id"].as_str().unwrap().to_string());
    }
    let simple = |id: &str| uuid::Uuid::parse_str(id).unwrap().simple().to_string();
    let status_of = |id: String| {
        let script = format!(
            r#"
import json
from mlflow import MlflowClient
info = MlflowClient().get_run("{id}").info
print(json.dumps([info.status, info.end_time is not None and info.end_time >= info.start_time]))
"#
        );
        move |env: &TestEnv, token: &str| tokio::task::block_in_place(|| mlflow_python(env, token, &script))
    };
    let sleeping = &jobs[2];
    env.wait_job_as(&member, sleeping, std::time::Duration::from_secs(60), |j| j["state"] == "running").await;
    assert_eq!(status_of(simple(sleeping))(&env, &member), json!(["RUNNING", false]), "while its job runs");
    let (status, body) = env.post(&format!("/api/v1/jobs/{sleeping}/cancel"), &member, &json!({})).await;
    assert!(status.is_success(), "{body}");
    for (id, state, mlflow_status) in
        [(&jobs[0], "succeeded", "FINISHED"), (&jobs[1], "failed", "FAILED"), (&jobs[2], "cancelled", "KILLED")]
    {
        let job = env.wait_job_as(&member, id, std::time::Duration::from_secs(60), |j| {
            ["succeeded", "failed", "cancelled"].contains(&j["state"].as_str().unwrap_or_default())
        });
        assert_eq!(job.await["state"], state);
        assert_eq!(status_of(simple(id))(&env, &member), json!([mlflow_status, true]), "job {state}");
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn a_laptops_run_keeps_its_artefacts_in_its_tenant_within_the_artefact_size_limit() {
    let env = TestEnv::start_with(&["--max-artifact-size", "1Ki"]).await;
    let member = env.member("default", "mia", "member").await;
    let script = r#"
import json, os, tempfile, mlflow
from mlflow import MlflowClient
folder = tempfile.mkdtemp()
small, big = os.path.join(folder, "notes.txt"), os.path.join(folder, "big.bin")
with open(small, "w") as f:
    f.write("a laptop's notes")
with open(big, "wb") as f:
    f.write(b"x" * 2048)
with mlflow.start_run(run_name="laptop") as run:
    mlflow.log_artifact(small)
    mlflow.log_artifact(small, artifact_path="plots")
    try:
        mlflow.log_artifact(big)
        too_big = None
    except Exception as e:
        too_big = type(e).__name__
client = MlflowClient()
run_id = run.info.run_id
got = mlflow.artifacts.download_artifacts(run_id=run_id, artifact_path="plots/notes.txt", dst_path=tempfile.mkdtemp())
whole = mlflow.artifacts.download_artifacts(run_id=run_id, dst_path=tempfile.mkdtemp())
print(json.dumps({"run_id": run_id, "too_big": too_big,
                  "root": sorted((f.path, f.is_dir) for f in client.list_artifacts(run_id)),
                  "folder": [(f.path, f.file_size) for f in client.list_artifacts(run_id, "plots")],
                  "file": open(got).read(), "whole": sorted(os.listdir(whole)),
                  "uri": client.get_run(run_id).info.artifact_uri}))
"#;
    let out = tokio::task::block_in_place(|| mlflow_python(&env, &member, script));
    let run_id = out["run_id"].as_str().unwrap().to_string();
    assert_eq!(out["uri"], format!("mlflow-artifacts:/{run_id}"));
    assert!(out["too_big"].is_string(), "an artefact over --max-artifact-size is refused: {out}");
    assert_eq!(out["root"], json!([["notes.txt", false], ["plots", true]]), "the big one is not kept: {out}");
    assert_eq!(out["folder"], json!([["plots/notes.txt", 16]]));
    assert_eq!(out["file"], "a laptop's notes");
    assert_eq!(out["whole"], json!(["notes.txt", "plots"]));

    // Another tenant's token: the run and its artefacts are none of its business.
    let (status, body) = env.post("/api/v1/admin/tenants", &env.admin_token, &json!({"name": "team-b"})).await;
    assert_eq!(status, StatusCode::CREATED, "{body}");
    let other = env.member("team-b", "bob", "admin").await;
    for path in [
        format!("/api/2.0/mlflow-artifacts/artifacts/{run_id}/plots/notes.txt"),
        format!("/api/2.0/mlflow-artifacts/artifacts?path={run_id}/plots"),
        format!("/api/2.0/mlflow/artifacts/list?run_id={run_id}"),
    ] {
        let (status, body) = env.get(&path, &other).await;
        assert_eq!(
            (status, body["error_code"].clone()),
            (StatusCode::NOT_FOUND, json!("RESOURCE_DOES_NOT_EXIST")),
            "{path}: {body}"
        );
    }
    let put = reqwest::Client::new()
        .put(format!("{}/api/2.0/mlflow-artifacts/artifacts/{run_id}/planted.txt", env.server.url))
        .bearer_auth(&other)
        .body("planted")
        .send()
        .await
        .unwrap();
    assert_eq!(put.status(), StatusCode::NOT_FOUND, "another tenant writes nothing there");
    let (_, listed) = env.get(&format!("/api/2.0/mlflow/artifacts/list?run_id={run_id}"), &member).await;
    let paths: Vec<&str> = listed["files"].as_array().unwrap().iter().filter_map(|f| f["path"].as_str()).collect();
    assert_eq!(paths, ["notes.txt", "plots"], "{listed}");
}

const PROTOCOL_CORNERS: &str = r#"
import json, mlflow
from mlflow import MlflowClient
from mlflow.entities import ViewType
from mlflow.exceptions import MlflowException

client = MlflowClient()
def code(call):
    try:
        call()
    except MlflowException as e:
        return e.error_code
out = {}
exp = client.create_experiment("corners", tags={"team": "vision"})
client.set_experiment_tag(exp, "stage", "dev")
client.set_experiment_tag(exp, "team", "nlp")  # tags overwrite
out["tags"] = client.get_experiment(exp).tags
client.rename_experiment(exp, "corners-2")
out["renamed"] = client.get_experiment_by_name("corners-2").experiment_id == exp
out["old_name"] = client.get_experiment_by_name("corners")
client.create_experiment("taken", tags={"team": "vision"})
out["rename_taken"] = code(lambda: client.rename_experiment(exp, "taken"))
def experiments(**kwargs):
    return [e.name for e in client.search_experiments(**kwargs)]
out["exp_like"] = experiments(filter_string="name LIKE 'corn%'")
out["exp_tag"] = experiments(filter_string="tags.team = 'vision'")
out["exp_tag_ne"] = experiments(filter_string="tags.team != 'vision'")
out["exp_order"] = experiments(order_by=["name DESC"])
out["exp_bad_filter"] = code(lambda: experiments(filter_string="creation_time > 0"))
ids = {}
for name, lr, opt, team, status, loss in [("run-a", "0.1", "adam", "vision", "FINISHED", 0.5),
                                          ("run-b", "0.01", "adagrad", "Vision-2", "FAILED", 0.3),
                                          ("other-c", "0.001", "sgd", "nlp", "FINISHED", 0.9)]:
    run_id = client.create_run(exp, run_name=name, tags={"team": team}).info.run_id
    client.log_param(run_id, "lr", lr)
    client.log_param(run_id, "opt", opt)
    client.log_metric(run_id, "loss", loss, step=0)
    client.set_terminated(run_id, status)
    ids[run_id] = name
by_name = {n: i for i, n in ids.items()}
def names(filter_string="", order_by=None, **kwargs):
    runs = mlflow.search_runs(experiment_ids=[exp], filter_string=filter_string, order_by=order_by,
                              output_format="list", **kwargs)
    return [ids[r.info.run_id] for r in runs]
out["ne"] = sorted(names("params.lr != '0.1'"))
out["name_ne"] = sorted(names("attributes.run_name != 'run-a'"))
out["like"] = sorted(names("params.opt LIKE 'ad%'"))
out["like_case"] = sorted(names("tags.team LIKE 'vis%'"))
out["ilike"] = sorted(names("tags.team ILIKE 'VIS%'"))
out["name_like"] = sorted(names("attributes.run_name LIKE 'run-_'"))
out["ids_in"] = sorted(names("attributes.run_id IN ('%s', '%s')" % (by_name["run-a"], by_name["other-c"])))
out["status_in"] = names("attributes.status IN ('FAILED', 'KILLED')")
out["status_not_in"] = names("attributes.status NOT IN ('FINISHED')")
out["combined"] = names("params.opt LIKE 'ad%' and metrics.loss < 0.4 and attributes.status = 'FAILED'")
user = client.get_run(by_name["run-a"]).info.user_id
out["by_user"] = len(names("attributes.user_id = '%s'" % user))
out["not_by_user"] = names("attributes.user_id != '%s'" % user)
out["started"] = len(names("attributes.start_time > 0"))
out["ended_later"] = len(names("attributes.end_time > 4102444800000"))
out["by_param"] = names(order_by=["params.opt ASC"])
out["two_keys"] = names(order_by=["attributes.status ASC", "metrics.loss DESC"])
out["by_tag_desc"] = names(order_by=["tags.team DESC"])
out["in_on_params"] = code(lambda: names("params.lr IN ('0.1')"))
out["like_on_metric"] = code(lambda: names("metrics.loss LIKE '0.%'"))
# get-history pages, as the client's store asks for them.
a = by_name["run-a"]
for step in range(1, 25):
    client.log_metric(a, "loss", 1.0 / step, step=step)
store = client._tracking_client.store
pages, token = [], None
while True:
    page = store.get_metric_history(a, "loss", max_results=10, page_token=token)
    pages.append([m.step for m in page])
    token = page.token
    if not token:
        break
out["pages"] = pages
out["whole"] = [m.step for m in client.get_metric_history(a, "loss")]
out["bad_page"] = code(lambda: store.get_metric_history(a, "loss", max_results=10, page_token="nope"))
# Deleting the experiment deletes its runs; restoring it restores them.
out["delete_default"] = code(lambda: client.delete_experiment("0"))
client.delete_experiment(exp)
out["deleted_stage"] = client.get_experiment(exp).lifecycle_stage
out["active_experiments"] = sorted(e.name for e in client.search_experiments())
out["deleted_experiments"] = [e.name for e in client.search_experiments(view_type=ViewType.DELETED_ONLY)]
out["runs_when_deleted"] = names()
out["deleted_runs"] = len(names(run_view_type=ViewType.DELETED_ONLY))
out["run_in_deleted"] = code(lambda: client.create_run(exp))
out["tag_deleted"] = code(lambda: client.set_experiment_tag(exp, "x", "y"))
client.restore_experiment(exp)
out["runs_restored"] = sorted(names())
client.delete_experiment_tag(exp, "stage")
out["tags_after_delete"] = client.get_experiment(exp).tags
out["unknown_experiment"] = code(lambda: client.delete_experiment("424242"))
out["bad_tag_key"] = code(lambda: client.set_experiment_tag(exp, "bad;key", "v"))
print(json.dumps(out))
"#;

#[tokio::test(flavor = "multi_thread")]
async fn the_mlflow_client_manages_experiments_pages_histories_and_searches_with_mlflows_operators() {
    let env = TestEnv::start().await;
    let member = env.member("default", "mia", "member").await;
    let out = tokio::task::block_in_place(|| mlflow_python(&env, &member, PROTOCOL_CORNERS));
    assert_eq!(out["tags"], json!({"team": "nlp", "stage": "dev"}), "{out}");
    assert_eq!(out["renamed"], true);
    assert_eq!(out["old_name"], Value::Null, "the old name finds nothing");
    assert_eq!(out["rename_taken"], "RESOURCE_ALREADY_EXISTS");
    assert_eq!(out["exp_like"], json!(["corners-2"]));
    assert_eq!(out["exp_tag"], json!(["taken"]), "the renamed one's team is nlp now");
    assert_eq!(out["exp_tag_ne"], json!(["corners-2"]), "an experiment without the tag matches no !=");
    assert_eq!(out["exp_order"], json!(["taken", "corners-2", "Default"]));
    assert_eq!(out["exp_bad_filter"], "INVALID_PARAMETER_VALUE");
    assert_eq!(out["ne"], json!(["other-c", "run-b"]));
    assert_eq!(out["name_ne"], json!(["other-c", "run-b"]));
    assert_eq!(out["like"], json!(["run-a", "run-b"]));
    assert_eq!(out["like_case"], json!(["run-a"]), "LIKE minds case");
    assert_eq!(out["ilike"], json!(["run-a", "run-b"]));
    assert_eq!(out["name_like"], json!(["run-a", "run-b"]));
    assert_eq!(out["ids_in"], json!(["other-c", "run-a"]));
    assert_eq!(out["status_in"], json!(["run-b"]));
    assert_eq!(out["status_not_in"], json!(["run-b"]));
    assert_eq!(out["combined"], json!(["run-b"]));
    assert_eq!(out["by_user"], 3, "{out}");
    assert_eq!(out["not_by_user"], json!([]));
    assert_eq!(out["started"], 3, "every run started after 1970");
    assert_eq!(out["ended_later"], 0, "none ends after 2100");
    assert_eq!(out["by_param"], json!(["run-b", "run-a", "other-c"]), "adagrad, adam, sgd");
    assert_eq!(out["two_keys"], json!(["run-b", "other-c", "run-a"]), "FAILED first, then by loss, highest first");
    assert_eq!(out["by_tag_desc"], json!(["run-a", "other-c", "run-b"]), "vision, nlp, Vision-2 (byte order)");
    assert_eq!(out["in_on_params"], "INVALID_PARAMETER_VALUE");
    assert_eq!(out["like_on_metric"], "INVALID_PARAMETER_VALUE");
    assert_eq!(
        out["pages"],
        json!([(0..10).collect::<Vec<_>>(), (10..20).collect::<Vec<_>>(), (20..25).collect::<Vec<_>>()]),
        "pages of 10 by step"
    );
    assert_eq!(out["whole"], json!((0..25).collect::<Vec<_>>()), "without max_results: every point");
    assert_eq!(out["bad_page"], "INVALID_PARAMETER_VALUE");
    assert_eq!(out["delete_default"], "INVALID_PARAMETER_VALUE");
    assert_eq!(out["deleted_stage"], "deleted");
    assert_eq!(out["active_experiments"], json!(["Default", "taken"]));
    assert_eq!(out["deleted_experiments"], json!(["corners-2"]));
    assert_eq!(out["runs_when_deleted"], json!([]), "its runs went with it");
    assert_eq!(out["deleted_runs"], 3);
    assert_eq!(out["run_in_deleted"], "INVALID_PARAMETER_VALUE");
    assert_eq!(out["tag_deleted"], "INVALID_PARAMETER_VALUE");
    assert_eq!(out["runs_restored"], json!(["other-c", "run-a", "run-b"]));
    assert_eq!(out["tags_after_delete"], json!({"team": "nlp"}));
    assert_eq!(out["unknown_experiment"], "RESOURCE_DOES_NOT_EXIST");
    assert_eq!(out["bad_tag_key"], "INVALID_PARAMETER_VALUE");
}
