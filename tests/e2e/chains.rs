//! Job chains and arrays (issue 43), with Slurm's semantics: `after_ok`/`after_any`/
//! `after_failed` hold a job until its dependencies end as asked, and cancel it with the reason
//! when they cannot; `array: "0-19%4"` makes 20 jobs, each with its index, at most 4 at once.

use std::time::{Duration, Instant};

use serde_json::{Value, json};
use trainyard_tests::{StatusCode, TestEnv, stderr, stdout};

fn short(id: &str) -> &str {
    &id[..8]
}

#[tokio::test]
async fn a_chain_whose_middle_job_fails_cancels_the_last_with_the_reason() {
    let env = TestEnv::start().await;
    let first = env.submit(json!({"name": "prepare", "command": ["sh", "-c", "sleep 2"]})).await;
    let middle = env.submit(json!({"name": "train", "command": ["sh", "-c", "exit 3"], "after_ok": [first]})).await;
    // The last link through the CLI, naming the middle one by a prefix of its id (a UUIDv7:
    // jobs submitted in the same millisecond share their first 8 digits).
    let submitted =
        env.yard(&env.admin_token, &["submit", "--name", "report", "--after-ok", &middle[..13], "--", "true"]);
    assert!(submitted.status.success(), "{}", stderr(&submitted));
    let last = stdout(&submitted).trim().to_string();

    // While the first runs, the middle one waits for it, and says so.
    let waiting = env
        .wait_job(&middle, Duration::from_secs(30), |j| {
            j["reason"].as_str().is_some_and(|r| r.starts_with(&format!("waiting for {}", short(&first))))
        })
        .await;
    assert_eq!(waiting["state"], "queued", "{waiting}");
    // Its schedule says the same, estimated after the first's expected end, naming it.
    let (status, schedule) = env.get(&format!("/api/v1/jobs/{middle}/schedule"), &env.admin_token).await;
    assert_eq!(status, StatusCode::OK, "{schedule}");
    assert!(schedule["reason"].as_str().unwrap().starts_with("waiting for "), "{schedule}");
    assert!(schedule["estimated_start"].is_string() && schedule["admitted_now"] == false, "{schedule}");
    assert_eq!(schedule["waits_for"][0]["job"], first.as_str(), "{schedule}");
    let (_, first_now) = env.get(&format!("/api/v1/jobs/{first}"), &env.admin_token).await;
    assert_ne!(first_now["state"], "succeeded", "the middle job waited while the first had not ended: {first_now}");

    env.wait_state(&first, "succeeded", Duration::from_secs(60)).await;
    let failed = env.wait_state(&middle, "failed", Duration::from_secs(60)).await;
    assert!(failed["started_at"].is_string(), "it ran after the first succeeded: {failed}");
    let cancelled = env.wait_state(&last, "cancelled", Duration::from_secs(60)).await;
    let reason = cancelled["reason"].as_str().unwrap();
    assert!(reason.contains(short(&middle)) && reason.contains("failed"), "the reason names the dependency: {reason}");
    assert!(cancelled["started_at"].is_null(), "it never ran: {cancelled}");
}

/// Seconds from now to an RFC 3339 time.
fn seconds_from_now(at: &Value) -> i64 {
    let at = chrono::DateTime::parse_from_rfc3339(at.as_str().unwrap_or_else(|| panic!("no time: {at}"))).unwrap();
    (at.with_timezone(&chrono::Utc) - chrono::Utc::now()).num_seconds()
}

