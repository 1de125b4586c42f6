//! An admin's first week (issue 43): removing a member, reissuing a lost token, every tenant's
//! jobs, draining a node. Through `yard` and the REST API of the real server.

use std::time::Duration;

use serde_json::{Value, json};
use trainyard_tests::{StatusCode, TestEnv, stderr, stdout};

const GPU: &str = "sim-a100";

async fn sleeper(env: &TestEnv, token: &str, name: &str, gpus: u32) -> String {
    let body =
        json!({"name": name, "command": ["sleep", "600"], "resources": {"gpus": gpus, "cpu": 0.1, "memory": "64Mi"}});
    let (status, job) = env.post("/api/v1/jobs", token, &body).await;
    assert_eq!(status, StatusCode::CREATED, "{job}");
    job["id"].as_str().unwrap().to_string()
}

async fn audit_of(env: &TestEnv, action: &str) -> Vec<Value> {
    let (status, page) = env.get(&format!("/api/v1/audit?action={action}"), &env.admin_token).await;
    assert_eq!(status, StatusCode::OK, "{page}");
    page["items"].as_array().cloned().unwrap_or_default()
}

async fn delete(env: &TestEnv, path: &str, token: &str) -> (StatusCode, Value) {
    env.call(reqwest::Method::DELETE, path, Some(token), None).await
}

#[tokio::test(flavor = "multi_thread")]
async fn a_removed_member_is_locked_out_at_once_and_their_jobs_are_kept() {
    let env = TestEnv::start().await;
    let admin = env.admin_token.clone();
    let mo = env.member("default", "mo", "member").await;
    let kept = sleeper(&env, &mo, "mo-training", 0).await;
    env.wait_job(&kept, Duration::from_secs(30), |j| j["state"] == "running").await;
    assert_eq!(env.get("/api/v1/me", &mo).await.0, StatusCode::OK);

    let removed = env.yard(&admin, &["admin", "member", "rm", "default", "mo"]);
    assert!(removed.status.success(), "{}", stderr(&removed));
    assert!(
        stdout(&removed).contains("removed mo from default: 1 token revoked, 0 jobs cancelled"),
        "{}",
        stdout(&removed)
    );
    // Their token is refused from the next request on; their job is still listed, still running.
    assert_eq!(env.get("/api/v1/me", &mo).await.0, StatusCode::UNAUTHORIZED);
    let (_, job) = env.get(&format!("/api/v1/jobs/{kept}"), &admin).await;
    assert_eq!(job["state"], "running", "{job}");
    let listed = env.yard(&admin, &["jobs", "ls", "--user", "mo"]);
    assert!(stdout(&listed).contains("mo-training"), "{}", stdout(&listed));
    let entries = audit_of(&env, "member.remove").await;
    assert!(entries.iter().any(|e| e["target"] == "tenant:default/user:mo" && e["outcome"] == "ok"), "{entries:?}");

    // Removing them again: not a member (404). With --cancel-jobs, a member's jobs end too.
    let (status, body) = delete(&env, "/api/v1/admin/tenants/default/members/mo", &admin).await;
    assert_eq!(status, StatusCode::NOT_FOUND, "{body}");
    let ida = env.member("default", "ida", "member").await;
    let doomed = sleeper(&env, &ida, "ida-job", 0).await;
    env.wait_job(&doomed, Duration::from_secs(30), |j| j["state"] == "running").await;
    let removed = env.yard(&admin, &["admin", "member", "rm", "default", "ida", "--cancel-jobs"]);
    assert!(removed.status.success(), "{}", stderr(&removed));
    let job = env.wait_state(&doomed, "cancelled", Duration::from_secs(30)).await;
    assert!(job["reason"].as_str().unwrap().contains("ida was removed from tenant default"), "{job}");

    // A tenant's last admin stays: 409 with the reason, from the API and from yard.
    assert_eq!(env.post("/api/v1/admin/tenants", &admin, &json!({"name": "solo"})).await.0, StatusCode::CREATED);
    let solo = env.member("solo", "sol", "admin").await;
    let refused = env.yard(&admin, &["admin", "member", "rm", "solo", "sol"]);
    assert!(!refused.status.success());
    assert!(stderr(&refused).contains("sol is the last admin of tenant solo"), "{}", stderr(&refused));
    let (status, body) = delete(&env, "/api/v1/admin/tenants/solo/members/sol", &solo).await;
    assert_eq!(status, StatusCode::CONFLICT, "{body}");
    assert_eq!(env.get("/api/v1/me", &solo).await.0, StatusCode::OK, "the refused removal changed nothing");
    // A second admin of the tenant may remove the first, then not themselves.
    let (status, body) =
        env.post("/api/v1/admin/tenants/solo/members", &solo, &json!({"user": "tam", "role": "admin"})).await;
    assert_eq!(status, StatusCode::CREATED, "{body}");
    let tam = body["token"]["token"].as_str().unwrap().to_string();
    assert_eq!(delete(&env, "/api/v1/admin/tenants/solo/members/sol", &tam).await.0, StatusCode::OK);
    assert_eq!(delete(&env, "/api/v1/admin/tenants/solo/members/tam", &tam).await.0, StatusCode::CONFLICT);
    // A tenant admin cannot remove a platform admin from the tenant (it could be their only one).
    let ted = env.member("default", "ted", "admin").await;
    let (status, body) = delete(&env, "/api/v1/admin/tenants/default/members/admin", &ted).await;
    assert_eq!(status, StatusCode::FORBIDDEN, "{body}");
    assert_eq!(env.get("/api/v1/me", &admin).await.0, StatusCode::OK);
}

