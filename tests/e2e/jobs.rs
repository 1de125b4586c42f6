//! Jobs through their life: run, restart, cancel, via the CLI and the API.

use std::time::{Duration, Instant};

use serde_json::json;
use trainyard_core::resources::human_memory;
use trainyard_tests::{StatusCode, TestEnv, group_alive, stderr, stdout};

#[tokio::test(flavor = "multi_thread")]
async fn two_replica_job_from_the_cli_succeeds_and_logs_both_ranks() {
    let env = TestEnv::start().await;
    let token = env.admin_token.clone();
    let submitted = env.yard(
        &token,
        &[
            "submit",
            "--name",
            "ranks",
            "--replicas",
            "2",
            "--cpu",
            "0.5",
            "--",
            "sh",
            "-c",
            "echo rank=$RANK world=$WORLD_SIZE master=$MASTER_ADDR",
        ],
    );
    assert!(submitted.status.success(), "yard submit: {}", stderr(&submitted));
    let id = stdout(&submitted).trim().to_string();
    assert_eq!(id.len(), 36, "yard submit prints the job id, got {id:?}");

    let waited = env.yard(&token, &["wait", &id, "--timeout", "60"]);
    assert!(waited.status.success(), "yard wait exits 0 for a succeeded job: {} {}", stdout(&waited), stderr(&waited));
    assert!(stdout(&waited).contains("succeeded"), "{}", stdout(&waited));

    for rank in 0..2 {
        let logs = env.yard(&token, &["logs", &id, "--replica", &rank.to_string()]);
        assert!(logs.status.success(), "{}", stderr(&logs));
        assert_eq!(stdout(&logs), format!("rank={rank} world=2 master=127.0.0.1\n"));
    }

    let shown = env.yard(&token, &["jobs", "show", &id, "-o", "json"]);
    let shown: serde_json::Value = serde_json::from_slice(&shown.stdout).expect("yard jobs show -o json");
    assert_eq!(shown["job"]["state"], "succeeded");
    assert_eq!(shown["attempts"][0]["exit_codes"], json!([0, 0]));

    // Every state change is in Postgres, in order, with who made it.
    let events: Vec<(String, String)> =
        sqlx::query_as("SELECT to_state, actor FROM job_events WHERE job_id = $1::uuid ORDER BY seq")
            .bind(&id)
            .fetch_all(&env.db.pool)
            .await
            .unwrap();
    let states: Vec<&str> = events.iter().map(|(s, _)| s.as_str()).filter(|s| *s != "running").collect();
    assert_eq!(states, ["queued", "admitted", "starting", "succeeded"]);
    assert_eq!(events[0].1, "user:admin");
    assert_eq!(events[1].1, "scheduler");

    let listed = env.yard(&token, &["jobs", "ls"]);
    let text = stdout(&listed);
    assert!(text.contains("ranks") && text.contains("succeeded"), "{text}");
    assert!(text.contains(&id[..13]) && !text.contains(&id), "short ids, as every id argument takes: {text}");
    assert!(text.contains("admin"), "who submitted it: {text}");

    // Filters: a substring of the name (any case), the submitter, the template.
    let found = stdout(&env.yard(&token, &["jobs", "ls", "--search", "RAN", "--user", "admin"]));
    assert!(found.contains(&id[..13]), "{found}");
    let none = stdout(&env.yard(&token, &["jobs", "ls", "--user", "nobody"]));
    assert_eq!(none, "no jobs match\n");
    let none = stdout(&env.yard(&token, &["jobs", "ls", "--search", "xyz"]));
    assert_eq!(none, "no jobs match\n");
}

