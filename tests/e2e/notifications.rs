//! Notifications (issue 43): webhooks when jobs end, fail or wait too long, signed as Standard
//! Webhooks sign, from an outbox in Postgres, delivered at least once. A small HTTP server in
//! the test is the receiver; it checks each signature with the secret shown at creation.

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use base64::Engine;
use hmac::{Hmac, Mac};
use serde_json::{Value, json};
use sha2::Sha256;
use trainyard_tests::{StatusCode, TestEnv, stdout};

/// One POST the receiver got.
#[derive(Debug, Clone)]
struct Received {
    id: String,
    timestamp: String,
    signature: String,
    body: Vec<u8>,
}

impl Received {
    fn json(&self) -> Value {
        serde_json::from_slice(&self.body).unwrap()
    }

    /// Whether the signature is right for `secret` (`whsec_<base64 key>`) and the timestamp
    /// recent, as a Standard Webhooks receiver checks (against replay: at most 5 minutes old).
    fn verified_with(&self, secret: &str) -> bool {
        let key = base64::engine::general_purpose::STANDARD.decode(secret.trim_start_matches("whsec_")).unwrap();
        let mut mac = Hmac::<Sha256>::new_from_slice(&key).unwrap();
        mac.update(format!("{}.{}.", self.id, self.timestamp).as_bytes());
        mac.update(&self.body);
        let expected = format!("v1,{}", base64::engine::general_purpose::STANDARD.encode(mac.finalize().into_bytes()));
        let age = chrono::Utc::now().timestamp() - self.timestamp.parse::<i64>().unwrap();
        self.signature.split(' ').any(|s| s == expected) && (0..300).contains(&age)
    }
}

/// A webhook receiver on `address` answering 200 to every POST, until dropped.
struct Receiver {
    received: Arc<Mutex<Vec<Received>>>,
    stop: Option<tokio::sync::oneshot::Sender<()>>,
}

impl Receiver {
    async fn start(address: SocketAddr, received: Arc<Mutex<Vec<Received>>>) -> Receiver {
        let listener = tokio::net::TcpListener::bind(address).await.expect("the receiver's address");
        let kept = Arc::clone(&received);
        let app = axum::Router::new().route(
            "/hook",
            axum::routing::post(move |headers: axum::http::HeaderMap, body: axum::body::Bytes| {
                let kept = Arc::clone(&kept);
                async move {
                    let header = |name: &str| headers.get(name).and_then(|v| v.to_str().ok()).unwrap_or("").to_string();
                    kept.lock().unwrap().push(Received {
                        id: header("webhook-id"),
                        timestamp: header("webhook-timestamp"),
                        signature: header("webhook-signature"),
                        body: body.to_vec(),
                    });
                    StatusCode::OK
                }
            }),
        );
        let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
        tokio::spawn(async move {
            axum::serve(listener, app)
                .with_graceful_shutdown(async move {
                    let _ = stopped.await;
                })
                .await
                .unwrap();
        });
        Receiver { received, stop: Some(stop) }
    }

    fn got(&self) -> Vec<Received> {
        self.received.lock().unwrap().clone()
    }

