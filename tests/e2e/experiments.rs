//! Experiments: hyperparameter searches whose trials are jobs of pytorch-ddp, trained for real
//! on CPU. Successive halving pauses trials at their rung with a checkpoint and resumes the best
//! from it; bad searches are refused naming every field; another tenant sees nothing.

use std::time::{Duration, Instant};

use fantoccini::Locator;
use serde_json::{Value, json};
use trainyard_tests::web::{WebClient, browser_or_skip, csrf_of};
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

    // The dashboard's page: the trials table, the best trial, and the metric of every trial
    // over steps on one chart, at 1280 and 390 px.
    experiment_page_shows_trials_best_and_chart(&env, &id, best["trial"].as_u64().unwrap()).await;
}

async fn experiment_page_shows_trials_best_and_chart(env: &TestEnv, id: &str, best: u64) {
    let Some(browser) = browser_or_skip("the experiment page in Chromium").await else { return };
    let c = &browser.client;
    let base = &env.server.url;
    browser.sign_in(base, &env.admin_token, "admin").await;
    c.goto(&format!("{base}/experiments")).await.unwrap();
    c.find(Locator::LinkText("lr-search")).await.unwrap().click().await.unwrap();
    let deadline = Instant::now() + Duration::from_secs(10);
    while !c.current_url().await.unwrap().as_str().ends_with(&format!("/experiments/{id}")) {
        assert!(Instant::now() < deadline, "the list's link leads to the experiment's page");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    browser.wait_text("#experiment-state", Duration::from_secs(10), |t| t == "completed").await;
    browser.wait_text("#best-trial", Duration::from_secs(5), |t| t.contains(&format!("trial {best} at rung 1"))).await;
    c.wait()
        .at_most(Duration::from_secs(10))
        .for_element(Locator::Css("#experiment-chart[data-series='4'] canvas"))
        .await
        .unwrap();
    let measure = "const rows = document.querySelectorAll('#trials tbody tr');\n\
        const best = document.querySelector('#trials tr.best td');\n\
        const chart = document.getElementById('experiment-chart').getBoundingClientRect();\n\
        return { rows: rows.length, best: best ? best.textContent : null, chartRight: chart.right,\n\
                 page: document.documentElement.clientWidth, scroll: document.documentElement.scrollWidth };";
    for width in [1280, 390] {
        c.set_window_size(width, 900).await.unwrap();
        tokio::time::sleep(Duration::from_millis(500)).await;
        let page = c.execute(measure, vec![]).await.unwrap();
        assert_eq!(page["rows"], 4, "{page}");
        assert!(
            page["best"].as_str().is_some_and(|t| t.starts_with(&best.to_string())),
            "the best row is marked: {page}"
        );
        assert!(page["chartRight"].as_f64() <= page["page"].as_f64(), "at {width} px the chart fits: {page}");
        assert!(
            page["scroll"].as_f64() <= page["page"].as_f64(),
            "at {width} px the page does not scroll sideways: {page}"
        );
        browser.screenshot("experiment", width).await;
    }
    browser.close().await;
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

/// What a finished search decided, comparable across runs: each trial's parameters and runs
/// (rung, value), in trial order, and the best trial.
fn decisions(detail: &Value) -> Vec<(Value, Vec<(u64, i64)>)> {
    detail["trials"]
        .as_array()
        .unwrap()
        .iter()
        .map(|t| {
            let runs = t["runs"]
                .as_array()
                .unwrap()
                .iter()
                .map(|r| (r["rung"].as_u64().unwrap(), (r["value"].as_f64().unwrap_or(f64::NAN) * 1e6).round() as i64))
                .collect();
            (t["params"].clone(), runs)
        })
        .collect()
}

/// Kill -9 the server three times during a search (one trial at a time, so the order results
/// come in is fixed): it finishes with the same trials and decisions as an uninterrupted search
/// with the same seed, each run a single job, never two of the search's jobs at once.
#[tokio::test(flavor = "multi_thread")]
async fn a_search_killed_three_times_decides_as_one_never_killed() {
    let mut env = TestEnv::start().await;
    let (data, _) = crate::training::packed_dataset_by(&env).await;
    let mut search = asha_search(data.to_str().unwrap(), "loss");
    search["searcher"]["max_concurrent_trials"] = json!(1);
    search["name"] = json!("calm");
    let (status, body) = env.post("/api/v1/experiments", &env.admin_token, &search).await;
    assert_eq!(status, StatusCode::CREATED, "{body}");
    let calm = wait_over(&env, body["id"].as_str().unwrap(), Duration::from_secs(600)).await;
    assert_eq!(calm["experiment"]["state"], "completed", "{calm:#}");

    search["name"] = json!("killed");
    let (status, body) = env.post("/api/v1/experiments", &env.admin_token, &search).await;
    assert_eq!(status, StatusCode::CREATED, "{body}");
    let id = body["id"].as_str().unwrap().to_string();
    // Kill it when its first, third and fifth runs have their jobs.
    for runs in [1, 3, 5] {
        let deadline = Instant::now() + Duration::from_secs(300);
        loop {
            let (_, detail) = env.get(&format!("/api/v1/experiments/{id}"), &env.admin_token).await;
            let made = detail["trials"].as_array().map_or(0, |ts| {
                ts.iter().flat_map(|t| t["runs"].as_array().unwrap().iter()).filter(|r| !r["job_id"].is_null()).count()
            });
            if made >= runs {
                break;
            }
            assert!(Instant::now() < deadline, "run {runs} never got its job: {detail:#}");
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        env.restart_after_crash_on_the_same_address();
    }
    let killed = wait_over(&env, &id, Duration::from_secs(600)).await;
    assert_eq!(killed["experiment"]["state"], "completed", "{killed:#}");
    assert_eq!(decisions(&killed), decisions(&calm), "same trials, promotions and values:\n{killed:#}\n{calm:#}");
    assert_eq!(killed["experiment"]["best"]["trial"], calm["experiment"]["best"]["trial"]);

    // Each run is one job, and the search's jobs ran one after another.
    let (_, jobs) = env.get("/api/v1/jobs?limit=100", &env.admin_token).await;
    let mut ours: Vec<&Value> = jobs["items"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|j| j["name"].as_str().unwrap().starts_with("killed-t"))
        .collect();
    let runs: usize = killed["trials"].as_array().unwrap().iter().map(|t| t["runs"].as_array().unwrap().len()).sum();
    assert_eq!(ours.len(), runs, "one job per run");
    ours.sort_by_key(|j| j["started_at"].as_str().unwrap().to_string());
    for pair in ours.windows(2) {
        assert!(
            pair[0]["finished_at"].as_str().unwrap() <= pair[1]["started_at"].as_str().unwrap(),
            "two of the search's jobs ran at once: {} and {}",
            pair[0],
            pair[1]
        );
    }
}

/// Optuna, unmodified from PyPI, drives a `custom` experiment: it asks Trainyard for each trial
/// (its TPE sampler choosing the learning rate), Trainyard runs the trial as a job, and the study
/// is told every result; then it says it asks no more and the experiment completes.
#[tokio::test(flavor = "multi_thread")]
async fn optuna_drives_an_experiment_through_ask_and_tell_and_sees_every_result() {
    let env = TestEnv::start().await;
    let (data, _) = crate::training::packed_dataset_by(&env).await;
    let mut search = asha_search(data.to_str().unwrap(), "loss");
    search["name"] = json!("optuna");
    search["space"] = json!({});
    search["searcher"] = json!({"method": "custom", "metric": "loss", "max_length": 8, "max_trials": 3});
    let (status, body) = env.post("/api/v1/experiments", &env.admin_token, &search).await;
    assert_eq!(status, StatusCode::CREATED, "{body}");
    let id = body["id"].as_str().unwrap().to_string();

    let driver = env.dir.path().join("optuna_driver.py");
    std::fs::write(&driver, OPTUNA_DRIVER).unwrap();
    let python = std::env::var("TRAINYARD_TEST_PYTHON").expect("TRAINYARD_TEST_PYTHON: run through tests/run");
    let out = tokio::process::Command::new(&python)
        .arg(&driver)
        .env("TY_URL", &env.server.url)
        .env("TY_TOKEN", &env.admin_token)
        .env("TY_EXPERIMENT", &id)
        .output()
        .await
        .unwrap();
    assert!(out.status.success(), "{}\n{}", String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr));
    let study: Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(study["trials"], 3, "{study}");

    let detail = wait_over(&env, &id, Duration::from_secs(120)).await;
    assert_eq!(detail["experiment"]["state"], "completed", "{detail:#}");
    let trials = detail["trials"].as_array().unwrap();
    assert_eq!(trials.len(), 3);
    for t in trials {
        let n = t["trial"].to_string();
        let told = &study["told"][&n];
        assert_eq!(t["params"]["lr"], told["lr"], "the trial ran what Optuna asked: {t} {told}");
        assert_eq!(t["runs"][0]["value"], told["value"], "Optuna was told the trial's value: {t} {told}");
    }
    assert_eq!(detail["experiment"]["best"]["value"], study["best_value"], "{detail:#} {study}");
    // A finished search takes no more asks.
    let (status, body) =
        env.post(&format!("/api/v1/experiments/{id}/ask"), &env.admin_token, &json!({"params": {"lr": 0.01}})).await;
    assert_eq!(status, StatusCode::CONFLICT, "{body}");
}

/// The outside searcher: Optuna's own ask/tell interface around Trainyard's.
const OPTUNA_DRIVER: &str = r#"
import json, os, time, urllib.request
import optuna

URL, TOKEN, EXPERIMENT = os.environ["TY_URL"], os.environ["TY_TOKEN"], os.environ["TY_EXPERIMENT"]

def call(method, path, body=None):
    request = urllib.request.Request(URL + path, method=method,
                                     data=None if body is None else json.dumps(body).encode(),
                                     headers={"Authorization": "Bearer " + TOKEN, "Content-Type": "application/json"})
    with urllib.request.urlopen(request, timeout=30) as response:
        return json.loads(response.read() or b"null")

optuna.logging.set_verbosity(optuna.logging.WARNING)
study = optuna.create_study(direction="minimize", sampler=optuna.samplers.TPESampler(seed=3))
told = {}
for _ in range(3):
    trial = study.ask()
    lr = trial.suggest_float("lr", 1e-3, 0.3, log=True)
    asked = call("POST", f"/api/v1/experiments/{EXPERIMENT}/ask", {"params": {"lr": lr}})
    deadline = time.monotonic() + 120
    while True:
        ours = call("GET", f"/api/v1/experiments/{EXPERIMENT}")["trials"][asked["trial"]]
        if ours["status"] in ("completed", "failed"):
            break
        assert time.monotonic() < deadline, ours
        time.sleep(0.5)
    value = ours["runs"][0]["value"]
    if value is None:
        study.tell(trial, state=optuna.trial.TrialState.FAIL)
    else:
        study.tell(trial, value)
    told[str(asked["trial"])] = {"lr": lr, "value": value}
call("POST", f"/api/v1/experiments/{EXPERIMENT}/tell", {"finished": True})
print(json.dumps({"trials": len(study.trials), "told": told, "best_value": study.best_value}))
"#;

/// The dashboard's form: a refused search comes back with every problem and the text as written;
/// a preview shows the ladder; a start goes to the new experiment's page. A viewer sees no form.
#[tokio::test(flavor = "multi_thread")]
async fn the_dashboard_form_previews_starts_and_refuses_a_search_keeping_what_was_written() {
    let env = TestEnv::start().await;
    let web = WebClient::signed_in(&env.server.url, &env.admin_token).await;
    let (_, page) = web.get("/experiments").await;
    assert!(page.contains("id=\"search-form\"") && page.contains("template: pytorch-ddp"), "the form with an example");
    let csrf = csrf_of(&page);

    let bad = "name: bad search\ntemplate: pytorch-ddp\nparams: {data: /d}\nspace:\n  lr: {type: float, min: 0.001, max: 50.0}\nsearcher: {metric: loss, max_length: 16, max_trials: 4, divisor: 1}\n";
    let (status, page) = web.post_form("/experiments", &[("csrf", &csrf), ("search", bad), ("action", "start")]).await;
    assert_eq!(status, StatusCode::OK);
    for problem in ["name:", "space.lr.max:", "searcher.divisor:"] {
        assert!(page.contains(problem), "{problem} is shown: {page}");
    }
    assert!(page.contains("max: 50.0}"), "the text as written is kept");

    let good = serde_yaml_ng::to_string(&failing_search("from-the-form")).unwrap();
    let (status, page) =
        web.post_form("/experiments", &[("csrf", &csrf), ("search", &good), ("action", "preview")]).await;
    assert_eq!(status, StatusCode::OK);
    assert!(page.contains("id=\"search-preview\"") && page.contains("1 trials, 4 training steps typically"), "{page}");
    let (_, list) = env.get("/api/v1/experiments", &env.admin_token).await;
    assert_eq!(list, json!([]), "a preview starts nothing");

    let (status, location) =
        web.post_form_location("/experiments", &[("csrf", &csrf), ("search", &good), ("action", "start")]).await;
    assert_eq!(status, StatusCode::SEE_OTHER);
    let (_, list) = env.get("/api/v1/experiments", &env.admin_token).await;
    assert_eq!(location.unwrap(), format!("/experiments/{}", list[0]["id"].as_str().unwrap()));

    let viewer = env.member("default", "vera", "viewer").await;
    let viewer = WebClient::signed_in(&env.server.url, &viewer).await;
    let (_, page) = viewer.get("/experiments").await;
    assert!(!page.contains("id=\"search-form\""), "a viewer has no form");
    let (status, _) = viewer.post_form("/experiments", &[("csrf", &csrf_of(&page)), ("search", &good)]).await;
    assert_eq!(status, StatusCode::FORBIDDEN);
}

/// The metric series `name` of a job: (step, value) pairs as stored.
async fn series(env: &TestEnv, job: &str, name: &str) -> Vec<(u64, f64)> {
    let (_, metrics) = env.get(&format!("/api/v1/jobs/{job}/metrics"), &env.admin_token).await;
    let Some(series) = metrics["series"].as_array().unwrap().iter().find(|s| s["name"] == name).cloned() else {
        return Vec::new();
    };
    let steps = series["steps"].as_array().unwrap().iter().map(|v| v.as_u64().unwrap());
    steps.zip(series["values"].as_array().unwrap().iter().map(|v| v.as_f64().unwrap())).collect()
}

/// Trials run on spare room by default: a tenant with quota that submits gets the GPUs within
/// one grace period; the trials are preempted (not failed), go back to the queue, resume from
/// their checkpoint once the room is free again, and the search completes.
#[tokio::test(flavor = "multi_thread")]
async fn trials_on_spare_room_make_way_for_a_tenant_with_quota_and_resume_where_they_stopped() {
    const GPU: &str = "sim-a100";
    let env = TestEnv::start_with(&["--simulate-gpus", "2", "--simulate-gpu-type", GPU]).await;
    let admin = env.admin_token.clone();
    assert_eq!(env.post("/api/v1/admin/tenants", &admin, &json!({"name": "team-a"})).await.0, StatusCode::CREATED);
    let quota = env.yard(&admin, &["admin", "quota", "set", "team-a", GPU, "--nominal", "2"]);
    assert!(quota.status.success(), "{}", stderr(&quota));
    let alice = env.member("team-a", "alice", "member").await;

    // The admin's tenant has no GPU quota at all: its trials take the two idle GPUs, one each,
    // checkpointing every 4 steps of STEPS: long enough that neither can end before Alice's
    // job arrives, even on a machine loaded by a full test run (at 48 steps one did).
    const STEPS: u64 = 160;
    let (data, _) = crate::training::packed_dataset_by(&env).await;
    let mut search = asha_search(data.to_str().unwrap(), "loss");
    search["name"] = json!("spare-search");
    search["params"]["gpus"] = json!(1);
    search["params"]["checkpoint_every"] = json!(4);
    search["searcher"] = json!({"method": "random", "metric": "loss", "max_length": STEPS, "max_trials": 2,
                                "max_concurrent_trials": 2, "seed": 5});
    let (status, created) = env.post("/api/v1/experiments", &admin, &search).await;
    assert_eq!(status, StatusCode::CREATED, "{created}");
    assert_eq!(created["spare"], true, "trials run on spare room unless asked otherwise");
    let id = created["id"].as_str().unwrap().to_string();

    // Both trials train and have saved a checkpoint.
    let deadline = Instant::now() + Duration::from_secs(240);
    let trial_jobs: Vec<String> = loop {
        let (_, detail) = env.get(&format!("/api/v1/experiments/{id}"), &admin).await;
        let jobs: Vec<String> = detail["trials"]
            .as_array()
            .unwrap()
            .iter()
            .filter_map(|t| t["runs"][0]["job_id"].as_str())
            .map(String::from)
            .collect();
        let mut saved = 0;
        for job in &jobs {
            let (_, j) = env.get(&format!("/api/v1/jobs/{job}"), &admin).await;
            if j["state"] == "running" && !series(&env, job, "checkpoint_step").await.is_empty() {
                saved += 1;
            }
        }
        if jobs.len() == 2 && saved == 2 {
            break jobs;
        }
        assert!(Instant::now() < deadline, "the trials did not start training: {detail:#}");
        tokio::time::sleep(Duration::from_millis(300)).await;
    };
    let (_, admins_quota) = env.get("/api/v1/quota", &admin).await;
    assert!(admins_quota["flavors"].as_array().unwrap().iter().all(|f| f["used"] == 0), "{admins_quota}");

    // Alice's job within her quota needs both GPUs: it runs within one grace period (10 s).
    let submitted = Instant::now();
    let body =
        json!({"name": "alice-0", "command": ["sleep", "3"], "resources": {"gpus": 2, "cpu": 0.1, "memory": "64Mi"}});
    let (status, job) = env.post("/api/v1/jobs", &alice, &body).await;
    assert_eq!(status, StatusCode::CREATED, "{job}");
    let alices = job["id"].as_str().unwrap().to_string();
    env.wait_job_as(&alice, &alices, Duration::from_secs(20), |j| j["state"] != "queued").await;
    let waited = submitted.elapsed();
    // What she waits for is the trials' stop: at most their grace period (10 s), plus the passes
    // that decide it and see them gone (up to 5 s more on a machine loaded by a full test run).
    assert!(waited < Duration::from_secs(15), "alice waited {waited:?}, beyond one grace period");
    for job in &trial_jobs {
        let (_, events) = env.get(&format!("/api/v1/jobs/{job}/events"), &admin).await;
        let requeued = events
            .as_array()
            .unwrap()
            .iter()
            .find(|e| e["from_state"] == "running" && e["to_state"] == "queued")
            .unwrap_or_else(|| panic!("trial job {job} was not sent back to the queue: {events:#}"));
        let reason = requeued["reason"].as_str().unwrap();
        assert!(reason.contains("preempted to give spare room back to a job within its quota"), "{reason}");
    }

    // Alice's job ends; the trials come back, resume from their checkpoints, and finish.
    let detail = wait_over(&env, &id, Duration::from_secs(420)).await;
    assert_eq!(detail["experiment"]["state"], "completed", "{detail:#}");
    let (_, alices_job) = env.get(&format!("/api/v1/jobs/{alices}"), &alice).await;
    assert_eq!(alices_job["state"], "succeeded");
    for trial in detail["trials"].as_array().unwrap() {
        assert_eq!(trial["status"], "completed", "preempted, never failed: {trial}");
        assert_eq!(trial["preemptions"], 1, "the searcher was told of the preemption: {trial}");
        let job = trial["runs"][0]["job_id"].as_str().unwrap();
        let second = std::fs::read_to_string(env.data_dir().join("jobs").join(job).join("attempt-2/replica-0.log"))
            .unwrap_or_default();
        let resumed_at: u64 = second
            .split("resuming from step ")
            .nth(1)
            .and_then(|rest| rest.split_whitespace().next())
            .and_then(|step| step.parse().ok())
            .unwrap_or_else(|| panic!("the second attempt did not resume: {second}"));
        assert!(resumed_at >= 4, "it resumed from a checkpoint, not from the start: {second}");
        // The loss goes on from there to the end, each step once.
        let steps: Vec<u64> = series(&env, job, "loss").await.into_iter().map(|(s, _)| s).collect();
        assert_eq!(steps.last(), Some(&STEPS), "{steps:?}");
        assert!(steps.windows(2).all(|w| w[0] < w[1]), "no step trained twice: {steps:?}");
    }
    let shown = env.yard(&admin, &["experiment", "show", &id]);
    let text = stdout(&shown);
    assert!(
        text.contains("trials run on spare room")
            && text.contains("preempted, each resumed from its checkpoint: trial 0 x1, trial 1 x1"),
        "{text}"
    );
}