#[tokio::test(flavor = "multi_thread")]
async fn failing_job_is_restarted_then_fails_with_its_exit_code_on_every_attempt() {
    let env = TestEnv::start().await;
    let id = env
        .submit(json!({"command": ["sh", "-c", "echo attempt $TRAINYARD_ATTEMPT; exit 3"], "max_restarts": 1}))
        .await;
    let job = env.wait_job(&id, Duration::from_secs(60), |j| j["state"] == "failed").await;
    assert_eq!(job["restart_count"], 1);
    assert_eq!(job["reason"], "replica 0 exited with code 3: attempt 2", "the last line it wrote explains the failure");

    let (_, attempts) = env.get(&format!("/api/v1/jobs/{id}/attempts"), &env.admin_token).await;
    let attempts = attempts.as_array().unwrap();
    assert_eq!(attempts.len(), 2, "{attempts:?}");
    for (i, attempt) in attempts.iter().enumerate() {
        assert_eq!(attempt["attempt"], i + 1);
        assert_eq!(attempt["exit_codes"], json!([3]));
        assert!(attempt["ended_at"].is_string());
    }

    let (_, events) = env.get(&format!("/api/v1/jobs/{id}/events"), &env.admin_token).await;
    let states: Vec<&str> = events
        .as_array()
        .unwrap()
        .iter()
        .map(|e| e["to_state"].as_str().unwrap())
        .filter(|s| *s != "running")
        .collect();
    assert_eq!(states, ["queued", "admitted", "starting", "restarting", "starting", "failed"]);

    // Each attempt has its own log.
    let (_, log) = env.get(&format!("/api/v1/jobs/{id}/logs?attempt=1"), &env.admin_token).await;
    assert_eq!(log, "attempt 1\n");
    let (_, log) = env.get(&format!("/api/v1/jobs/{id}/logs"), &env.admin_token).await;
    assert_eq!(log, "attempt 2\n");

    let waited = env.yard(&env.admin_token, &["wait", &id]);
    assert!(!waited.status.success(), "yard wait exits non-zero for a failed job");
}

#[tokio::test(flavor = "multi_thread")]
async fn cancelling_a_running_job_stops_it_within_five_seconds_and_leaves_no_process() {
    let env = TestEnv::start().await;
    // The child of the shell is a second process in the group: it must go too.
    let id = env.submit(json!({"command": ["sh", "-c", "sleep 600 & sleep 600; wait"]})).await;
    env.wait_state(&id, "running", Duration::from_secs(30)).await;
    let pids = env.replica_pids(&id, 1).await;
    assert!(group_alive(pids[0]));

    let started = Instant::now();
    let cancelled = env.yard(&env.admin_token, &["cancel", &id]);
    assert!(cancelled.status.success(), "{}", stderr(&cancelled));
    let job = env.wait_state(&id, "cancelled", Duration::from_secs(5)).await;
    assert!(started.elapsed() < Duration::from_secs(5));
    assert_eq!(job["reason"], "cancelled by user:admin");
    assert!(!group_alive(pids[0]), "a process of the cancelled job is still alive");

    // Cancelling again is harmless; a finished job cannot be cancelled.
    let (status, _) = env.post(&format!("/api/v1/jobs/{id}/cancel"), &env.admin_token, &json!({})).await;
    assert_eq!(status, StatusCode::OK);
    let done = env.submit(json!({"command": ["true"]})).await;
    env.wait_state(&done, "succeeded", Duration::from_secs(30)).await;
    let (status, body) = env.post(&format!("/api/v1/jobs/{done}/cancel"), &env.admin_token, &json!({})).await;
    assert_eq!(status, StatusCode::CONFLICT, "{body}");
}

#[tokio::test(flavor = "multi_thread")]
async fn a_queued_job_is_cancelled_at_once_and_never_runs() {
    let env = TestEnv::start().await;
    // More GPUs than any machine has: it waits, with a reason that says why.
    let id = env.submit(json!({"command": ["true"], "resources": {"gpus": 64}})).await;
    let job = env.wait_job(&id, Duration::from_secs(10), |j| j["reason"].is_string()).await;
    assert_eq!(job["state"], "queued");
    assert!(job["reason"].as_str().unwrap().contains("GPUs"), "{job}");
    let (status, job) = env.post(&format!("/api/v1/jobs/{id}/cancel"), &env.admin_token, &json!({})).await;
    assert_eq!(status, StatusCode::OK);
    assert_eq!(job["state"], "cancelled");
    let (_, attempts) = env.get(&format!("/api/v1/jobs/{id}/attempts"), &env.admin_token).await;
    assert_eq!(attempts, json!([]));
}

