//! Operations: the audit log, usage accounting from the allocation ledger, and Prometheus
//! metrics, through the real server on the local executor with simulated GPUs.

use std::collections::BTreeMap;
use std::time::Duration;

use chrono::{DateTime, Utc};
use reqwest::Method;
use serde_json::{Value, json};
use trainyard_tests::{StatusCode, TestEnv, stderr, stdout};

const GPU: &str = "sim-h100";

async fn quota(env: &TestEnv, tenant: &str, nominal: u64) {
    let path = format!("/api/v1/admin/tenants/{tenant}/quotas/{GPU}");
    let (status, body) = env.call(Method::PUT, &path, Some(&env.admin_token), Some(&json!({"nominal": nominal}))).await;
    assert_eq!(status, StatusCode::OK, "{body}");
}

async fn submit_as(env: &TestEnv, token: &str, body: Value) -> String {
    let (status, job) = env.post("/api/v1/jobs", token, &body).await;
    assert_eq!(status, StatusCode::CREATED, "{job}");
    job["id"].as_str().unwrap().to_string()
}

fn gpu_job(name: &str, gpus: u32, seconds: f64) -> Value {
    json!({"name": name, "command": ["sleep", seconds.to_string()], "resources": {"gpus": gpus, "cpu": 0.1, "memory": "64Mi"}})
}

/// Every audit entry, oldest first: (action, actor, outcome, target, tenant).
async fn audit_rows(env: &TestEnv) -> Vec<(String, String, String, String, Option<String>)> {
    sqlx::query_as("SELECT action, actor, outcome, target, tenant FROM audit_log ORDER BY seq")
        .fetch_all(&env.db.pool)
        .await
        .unwrap()
}