#[tokio::test(flavor = "multi_thread")]
async fn a_lost_token_is_reissued_once_and_the_old_one_revoked() {
    let env = TestEnv::start().await;
    let admin = env.admin_token.clone();
    let lost = env.member("default", "lu", "member").await;
    let spare = env.yard(&lost, &["tokens", "create", "ci"]);
    assert!(spare.status.success(), "{}", stderr(&spare));
    let spare = stdout(&spare).trim().to_string();

    // Without --revoke-others the new token is one more.
    let first = env.yard(&admin, &["admin", "member", "token", "default", "lu"]);
    assert!(first.status.success(), "{}", stderr(&first));
    let first = stdout(&first).trim().to_string();
    assert!(first.starts_with("tyd_") && !first.contains(' '), "only the secret on standard output: {first:?}");
    let (status, me) = env.get("/api/v1/me", &first).await;
    assert_eq!((status, me["user"].as_str()), (StatusCode::OK, Some("lu")), "{me}");
    assert_eq!(env.get("/api/v1/me", &lost).await.0, StatusCode::OK);

    let again =
        env.yard(&admin, &["admin", "member", "token", "default", "lu", "--revoke-others", "--name", "laptop-2"]);
    assert!(again.status.success(), "{}", stderr(&again));
    assert!(stderr(&again).contains("revoked 3 other tokens of lu in default"), "{}", stderr(&again));
    let fresh = stdout(&again).trim().to_string();
    assert_eq!(env.get("/api/v1/me", &fresh).await.0, StatusCode::OK);
    for old in [&lost, &spare, &first] {
        assert_eq!(env.get("/api/v1/me", old).await.0, StatusCode::UNAUTHORIZED, "an old token still works");
    }
    let tokens = env.yard(&fresh, &["tokens", "ls"]);
    assert!(stdout(&tokens).contains("laptop-2"), "{}", stdout(&tokens));

    // Audited, without the secret.
    let entries = audit_of(&env, "member.token_reissue").await;
    assert_eq!(entries.iter().filter(|e| e["outcome"] == "ok").count(), 2, "{entries:?}");
    let audit = serde_json::to_string(&entries).unwrap();
    for secret in [&first, &fresh] {
        assert!(!audit.contains(secret.as_str()), "a secret in the audit log: {audit}");
    }
    // Someone not a member: 404; a tenant admin may not mint a platform admin's token.
    let (status, _) = env.post("/api/v1/admin/tenants/default/members/nobody/tokens", &admin, &json!({})).await;
    assert_eq!(status, StatusCode::NOT_FOUND);
    let tenant_admin = env.member("default", "ted", "admin").await;
    let (status, body) =
        env.post("/api/v1/admin/tenants/default/members/admin/tokens", &tenant_admin, &json!({})).await;
    assert_eq!(status, StatusCode::FORBIDDEN, "{body}");
    let (status, body) = env
        .post("/api/v1/admin/tenants/default/members/lu/tokens", &tenant_admin, &json!({"revoke_others": true}))
        .await;
    assert_eq!(status, StatusCode::CREATED, "{body}");
}

#[tokio::test(flavor = "multi_thread")]
async fn platform_admins_list_every_tenants_jobs_and_no_one_else_does() {
    let env = TestEnv::start().await;
    let admin = env.admin_token.clone();
    assert_eq!(env.post("/api/v1/admin/tenants", &admin, &json!({"name": "team-b"})).await.0, StatusCode::CREATED);
    let bob = env.member("team-b", "bob", "admin").await;
    let mia = env.member("default", "mia", "member").await;
    for (token, name) in [(&bob, "b-one"), (&bob, "b-two"), (&mia, "a-one")] {
        let (status, job) = env.post("/api/v1/jobs", token, &json!({"name": name, "command": ["true"]})).await;
        assert_eq!(status, StatusCode::CREATED, "{job}");
    }
    let all = env.yard(&admin, &["jobs", "ls", "--all-tenants"]);
    assert!(all.status.success(), "{}", stderr(&all));
    let text = stdout(&all);
    let header = text.lines().find(|l| l.contains("ID")).unwrap();
    assert!(header.contains("ID  ") && header.contains("TENANT"), "{text}");
    for (tenant, name) in [("team-b", "b-one"), ("team-b", "b-two"), ("default", "a-one")] {
        assert!(
            text.lines().any(|l| l.contains(name) && l.split_whitespace().filter(|w| *w != "│").nth(1) == Some(tenant)),
            "{name} of {tenant}: {text}"
        );
    }
    let own = stdout(&env.yard(&admin, &["jobs", "ls"]));
    assert!(!own.contains("b-one") && !own.contains("TENANT"), "{own}");
    let one = stdout(&env.yard(&admin, &["jobs", "ls", "--tenant", "team-b"]));
    assert!(one.contains("b-one") && one.contains("b-two") && !one.contains("a-one"), "{one}");
    // Paged like the tenant's list.
    let page: Value = serde_json::from_slice(
        &env.yard(&admin, &["jobs", "ls", "--all-tenants", "--limit", "2", "-o", "json"]).stdout,
    )
    .unwrap();
    assert_eq!(page["items"].as_array().unwrap().len(), 2);
    let cursor = page["next_cursor"].as_str().expect("a next page").to_string();
    let rest = stdout(&env.yard(&admin, &["jobs", "ls", "--all-tenants", "--cursor", &cursor]));
    assert!(rest.contains("b-one"), "the oldest on the next page: {rest}");
    // A tenant admin or member asking: 403; a tenant that does not exist: 404.
    for token in [&bob, &mia] {
        let (status, body) = env.get("/api/v1/jobs?all_tenants=true", token).await;
        assert_eq!(status, StatusCode::FORBIDDEN, "{body}");
        let refused = env.yard(token, &["jobs", "ls", "--tenant", "default"]);
        assert!(!refused.status.success() && stderr(&refused).contains("platform admins"), "{}", stderr(&refused));
    }
    assert_eq!(env.get("/api/v1/jobs?tenant=nope", &admin).await.0, StatusCode::NOT_FOUND);
}