#[tokio::test(flavor = "multi_thread")]
async fn following_logs_streams_output_and_ends_when_the_job_ends() {
    let env = TestEnv::start().await;
    let id = env.submit(json!({"command": ["sh", "-c", "for i in 1 2 3; do echo line $i; sleep 0.3; done"]})).await;
    let followed = tokio::task::spawn_blocking({
        let (url, token, id) = (env.server.url.clone(), env.admin_token.clone(), id.clone());
        move || {
            std::process::Command::new(trainyard_tests::bin("yard"))
                .args(["logs", &id, "-f"])
                .env("TRAINYARD_URL", url)
                .env("TRAINYARD_TOKEN", token)
                .output()
                .unwrap()
        }
    });
    let output =
        tokio::time::timeout(Duration::from_secs(30), followed).await.expect("follow ends with the job").unwrap();
    assert!(output.status.success(), "{}", stderr(&output));
    assert_eq!(stdout(&output), "line 1\nline 2\nline 3\n");
    assert!(stderr(&output).contains(&format!("== job {id} succeeded")), "the outcome ends it: {}", stderr(&output));

    // A failing job: the follow ends with its outcome and exit code, and fails as `yard wait` does.
    let (status, body) = env
        .post(
            "/api/v1/jobs",
            &env.admin_token,
            &json!({"command": ["sh", "-c", "echo trying; exit 3"], "max_restarts": 0}),
        )
        .await;
    assert_eq!(status, StatusCode::CREATED, "{body}");
    let id = body["id"].as_str().unwrap();
    let output = env.yard(&env.admin_token, &["logs", id, "-f"]);
    assert_eq!(stdout(&output), "trying\n");
    let said = stderr(&output);
    assert!(said.contains(&format!("== job {id} failed")) && said.contains("code 3"), "{said}");
    assert_eq!(output.status.code(), Some(1), "{said}");
}

#[tokio::test(flavor = "multi_thread")]
async fn listing_filters_by_state_and_name_and_pages_with_a_cursor() {
    let env = TestEnv::start().await;
    let mut ids = Vec::new();
    for i in 0..5 {
        ids.push(
            env.submit(json!({"name": format!("job-{}", i % 2), "command": ["true"], "resources": {"gpus": 64}})).await,
        );
    }
    let (_, page) = env.get("/api/v1/jobs?limit=2", &env.admin_token).await;
    let first: Vec<&str> = page["items"].as_array().unwrap().iter().map(|j| j["id"].as_str().unwrap()).collect();
    assert_eq!(first, [ids[4].as_str(), ids[3].as_str()], "newest first");
    let cursor = page["next_cursor"].as_str().unwrap();
    let (_, page) = env.get(&format!("/api/v1/jobs?limit=2&cursor={cursor}"), &env.admin_token).await;
    let second: Vec<&str> = page["items"].as_array().unwrap().iter().map(|j| j["id"].as_str().unwrap()).collect();
    assert_eq!(second, [ids[2].as_str(), ids[1].as_str()]);
    let (_, page) = env
        .get(&format!("/api/v1/jobs?limit=2&cursor={}", page["next_cursor"].as_str().unwrap()), &env.admin_token)
        .await;
    assert_eq!(page["items"].as_array().unwrap().len(), 1);
    assert!(page["next_cursor"].is_null(), "the last page has no cursor");

    let (_, page) = env.get("/api/v1/jobs?name=job-1", &env.admin_token).await;
    assert_eq!(page["items"].as_array().unwrap().len(), 2);
    let (_, page) = env.get("/api/v1/jobs?state=queued", &env.admin_token).await;
    assert_eq!(page["items"].as_array().unwrap().len(), 5);
    let (_, page) = env.get("/api/v1/jobs?state=running", &env.admin_token).await;
    assert_eq!(page["items"].as_array().unwrap().len(), 0);
}

