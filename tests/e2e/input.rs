//! Bad input gets a typed 4xx naming the field, and writes nothing.

use std::time::Duration;

use reqwest::Method;
use serde_json::{Value, json};
use trainyard_tests::{StatusCode, TestEnv};

#[tokio::test(flavor = "multi_thread")]
async fn every_bad_submission_is_refused_with_its_field_named_and_nothing_written() {
    let env = TestEnv::start().await;
    let huge_name = "n".repeat(1024 * 1024);
    let cases: Vec<(&str, Value, StatusCode, &str)> = vec![
        ("unknown field", json!({"command": ["true"], "replica": 2}), StatusCode::UNPROCESSABLE_ENTITY, "replica"),
        (
            "unknown nested field",
            json!({"command": ["true"], "resources": {"gpu": 1}}),
            StatusCode::UNPROCESSABLE_ENTITY,
            "resources.gpu",
        ),
        (
            "negative cpu",
            json!({"command": ["true"], "resources": {"cpu": -1}}),
            StatusCode::UNPROCESSABLE_ENTITY,
            "resources.cpu",
        ),
        (
            "negative gpus",
            json!({"command": ["true"], "resources": {"gpus": -2}}),
            StatusCode::UNPROCESSABLE_ENTITY,
            "resources.gpus",
        ),
        (
            "absurd gpus",
            json!({"command": ["true"], "resources": {"gpus": 100000}}),
            StatusCode::UNPROCESSABLE_ENTITY,
            "resources.gpus",
        ),
        (
            "absurd memory",
            json!({"command": ["true"], "resources": {"memory": "900Pi"}}),
            StatusCode::UNPROCESSABLE_ENTITY,
            "resources.memory",
        ),
        (
            "absurd replicas",
            json!({"command": ["true"], "replicas": 1000000}),
            StatusCode::UNPROCESSABLE_ENTITY,
            "replicas",
        ),
        ("zero replicas", json!({"command": ["true"], "replicas": 0}), StatusCode::UNPROCESSABLE_ENTITY, "replicas"),
        ("empty command", json!({"command": []}), StatusCode::UNPROCESSABLE_ENTITY, "command"),
        ("missing command", json!({"name": "x"}), StatusCode::UNPROCESSABLE_ENTITY, "command"),
        ("command not a list", json!({"command": "rm -rf /"}), StatusCode::UNPROCESSABLE_ENTITY, "command"),
        ("1 MiB name", json!({"command": ["true"], "name": huge_name}), StatusCode::UNPROCESSABLE_ENTITY, "name"),
        (
            "reserved env",
            json!({"command": ["true"], "env": {"WORLD_SIZE": "9"}}),
            StatusCode::UNPROCESSABLE_ENTITY,
            "env.WORLD_SIZE",
        ),
        (
            "priority out of range",
            json!({"command": ["true"], "priority": 99999}),
            StatusCode::UNPROCESSABLE_ENTITY,
            "priority",
        ),
    ];
    for (what, body, status, field) in cases {
        let (got, error) = env.post("/api/v1/jobs", &env.admin_token, &body).await;
        assert_eq!(got, status, "{what}: {error}");
        assert_eq!(error["error"]["code"], "invalid_input", "{what}: {error}");
        assert_eq!(error["error"]["field"], field, "{what}: {error}");
        assert!(error["error"]["message"].as_str().unwrap().len() < 1000, "{what}: the message stays short");
    }
    assert_eq!(env.jobs_in_db().await, 0, "no bad submission wrote anything");
}

