//! The control plane crashes (SIGKILL) and comes back: every job is accounted for.

use std::time::Duration;

use serde_json::json;
use trainyard_tests::TestEnv;

/// A replica that waits for a file to appear, then exits with `code`.
fn wait_for(marker: &std::path::Path, code: i32) -> serde_json::Value {
    let script = format!("while [ ! -e '{}' ]; do sleep 0.1; done; exit {code}", marker.display());
    json!({"command": ["sh", "-c", script], "resources": {"cpu": 0.5}})
}

#[tokio::test(flavor = "multi_thread")]
async fn after_a_crash_running_jobs_are_readopted_with_their_true_state_and_vanished_ones_are_lost() {
    let mut env = TestEnv::start().await;
    let during = env.dir.path().join("end-during-outage");
    let after = env.dir.path().join("end-after-restart");

    let ends_ok_during = env.submit(wait_for(&during, 0)).await;
    let ends_7_during = env.submit(wait_for(&during, 7)).await;
    let ends_ok_after = env.submit(wait_for(&after, 0)).await;
    let vanishes = env.submit(json!({"command": ["sleep", "600"], "resources": {"cpu": 0.5}})).await;
    for id in [&ends_ok_during, &ends_7_during, &ends_ok_after, &vanishes] {
        env.wait_state(id, "running", Duration::from_secs(30)).await;
    }
    let vanishing_group = env.replica_pids(&vanishes, 1).await[0];

    // The server dies hard. Meanwhile two jobs end on their own and one is killed outright,
    // supervisor and all, so that nothing records how it ended.
    env.server.kill_hard();
    std::fs::write(&during, "").unwrap();
    nix::sys::signal::killpg(nix::unistd::Pid::from_raw(vanishing_group as i32), nix::sys::signal::Signal::SIGKILL)
        .unwrap();
    tokio::time::sleep(Duration::from_millis(500)).await;

    env.restart_after_crash();
    let job = env.wait_state(&ends_ok_during, "succeeded", Duration::from_secs(30)).await;
    assert_eq!(job["restart_count"], 0);
    let job = env.wait_state(&ends_7_during, "failed", Duration::from_secs(30)).await;
    assert_eq!(job["reason"], "replica 0 exited with code 7", "the true exit code, read after the restart");
    let job = env.wait_state(&vanishes, "failed", Duration::from_secs(30)).await;
    assert_eq!(job["reason"], "lost");
    let (_, attempts) = env.get(&format!("/api/v1/jobs/{vanishes}/attempts"), &env.admin_token).await;
    assert_eq!(attempts[0]["exit_codes"], json!([null]), "no exit code is invented for a lost replica");

    // Still running across the restart: re-adopted, and its end is seen when it comes.
    let job = env.wait_state(&ends_ok_after, "running", Duration::from_secs(5)).await;
    assert!(job["finished_at"].is_null());
    std::fs::write(&after, "").unwrap();
    env.wait_state(&ends_ok_after, "succeeded", Duration::from_secs(30)).await;
    let (_, attempts) = env.get(&format!("/api/v1/jobs/{ends_ok_after}/attempts"), &env.admin_token).await;
    assert_eq!(attempts.as_array().unwrap().len(), 1, "re-adopted, not relaunched");
}

#[tokio::test(flavor = "multi_thread")]
async fn a_clean_shutdown_leaves_jobs_running_for_the_next_start() {
    let mut env = TestEnv::start().await;
    let marker = env.dir.path().join("finish");
    let id = env.submit(wait_for(&marker, 0)).await;
    env.wait_state(&id, "running", Duration::from_secs(30)).await;
    let status = env.server.stop();
    assert!(status.success(), "SIGTERM ends the server cleanly: {status:?}");
    let pid = env.replica_pids_from_db(&id).await;
    assert!(trainyard_tests::group_alive(pid), "the job survives a restart of the control plane");
    env.restart_after_crash();
    std::fs::write(&marker, "").unwrap();
    env.wait_state(&id, "succeeded", Duration::from_secs(30)).await;
}