/// The images an attempt ran are recorded by the reconciler from what a cluster executor
/// reports (the Kubernetes tests cover that report); here the record's way out: the attempts
/// API shows them, the local executor's attempts have none, and the attempt's end keeps them.
#[tokio::test(flavor = "multi_thread")]
async fn an_attempts_image_digests_are_shown_with_the_attempt() {
    let env = TestEnv::start().await;
    let id = env.submit(json!({"command": ["true"]})).await;
    env.wait_state(&id, "succeeded", Duration::from_secs(30)).await;
    let (_, attempts) = env.get(&format!("/api/v1/jobs/{id}/attempts"), &env.admin_token).await;
    assert!(attempts[0].get("image_digests").is_none(), "no images ran: {attempts}");

    // Written as a cluster executor's observation would be (that write is the leader's, fenced
    // by its epoch; the test writes the row itself).
    let digest = "registry.example/trainer@sha256:".to_string() + &"ab".repeat(32);
    sqlx::query("UPDATE job_attempts SET image_digests = $2 WHERE job_id = $1::uuid AND attempt = 1")
        .bind(&id)
        .bind(std::slice::from_ref(&digest))
        .execute(&env.db.pool)
        .await
        .unwrap();
    let (_, attempts) = env.get(&format!("/api/v1/jobs/{id}/attempts"), &env.admin_token).await;
    assert_eq!(attempts[0]["image_digests"], json!([digest]));
}

/// A shell line given as one word cannot be found as a program: the job fails at once (a
/// missing command would be missing again, so its restarts stay unused) and the reason shows
/// how to run a shell line.
#[tokio::test(flavor = "multi_thread")]
async fn a_shell_line_given_as_the_command_fails_with_a_hint_and_is_not_restarted() {
    let env = TestEnv::start().await;
    let id = env.submit(json!({"command": ["echo hi && ls"], "max_restarts": 2})).await;
    let job = env.wait_job(&id, Duration::from_secs(30), |j| j["finished_at"].is_string()).await;
    assert_eq!(job["state"], "failed", "{job}");
    assert_eq!(job["restart_count"], 0, "{job}");
    let reason = job["reason"].as_str().unwrap();
    assert!(reason.starts_with("replica 0 exited with code 127"), "{reason}");
    assert!(reason.contains("submit `sh -c 'echo hi && ls'`"), "{reason}");
    assert!(reason.contains("not restarted: the command was not found"), "{reason}");
}

/// Short ids: every command that takes a job id takes the first hex digits of one (at least 6),
/// as `git` takes a commit's; an ambiguous or unknown prefix says which, and the API's
/// `id_prefix` filter answers from the primary key's index.
#[tokio::test(flavor = "multi_thread")]
async fn a_job_is_named_by_the_start_of_its_id() {
    let env = TestEnv::start().await;
    let first = env.submit(json!({"command": ["echo", "from the first"]})).await;
    let second = env.submit(json!({"command": ["echo", "from the second"]})).await;
    env.wait_state(&first, "succeeded", Duration::from_secs(30)).await;
    env.wait_state(&second, "succeeded", Duration::from_secs(30)).await;
    // UUIDv7: the first 12 hex digits are the submit time in ms, so 13 characters with the
    // dash tell these two apart unless they came in the same millisecond (then more are needed).
    let common = first.chars().zip(second.chars()).take_while(|(a, b)| a == b).count();
    let short = &first[..(common + 1).max(13)];
    let logs = env.yard(&env.admin_token, &["logs", short]);
    assert!(logs.status.success(), "{}", stderr(&logs));
    assert_eq!(stdout(&logs), "from the first\n");
    let shown = env.yard(&env.admin_token, &["-o", "json", "jobs", "show", &first[..common.max(6)]]);
    if common >= 6 {
        assert!(!shown.status.success());
        assert!(stderr(&shown).contains("is ambiguous"), "{}", stderr(&shown));
    }
    let unknown = env.yard(&env.admin_token, &["jobs", "show", "ffffff"]);
    assert!(!unknown.status.success());
    assert!(stderr(&unknown).contains("no job of your tenant has an id starting with ffffff"), "{}", stderr(&unknown));

    let (status, page) = env.get(&format!("/api/v1/jobs?id_prefix={short}"), &env.admin_token).await;
    assert_eq!(status, StatusCode::OK);
    let ids: Vec<&str> = page["items"].as_array().unwrap().iter().map(|j| j["id"].as_str().unwrap()).collect();
    assert_eq!(ids, [first.as_str()]);
    let (status, body) = env.get("/api/v1/jobs?id_prefix=01a", &env.admin_token).await;
    assert_eq!(status, StatusCode::UNPROCESSABLE_ENTITY);
    assert_eq!(body["error"]["field"], "id_prefix", "{body}");
}