#[tokio::test(flavor = "multi_thread")]
async fn every_change_is_audited_once_with_its_actor_and_outcome_and_the_log_cannot_be_rewritten() {
    let env = TestEnv::start_with(&["--simulate-gpus", "4", "--simulate-gpu-type", GPU]).await;
    let admin = env.admin_token.clone();
    let before = audit_rows(&env).await.len();

    // Changes by a platform admin, a tenant admin and a member.
    quota(&env, "default", 4).await;
    let (status, _) = env.post("/api/v1/admin/tenants", &admin, &json!({"name": "beta"})).await;
    assert_eq!(status, StatusCode::CREATED);
    let ann = env.member("default", "ann", "member").await;
    let bea = env.member("beta", "bea", "admin").await;
    let (status, token) = env.post("/api/v1/tokens", &ann, &json!({"name": "laptop"})).await;
    assert_eq!(status, StatusCode::CREATED, "{token}");
    let (token_id, secret) = (token["id"].as_str().unwrap(), token["token"].as_str().unwrap().to_string());
    let (status, _) = env.call(Method::DELETE, &format!("/api/v1/tokens/{token_id}"), Some(&ann), None).await;
    assert_eq!(status, StatusCode::NO_CONTENT);
    let job = submit_as(&env, &ann, json!({"name": "long", "command": ["sleep", "600"]})).await;
    let (status, _) = env.post(&format!("/api/v1/jobs/{job}/cancel"), &ann, &json!({})).await;
    assert_eq!(status, StatusCode::OK);
    let manifest = "name: tiny\nversion: 1.0.0\ndescription: a test template\ncommand: [\"true\"]\n";
    let (status, body) = env.post("/api/v1/templates", &ann, &json!({"manifest": manifest})).await;
    assert_eq!(status, StatusCode::CREATED, "{body}");
    let (status, body) = env.post("/api/v1/volumes", &ann, &json!({"name": "scratch", "size": "1Mi"})).await;
    assert_eq!(status, StatusCode::CREATED, "{body}");
    let (status, _) = env.call(Method::DELETE, "/api/v1/volumes/scratch", Some(&ann), None).await;
    assert_eq!(status, StatusCode::NO_CONTENT);
    // Refused: another tenant's admin cancels ann's job (404, as if it did not exist), and a
    // member sets a quota (403).
    let (status, _) = env.post(&format!("/api/v1/jobs/{job}/cancel"), &bea, &json!({})).await;
    assert_eq!(status, StatusCode::NOT_FOUND);
    let path = format!("/api/v1/admin/tenants/default/quotas/{GPU}");
    let (status, _) = env.call(Method::PUT, &path, Some(&ann), Some(&json!({"nominal": 99}))).await;
    assert_eq!(status, StatusCode::FORBIDDEN);

    let rows = audit_rows(&env).await;
    let new: Vec<_> = rows[before..].to_vec();
    let count = |action: &str, actor: &str, outcome: &str| {
        new.iter().filter(|(a, who, o, _, _)| a == action && who == actor && o == outcome).count()
    };
    let expected = [
        ("quota.set", "user:admin", "ok"),
        ("tenant.create", "user:admin", "ok"),
        ("token.create", "user:ann", "ok"),
        ("token.revoke", "user:ann", "ok"),
        ("job.submit", "user:ann", "ok"),
        ("job.cancel", "user:ann", "ok"),
        ("template.publish", "user:ann", "ok"),
        ("volume.create", "user:ann", "ok"),
        ("volume.delete", "user:ann", "ok"),
        ("job.cancel", "user:bea", "denied"),
        ("quota.set", "user:ann", "denied"),
    ];
    for (action, actor, outcome) in expected {
        assert_eq!(count(action, actor, outcome), 1, "{action} by {actor} ({outcome}) once, in {new:#?}");
    }
    assert_eq!(new.iter().filter(|(a, ..)| a == "member.add").count(), 2, "{new:#?}");
    let submit = new.iter().find(|(a, ..)| a == "job.submit").unwrap();
    assert_eq!((submit.3.as_str(), submit.4.as_deref()), (format!("job:{job}").as_str(), Some("default")));
    // The refused cross-tenant call is the refuser's tenant's business, not the target's.
    let refused = new.iter().find(|(a, who, ..)| a == "job.cancel" && who == "user:bea").unwrap();
    assert_eq!(refused.4.as_deref(), Some("beta"));
    // A quota change is recorded on the tenant it changes.
    let quota_set = new.iter().find(|(a, who, o, ..)| a == "quota.set" && who == "user:admin" && o == "ok").unwrap();
    assert_eq!(quota_set.4.as_deref(), Some("default"));

    // Append-only, for SQL too.
    for statement in ["UPDATE audit_log SET outcome = 'ok'", "DELETE FROM audit_log", "TRUNCATE audit_log"] {
        let err = sqlx::query(statement).execute(&env.db.pool).await.expect_err(statement);
        assert!(err.to_string().contains("append-only"), "{statement}: {err}");
    }
    assert_eq!(audit_rows(&env).await.len(), rows.len());
    // No secret in it, anywhere.
    let leaks: i64 = sqlx::query_scalar("SELECT count(*) FROM audit_log a WHERE strpos(row_to_json(a)::text, $1) > 0")
        .bind(&secret)
        .fetch_one(&env.db.pool)
        .await
        .unwrap();
    assert_eq!(leaks, 0);

    // Readers: a tenant admin sees their tenant's entries only; a member none.
    let (status, page) = env.get("/api/v1/audit?limit=1000", &bea).await;
    assert_eq!(status, StatusCode::OK, "{page}");
    let items = page["items"].as_array().unwrap();
    assert!(!items.is_empty() && items.iter().all(|e| e["tenant"] == "beta"), "{page}");
    assert!(items.iter().any(|e| e["action"] == "job.cancel" && e["outcome"] == "denied"), "{page}");
    assert_eq!(env.get("/api/v1/audit", &ann).await.0, StatusCode::FORBIDDEN);
    let (status, page) = env.get("/api/v1/audit?action=job.&actor=ann", &admin).await;
    assert_eq!(status, StatusCode::OK);
    let actions: Vec<&str> = page["items"].as_array().unwrap().iter().map(|e| e["action"].as_str().unwrap()).collect();
    assert_eq!(actions, ["job.cancel", "job.submit"], "{page}");
    let source = &page["items"][0]["source"];
    assert_eq!(source, "127.0.0.1", "the client's address is recorded: {page}");
    // `yard audit`: the same entries as a table; a member is refused with the server's reason.
    let out = env.yard(&admin, &["audit", "--action", "job.", "--actor", "ann"]);
    assert!(out.status.success(), "{}", stderr(&out));
    let table = stdout(&out);
    let rows: Vec<&str> = table.lines().filter(|l| l.contains("job.")).collect();
    assert_eq!(rows.len(), 2, "{table}");
    assert!(rows[0].contains("job.cancel") && rows[1].contains("job.submit") && rows[1].contains(&job), "{table}");
    let out = env.yard(&ann, &["audit"]);
    assert!(!out.status.success());
    assert!(stderr(&out).contains("admin"), "{}", stderr(&out));
}

