//! The control loop cannot be stopped by any single job: a row that does not decode, a job
//! whose handling panics and a job whose end the database refuses are each reported and
//! skipped, and every other job goes on.

use std::time::Duration;

use serde_json::json;
use trainyard_tests::{StatusCode, TestEnv};

#[tokio::test(flavor = "multi_thread")]
async fn a_job_whose_spec_does_not_decode_is_reported_and_skipped_while_others_run() {
    let env = TestEnv::start().await;
    let broken = env.submit(json!({"command": ["true"], "resources": {"gpus": 64}})).await;
    // A row this version cannot read (a bad migration, a hand edit, a newer server's format).
    sqlx::query("UPDATE jobs SET spec = '{\"commandz\": 1}'::jsonb WHERE id = $1::uuid")
        .bind(&broken)
        .execute(&env.db.pool)
        .await
        .unwrap();

    let (status, _) = env.post("/api/v1/admin/tenants", &env.admin_token, &json!({"name": "team-b"})).await;
    assert_eq!(status, StatusCode::CREATED);
    let bob = env.member("team-b", "bob", "member").await;
    let (status, job) = env.post("/api/v1/jobs", &bob, &json!({"command": ["true"]})).await;
    assert_eq!(status, StatusCode::CREATED, "{job}");
    let id = job["id"].as_str().unwrap();
    env.wait_job_as(&bob, id, Duration::from_secs(30), |j| j["state"] == "succeeded").await;

    let (state, reason): (String, Option<String>) =
        sqlx::query_as("SELECT state, reason FROM jobs WHERE id = $1::uuid")
            .bind(&broken)
            .fetch_one(&env.db.pool)
            .await
            .unwrap();
    assert_eq!(state, "queued", "its state is left as it was");
    let reason = reason.unwrap_or_default();
    assert!(reason.starts_with("cannot be handled: its stored spec does not decode"), "{reason}");
    let events: i64 = sqlx::query_scalar(
        "SELECT count(*) FROM job_events WHERE job_id = $1::uuid AND reason LIKE 'cannot be handled:%'",
    )
    .bind(&broken)
    .fetch_one(&env.db.pool)
    .await
    .unwrap();
    assert_eq!(events, 1, "one event records it, however many passes saw it");
    let log = std::fs::read_to_string(env.data_dir().join("server.log")).unwrap();
    assert!(log.contains("a job cannot be handled") && log.contains(&broken), "the log names the job");
    let (_, readiness) = env.call(reqwest::Method::GET, "/readyz", None, None).await;
    assert_eq!(readiness["unhandled_jobs"], 1, "{readiness}");

    // Its owner still sees it (alone and in the list, which one bad row must not break), says
    // why, and can cancel it.
    let (status, shown) = env.get(&format!("/api/v1/jobs/{broken}"), &env.admin_token).await;
    assert_eq!(status, StatusCode::OK, "{shown}");
    assert!(shown["spec_unreadable"].as_str().unwrap().contains("does not decode"), "{shown}");
    let (status, list) = env.get("/api/v1/jobs", &env.admin_token).await;
    assert_eq!(status, StatusCode::OK, "{list}");
    assert_eq!(list["items"][0]["id"], broken.as_str());
    let (status, page) = trainyard_tests::web::WebClient::signed_in(&env.server.url, &env.admin_token)
        .await
        .get(&format!("/jobs/{broken}"))
        .await;
    assert_eq!(status, StatusCode::OK, "{page}");
    let (status, cancelled) = env.post(&format!("/api/v1/jobs/{broken}/cancel"), &env.admin_token, &json!({})).await;
    assert_eq!(status, StatusCode::OK, "{cancelled}");
    env.wait_state(&broken, "cancelled", Duration::from_secs(10)).await;
}

#[tokio::test(flavor = "multi_thread")]
async fn a_panic_while_launching_one_job_does_not_stop_scheduling() {
    let marker = "fault-marker-3f9c";
    let env = TestEnv::start_with_env(&[], &[("TRAINYARD_FAULT_PANIC_ON_LAUNCH".into(), marker.into())]).await;
    let faulty = env.submit(json!({"command": ["echo", marker]})).await;
    let mut others = Vec::new();
    for _ in 0..3 {
        others.push(env.submit(json!({"command": ["true"]})).await);
    }
    for id in &others {
        env.wait_state(id, "succeeded", Duration::from_secs(30)).await;
    }
    let job = env
        .wait_job(&faulty, Duration::from_secs(10), |j| {
            j["reason"].as_str().is_some_and(|r| r.starts_with("cannot be handled"))
        })
        .await;
    assert_eq!(job["state"], "admitted", "its state is left as it was: {job}");
    assert!(job["reason"].as_str().unwrap().contains("fault injected"), "{job}");

    let (status, readiness) = env.call(reqwest::Method::GET, "/readyz", None, None).await;
    assert_eq!(status, StatusCode::OK, "the loop goes on, so the server stays ready: {readiness}");
    assert_eq!(readiness["leader"], true);
    assert!(readiness["panics"].as_u64().unwrap() >= 1, "{readiness}");
    assert!(readiness["last_panic"].as_str().unwrap().contains("fault injected"), "{readiness}");
    let log = std::fs::read_to_string(env.data_dir().join("server.log")).unwrap();
    assert!(log.contains("handling a job panicked") && log.contains("fault injected"), "the panic is in the log");
    // Jobs submitted after the panic run too.
    let later = env.submit(json!({"command": ["true"]})).await;
    env.wait_state(&later, "succeeded", Duration::from_secs(30)).await;
}