/// `yard submit -- python3 train.py` from a folder holding train.py: the folder ships with the
/// job (what .yardignore names stays out), every replica starts in a copy of it, the job records
/// the archive's digest, and submitting the same folder again ships the same digest.
#[tokio::test(flavor = "multi_thread")]
async fn yard_submit_ships_the_folder_it_runs_in_and_the_job_records_its_digest() {
    let env = TestEnv::start().await;
    let token = env.admin_token.clone();
    let project = env.dir.path().join("project");
    std::fs::create_dir_all(project.join("conf")).unwrap();
    std::fs::create_dir_all(project.join("data")).unwrap();
    std::fs::write(project.join("train.py"), "import os\nprint('lr from conf:', open('conf/lr.txt').read().strip())\nprint('data shipped:', os.path.exists('data'))\n").unwrap();
    std::fs::write(project.join("conf/lr.txt"), "0.001\n").unwrap();
    std::fs::write(project.join("data/huge.bin"), vec![0u8; 4096]).unwrap();
    std::fs::write(project.join(".yardignore"), "data/\n").unwrap();

    let submitted = env.yard_in(
        &project,
        &token,
        &["submit", "--name", "shipped", "--replicas", "2", "--cpu", "0.25", "--", "python3", "train.py"],
    );
    assert!(submitted.status.success(), "{}", stderr(&submitted));
    let id = stdout(&submitted).trim().to_string();
    assert!(stderr(&submitted).contains("code: 3 files"), "what was shipped is said: {}", stderr(&submitted));
    env.wait_state(&id, "succeeded", Duration::from_secs(60)).await;
    for replica in ["0", "1"] {
        let log = stdout(&env.yard(&token, &["logs", &id, "--replica", replica]));
        assert!(log.contains("lr from conf: 0.001") && log.contains("data shipped: False"), "replica {replica}: {log}");
    }
    let (_, job) = env.get(&format!("/api/v1/jobs/{id}"), &token).await;
    let digest = job["spec"]["code"]["digest"].as_str().expect("the job records its code").to_string();
    assert!(digest.starts_with("sha256:") && job["spec"]["code"]["size_bytes"].as_u64() > Some(0), "{job}");
    // `yard jobs show` names the archive by digest with its size in human units.
    let size = human_memory(job["spec"]["code"]["size_bytes"].as_u64().unwrap());
    let shown = stdout(&env.yard(&token, &["jobs", "show", &id]));
    assert!(shown.contains(&format!("code:      {digest} ({size})\n")), "{shown}");
    let web = trainyard_tests::web::WebClient::signed_in(&env.server.url, &token).await;
    let (_, page) = web.get(&format!("/jobs/{id}")).await;
    assert!(page.contains(&format!("({size}, shipped with the job)")), "the job page says the same: {page}");

    // The same folder again: the same digest. Another tenant cannot name it.
    let again = env.yard_in(&project, &token, &["submit", "--", "python3", "train.py"]);
    let (_, second) = env.get(&format!("/api/v1/jobs/{}", stdout(&again).trim()), &token).await;
    assert_eq!(second["spec"]["code"]["digest"], digest.as_str());
    let (status, _) = env.post("/api/v1/admin/tenants", &token, &json!({"name": "team-b"})).await;
    assert_eq!(status, StatusCode::CREATED);
    let bob = env.member("team-b", "bob", "member").await;
    let (status, body) =
        env.post("/api/v1/jobs", &bob, &json!({"command": ["python3", "train.py"], "code": digest})).await;
    assert_eq!(status, StatusCode::UNPROCESSABLE_ENTITY, "{body}");
    assert_eq!(body["error"]["field"], "code", "{body}");

    // An archive over the limit is refused with the API's own error, and nothing is stored.
    let huge = reqwest::Client::new()
        .put(format!("{}/api/v1/code/sha256:{}", env.server.url, "0".repeat(64)))
        .bearer_auth(&token)
        .header("content-type", "application/octet-stream")
        .body(vec![0u8; 33 << 20])
        .send()
        .await
        .unwrap();
    assert_eq!(huge.status(), StatusCode::PAYLOAD_TOO_LARGE);
    let body: serde_json::Value = huge.json().await.unwrap();
    assert_eq!(body["error"]["code"], "payload_too_large", "{body}");
    // A wrong digest for the bytes names the digest.
    let (status, body) = {
        let response = reqwest::Client::new()
            .put(format!("{}/api/v1/code/sha256:{}", env.server.url, "0".repeat(64)))
            .bearer_auth(&token)
            .body(vec![0u8; 1024])
            .send()
            .await
            .unwrap();
        (response.status(), response.json::<serde_json::Value>().await.unwrap())
    };
    assert_eq!(status, StatusCode::UNPROCESSABLE_ENTITY, "{body}");
    assert_eq!(body["error"]["field"], "digest", "{body}");
}

