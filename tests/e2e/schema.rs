//! Invariants held by Postgres itself, whatever the Rust code does.

use trainyard_core::job::JobState;
use trainyard_tests::TestDb;

#[tokio::test(flavor = "multi_thread")]
async fn the_database_and_the_core_agree_on_the_state_machine() {
    let db = TestDb::fresh().await;
    let mut in_sql: Vec<(String, String)> =
        sqlx::query_as("SELECT from_state, to_state FROM job_state_transitions").fetch_all(&db.pool).await.unwrap();
    in_sql.sort();
    let mut in_rust: Vec<(String, String)> =
        JobState::TRANSITIONS.iter().map(|(a, b)| (a.as_str().to_string(), b.as_str().to_string())).collect();
    in_rust.sort();
    assert_eq!(in_sql, in_rust);
}

/// The control plane's sessions never JIT-compile: its queries are short, and compiling one the
/// planner overestimates cost more than running it (67 ms for the unfinished jobs' read).
#[tokio::test(flavor = "multi_thread")]
async fn the_stores_sessions_run_without_jit() {
    let db = TestDb::fresh().await;
    let jit: String = sqlx::query_scalar("SHOW jit").fetch_one(&db.pool).await.unwrap();
    assert_eq!(jit, "off");
}

#[tokio::test(flavor = "multi_thread")]
async fn an_illegal_transition_cannot_be_persisted() {
    let db = TestDb::fresh().await;
    let store = trainyard_store::Store::from_pool(db.pool.clone());
    store.bootstrap("default", "admin").await.unwrap();
    let job_id: uuid::Uuid = sqlx::query_scalar(
        "INSERT INTO jobs (id, tenant_id, name, spec, last_actor, created_by)
         SELECT gen_random_uuid(), t.id, 'x', '{}', 'test', u.id FROM tenants t, users u RETURNING id",
    )
    .fetch_one(&db.pool)
    .await
    .unwrap();
    for illegal in ["running", "succeeded", "restarting"] {
        let err = sqlx::query("UPDATE jobs SET state = $1 WHERE id = $2")
            .bind(illegal)
            .bind(job_id)
            .execute(&db.pool)
            .await
            .expect_err(illegal);
        assert!(err.to_string().contains("illegal job state transition queued -> "), "{err}");
    }
    // Starting anywhere but queued is refused as well.
    let err = sqlx::query(
        "INSERT INTO jobs (id, tenant_id, name, spec, last_actor, created_by, state)
         SELECT gen_random_uuid(), t.id, 'x', '{}', 'test', u.id, 'running' FROM tenants t, users u",
    )
    .execute(&db.pool)
    .await
    .unwrap_err();
    assert!(err.to_string().contains("must start queued"), "{err}");
    // A legal move is recorded as an event by the database itself.
    sqlx::query("UPDATE jobs SET state = 'cancelled', last_actor = 'test' WHERE id = $1")
        .bind(job_id)
        .execute(&db.pool)
        .await
        .unwrap();
    let events: Vec<String> = sqlx::query_scalar("SELECT to_state FROM job_events WHERE job_id = $1 ORDER BY seq")
        .bind(job_id)
        .fetch_all(&db.pool)
        .await
        .unwrap();
    assert_eq!(events, ["queued", "cancelled"]);
    let err =
        sqlx::query("UPDATE jobs SET state = 'queued' WHERE id = $1").bind(job_id).execute(&db.pool).await.unwrap_err();
    assert!(err.to_string().contains("cancelled -> queued"), "terminal states are final: {err}");
}