#[tokio::test(flavor = "multi_thread")]
async fn malformed_oversized_and_mistyped_bodies_get_their_own_errors() {
    let env = TestEnv::start().await;
    // A fresh connection per request: the server answers 413 without reading the rest of an
    // oversized body and closes that connection, which a pooled client might reuse.
    let client = reqwest::Client::builder().pool_max_idle_per_host(0).build().unwrap();
    let url = format!("{}/api/v1/jobs", env.server.url);
    let send = |body: Vec<u8>, content_type: &'static str| {
        client.post(&url).bearer_auth(&env.admin_token).header("content-type", content_type).body(body).send()
    };
    let response = send(b"{\"command\": [".to_vec(), "application/json").await.unwrap();
    assert_eq!(response.status(), StatusCode::BAD_REQUEST);
    let body: Value = response.json().await.unwrap();
    assert_eq!(body["error"]["code"], "malformed_json");

    let mut big = b"{\"command\": [\"true\"], \"args\": [\"".to_vec();
    big.extend(std::iter::repeat_n(b'a', 3 * 1024 * 1024));
    big.extend(b"\"]}");
    let response = send(big, "application/json").await.unwrap();
    assert_eq!(response.status(), StatusCode::PAYLOAD_TOO_LARGE);
    let body: Value = response.json().await.unwrap();
    assert_eq!(body["error"]["code"], "payload_too_large");

    let response = send(b"command=true".to_vec(), "application/x-www-form-urlencoded").await.unwrap();
    assert_eq!(response.status(), StatusCode::UNSUPPORTED_MEDIA_TYPE);

    let (status, body) = env.get("/api/v1/jobs?state=sleeping", &env.admin_token).await;
    assert_eq!(status, StatusCode::UNPROCESSABLE_ENTITY);
    assert_eq!(body["error"]["field"], "state");
    let (status, body) = env.get("/api/v1/jobs?limit=0", &env.admin_token).await;
    assert_eq!((status, body["error"]["field"].as_str()), (StatusCode::UNPROCESSABLE_ENTITY, Some("limit")));
    let (status, body) = env.get("/api/v1/jobs?colour=red", &env.admin_token).await;
    assert_eq!((status, body["error"]["field"].as_str()), (StatusCode::UNPROCESSABLE_ENTITY, Some("colour")));
    let (status, _) = env.get("/api/v1/jobs/not-a-uuid", &env.admin_token).await;
    assert_eq!(status, StatusCode::NOT_FOUND);
    assert_eq!(env.jobs_in_db().await, 0);
}

#[tokio::test(flavor = "multi_thread")]
async fn the_same_idempotency_key_returns_the_same_job() {
    let env = TestEnv::start().await;
    let body = json!({"command": ["true"], "idempotency_key": "nightly-2026-11-21", "resources": {"gpus": 64}});
    let (first_status, first) = env.post("/api/v1/jobs", &env.admin_token, &body).await;
    let (second_status, second) = env.post("/api/v1/jobs", &env.admin_token, &body).await;
    assert_eq!((first_status, second_status), (StatusCode::CREATED, StatusCode::OK));
    assert_eq!(first["id"], second["id"]);
    assert_eq!(env.jobs_in_db().await, 1);

    let different = json!({"command": ["false"], "idempotency_key": "nightly-2026-11-21"});
    let (status, error) = env.post("/api/v1/jobs", &env.admin_token, &different).await;
    assert_eq!(status, StatusCode::CONFLICT, "{error}");
    assert_eq!(env.jobs_in_db().await, 1);

    // Through the CLI too.
    let run =
        |key: &str| env.yard(&env.admin_token, &["submit", "--idempotency-key", key, "--gpus", "64", "--", "true"]);
    let a = run("cli-key");
    let b = run("cli-key");
    assert_eq!(a.stdout, b.stdout);
    assert_eq!(env.jobs_in_db().await, 2);
}