/// An attempt as the test reads it: tenant, user, GPUs, start, end.
type AttemptRange = (String, String, i32, DateTime<Utc>, DateTime<Utc>);

/// GPU-hours per tenant and user from the ledger equal the sum of the attempts' time ranges,
/// clipped to the window asked for, across a server crash in the middle of an attempt.
#[tokio::test(flavor = "multi_thread")]
async fn usage_is_the_sum_of_attempt_ranges_clipped_to_the_window_across_a_crash() {
    let mut env = TestEnv::start_with(&["--simulate-gpus", "8", "--simulate-gpu-type", GPU]).await;
    quota(&env, "default", 8).await;
    env.post("/api/v1/admin/tenants", &env.admin_token, &json!({"name": "beta"})).await;
    quota(&env, "beta", 8).await;
    let ann = env.member("default", "ann", "member").await;
    let bea = env.member("beta", "bea", "member").await;
    let started = Utc::now();
    let jobs = [
        submit_as(&env, &ann, gpu_job("a2", 2, 2.0)).await,
        submit_as(&env, &env.admin_token, gpu_job("a1", 1, 1.0)).await,
        submit_as(&env, &bea, gpu_job("b4", 4, 6.0)).await,
    ];
    // The server dies while b4 runs; the next one adopts it and records its end.
    env.wait_job_as(&bea, &jobs[2], Duration::from_secs(30), |j| j["state"] == "running").await;
    tokio::time::sleep(Duration::from_secs(1)).await;
    env.restart_after_crash();
    for (id, token) in jobs.iter().zip([&ann, &env.admin_token, &bea]) {
        env.wait_job_as(token, id, Duration::from_secs(60), |j| j["state"] == "succeeded").await;
    }
    let ended = Utc::now() + chrono::Duration::seconds(1);

    // The truth: each attempt's range times its GPUs, from job_attempts.
    let attempts: Vec<AttemptRange> = sqlx::query_as(
        "SELECT n.name, u.name, ((j.spec->'resources'->>'gpus')::int * (j.spec->>'replicas')::int),
                a.started_at, a.ended_at
         FROM job_attempts a JOIN jobs j ON j.id = a.job_id JOIN tenants n ON n.id = j.tenant_id
              JOIN users u ON u.id = j.created_by",
    )
    .fetch_all(&env.db.pool)
    .await
    .unwrap();
    assert_eq!(attempts.len(), 3, "one attempt each, none repeated by the crash: {attempts:?}");
    let truth = |from: DateTime<Utc>, to: DateTime<Utc>| {
        let mut sums: BTreeMap<(String, String), f64> = BTreeMap::new();
        for (tenant, user, gpus, start, end) in &attempts {
            let seconds = ((*end).min(to) - (*start).max(from)).num_microseconds().unwrap().max(0) as f64 / 1e6;
            *sums.entry((tenant.clone(), user.clone())).or_default() += f64::from(*gpus) * seconds / 3600.0;
        }
        sums
    };
    let report = |from: DateTime<Utc>, to: DateTime<Utc>| {
        let env = &env;
        async move {
            let query = format!(
                "/api/v1/usage?by=tenant,user&from={}&to={}",
                urlencode(&from.to_rfc3339()),
                urlencode(&to.to_rfc3339())
            );
            let (status, report) = env.get(&query, &env.admin_token).await;
            assert_eq!(status, StatusCode::OK, "{report}");
            let mut sums = BTreeMap::new();
            for row in report["rows"].as_array().unwrap() {
                let key = (row["tenant"].as_str().unwrap().to_string(), row["user"].as_str().unwrap().to_string());
                sums.insert(key, row["gpu_hours"].as_f64().unwrap());
            }
            (sums, report)
        }
    };
    let close = |a: &BTreeMap<(String, String), f64>, b: &BTreeMap<(String, String), f64>| {
        a.len() == b.len() && a.iter().zip(b).all(|((ka, va), (kb, vb))| ka == kb && (va - vb).abs() < 1e-6)
    };
    let (whole, whole_report) = report(started - chrono::Duration::seconds(5), ended).await;
    let expected = truth(started - chrono::Duration::seconds(5), ended);
    assert!(close(&whole, &expected), "usage {whole:?}\ntruth {expected:?}");
    assert_eq!(whole.len(), 3, "ann and admin in default, bea in beta: {whole:?}");
    assert!(whole[&("beta".to_string(), "bea".to_string())] > 4.0 * 5.0 / 3600.0, "b4 held 4 GPUs for ~6 s: {whole:?}");
    // Clipped: a window that starts in the middle of b4's attempt.
    let b4_start = attempts.iter().find(|a| a.0 == "beta").unwrap().3;
    let mid = b4_start + chrono::Duration::seconds(3);
    let (clipped, _) = report(mid, ended).await;
    let expected = truth(mid, ended);
    assert!(close(&clipped, &expected), "usage {clipped:?}\ntruth {expected:?}");
    assert!(clipped[&("beta".to_string(), "bea".to_string())] < whole[&("beta".to_string(), "bea".to_string())]);

    // `yard usage`: CSV and JSON say the same, number for number.
    let (from, to) = ((started - chrono::Duration::seconds(5)).to_rfc3339(), ended.to_rfc3339());
    let args = |format: &'static str| {
        ["usage", "--by", "tenant,user", "--from", &from, "--to", &to, "-o", format].map(str::to_string)
    };
    let json_out = env.yard(&env.admin_token, &args("json").iter().map(String::as_str).collect::<Vec<_>>());
    assert!(json_out.status.success(), "{}", stderr(&json_out));
    let csv_out = env.yard(&env.admin_token, &args("csv").iter().map(String::as_str).collect::<Vec<_>>());
    assert!(csv_out.status.success(), "{}", stderr(&csv_out));
    let json_report: Value = serde_json::from_str(&stdout(&json_out)).unwrap();
    let csv_text = stdout(&csv_out);
    let mut lines = csv_text.lines();
    let header: Vec<&str> = lines.next().unwrap().split(',').collect();
    let csv_rows: Vec<BTreeMap<&str, &str>> =
        lines.map(|l| header.iter().copied().zip(l.split(',')).collect()).collect();
    let json_rows = json_report["rows"].as_array().unwrap();
    assert_eq!(csv_rows.len(), json_rows.len(), "{csv_text}");
    for row in json_rows {
        let csv =
            csv_rows.iter().find(|c| c["tenant"] == row["tenant"] && c["user"] == row["user"]).expect("the same row");
        for number in ["gpu_hours", "cpu_hours"] {
            assert_eq!(csv[number].parse::<f64>().unwrap(), row[number].as_f64().unwrap(), "{number} in {csv_text}");
        }
        // Decayed usage is as of each report's own `now`: the two calls are moments apart.
        let (a, b) = (csv["decayed_gpu_hours"].parse::<f64>().unwrap(), row["decayed_gpu_hours"].as_f64().unwrap());
        assert!((a - b).abs() <= 1e-3 * b, "decayed {a} vs {b}");
        assert_eq!(csv["attempts"].parse::<i64>().unwrap(), row["attempts"].as_i64().unwrap());
    }
    let by_user: BTreeMap<(String, String), f64> = json_rows
        .iter()
        .map(|r| {
            (
                (r["tenant"].as_str().unwrap().into(), r["user"].as_str().unwrap().into()),
                r["gpu_hours"].as_f64().unwrap(),
            )
        })
        .collect();
    assert!(close(&by_user, &whole), "the CLI's report is the API's: {by_user:?}");

    // A member sees their tenant only; the chart has one series per tenant for the admin.
    let (_, mine) = env.get("/api/v1/usage", &ann).await;
    assert!(mine["rows"].as_array().unwrap().iter().all(|r| r["tenant"] == "default"), "{mine}");
    let series: Vec<&str> =
        whole_report["series"].as_array().unwrap().iter().map(|s| s["tenant"].as_str().unwrap()).collect();
    assert_eq!(series, ["beta", "default"]);
    assert_eq!(env.get("/api/v1/usage?tenant=beta", &ann).await.0, StatusCode::NOT_FOUND);
    let (status, body) = env.get("/api/v1/usage?by=team", &ann).await;
    assert_eq!((status, body["error"]["field"].as_str()), (StatusCode::UNPROCESSABLE_ENTITY, Some("by")));
}