#[tokio::test(flavor = "multi_thread")]
async fn a_job_whose_end_the_database_refuses_waits_alone_while_others_end() {
    let env = TestEnv::start().await;
    // A pass records all the ends it saw in one transaction; one the database refuses must not
    // take the others with it, pass after pass.
    let refused = env.submit(json!({"command": ["sleep", "0.3"]})).await;
    sqlx::raw_sql(
        "CREATE TABLE refused_ends (job_id uuid PRIMARY KEY);
         CREATE FUNCTION refuse_this_end() RETURNS trigger LANGUAGE plpgsql AS $$
         BEGIN
             IF NEW.ended_at IS NOT NULL AND EXISTS (SELECT 1 FROM refused_ends WHERE job_id = NEW.job_id) THEN
                 RAISE EXCEPTION 'this end is refused by the test';
             END IF;
             RETURN NEW;
         END $$;
         CREATE TRIGGER refuse_this_end BEFORE UPDATE ON job_attempts FOR EACH ROW EXECUTE FUNCTION refuse_this_end();",
    )
    .execute(&env.db.pool)
    .await
    .unwrap();
    sqlx::query("INSERT INTO refused_ends VALUES ($1::uuid)").bind(&refused).execute(&env.db.pool).await.unwrap();
    env.wait_state(&refused, "running", Duration::from_secs(30)).await;
    // Its process is long gone; its end is tried (and refused) at every pass.
    tokio::time::sleep(Duration::from_secs(2)).await;
    let mut others = Vec::new();
    for _ in 0..3 {
        others.push(env.submit(json!({"command": ["sleep", "0.3"]})).await);
    }
    for id in &others {
        env.wait_state(id, "succeeded", Duration::from_secs(30)).await;
    }
    let (_, job) = env.get(&format!("/api/v1/jobs/{refused}"), &env.admin_token).await;
    assert_eq!(job["state"], "running", "its end is not recorded while refused: {job}");
    let log = std::fs::read_to_string(env.data_dir().join("server.log")).unwrap();
    assert!(log.contains("recording them one at a time"), "the log says the batch was refused");
    assert!(log.contains("this end is refused by the test") && log.contains(&refused), "the log names the job");

    // Once the database takes it, its end is recorded as it happened.
    sqlx::raw_sql("DROP TRIGGER refuse_this_end ON job_attempts").execute(&env.db.pool).await.unwrap();
    env.wait_state(&refused, "succeeded", Duration::from_secs(30)).await;
}

#[tokio::test(flavor = "multi_thread")]
async fn a_failed_jobs_last_words_with_a_nul_become_its_reason() {
    let env = TestEnv::start().await;
    let id = env.submit(json!({"command": ["python3", "-c", "import sys; print('bad\\x00byte'); sys.exit(3)"]})).await;
    env.wait_state(&id, "failed", Duration::from_secs(30)).await;
    let (_, job) = env.get(&format!("/api/v1/jobs/{id}"), &env.admin_token).await;
    let reason = job["reason"].as_str().unwrap_or_default();
    assert!(reason.contains("exited with code 3") && reason.contains("bad\u{FFFD}byte"), "{job}");
}

#[tokio::test(flavor = "multi_thread")]
async fn an_attempt_changed_in_the_database_alone_is_read_again() {
    let env = TestEnv::start().await;
    // The loop keeps each unfinished job's decoded row by the versions of the job's row and of
    // its latest attempt's: a change of the attempt alone must reach it too. Here its start is
    // moved an hour back, so its time limit is long past.
    let id = env.submit(json!({"command": ["sleep", "300"], "time_limit_seconds": 600})).await;
    env.wait_state(&id, "running", Duration::from_secs(30)).await;
    tokio::time::sleep(Duration::from_secs(1)).await;
    let moved = sqlx::query(
        "UPDATE job_attempts SET started_at = started_at - interval '1 hour' WHERE job_id = $1::uuid AND ended_at IS NULL",
    )
    .bind(&id)
    .execute(&env.db.pool)
    .await
    .unwrap();
    assert_eq!(moved.rows_affected(), 1);
    let job = env.wait_state(&id, "failed", Duration::from_secs(30)).await;
    assert!(job["reason"].as_str().unwrap_or_default().contains("time limit"), "{job}");
}

#[tokio::test(flavor = "multi_thread")]
async fn a_spec_changed_in_the_database_after_the_loop_read_it_is_read_again() {
    let env = TestEnv::start().await;
    // The loop keeps each unfinished job's decoded spec by row version: a change of the row (a
    // hand edit, a migration) must reach it however long ago it was read.
    let id = env.submit(json!({"command": ["true"], "resources": {"gpus": 64}})).await;
    let waiting = env.wait_state(&id, "queued", Duration::from_secs(10)).await;
    let deadline = std::time::Instant::now() + Duration::from_secs(30);
    while env.get(&format!("/api/v1/jobs/{id}"), &env.admin_token).await.1["reason"].is_null() {
        assert!(std::time::Instant::now() < deadline, "the loop never said why it waits: {waiting}");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    tokio::time::sleep(Duration::from_secs(1)).await;
    sqlx::query("UPDATE jobs SET spec = jsonb_set(spec, '{resources,gpus}', '0') WHERE id = $1::uuid")
        .bind(&id)
        .execute(&env.db.pool)
        .await
        .unwrap();
    env.wait_state(&id, "succeeded", Duration::from_secs(30)).await;
}