    /// Waits until `count` notices arrived; panics with what did after `timeout`.
    async fn wait_for(&self, count: usize, timeout: Duration) -> Vec<Received> {
        let deadline = Instant::now() + timeout;
        loop {
            let got = self.got();
            if got.len() >= count {
                return got;
            }
            assert!(Instant::now() < deadline, "{count} notices did not arrive in {timeout:?}; got {got:?}");
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }
}

impl Drop for Receiver {
    fn drop(&mut self) {
        if let Some(stop) = self.stop.take() {
            let _ = stop.send(());
        }
    }
}

/// A free address on the loopback interface (bound, then let go).
fn free_address() -> SocketAddr {
    std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap()
}

async fn subscribe(env: &TestEnv, token: &str, body: Value) -> (String, String) {
    let (status, created) = env.post("/api/v1/notifications/subscriptions", token, &body).await;
    assert_eq!(status, StatusCode::CREATED, "{created}");
    assert!(created["secret"].as_str().unwrap().starts_with("whsec_"), "{created}");
    (created["id"].as_str().unwrap().to_string(), created["secret"].as_str().unwrap().to_string())
}

async fn submit_as(env: &TestEnv, token: &str, body: Value) -> String {
    let (status, job) = env.post("/api/v1/jobs", token, &body).await;
    assert_eq!(status, StatusCode::CREATED, "{job}");
    job["id"].as_str().unwrap().to_string()
}

/// Each notice by kind and job, from the bodies' JSON.
fn by_kind_and_job(got: &[Received]) -> BTreeMap<(String, String), usize> {
    let mut seen = BTreeMap::new();
    for r in got {
        let body = r.json();
        let key = (body["type"].as_str().unwrap().to_string(), body["data"]["job_id"].as_str().unwrap().to_string());
        *seen.entry(key).or_insert(0) += 1;
    }
    seen
}

#[tokio::test]
async fn each_subscribed_event_arrives_once_with_a_valid_signature() {
    let env = TestEnv::start_with(&["--notify-allow-private-addresses"]).await;
    let alice = env.member("default", "alice", "member").await;
    let bob = env.member("default", "bob", "member").await;
    let address = free_address();
    let mine = Receiver::start(address, Default::default()).await;
    let url = format!("http://{address}/hook");
    // Alice: her own jobs' successes, failures and long waits.
    let (alice_sub, alice_secret) =
        subscribe(&env, &alice, json!({"url": url, "events": ["succeeded", "failed", "waiting"], "wait_seconds": 1}))
            .await;
    // The tenant's admin: every job's failures, as Slack messages, at another receiver.
    let team_address = free_address();
    let team = Receiver::start(team_address, Default::default()).await;
    let (_, team_secret) = subscribe(
        &env,
        &env.admin_token,
        json!({"url": format!("http://{team_address}/hook"), "events": ["failed"], "scope": "tenant", "format": "slack"}),
    )
    .await;

    let ok = submit_as(&env, &alice, json!({"name": "fine", "command": ["true"]})).await;
    let broken = submit_as(&env, &alice, json!({"name": "broken", "command": ["sh", "-c", "exit 3"]})).await;
    let waits = submit_as(&env, &alice, json!({"name": "big", "command": ["true"], "resources": {"gpus": 64}})).await;
    let bobs = submit_as(&env, &bob, json!({"name": "bobs", "command": ["sh", "-c", "exit 4"]})).await;
    for id in [&ok, &broken, &bobs] {
        env.wait_job_as(&alice, id, Duration::from_secs(60), |j| j["finished_at"].is_string()).await;
    }

    let got = mine.wait_for(3, Duration::from_secs(30)).await;
    let team_got = team.wait_for(2, Duration::from_secs(30)).await;
    // Long enough for a second delivery of any of them, or for bob's job to reach alice.
    tokio::time::sleep(Duration::from_secs(3)).await;
    let got_after = mine.got();
    assert_eq!(got_after.len(), 3, "each event once, bob's not at all: {got_after:?}");
    let expected: BTreeMap<(String, String), usize> = [
        (("job.succeeded".to_string(), ok.clone()), 1),
        (("job.failed".to_string(), broken.clone()), 1),
        (("job.waiting".to_string(), waits.clone()), 1),
    ]
    .into();
    assert_eq!(by_kind_and_job(&got), expected);
    for r in &got {
        assert!(r.verified_with(&alice_secret), "a valid, recent signature: {r:?}");
        assert!(!r.verified_with(&team_secret), "signed with this subscription's own secret");
    }
    let failed = got.iter().map(Received::json).find(|b| b["type"] == "job.failed").unwrap();
    assert_eq!(failed["data"]["job_name"], "broken", "{failed}");
    assert!(failed["data"]["reason"].as_str().unwrap().contains('3'), "the failure's reason: {failed}");

    // The team's Slack messages: both failures of the tenant, alice's and bob's.
    assert_eq!(team.got().len(), 2, "{team_got:?}");
    let texts: Vec<String> = team_got.iter().map(|r| r.json()["text"].as_str().unwrap().to_string()).collect();
    assert!(texts.iter().any(|t| t.contains("`broken`") && t.contains("failed")), "{texts:?}");
    assert!(texts.iter().any(|t| t.contains("`bobs`") && t.contains("failed")), "{texts:?}");
    assert!(team_got.iter().all(|r| r.verified_with(&team_secret)));

    // Alice reads the delivery log: each delivered at the first try, with the receiver's 200.
    let (status, deliveries) =
        env.get(&format!("/api/v1/notifications/subscriptions/{alice_sub}/deliveries"), &alice).await;
    assert_eq!(status, StatusCode::OK, "{deliveries}");
    let deliveries = deliveries.as_array().unwrap();
    assert_eq!(deliveries.len(), 3, "{deliveries:?}");
    for d in deliveries {
        assert_eq!(d["status"], "delivered", "{d}");
        assert_eq!(d["attempts"][0]["status_code"], 200, "{d}");
        assert!(got.iter().any(|r| r.id == d["id"].as_str().unwrap()), "the webhook-id is the notice's id: {d}");
    }
    let listed = env.yard(&alice, &["notify", "deliveries", &alice_sub]);
    assert!(listed.status.success(), "{listed:?}");
    let listed = stdout(&listed);
    assert_eq!(listed.matches("delivered").count(), 3, "{listed}");
    assert!(listed.contains("job.waiting"), "{listed}");

    // Removed, it hears nothing more.
    let removed = env.yard(&alice, &["notify", "rm", &alice_sub]);
    assert!(removed.status.success(), "{removed:?}");
    let after = submit_as(&env, &alice, json!({"command": ["sh", "-c", "exit 5"]})).await;
    env.wait_job_as(&alice, &after, Duration::from_secs(60), |j| j["state"] == "failed").await;
    team.wait_for(3, Duration::from_secs(30)).await;
    assert_eq!(mine.got().len(), 3, "{:?}", mine.got());
}

#[tokio::test]
async fn a_notice_survives_a_crash_and_reaches_a_receiver_that_was_down() {
    let mut env = TestEnv::start_with(&["--notify-allow-private-addresses"]).await;
    let address = free_address();
    let (sub, secret) =
        subscribe(&env, &env.admin_token, json!({"url": format!("http://{address}/hook"), "events": ["ended"]})).await;
    let job = env.submit(json!({"name": "done", "command": ["true"]})).await;
    env.wait_state(&job, "succeeded", Duration::from_secs(60)).await;

    // Nobody listens yet: the tries fail and are logged.
    let deadline = Instant::now() + Duration::from_secs(30);
    let log = loop {
        let (status, log) =
            env.get(&format!("/api/v1/notifications/subscriptions/{sub}/deliveries"), &env.admin_token).await;
        assert_eq!(status, StatusCode::OK, "{log}");
        if log[0]["attempts"].as_array().is_some_and(|a| !a.is_empty()) {
            break log;
        }
        assert!(Instant::now() < deadline, "no try logged: {log}");
        tokio::time::sleep(Duration::from_millis(200)).await;
    };
    assert_eq!(log[0]["status"], "retrying", "{log}");
    assert!(log[0]["attempts"][0]["status_code"].is_null(), "{log}");
    assert!(log[0]["attempts"][0]["error"].as_str().unwrap().contains("onnect"), "why it failed: {log}");

    // The server is killed with the notice still in its outbox; the receiver comes up.
    env.restart_after_crash_on_the_same_address();
    let receiver = Receiver::start(address, Default::default()).await;
    let got = receiver.wait_for(1, Duration::from_secs(60)).await;
    tokio::time::sleep(Duration::from_secs(3)).await;
    assert_eq!(receiver.got().len(), 1, "delivered once: {:?}", receiver.got());
    assert!(got[0].verified_with(&secret), "{got:?}");
    let body = got[0].json();
    assert_eq!(body["type"], "job.succeeded", "{body}");
    assert_eq!(body["data"]["job_id"], job.as_str(), "{body}");

    let (_, log) = env.get(&format!("/api/v1/notifications/subscriptions/{sub}/deliveries"), &env.admin_token).await;
    assert_eq!(log.as_array().unwrap().len(), 1, "{log}");
    assert_eq!(log[0]["status"], "delivered", "{log}");
    let attempts = log[0]["attempts"].as_array().unwrap();
    assert!(attempts.len() >= 2, "the failed tries and the one that got through: {log}");
    assert_eq!(attempts.last().unwrap()["status_code"], 200, "{log}");
}

#[tokio::test]
async fn subscriptions_are_their_tenants_and_bad_ones_are_refused_whole() {
    let env = TestEnv::start_with(&["--notify-allow-private-addresses"]).await;
    let alice = env.member("default", "alice", "member").await;
    let bob = env.member("default", "bob", "member").await;
    let viewer = env.member("default", "vera", "viewer").await;
    let (status, body) = env.post("/api/v1/admin/tenants", &env.admin_token, &json!({"name": "other"})).await;
    assert_eq!(status, StatusCode::CREATED, "{body}");
    let olga = env.member("other", "olga", "admin").await;

    let (sub, _) = subscribe(&env, &alice, json!({"url": "http://127.0.0.1:9/hook", "events": ["ended"]})).await;
    let deliveries = format!("/api/v1/notifications/subscriptions/{sub}/deliveries");
    let one = format!("/api/v1/notifications/subscriptions/{sub}");

    // Another tenant's admin neither sees, reads nor removes it; nor does a fellow member.
    for token in [&olga, &bob] {
        let (status, list) = env.get("/api/v1/notifications/subscriptions", token).await;
        assert_eq!(status, StatusCode::OK, "{list}");
        assert!(!list.to_string().contains(&sub), "{list}");
        assert_eq!(env.get(&deliveries, token).await.0, StatusCode::NOT_FOUND);
        assert_eq!(env.call(reqwest::Method::DELETE, &one, Some(token), None).await.0, StatusCode::NOT_FOUND);
    }
    let olga_rm = env.yard(&olga, &["notify", "rm", &sub]);
    assert!(!olga_rm.status.success(), "{olga_rm:?}");
    // The tenant's admin sees every subscription of the tenant.
    let (_, list) = env.get("/api/v1/notifications/subscriptions", &env.admin_token).await;
    assert!(list.to_string().contains(&sub), "{list}");
    // Through the CLI: the secret once at creation; the list never shows it.
    let added = env.yard(&alice, &["notify", "add", "http://127.0.0.1:9/hook", "--on", "waiting", "--after", "30m"]);
    assert!(added.status.success() && stdout(&added).contains("whsec_"), "{added:?}");
    let listed = env.yard(&alice, &["notify", "ls"]);
    assert!(stdout(&listed).contains("waiting (after 30m)"), "{listed:?}");
    assert!(listed.status.success() && stdout(&listed).contains(&sub), "{listed:?}");
    assert!(!stdout(&listed).contains("whsec_"), "{listed:?}");

    // A viewer cannot subscribe; a member cannot subscribe to the whole tenant.
    let hook = json!({"url": "http://127.0.0.1:9/hook", "events": ["ended"]});
    assert_eq!(env.post("/api/v1/notifications/subscriptions", &viewer, &hook).await.0, StatusCode::FORBIDDEN);
    let wide = json!({"url": "http://127.0.0.1:9/hook", "events": ["ended"], "scope": "tenant"});
    let (status, body) = env.post("/api/v1/notifications/subscriptions", &bob, &wide).await;
    assert_eq!(status, StatusCode::FORBIDDEN, "{body}");

    // Three mistakes, three errors, each naming its field.
    let bad = json!({"url": "file:///etc/passwd", "events": ["ended", "exploded"], "format": "teams"});
    let (status, body) = env.post("/api/v1/notifications/subscriptions", &alice, &bad).await;
    assert_eq!(status, StatusCode::UNPROCESSABLE_ENTITY, "{body}");
    let fields: Vec<&str> =
        body["error"]["errors"].as_array().unwrap().iter().map(|e| e["field"].as_str().unwrap()).collect();
    assert_eq!(fields, ["url", "events", "format"], "{body}");

    // Alice removes her own; it is gone.
    assert_eq!(env.call(reqwest::Method::DELETE, &one, Some(&alice), None).await.0, StatusCode::NO_CONTENT);
    assert_eq!(env.get(&deliveries, &alice).await.0, StatusCode::NOT_FOUND);
}

#[tokio::test]
async fn without_the_operators_leave_private_addresses_are_refused() {
    let env = TestEnv::start().await;
    for url in ["http://127.0.0.1:9/hook", "http://169.254.169.254/latest/meta-data", "http://[::1]/hook"] {
        let (status, body) = env
            .post("/api/v1/notifications/subscriptions", &env.admin_token, &json!({"url": url, "events": ["ended"]}))
            .await;
        assert_eq!(status, StatusCode::UNPROCESSABLE_ENTITY, "{url}: {body}");
        assert_eq!(body["error"]["field"], "url", "{body}");
    }
    // A name that resolves to the loopback address is refused when it is sent to, and logged.
    let (sub, _) =
        subscribe(&env, &env.admin_token, json!({"url": "http://localhost:9/hook", "events": ["ended"]})).await;
    let job = env.submit(json!({"command": ["true"]})).await;
    env.wait_state(&job, "succeeded", Duration::from_secs(60)).await;
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let (_, log) =
            env.get(&format!("/api/v1/notifications/subscriptions/{sub}/deliveries"), &env.admin_token).await;
        if let Some(error) = log[0]["attempts"][0]["error"].as_str() {
            assert!(error.contains("private or local"), "{log}");
            break;
        }
        assert!(Instant::now() < deadline, "no try logged: {log}");
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

/// The trigger's side, against Postgres alone: which changes of state make which notice, for
/// whom, and that a change rolled back leaves none (the notice is in the change's transaction).
#[tokio::test]
async fn the_outbox_holds_a_notice_exactly_when_its_change_of_state_commits() {
    let db = trainyard_tests::TestDb::fresh().await;
    let store = trainyard_store::Store::from_pool(db.pool.clone());
    store.bootstrap("default", "admin").await.unwrap();
    let pool = &db.pool;
    // Two subscriptions of the admin: their own jobs' preemptions and idle warnings; the
    // tenant's ended jobs.
    for (scope, events) in [("user", vec!["preempted", "idle"]), ("tenant", vec!["ended"])] {
        sqlx::query(
            "INSERT INTO notification_subscriptions (id, tenant_id, user_id, scope, url, format, events)
             SELECT gen_random_uuid(), m.tenant_id, m.user_id, $1, 'https://hooks.example.com/x', 'standard', $2
             FROM memberships m",
        )
        .bind(scope)
        .bind(&events)
        .execute(pool)
        .await
        .unwrap();
    }
    let id: uuid::Uuid = sqlx::query_scalar(
        "INSERT INTO jobs (id, tenant_id, name, spec, last_actor, created_by)
         SELECT gen_random_uuid(), t.id, 'x', '{}', 'test', u.id FROM tenants t, users u RETURNING id",
    )
    .fetch_one(pool)
    .await
    .unwrap();
    let to = |state: &'static str| async move {
        sqlx::query("UPDATE jobs SET state = $1 WHERE id = $2").bind(state).bind(id).execute(pool).await.unwrap();
    };
    let kinds = || async move {
        let kinds: Vec<String> =
            sqlx::query_scalar("SELECT kind FROM notification_outbox WHERE job_id = $1 ORDER BY created_at, kind")
                .bind(id)
                .fetch_all(pool)
                .await
                .unwrap();
        kinds
    };
    for state in ["admitted", "starting", "running"] {
        to(state).await;
    }
    assert!(kinds().await.is_empty(), "no notice for starting");
    to("queued").await; // preempted: back to the queue from running
    assert_eq!(kinds().await, ["job.preempted"]);
    // The idle sweep's warning is an event of its own, with the same state.
    sqlx::query("UPDATE jobs SET event_seq = event_seq + 1 WHERE id = $1;").bind(id).execute(pool).await.unwrap();
    sqlx::query(
        "INSERT INTO job_events (job_id, tenant_id, seq, from_state, to_state, actor, reason)
         SELECT id, tenant_id, event_seq, state, state, 'control:idle', 'idle: no use through its proxy since 10:00:00 UTC'
         FROM jobs WHERE id = $1",
    )
    .bind(id)
    .execute(pool)
    .await
    .unwrap();
    assert_eq!(kinds().await, ["job.preempted", "session.idle"]);

    // A cancel rolled back announces nothing; committed, it is announced to the tenant's subscription.
    let mut tx = store.begin().await.unwrap();
    sqlx::query("UPDATE jobs SET state = 'cancelled' WHERE id = $1").bind(id).execute(&mut *tx).await.unwrap();
    let inside: i64 =
        sqlx::query_scalar("SELECT count(*) FROM notification_outbox WHERE job_id = $1 AND kind = 'job.cancelled'")
            .bind(id)
            .fetch_one(&mut *tx)
            .await
            .unwrap();
    assert_eq!(inside, 1, "written in the change's own transaction");
    tx.rollback().await.unwrap();
    assert_eq!(kinds().await, ["job.preempted", "session.idle"]);
    to("cancelled").await;
    assert_eq!(kinds().await, ["job.preempted", "session.idle", "job.cancelled"]);
}