/// A job whose replicas ended before any pass saw them running went from `starting` to its end
/// and had no `started_at` ("Started -"): it takes its first launched attempt's start; a launch
/// that started nothing leaves it unset.
#[tokio::test(flavor = "multi_thread")]
async fn a_job_that_ends_before_it_is_seen_running_still_has_started() {
    let db = TestDb::fresh().await;
    let store = trainyard_store::Store::from_pool(db.pool.clone());
    store.bootstrap("default", "admin").await.unwrap();
    let job = |placed: bool| {
        let pool = db.pool.clone();
        async move {
            let id: uuid::Uuid = sqlx::query_scalar(
                "INSERT INTO jobs (id, tenant_id, name, spec, last_actor, created_by)
                 SELECT gen_random_uuid(), t.id, 'x', '{}', 'test', u.id FROM tenants t, users u RETURNING id",
            )
            .fetch_one(&pool)
            .await
            .unwrap();
            for state in ["admitted", "starting"] {
                sqlx::query("UPDATE jobs SET state = $1 WHERE id = $2")
                    .bind(state)
                    .bind(id)
                    .execute(&pool)
                    .await
                    .unwrap();
            }
            let placement = placed.then(|| serde_json::json!({"replicas": []}));
            sqlx::query(
                "INSERT INTO job_attempts (job_id, tenant_id, attempt, placement, started_at)
                 SELECT id, tenant_id, 1, $2, now() - interval '3 seconds' FROM jobs WHERE id = $1",
            )
            .bind(id)
            .bind(placement)
            .execute(&pool)
            .await
            .unwrap();
            sqlx::query("UPDATE jobs SET state = 'succeeded' WHERE id = $1").bind(id).execute(&pool).await.unwrap();
            let (started, attempt_started): (Option<chrono::DateTime<chrono::Utc>>, chrono::DateTime<chrono::Utc>) =
                sqlx::query_as(
                    "SELECT j.started_at, a.started_at FROM jobs j JOIN job_attempts a ON a.job_id = j.id WHERE j.id = $1",
                )
                .bind(id)
                .fetch_one(&pool)
                .await
                .unwrap();
            (started, attempt_started)
        }
    };
    let (started, attempt_started) = job(true).await;
    assert_eq!(started, Some(attempt_started), "it started when its attempt was launched");
    let (started, _) = job(false).await;
    assert_eq!(started, None, "a launch that placed nothing started nothing");
}

/// A transaction whose caller is cancelled while it begins leaves no transaction open on the
/// pooled connection. (sqlx 0.9.0's `Pool::begin` does, transact-rs/sqlx#4393: the next user of
/// the connection writes into a transaction nobody commits. A chaos run lost a job's writes and
/// stalled the control loops on the row locks it held.) The begin is cut off after each number
/// of polls in turn, so that one of them lands while `BEGIN` is on the wire; a pool of one
/// connection hands the same connection to the check that follows.
#[tokio::test(flavor = "multi_thread")]
async fn a_cancelled_begin_leaves_no_open_transaction_on_the_pooled_connection() {
    let db = TestDb::fresh().await;
    let pool = sqlx::postgres::PgPoolOptions::new().max_connections(1).connect(&db.url).await.unwrap();
    let store = trainyard_store::Store::from_pool(pool.clone());
    for polls in 1..=30 {
        {
            let mut begin = std::pin::pin!(store.begin());
            for _ in 0..polls {
                if futures_poll_once(begin.as_mut()).await {
                    break;
                }
                tokio::task::yield_now().await;
            }
        } // dropped here, finished or not
        // The pool's one connection, used again, is seen from another session: idle, not idle
        // inside a transaction. A begin that goes on after its caller left (as `Store::begin`'s
        // does) may hold it in a transaction for a moment, then rolls back; one left open stays.
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(3);
        loop {
            let backend: i32 = sqlx::query_scalar("SELECT pg_backend_pid()").fetch_one(&pool).await.unwrap();
            let state: String = sqlx::query_scalar("SELECT state FROM pg_stat_activity WHERE pid = $1")
                .bind(backend)
                .fetch_one(&db.pool)
                .await
                .unwrap();
            if state == "idle" {
                break;
            }
            assert!(
                std::time::Instant::now() < deadline,
                "a begin cut off after {polls} polls left its transaction open on the connection: {state}"
            );
            tokio::time::sleep(std::time::Duration::from_millis(20)).await;
        }
    }
}

/// Polls a future once; true when it finished.
async fn futures_poll_once<F: std::future::Future>(mut future: std::pin::Pin<&mut F>) -> bool {
    std::future::poll_fn(|cx| std::task::Poll::Ready(future.as_mut().poll(cx).is_ready())).await
}