/// `--time` is Slurm's time limit: an attempt that runs that long is stopped and the job fails
/// without a restart, saying why; start estimates assume it takes that long.
#[tokio::test(flavor = "multi_thread")]
async fn a_job_past_its_time_limit_is_stopped_and_fails_without_a_restart() {
    let env = TestEnv::start().await;
    let token = env.admin_token.clone();
    let refused = env.yard(&token, &["submit", "--time", "forever", "--", "sleep", "60"]);
    assert!(!refused.status.success());
    assert!(stderr(&refused).contains("--time"), "{}", stderr(&refused));

    let submitted = env.yard(&token, &["submit", "--time", "2s", "--max-restarts", "2", "--", "sleep", "60"]);
    assert!(submitted.status.success(), "{}", stderr(&submitted));
    let id = stdout(&submitted).trim().to_string();
    let started = Instant::now();
    let job = env.wait_job(&id, Duration::from_secs(30), |j| j["state"] == "failed").await;
    assert!(started.elapsed() < Duration::from_secs(20), "stopped near its limit, not at the end of its sleep");
    assert_eq!(job["reason"], "stopped at its time limit of 2s (not restarted)", "{job}");
    assert_eq!(job["restart_count"], 0, "a time limit is not a failure to retry");
    assert_eq!(job["spec"]["time_limit_seconds"], 2);
    let expected: Option<i32> = sqlx::query_scalar("SELECT expected_runtime_seconds FROM jobs WHERE id = $1::uuid")
        .bind(&id)
        .fetch_one(&env.db.pool)
        .await
        .unwrap();
    assert_eq!(expected, Some(2), "estimates assume the limit");
}

/// `yard diff A B` shows only what differs between two runs (here one variable), in a table per
/// section or as JSON; a run compared with itself has no differences.
#[tokio::test(flavor = "multi_thread")]
async fn yard_diff_shows_only_what_differs_between_two_runs() {
    let env = TestEnv::start().await;
    let token = env.admin_token.clone();
    let submit = |lr: &'static str| {
        let out = env.yard(&token, &["submit", "--name", "sweep", "-e", lr, "--", "sh", "-c", "echo $LR"]);
        assert!(out.status.success(), "{}", stderr(&out));
        stdout(&out).trim().to_string()
    };
    let (a, b) = (submit("LR=0.1"), submit("LR=0.01"));
    for id in [&a, &b] {
        env.wait_state(id, "succeeded", Duration::from_secs(30)).await;
    }
    let table = stdout(&env.yard(&token, &["diff", &a[..13], &b[..13]]));
    assert!(table.contains("spec.env.LR") && table.contains("0.1") && table.contains("0.01"), "{table}");
    assert!(table.contains("1 fields differ"), "only the variable differs: {table}");

    let json = env.yard(&token, &["diff", &a, &b, "-o", "json"]);
    let json: serde_json::Value = serde_json::from_slice(&json.stdout).unwrap();
    let spec = json["sections"].as_array().unwrap().iter().find(|s| s["name"] == "spec").unwrap();
    assert_eq!(spec["fields"], json!([{"field": "spec.env.LR", "values": ["0.1", "0.01"], "differs": true}]), "{json}");
    assert_eq!(json["differ"], 1, "{json}");

    let itself = stdout(&env.yard(&token, &["diff", &a, &a]));
    assert!(itself.starts_with("no differences"), "{itself}");
}

