//! Roles within a tenant, and walls between tenants.

use std::time::Duration;

use reqwest::Method;
use serde_json::json;
use trainyard_tests::{StatusCode, TestEnv};

#[tokio::test(flavor = "multi_thread")]
async fn a_viewer_lists_but_cannot_submit_or_cancel() {
    let env = TestEnv::start().await;
    let viewer = env.member("default", "vera", "viewer").await;
    let id = env.submit(json!({"command": ["true"], "resources": {"gpus": 64}})).await;

    let (status, page) = env.get("/api/v1/jobs", &viewer).await;
    assert_eq!(status, StatusCode::OK);
    assert_eq!(page["items"][0]["id"], id.as_str());
    assert_eq!(env.get(&format!("/api/v1/jobs/{id}/events"), &viewer).await.0, StatusCode::OK);

    let (status, body) = env.post("/api/v1/jobs", &viewer, &json!({"command": ["true"]})).await;
    assert_eq!(status, StatusCode::FORBIDDEN, "{body}");
    assert!(body["error"]["message"].as_str().unwrap().contains("member role"));
    let (status, _) = env.post(&format!("/api/v1/jobs/{id}/cancel"), &viewer, &json!({})).await;
    assert_eq!(status, StatusCode::FORBIDDEN);
    let cli = env.yard(&viewer, &["submit", "--", "true"]);
    assert!(!cli.status.success());
    assert_eq!(env.jobs_in_db().await, 1);
    assert_eq!(env.get(&format!("/api/v1/jobs/{id}"), &env.admin_token).await.1["state"], "queued");

    // Non-admins cannot reach the admin endpoints.
    assert_eq!(env.post("/api/v1/admin/tenants", &viewer, &json!({"name": "x"})).await.0, StatusCode::FORBIDDEN);
}

#[tokio::test(flavor = "multi_thread")]
async fn a_member_of_one_tenant_sees_nothing_of_another() {
    let env = TestEnv::start().await;
    let (status, _) = env.post("/api/v1/admin/tenants", &env.admin_token, &json!({"name": "team-b"})).await;
    assert_eq!(status, StatusCode::CREATED);
    let bob = env.member("team-b", "bob", "admin").await;

    // A job of the default tenant that runs, so it has attempts, events and logs.
    let id = env.submit(json!({"command": ["sh", "-c", "echo secret-output"]})).await;
    env.wait_state(&id, "succeeded", Duration::from_secs(30)).await;

    let (_, page) = env.get("/api/v1/jobs", &bob).await;
    assert_eq!(page["items"], json!([]));
    for path in ["", "/events", "/attempts", "/logs", "/logs?follow=true"] {
        let (status, body) = env.get(&format!("/api/v1/jobs/{id}{path}"), &bob).await;
        assert_eq!(status, StatusCode::NOT_FOUND, "GET {path}: {body}");
        assert!(!body.to_string().contains("secret-output"));
    }
    let (status, _) = env.post(&format!("/api/v1/jobs/{id}/cancel"), &bob, &json!({})).await;
    assert_eq!(status, StatusCode::NOT_FOUND, "404, not 403: existence does not leak");
    // A job id that exists nowhere gets the very same answer.
    let (status, _) = env.get("/api/v1/jobs/01a1fff7-34c2-71b0-8fbc-8b0373c4d5e0", &bob).await;
    assert_eq!(status, StatusCode::NOT_FOUND);
    // Bob's tenant admin rights do not reach other tenants.
    let (status, _) =
        env.post("/api/v1/admin/tenants/default/members", &bob, &json!({"user": "mallory", "role": "admin"})).await;
    assert_eq!(status, StatusCode::FORBIDDEN);
    // The same idempotency key in two tenants makes two jobs.
    let body = json!({"command": ["true"], "idempotency_key": "k", "resources": {"gpus": 64}});
    let (_, a) = env.post("/api/v1/jobs", &env.admin_token, &body).await;
    let (_, b) = env.post("/api/v1/jobs", &bob, &body).await;
    assert_ne!(a["id"], b["id"]);
    // Tokens of another tenant cannot be revoked across the wall.
    let (_, tokens) = env.get("/api/v1/tokens", &env.admin_token).await;
    let admin_token_id = tokens[0]["id"].as_str().unwrap();
    let (status, _) = env.call(Method::DELETE, &format!("/api/v1/tokens/{admin_token_id}"), Some(&bob), None).await;
    assert_eq!(status, StatusCode::NOT_FOUND);
}