fn urlencode(text: &str) -> String {
    text.replace('+', "%2B").replace(':', "%3A")
}

/// Parses the exposition with the Prometheus project's own parser (Python's
/// `prometheus_client`), printing one `name{labels} value` per sample as JSON lines.
fn parse_exposition(text: &str) -> Vec<(String, BTreeMap<String, String>, f64)> {
    let python = std::env::var("TRAINYARD_TEST_PYTHON")
        .expect("TRAINYARD_TEST_PYTHON is not set: run the tests through tests/run, which installs prometheus-client");
    let script = r#"
import json, sys
from prometheus_client.parser import text_string_to_metric_families
for family in text_string_to_metric_families(sys.stdin.read()):
    for s in family.samples:
        print(json.dumps([s.name, s.labels, s.value]))
"#;
    let mut child = std::process::Command::new(python)
        .args(["-c", script])
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    use std::io::Write;
    child.stdin.take().unwrap().write_all(text.as_bytes()).unwrap();
    let output = child.wait_with_output().unwrap();
    assert!(output.status.success(), "the Prometheus parser refused the exposition: {}", stderr(&output));
    stdout(&output).lines().map(|line| serde_json::from_str(line).unwrap()).collect()
}

fn sample(samples: &[(String, BTreeMap<String, String>, f64)], name: &str, labels: &[(&str, &str)]) -> f64 {
    samples
        .iter()
        .filter(|(n, l, _)| n == name && labels.iter().all(|(k, v)| l.get(*k).map(String::as_str) == Some(*v)))
        .map(|(_, _, v)| v)
        .sum()
}