#[tokio::test(flavor = "multi_thread")]
async fn the_cli_ends_quietly_when_its_reader_goes_away() {
    // `yard jobs ls | head -1`: once the reader has gone, yard stops without a panic or a word.
    let env = TestEnv::start().await;
    for _ in 0..3 {
        env.submit(serde_json::json!({"command": ["true"], "resources": {"gpus": 64}})).await;
    }
    // `true` has exited before yard's answer arrives, so yard writes into a closed pipe.
    let script = format!("'{}' jobs ls -o json | true", trainyard_tests::bin("yard").display());
    let output = std::process::Command::new("bash")
        .args(["-o", "pipefail", "-c", &script])
        .env("HOME", env.dir.path())
        .env("TRAINYARD_URL", &env.server.url)
        .env("TRAINYARD_TOKEN", &env.admin_token)
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(!stderr.contains("panicked"), "{stderr}");
    assert!(stderr.is_empty(), "nothing on stderr: {stderr}");
}

/// A client that stops following a quiet job's log frees its stream at once, though the job
/// prints nothing more: `trainyard_log_streams` counts the stream while it is read and falls
/// back within seconds of the client going. On the local executor the follower polls the log
/// file; on a cluster it reads the kubelet's followed stream, which sends nothing while the pod
/// is quiet: there the follower waited for the pod's next line (or its end) before.
#[tokio::test(flavor = "multi_thread")]
async fn a_follower_that_goes_away_frees_its_stream_though_the_job_is_quiet() {
    let env = TestEnv::start().await;
    let id = env.submit(json!({"command": ["sh", "-c", "echo started; sleep 300"]})).await;
    env.wait_state(&id, "running", Duration::from_secs(30)).await;
    follower_goes_away(&env, &id, "started").await;

    let scratch = tempfile::tempdir().unwrap();
    let fake = trainyard_tests::FakeApiServer::start(scratch.path(), &["1"]);
    let env = TestEnv::start_with_env(
        &["--executor", "kubernetes", "--kube-image", "registry.example/runtime:1"],
        &[("KUBECONFIG".to_string(), fake.kubeconfig.display().to_string())],
    )
    .await;
    let id = env.submit(json!({"command": ["sleep", "300"]})).await;
    env.wait_state(&id, "running", Duration::from_secs(30)).await;
    follower_goes_away(&env, &id, "").await;
}