#[tokio::test(flavor = "multi_thread")]
async fn missing_garbled_revoked_and_expired_tokens_are_refused() {
    let env = TestEnv::start().await;
    let (status, body) = env.call(Method::GET, "/api/v1/jobs", None, None).await;
    assert_eq!(status, StatusCode::UNAUTHORIZED);
    assert_eq!(body["error"]["code"], "unauthenticated");
    let (status, _) = env.get("/api/v1/jobs", "tyd_0000").await;
    assert_eq!(status, StatusCode::UNAUTHORIZED);

    let (status, token) = env.post("/api/v1/tokens", &env.admin_token, &json!({"name": "laptop"})).await;
    assert_eq!(status, StatusCode::CREATED);
    let secret = token["token"].as_str().unwrap();
    assert_eq!(env.get("/api/v1/me", secret).await.0, StatusCode::OK);
    // The secret is not stored: only its hash.
    let stored: i64 =
        sqlx::query_scalar("SELECT count(*) FROM api_tokens WHERE encode(token_hash, 'escape') LIKE '%' || $1 || '%'")
            .bind(&secret[4..20])
            .fetch_one(&env.db.pool)
            .await
            .unwrap();
    assert_eq!(stored, 0);
    let (_, listed) = env.get("/api/v1/tokens", &env.admin_token).await;
    assert!(!listed.to_string().contains(secret), "listing never shows a secret");

    let revoked = env
        .call(
            Method::DELETE,
            &format!("/api/v1/tokens/{}", token["id"].as_str().unwrap()),
            Some(&env.admin_token),
            None,
        )
        .await;
    assert_eq!(revoked.0, StatusCode::NO_CONTENT);
    let (status, body) = env.get("/api/v1/me", secret).await;
    assert_eq!(status, StatusCode::UNAUTHORIZED);
    assert_eq!(body["error"]["message"], "the token is not valid (unknown, revoked or expired)");
    let cli = env.yard(secret, &["jobs", "ls"]);
    assert!(!cli.status.success());
    assert!(trainyard_tests::stderr(&cli).contains("revoked"), "yard prints the server's message");

    let (_, token) =
        env.post("/api/v1/tokens", &env.admin_token, &json!({"name": "short", "expires_in_days": 1})).await;
    sqlx::query("UPDATE api_tokens SET expires_at = now() - interval '1 minute' WHERE id = $1::uuid")
        .bind(token["id"].as_str().unwrap())
        .execute(&env.db.pool)
        .await
        .unwrap();
    let (status, body) = env.get("/api/v1/me", token["token"].as_str().unwrap()).await;
    assert_eq!(status, StatusCode::UNAUTHORIZED);
    assert_eq!(body["error"]["message"], "the token is not valid (unknown, revoked or expired)");
}