#[tokio::test]
async fn estimates_run_down_a_chain_link_by_link() {
    let env = TestEnv::start().await;
    // Each link's run time is guessed from its time limit (no history): 10 min, 20 min, 30 min.
    let first = env.submit(json!({"name": "prepare", "command": ["sleep", "600"], "time_limit_seconds": 600})).await;
    let second = env
        .submit(json!({"name": "train", "command": ["true"], "time_limit_seconds": 1200, "after_ok": [first]}))
        .await;
    let third = env
        .submit(json!({"name": "report", "command": ["true"], "time_limit_seconds": 1800, "after_ok": [second]}))
        .await;
    env.wait_state(&first, "running", Duration::from_secs(30)).await;

    let (status, two) = env.get(&format!("/api/v1/jobs/{second}/schedule"), &env.admin_token).await;
    assert_eq!(status, StatusCode::OK, "{two}");
    let starts_in = seconds_from_now(&two["estimated_start"]);
    assert!((560..=610).contains(&starts_in), "the second starts when the first is expected to end, in ~600 s: {two}");
    assert_eq!(two["waits_for"][0]["job"], first.as_str(), "{two}");
    assert!(two["waits_for"][0]["assuming"].as_str().unwrap().contains("10 min"), "{two}");

    let (_, three) = env.get(&format!("/api/v1/jobs/{third}/schedule"), &env.admin_token).await;
    let starts_in = seconds_from_now(&three["estimated_start"]);
    assert!((1760..=1810).contains(&starts_in), "the third 20 min after the second: ~1,800 s: {three}");
    assert_eq!(three["waits_for"][0]["job"], second.as_str(), "it names the link before it: {three}");
    assert!(three["reason"].as_str().unwrap().starts_with(&format!("waiting for {}", short(&second))), "{three}");

    // The queue lists the held links after the jobs the cluster's queue places, with estimates.
    let (_, queue) = env.get("/api/v1/queue", &env.admin_token).await;
    let ids: Vec<&str> = queue["items"].as_array().unwrap().iter().map(|e| e["id"].as_str().unwrap()).collect();
    assert_eq!(ids, [second.as_str(), third.as_str()], "{queue}");
    // `yard jobs show` says when and after what.
    let shown = env.yard(&env.admin_token, &["jobs", "show", &third]);
    assert!(shown.status.success(), "{}", stderr(&shown));
    let text = stdout(&shown);
    assert!(text.contains("after:") && text.contains(short(&second)), "{text}");

    // A what-if of a fourth link says it would wait for the third, ~50 min away.
    let (status, what_if) = env
        .post(
            "/api/v1/jobs/what-if",
            &env.admin_token,
            &json!({"command": ["true"], "time_limit_seconds": 60, "after_ok": [third]}),
        )
        .await;
    assert_eq!(status, StatusCode::OK, "{what_if}");
    assert_eq!(what_if["admitted_now"], false, "{what_if}");
    assert!(what_if["reason"].as_str().unwrap().contains(short(&third)), "{what_if}");
    let starts_in = seconds_from_now(&what_if["estimated_start"]);
    assert!((3560..=3610).contains(&starts_in), "after the third's 30 min: ~3,600 s: {what_if}");
    env.post(&format!("/api/v1/jobs/{first}/cancel"), &env.admin_token, &json!({})).await;
}