#[tokio::test(flavor = "multi_thread")]
async fn metrics_move_by_what_happened_and_need_the_metrics_credential() {
    let dir = tempfile::tempdir().unwrap();
    let token_file = dir.path().join("metrics-token");
    let scrape_token = "a-metrics-token-for-prometheus";
    std::fs::write(&token_file, scrape_token).unwrap();
    let env = TestEnv::start_with(&[
        "--simulate-gpus",
        "4",
        "--simulate-gpu-type",
        GPU,
        "--metrics-token-file",
        token_file.to_str().unwrap(),
    ])
    .await;
    quota(&env, "default", 4).await;
    let (status, _) = env
        .call(
            Method::PATCH,
            "/api/v1/admin/tenants/default",
            Some(&env.admin_token),
            Some(&json!({"preempt_lower_priority": true})),
        )
        .await;
    assert_eq!(status, StatusCode::NO_CONTENT);
    let scrape = |token: Option<&'static str>| {
        let url = format!("{}/metrics", env.server.url);
        async move {
            let mut request = reqwest::Client::new().get(url);
            if let Some(token) = token {
                request = request.bearer_auth(token);
            }
            let response = request.send().await.unwrap();
            (response.status(), response.text().await.unwrap())
        }
    };
    assert_eq!(scrape(None).await.0, StatusCode::UNAUTHORIZED);
    assert_eq!(scrape(Some("not-the-token")).await.0, StatusCode::UNAUTHORIZED);
    let before = parse_exposition(&scrape(Some("a-metrics-token-for-prometheus")).await.1);

    // Two successes, one failure, one preemption (a low-priority job holding every GPU makes
    // way for a high-priority one of the same tenant).
    let ok1 = env.submit(gpu_job("ok1", 1, 0.2)).await;
    let ok2 = env.submit(gpu_job("ok2", 1, 0.2)).await;
    let bad = env.submit(json!({"name": "bad", "command": ["sh", "-c", "exit 3"]})).await;
    for id in [&ok1, &ok2] {
        env.wait_state(id, "succeeded", Duration::from_secs(30)).await;
    }
    env.wait_state(&bad, "failed", Duration::from_secs(30)).await;
    let low =
        env.submit(json!({"name": "low", "priority": 0, "command": ["sleep", "600"], "resources": {"gpus": 4}})).await;
    env.wait_state(&low, "running", Duration::from_secs(30)).await;
    let high = env
        .submit(json!({"name": "high", "priority": 10, "command": ["sleep", "0.2"], "resources": {"gpus": 4}}))
        .await;
    env.wait_state(&high, "succeeded", Duration::from_secs(60)).await;
    env.wait_state(&low, "running", Duration::from_secs(30)).await;
    // The gauges follow within a pass or two (the quotas behind them are read every 2 s).
    let default = ("tenant", "default");
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    let (text, after) = loop {
        let (status, text) = scrape(Some("a-metrics-token-for-prometheus")).await;
        assert_eq!(status, StatusCode::OK);
        let after = parse_exposition(&text);
        let gauge = |name: &str| sample(&after, name, &[default, ("gpu_type", GPU)]);
        if (gauge("trainyard_quota_nominal_gpus"), gauge("trainyard_quota_used_gpus")) == (4.0, 4.0)
            || std::time::Instant::now() > deadline
        {
            break (text, after);
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    };
    let moved = |name: &str, labels: &[(&str, &str)]| sample(&after, name, labels) - sample(&before, name, labels);
    assert_eq!(moved("trainyard_jobs_finished_total", &[default, ("state", "succeeded")]), 3.0, "ok1, ok2, high");
    assert_eq!(moved("trainyard_jobs_finished_total", &[default, ("state", "failed")]), 1.0);
    assert_eq!(moved("trainyard_preempted_jobs_total", &[default, ("reason", "priority")]), 1.0);
    // Admitted: ok1, ok2, bad, low, high, and low again after its preemption.
    let admitted = moved("trainyard_admission_wait_time_seconds_count", &[default]);
    assert_eq!(admitted, 6.0);
    assert_eq!(moved("trainyard_admission_wait_time_seconds_count", &[default, ("gpu_type", GPU)]), admitted - 1.0);
    // One observation per job seen running, at the pass that saw it: low twice, and each of the
    // short jobs that a pass saw running before it ended (under load some end unseen).
    let seen_running: i64 = sqlx::query_scalar("SELECT count(*) FROM job_events WHERE to_state = 'running'")
        .fetch_one(&env.db.pool)
        .await
        .unwrap();
    assert!(seen_running >= 2, "{seen_running}");
    assert_eq!(moved("trainyard_launch_time_seconds_count", &[default]), seen_running as f64);
    // Every launch waited for a slot, then launched.
    let launches = moved("trainyard_launch_phase_duration_seconds_count", &[("phase", "launch")]);
    assert!(launches >= 5.0, "{launches}");
    assert_eq!(moved("trainyard_launch_phase_duration_seconds_count", &[("phase", "wait")]), launches);
    assert!(moved("trainyard_admission_attempts_total", &[("result", "success")]) >= admitted);
    assert_eq!(
        moved("trainyard_http_requests_total", &[("route", "/api/v1/jobs"), ("method", "POST"), ("status", "201")]),
        5.0
    );
    assert!(moved("trainyard_http_request_duration_seconds_count", &[("route", "/api/v1/jobs/{id}")]) >= 5.0);
    assert!(moved("trainyard_gpu_hours_total", &[default, ("gpu_type", GPU)]) > 0.0);
    assert_eq!(sample(&after, "trainyard_leader", &[]), 1.0);
    assert_eq!(sample(&after, "trainyard_quota_nominal_gpus", &[default, ("gpu_type", GPU)]), 4.0);
    assert_eq!(sample(&after, "trainyard_quota_used_gpus", &[default, ("gpu_type", GPU)]), 4.0, "low runs again");
    let last = sample(&after, "trainyard_reconciler_last_success_timestamp_seconds", &[]);
    assert!((Utc::now().timestamp() as f64 - last).abs() < 30.0, "{last}");
    // No job id in any label.
    assert!(!text.contains(&low) && !text.contains(&high), "a job id leaked into a label");
}