/// Text that Postgres cannot store (the NUL character) is refused at the edge with a 422 naming
/// the field, on every kind of input the attack reached Postgres through (JSON fields, a path
/// segment, query parameters, dashboard forms and filters), and nothing is written. Bytes after
/// a JSON body make it malformed.
#[tokio::test(flavor = "multi_thread")]
async fn text_postgres_cannot_store_is_refused_with_the_field_named() {
    let env = TestEnv::start().await;
    let nul = "a\u{0}{";
    let cases: Vec<(Method, &str, Option<Value>, &str)> = vec![
        (Method::POST, "/api/v1/tokens", Some(json!({"name": nul})), "name"),
        (Method::POST, "/api/v1/datasets", Some(json!({"name": nul, "version": "1", "uri": "/d"})), "name"),
        (Method::POST, "/api/v1/datasets", Some(json!({"name": "d", "version": "1", "uri": nul})), "uri"),
        (Method::POST, "/api/v1/admin/tenants", Some(json!({"name": nul})), "name"),
        (Method::POST, "/api/v1/admin/tenants/default/members", Some(json!({"user": nul, "role": "member"})), "user"),
        (Method::PUT, "/api/v1/admin/tenants/default/quotas/h100%00", Some(json!({"nominal": 1})), "flavor"),
        (Method::GET, "/api/v1/jobs?name=x%00", None, "name"),
        (Method::POST, "/api/v1/jobs", Some(json!({"command": ["true"], "env": {"A": nul}})), "env.A"),
        (Method::POST, "/api/v1/jobs", Some(json!({"command": ["true", nul]})), "command[1]"),
    ];
    for (method, path, body, field) in cases {
        let (status, answer) = env.call(method.clone(), path, Some(&env.admin_token), body.as_ref()).await;
        assert_eq!(status, StatusCode::UNPROCESSABLE_ENTITY, "{method} {path}: {answer}");
        assert_eq!(answer["error"]["field"], field, "{method} {path}: {answer}");
    }
    assert_eq!(env.jobs_in_db().await, 0);
    let (_, tokens) = env.get("/api/v1/tokens", &env.admin_token).await;
    assert_eq!(tokens.as_array().unwrap().len(), 1, "no token was made: {tokens}");

    let response = reqwest::Client::new()
        .post(format!("{}/api/v1/jobs", env.server.url))
        .bearer_auth(&env.admin_token)
        .header("content-type", "application/json")
        .body(r#"{"command": ["true"]}xyz"#)
        .send()
        .await
        .unwrap();
    assert_eq!(response.status(), StatusCode::BAD_REQUEST);
    assert_eq!(env.jobs_in_db().await, 0);

    let web = trainyard_tests::web::WebClient::signed_in(&env.server.url, &env.admin_token).await;
    assert_eq!(web.get("/jobs?name=x%00").await.0, StatusCode::UNPROCESSABLE_ENTITY);
    assert_eq!(web.get("/jobs/rows?template=x%00").await.0, StatusCode::UNPROCESSABLE_ENTITY);
    let (_, page) = web.get("/tokens").await;
    let csrf = trainyard_tests::web::csrf_of(&page);
    let (status, answer) = web.post_form("/tokens", &[("csrf", &csrf), ("name", nul)]).await;
    assert_eq!(status, StatusCode::UNPROCESSABLE_ENTITY, "{answer}");
    assert!(answer.contains("\"field\":\"name\""), "{answer}");
    let (_, tokens) = env.get("/api/v1/tokens", &env.admin_token).await;
    assert_eq!(tokens.as_array().unwrap().len(), 1, "none named with a NUL: {tokens}");
}

/// Failed authentication is throttled: one wrong token tried over and over is refused with 429
/// and Retry-After before any lookup; many wrong tokens from one client get 429 for its further
/// failures; a good token is never held back by someone else's wrong ones, from anywhere.
#[tokio::test(flavor = "multi_thread")]
async fn failed_authentication_is_throttled_per_token_and_per_client() {
    let env = TestEnv::start().await;
    let client = reqwest::Client::new();
    let me = |token: String| client.get(format!("{}/api/v1/me", env.server.url)).bearer_auth(token).send();
    let wrong = "tyd_deadbeef".to_string() + &"0".repeat(56);
    // Ten failures are allowed; the eleventh is one too many, and from then on it is refused.
    for _ in 0..11 {
        assert_eq!(me(wrong.clone()).await.unwrap().status(), StatusCode::UNAUTHORIZED);
    }
    let refused = me(wrong.clone()).await.unwrap();
    assert_eq!(refused.status(), StatusCode::TOO_MANY_REQUESTS, "the same wrong token, too often");
    let retry_after: u64 = refused.headers()["retry-after"].to_str().unwrap().parse().unwrap();
    assert!((1..=60).contains(&retry_after), "Retry-After {retry_after}");
    assert_eq!(me(env.admin_token.clone()).await.unwrap().status(), StatusCode::OK, "a good token still works");

    let mut statuses = Vec::new();
    for i in 0..25 {
        statuses.push(me(format!("tyd_{i:08x}{}", "0".repeat(56))).await.unwrap().status());
    }
    assert!(statuses.contains(&StatusCode::TOO_MANY_REQUESTS), "the client ran out of allowance: {statuses:?}");
    // Many tenants share one address (jobs on one host, a proxy): a valid token from a client
    // out of allowance is served all the same, while its guesses go on being refused, at the
    // pace of a guessing job (2 a second) and of a burst.
    let mut guesses = Vec::new();
    for _ in 0..8 {
        guesses.push(me(format!("tyd_{:08x}{}", rand_u32(), "1".repeat(56))).await.unwrap().status());
        let started = std::time::Instant::now();
        assert_eq!(
            me(env.admin_token.clone()).await.unwrap().status(),
            StatusCode::OK,
            "a valid token from the same address"
        );
        assert!(started.elapsed() < Duration::from_secs(1), "served without delay: {:?}", started.elapsed());
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
    // Its allowance grows back by one failure every 2 s: at 2 guesses a second, most are refused.
    let refused = guesses.iter().filter(|s| **s == StatusCode::TOO_MANY_REQUESTS).count();
    assert!(refused >= 5 && guesses.iter().all(|s| s.as_u16() == 401 || s.as_u16() == 429), "{guesses:?}");
}

fn rand_u32() -> u32 {
    use std::hash::{BuildHasher, Hasher};
    let mut hasher = std::collections::hash_map::RandomState::new().build_hasher();
    hasher.write_u64(std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap().as_nanos() as u64);
    hasher.finish() as u32
}

/// One rule per kind of name, whichever way the name comes in: a volume name refused by the
/// API, by a template's `volume` parameter and by the dashboard's form gets the same words.
#[tokio::test(flavor = "multi_thread")]
async fn a_name_gets_the_same_answer_from_the_api_a_template_and_the_dashboard() {
    let env = TestEnv::start().await;
    let rule = "is not a valid name: 1 to 63 lowercase letters, digits or";
    let (status, body) =
        env.post("/api/v1/volumes", &env.admin_token, &json!({"name": "Bad_Name", "size": "1Gi"})).await;
    assert_eq!((status, body["error"]["field"].as_str()), (StatusCode::UNPROCESSABLE_ENTITY, Some("name")), "{body}");
    assert!(body["error"]["message"].as_str().unwrap().contains(rule), "{body}");

    let manifest = "name: usevol\nversion: 1.0.0\ndescription: Uses a volume.\nparameters:\n  scratch:\n    type: volume\n    required: true\n    help: The volume.\ncommand: [ls, \"{{ scratch }}\"]\n";
    let (status, body) =
        env.post("/api/v1/templates", &env.admin_token, &json!({"manifest": manifest, "files": {}})).await;
    assert!(status.is_success(), "{body}");
    let (status, body) =
        env.post("/api/v1/templates/usevol/jobs", &env.admin_token, &json!({"params": {"scratch": "Bad_Name"}})).await;
    assert_eq!(
        (status, body["error"]["field"].as_str()),
        (StatusCode::UNPROCESSABLE_ENTITY, Some("params.scratch")),
        "{body}"
    );
    assert!(body["error"]["message"].as_str().unwrap().contains(rule), "{body}");

    let web = trainyard_tests::web::WebClient::signed_in(&env.server.url, &env.admin_token).await;
    let (_, page) = web.get("/volumes").await;
    let csrf = trainyard_tests::web::csrf_of(&page);
    let form = [("csrf", csrf.as_str()), ("name", "Bad_Name"), ("size", "1Gi"), ("access_mode", "ReadWriteOnce")];
    let (_, page) = web.post_form("/volumes", &form).await;
    assert!(page.contains(rule), "the dashboard shows the same rule:\n{page}");
    assert_eq!(env.jobs_in_db().await, 0);
}

/// A submission that breaks three rules is told all three at once: in the API (each field in
/// `errors`), by the CLI (one a line) and on the dashboard's form (each next to its field, and
/// a summary at the top); nothing is written.
#[tokio::test(flavor = "multi_thread")]
async fn a_submission_with_three_errors_gets_three_in_the_api_the_cli_and_the_form() {
    let env = TestEnv::start().await;
    let bad = json!({"command": ["true"], "name": "Bad Name!", "replicas": 0, "priority": 5000});
    let (status, body) = env.post("/api/v1/jobs", &env.admin_token, &bad).await;
    assert_eq!(status, StatusCode::UNPROCESSABLE_ENTITY, "{body}");
    let fields: Vec<&str> =
        body["error"]["errors"].as_array().unwrap().iter().map(|e| e["field"].as_str().unwrap()).collect();
    assert_eq!(fields, ["name", "replicas", "priority"], "{body}");
    assert_eq!(body["error"]["field"], "name", "the first, as before, for clients that read one");
    assert!(body["error"]["message"].as_str().unwrap().starts_with("3 problems: name: "), "{body}");

    let cli = env.yard(
        &env.admin_token,
        &["submit", "--name", "Bad Name!", "--replicas", "0", "--priority", "5000", "--", "true"],
    );
    assert!(!cli.status.success());
    let said = trainyard_tests::stderr(&cli);
    assert!(said.contains("error: 3 problems:\n"), "{said}");
    for field in ["  name: ", "  replicas: ", "  priority: "] {
        assert!(said.contains(field), "{field} in {said}");
    }

    let web = trainyard_tests::web::WebClient::signed_in(&env.server.url, &env.admin_token).await;
    let (_, form) = web.get("/submit/shell").await;
    let csrf = trainyard_tests::web::csrf_of(&form);
    let fields = [
        ("csrf", csrf.as_str()),
        ("p.command", "true"),
        ("name", "Bad Name!"),
        ("priority", "5000"),
        ("max_restarts", "1000"),
    ];
    let (status, page) = web.post_form("/submit/shell", &fields).await;
    assert_eq!(status, StatusCode::UNPROCESSABLE_ENTITY, "{page}");
    for id in ["form-error", "f-name-error", "f-priority-error"] {
        assert!(page.contains(&format!("id=\"{id}\"")), "{id} shown: {page}");
    }
    assert!(page.contains("3 problems"), "the summary at the top names all three: {page}");
    assert_eq!(env.jobs_in_db().await, 0, "nothing was written");
}