#[tokio::test]
async fn after_any_and_after_failed_follow_how_the_dependency_ended() {
    let env = TestEnv::start().await;
    let fails = env.submit(json!({"command": ["sh", "-c", "exit 1"]})).await;
    let any = env.submit(json!({"command": ["true"], "after_any": [fails]})).await;
    let on_failure = env.submit(json!({"command": ["true"], "after_failed": [fails]})).await;
    let on_success = env.submit(json!({"command": ["true"], "after_ok": [fails]})).await;
    env.wait_state(&any, "succeeded", Duration::from_secs(60)).await;
    env.wait_state(&on_failure, "succeeded", Duration::from_secs(60)).await;
    env.wait_state(&on_success, "cancelled", Duration::from_secs(60)).await;
    // An array through the CLI: one job per index.
    let pair = env.yard(&env.admin_token, &["submit", "--name", "pair", "--array", "3-4", "--", "true"]);
    assert!(pair.status.success(), "{}", stderr(&pair));
    let jobs = array_jobs(&env, "pair").await;
    let mut indexes: Vec<u64> = jobs.iter().map(|j| j["array_index"].as_u64().unwrap()).collect();
    indexes.sort();
    assert_eq!(indexes, [3, 4], "{jobs:?}");
    let bad = env.yard(&env.admin_token, &["submit", "--array", "4-3", "--", "true"]);
    assert!(!bad.status.success() && stderr(&bad).contains("array"), "{}", stderr(&bad));

    // A dependency that is not a job of the tenant: named with its field.
    let stranger = uuid::Uuid::now_v7();
    let (status, body) = env
        .post("/api/v1/jobs", &env.admin_token, &json!({"command": ["true"], "after_ok": [stranger], "array": "9-1"}))
        .await;
    assert_eq!(status, StatusCode::UNPROCESSABLE_ENTITY, "{body}");
    let fields: Vec<&str> = match body["error"]["errors"].as_array() {
        Some(errors) => errors.iter().map(|e| e["field"].as_str().unwrap()).collect(),
        None => vec![body["error"]["field"].as_str().unwrap()],
    };
    assert_eq!(fields, ["array"], "its own rules are checked before its dependencies are looked up: {body}");
    let (status, body) =
        env.post("/api/v1/jobs", &env.admin_token, &json!({"command": ["true"], "after_ok": [stranger]})).await;
    assert_eq!(status, StatusCode::UNPROCESSABLE_ENTITY, "{body}");
    assert_eq!(body["error"]["field"], "after_ok", "{body}");
}

/// The array's jobs by state (they share the array's name).
async fn array_jobs(env: &TestEnv, name: &str) -> Vec<Value> {
    let (status, page) = env.get(&format!("/api/v1/jobs?name={name}&limit=100"), &env.admin_token).await;
    assert_eq!(status, StatusCode::OK, "{page}");
    page["items"].as_array().unwrap().clone()
}

#[tokio::test]
async fn an_array_of_20_at_most_4_at_once_runs_each_index_once() {
    let env = TestEnv::start().await;
    let (status, first) = env
        .post(
            "/api/v1/jobs",
            &env.admin_token,
            &json!({"name": "sweep", "array": "0-19%4",
                    "command": ["sh", "-c", "test -n \"$TRAINYARD_ARRAY_INDEX\" && sleep 0.5"]}),
        )
        .await;
    assert_eq!(status, StatusCode::CREATED, "{first}");
    assert_eq!(first["array_index"], 0, "the answer is the array's first job: {first}");
    // The list shows the array's jobs by index; its queued ones on one line.
    let listed = stdout(&env.yard(&env.admin_token, &["jobs", "ls", "--limit", "100"]));
    let lines: Vec<&str> = listed.lines().filter(|l| l.contains("sweep[")).collect();
    assert!(!lines.is_empty() && lines.len() < 20, "grouped: {listed}");
    let mut most = 0;
    let deadline = Instant::now() + Duration::from_secs(180);
    loop {
        let jobs = array_jobs(&env, "sweep").await;
        assert_eq!(jobs.len(), 20, "one job per index");
        let under_way = jobs
            .iter()
            .filter(|j| ["admitted", "starting", "running", "restarting"].contains(&j["state"].as_str().unwrap()))
            .count();
        assert!(under_way <= 4, "at most 4 at once, saw {under_way}");
        most = most.max(under_way);
        if jobs.iter().all(|j| j["state"] == "succeeded") {
            let mut indexes: Vec<u32> = jobs
                .iter()
                .map(|j| j["spec"]["env"]["TRAINYARD_ARRAY_INDEX"].as_str().unwrap().parse().unwrap())
                .collect();
            indexes.sort();
            assert_eq!(indexes, (0..20).collect::<Vec<u32>>());
            assert!(jobs.iter().all(|j| j["array_id"] == first["id"]), "{jobs:?}");
            break;
        }
        assert!(!jobs.iter().any(|j| j["state"] == "failed"), "each job saw its index: {jobs:?}");
        assert!(Instant::now() < deadline, "the array did not finish: {jobs:?}");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert!(most >= 2, "the array ran in parallel (at most {most} at once)");
}