#[tokio::test(flavor = "multi_thread")]
async fn a_drained_node_takes_no_new_jobs_survives_a_restart_and_preempts_on_request() {
    let mut env = TestEnv::start_with(&["--simulate-gpus", "4", "--simulate-gpu-type", GPU]).await;
    let admin = env.admin_token.clone();
    let quota = env.yard(&admin, &["admin", "quota", "set", "default", GPU, "--nominal", "4"]);
    assert!(quota.status.success(), "{}", stderr(&quota));
    let running = sleeper(&env, &admin, "before-drain", 2).await;
    env.wait_job(&running, Duration::from_secs(30), |j| j["state"] == "running").await;

    let drained = env.yard(&admin, &["admin", "node", "drain", "local", "--reason", "new cooling"]);
    assert!(drained.status.success(), "{}", stderr(&drained));
    let nodes = stdout(&env.yard(&admin, &["nodes"]));
    assert!(nodes.contains("DRAINED"), "{nodes}");
    assert!(nodes.contains("local is DRAINED (no new jobs): new cooling; by user:admin"), "{nodes}");
    let waiting = sleeper(&env, &admin, "after-drain", 2).await;
    let job = env
        .wait_job(&waiting, Duration::from_secs(30), |j| {
            j["reason"].as_str().is_some_and(|r| r.contains("node local is drained: new cooling"))
        })
        .await;
    assert_eq!(job["state"], "queued", "{job}");
    // What ran before the drain runs on.
    let (_, before) = env.get(&format!("/api/v1/jobs/{running}"), &admin).await;
    assert_eq!(before["state"], "running", "{before}");

    // The drain is in Postgres: after a restart the node still takes nothing.
    env.restart_after_crash();
    tokio::time::sleep(Duration::from_secs(3)).await;
    let (_, job) = env.get(&format!("/api/v1/jobs/{waiting}"), &admin).await;
    assert_eq!(job["state"], "queued", "{job}");
    assert!(job["reason"].as_str().unwrap().contains("drained"), "{job}");

    // With --preempt, what runs there goes back to the queue, no restart counted.
    let preempt = env.yard(&admin, &["admin", "node", "drain", "local", "--preempt", "--reason", "new cooling"]);
    assert!(preempt.status.success(), "{}", stderr(&preempt));
    assert!(stdout(&preempt).contains("1 job sent back to the queue"), "{}", stdout(&preempt));
    let back = env.wait_state(&running, "queued", Duration::from_secs(60)).await;
    assert_eq!(back["restart_count"], 0, "{back}");
    let (_, events) = env.get(&format!("/api/v1/jobs/{running}/events"), &admin).await;
    assert!(events.to_string().contains("node local is drained"), "{events}");

    let undrained = env.yard(&admin, &["admin", "node", "undrain", "local"]);
    assert!(undrained.status.success(), "{}", stderr(&undrained));
    for id in [&running, &waiting] {
        env.wait_job(id, Duration::from_secs(30), |j| j["state"] == "running").await;
    }
    assert!(!stdout(&env.yard(&admin, &["nodes"])).contains("DRAINED"));
    let again = env.yard(&admin, &["admin", "node", "undrain", "local"]);
    assert!(!again.status.success() && stderr(&again).contains("not drained"), "{}", stderr(&again));
    let unknown = env.yard(&admin, &["admin", "node", "drain", "no-such-node"]);
    assert!(!unknown.status.success(), "a typo drains nothing");
    let entries = audit_of(&env, "node.drain").await;
    assert_eq!(entries.iter().filter(|e| e["outcome"] == "ok").count(), 2, "{entries:?}");
}