#[tokio::test(flavor = "multi_thread")]
async fn one_server_leads_the_control_loops_and_a_standby_takes_over() {
    let mut env = TestEnv::start().await;
    let standby = trainyard_tests::ServerProcess::start(&env.db.url, &env.dir.path().join("standby"));
    let via_standby = |body: serde_json::Value| {
        let (url, token) = (standby.url.clone(), env.admin_token.clone());
        async move {
            let response = reqwest::Client::new()
                .post(format!("{url}/api/v1/jobs"))
                .bearer_auth(token)
                .json(&body)
                .send()
                .await
                .unwrap();
            assert_eq!(response.status(), reqwest::StatusCode::CREATED);
            response.json::<serde_json::Value>().await.unwrap()["id"].as_str().unwrap().to_string()
        }
    };
    // Submitted through the standby, run by the leader, exactly once.
    let first = via_standby(json!({"command": ["true"]})).await;
    env.wait_state(&first, "succeeded", Duration::from_secs(30)).await;
    let (_, attempts) = env.get(&format!("/api/v1/jobs/{first}/attempts"), &env.admin_token).await;
    assert_eq!(attempts.as_array().unwrap().len(), 1);
    assert!(!env.dir.path().join("standby/jobs").read_dir().unwrap().any(|_| true), "the standby launched nothing");

    // The leader dies; the standby leads from then on.
    env.server.kill_hard();
    let second = via_standby(json!({"command": ["true"]})).await;
    let deadline = std::time::Instant::now() + Duration::from_secs(30);
    loop {
        let state: String = sqlx::query_scalar("SELECT state FROM jobs WHERE id = $1::uuid")
            .bind(&second)
            .fetch_one(&env.db.pool)
            .await
            .unwrap();
        if state == "succeeded" {
            break;
        }
        assert!(std::time::Instant::now() < deadline, "the standby never took over; the job is {state}");
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    drop(standby);
}

/// A failing job restarts after a back-off that doubles each time (1 s, 2 s, 4 s here), so a
/// crash loop does not burn its restarts in seconds.
#[tokio::test(flavor = "multi_thread")]
async fn restarts_back_off_twice_as_long_each_time() {
    let env = TestEnv::start_with(&["--restart-backoff-seconds", "1"]).await;
    let starts = env.dir.path().join("starts");
    let script = format!("date +%s.%N >> {}; exit 3", starts.display());
    let id = env.submit(json!({"command": ["sh", "-c", script], "max_restarts": 3})).await;
    let job = env.wait_job(&id, Duration::from_secs(60), |j| j["state"] == "failed").await;
    assert_eq!(job["restart_count"], 3, "{job}");
    let times: Vec<f64> =
        std::fs::read_to_string(&starts).unwrap().lines().map(|l| l.trim().parse().unwrap()).collect();
    assert_eq!(times.len(), 4, "{times:?}");
    let gaps: Vec<f64> = times.windows(2).map(|w| w[1] - w[0]).collect();
    for (n, gap) in gaps.iter().enumerate() {
        let wanted = f64::from(1u32 << n);
        assert!(*gap >= wanted - 0.05, "restart {} came {gap:.2} s after the attempt before; wanted {wanted} s", n + 1);
        assert!(*gap < wanted + 3.0, "restart {} waited {gap:.2} s, far more than {wanted} s", n + 1);
    }
}

/// A failure that would happen again however often it ran (a Python import error) ends the job
/// at once, with its restarts left unused and a reason that says why.
#[tokio::test(flavor = "multi_thread")]
async fn an_import_error_is_not_restarted_and_says_why() {
    let env = TestEnv::start().await;
    let python = std::env::var("TRAINYARD_TEST_PYTHON").unwrap_or_else(|_| "python3".into());
    let id =
        env.submit(json!({"command": [python, "-c", "import no_such_module_for_trainyard"], "max_restarts": 3})).await;
    let job = env.wait_job(&id, Duration::from_secs(30), |j| j["finished_at"].is_string()).await;
    assert_eq!(job["state"], "failed", "{job}");
    assert_eq!(job["restart_count"], 0, "{job}");
    let reason = job["reason"].as_str().unwrap();
    assert!(reason.contains("ModuleNotFoundError"), "{reason}");
    assert!(
        reason.contains("not restarted: a Python import or syntax error fails the same way every time"),
        "{reason}"
    );
}