/// Follows the job's log until it has shown `first`, checks the stream is counted, goes away,
/// and waits for the count to fall.
async fn follower_goes_away(env: &TestEnv, id: &str, first: &str) {
    let streams = || async {
        let text = env.metrics_text().await;
        let line = text.lines().find(|l| l.starts_with("trainyard_log_streams ")).unwrap_or_else(|| panic!("{text}"));
        line.split_whitespace().nth(1).unwrap().parse::<f64>().unwrap()
    };
    let mut follower = reqwest::Client::new()
        .get(format!("{}/api/v1/jobs/{id}/logs?follow=true", env.server.url))
        .bearer_auth(&env.admin_token)
        .send()
        .await
        .unwrap();
    assert_eq!(follower.status(), StatusCode::OK);
    let mut seen = String::new();
    while !seen.contains(first) {
        let chunk = tokio::time::timeout(Duration::from_secs(10), follower.chunk()).await.unwrap().unwrap().unwrap();
        seen.push_str(&String::from_utf8_lossy(&chunk));
    }
    let deadline = Instant::now() + Duration::from_secs(5);
    while streams().await != 1.0 {
        assert!(Instant::now() < deadline, "the stream was never counted");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    drop(follower);
    let deadline = Instant::now() + Duration::from_secs(5);
    while streams().await != 0.0 {
        assert!(Instant::now() < deadline, "the stream of a client that went away stayed open");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// A pod the kube-scheduler cannot place (the nodes' CPU is held by pods Trainyard does not
/// know): the job stays `starting`, and its reason says what the pod says, within a pass or two,
/// not ten minutes of silence.
#[tokio::test(flavor = "multi_thread")]
async fn a_job_whose_pod_the_cluster_cannot_place_says_why_while_it_waits() {
    let scratch = tempfile::tempdir().unwrap();
    let fake = trainyard_tests::FakeApiServer::start(scratch.path(), &["1", "--cpu-free", "1000"]);
    let env = TestEnv::start_with_env(
        &["--executor", "kubernetes", "--kube-image", "registry.example/runtime:1"],
        &[("KUBECONFIG".to_string(), fake.kubeconfig.display().to_string())],
    )
    .await;
    let id = env.submit(json!({"command": ["true"], "resources": {"cpu": 2}})).await;
    let deadline = std::time::Instant::now() + Duration::from_secs(20);
    let job = loop {
        let (_, job) = env.get(&format!("/api/v1/jobs/{id}"), &env.admin_token).await;
        if job["reason"].as_str().is_some_and(|r| r.contains("Insufficient cpu")) {
            break job;
        }
        assert!(std::time::Instant::now() < deadline, "no reason said why the pod waits: {job}");
        tokio::time::sleep(Duration::from_millis(200)).await;
    };
    assert_eq!(job["state"], "starting", "{job}");
    assert!(job["reason"].as_str().unwrap().starts_with("replica 0 waits: 0/1 nodes are available"), "{job}");
    // A job the cluster can place runs, and its reason is gone once it does.
    let placed = env.submit(json!({"command": ["sleep", "300"], "resources": {"cpu": 0.5}})).await;
    let job = env.wait_state(&placed, "running", Duration::from_secs(20)).await;
    assert!(job["reason"].is_null(), "{job}");
}

/// Kubernetes ships a job's code in the attempt's ConfigMap (1 MiB at most): code larger than
/// that is refused at submit, naming the limit and the way out, and nothing is queued; it used
/// to queue, wait its turn and fail only at its launch.
#[tokio::test(flavor = "multi_thread")]
async fn code_larger_than_the_cluster_delivers_is_refused_at_submit() {
    let scratch = tempfile::tempdir().unwrap();
    let fake = trainyard_tests::FakeApiServer::start(scratch.path(), &["1"]);
    let env = TestEnv::start_with_env(
        &["--executor", "kubernetes", "--kube-image", "registry.example/runtime:1"],
        &[("KUBECONFIG".to_string(), fake.kubeconfig.display().to_string())],
    )
    .await;
    let project = env.dir.path().join("project");
    std::fs::create_dir_all(&project).unwrap();
    // Bytes no compression shrinks (an xorshift sequence), 1.5 MiB of them.
    let mut state = 0x2545_f491_4f6c_dd1d_u64;
    let noise: Vec<u8> = (0..(3 << 19))
        .map(|_| {
            state ^= state << 13;
            state ^= state >> 7;
            state ^= state << 17;
            state as u8
        })
        .collect();
    std::fs::write(project.join("weights.bin"), noise).unwrap();
    let refused = env.yard_in(&project, &env.admin_token, &["submit", "--", "true"]);
    assert!(!refused.status.success(), "{}", stdout(&refused));
    let said = stderr(&refused);
    assert!(
        said.contains("code") && said.contains("more than this cluster delivers") && said.contains("image or a volume"),
        "{said}"
    );
    assert_eq!(env.jobs_in_db().await, 0, "nothing was queued");

    std::fs::write(project.join("weights.bin"), b"small").unwrap();
    let accepted = env.yard_in(&project, &env.admin_token, &["submit", "--", "true"]);
    assert!(accepted.status.success(), "{}", stderr(&accepted));
}
