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

/// The escalation the attack found (issue 14): an admin of tenant `tb` named the existing
/// platform admin in a member add and received a token in that user's name, platform-admin flag
/// included. Replayed here, it is refused at the first step, for every existing user and role.
#[tokio::test(flavor = "multi_thread")]
async fn a_tenant_admin_cannot_obtain_a_token_in_another_users_name() {
    let env = TestEnv::start().await;
    for tenant in ["ta", "tb"] {
        let (status, body) = env.post("/api/v1/admin/tenants", &env.admin_token, &json!({"name": tenant})).await;
        assert_eq!(status, StatusCode::CREATED, "{body}");
    }
    let alice = env.member("ta", "alice", "member").await;
    let tina = env.member("tb", "tina", "admin").await;

    for user in ["admin", "alice"] {
        for role in ["viewer", "member", "admin"] {
            let (status, body) =
                env.post("/api/v1/admin/tenants/tb/members", &tina, &json!({"user": user, "role": role})).await;
            assert_eq!(status, StatusCode::FORBIDDEN, "{user} as {role}: {body}");
            assert!(body["error"]["message"].as_str().unwrap().contains("already exists"), "{body}");
            assert!(!body.to_string().contains("tyd_"), "no token in a refusal: {body}");
        }
    }
    let cli = env.yard(&tina, &["admin", "member-add", "tb", "admin", "--role", "admin"]);
    assert!(!cli.status.success(), "the CLI reports the refusal");
    assert!(!String::from_utf8_lossy(&cli.stdout).contains("tyd_"));
    // The attack's next steps stay closed: tina is no platform admin and sees no other tenant.
    assert_eq!(env.get("/api/v1/admin/tenants", &tina).await.0, StatusCode::FORBIDDEN);
    let (_, me) = env.get("/api/v1/me", &tina).await;
    assert_eq!(me["platform_admin"], false);

    // What a tenant admin may do: invite a new user (whose first token the answer carries, and
    // who is no platform admin) and change the role of the tenant's own members (no token).
    let (status, added) =
        env.post("/api/v1/admin/tenants/tb/members", &tina, &json!({"user": "newbie", "role": "member"})).await;
    assert_eq!(status, StatusCode::CREATED, "{added}");
    assert_eq!(added["user_created"], true);
    let newbie = added["token"]["token"].as_str().expect("an invitation carries the first token").to_string();
    let (_, me) = env.get("/api/v1/me", &newbie).await;
    assert_eq!(
        (me["user"].as_str(), me["tenant"].as_str(), me["platform_admin"].as_bool()),
        (Some("newbie"), Some("tb"), Some(false))
    );
    let (status, changed) =
        env.post("/api/v1/admin/tenants/tb/members", &tina, &json!({"user": "newbie", "role": "viewer"})).await;
    assert_eq!(status, StatusCode::CREATED, "{changed}");
    assert_eq!((changed["user_created"].as_bool(), changed["token"].is_null()), (Some(false), true), "{changed}");
    assert_eq!(env.get("/api/v1/me", &newbie).await.1["role"], "viewer");

    // Tokens for another tenant: only for yourself, only where you are a member.
    let (status, body) = env.post("/api/v1/tokens", &tina, &json!({"name": "x", "tenant": "ta"})).await;
    assert_eq!(status, StatusCode::UNPROCESSABLE_ENTITY, "{body}");
    assert_eq!(body["error"]["field"], "tenant");
    // A platform admin adds the existing alice to tb: the answer carries no token of hers; she
    // makes her own for tb with her token of ta.
    let (status, added) = env
        .post("/api/v1/admin/tenants/tb/members", &env.admin_token, &json!({"user": "alice", "role": "member"}))
        .await;
    assert_eq!(status, StatusCode::CREATED, "{added}");
    assert!(added["token"].is_null(), "no token in another user's name, not even for a platform admin: {added}");
    let (status, created) = env.post("/api/v1/tokens", &alice, &json!({"name": "tb", "tenant": "tb"})).await;
    assert_eq!(status, StatusCode::CREATED, "{created}");
    let (_, me) = env.get("/api/v1/me", created["token"].as_str().unwrap()).await;
    assert_eq!(
        (me["user"].as_str(), me["tenant"].as_str(), me["role"].as_str()),
        (Some("alice"), Some("tb"), Some("member"))
    );
}

/// Jobs are isolated on the local executor: the server runs as root here (as in `tests/run`),
/// so each tenant's replicas run as that tenant's unprivileged user. A job of tenant B tries to
/// read tenant A's job directory, log, artefact and volume, the server's object store and data
/// directory, and the server's environment (where its database credentials are): every try is
/// refused with "Permission denied", and nothing of A's shows in B's output.
#[tokio::test(flavor = "multi_thread")]
async fn a_job_cannot_read_another_tenants_files_or_the_control_planes() {
    let env = TestEnv::start().await;
    let data = env.data_dir();
    // Tenant A (the default tenant): a job that leaves a file and a log line, an artefact, a volume.
    let a = env.submit(json!({"command": ["sh", "-c", "echo A-WORKDIR-SECRET > secret.txt; echo A-LOG-SECRET"]})).await;
    let job = env.wait_state(&a, "succeeded", Duration::from_secs(30)).await;
    env.artifact_put(&a, "model.bin", &env.admin_token, "A-ARTIFACT-SECRET").await;
    let (status, volume) = env.post("/api/v1/volumes", &env.admin_token, &json!({"name": "avol", "size": "1Gi"})).await;
    assert_eq!(status, StatusCode::CREATED, "{volume}");
    let (_, attempts) = env.get(&format!("/api/v1/jobs/{a}/attempts"), &env.admin_token).await;
    let isolation = attempts[0]["placement"]["isolation"].as_str().unwrap_or_default().to_string();
    if !nix::unistd::geteuid().is_root() {
        // Not root: the server cannot switch users, and the job's record says so.
        assert!(isolation.starts_with("none:"), "{isolation}");
        panic!("this test needs root (as tests/run has it): replicas were not isolated ({isolation})");
    }
    assert!(isolation.starts_with("user tyt-"), "the record names the user the replicas ran as: {job} {isolation}");
    let find = |name: &str| -> String {
        let mut pending = vec![data.clone()];
        while let Some(dir) = pending.pop() {
            for entry in std::fs::read_dir(&dir).unwrap().flatten() {
                if entry.file_name() == name {
                    return entry.path().display().to_string();
                }
                if entry.file_type().unwrap().is_dir() {
                    pending.push(entry.path());
                }
            }
        }
        panic!("{name} not found under {}", data.display())
    };
    let volume_dir = find("avol");
    std::fs::write(format!("{volume_dir}/secret"), "A-VOLUME-SECRET").unwrap();
    let targets = [
        ("workdir", format!("{}/jobs/{a}/work-1/replica-0/secret.txt", data.display())),
        ("log", format!("{}/jobs/{a}/attempt-1/replica-0.log", data.display())),
        ("artifact", find("model.bin")),
        ("volume", format!("{volume_dir}/secret")),
        ("object store", format!("{}/objects", data.display())),
        ("data directory", data.display().to_string()),
        // Its names are the tenants' ids; each replica passes through to its own tenant's folder.
        ("shard cache root", format!("{}/shard-cache", data.display())),
        ("server environment", format!("/proc/{}/environ", env.server.pid())),
    ];
    let cmdline = std::fs::read(format!("/proc/{}/cmdline", env.server.pid())).unwrap();
    assert!(!String::from_utf8_lossy(&cmdline).contains("postgres://"), "no database URL on the server's command line");

    // Tenant B tries each: `cat` for files, `ls` for folders. In its own PID namespace the
    // server's process is not there at all, which denies as much.
    let script: String = targets
        .iter()
        .map(|(what, path)| {
            let hidden = if path.starts_with("/proc/") { "|*'No such file'*" } else { "" };
            format!(
                "out=$( (test -d '{path}' && ls '{path}' || cat '{path}') 2>&1 ); \
                 case \"$out\" in *'Permission denied'*{hidden}) echo 'DENIED {what}';; *) echo \"READ {what}: $out\";; esac; "
            )
        })
        .collect();
    let (status, _) = env.post("/api/v1/admin/tenants", &env.admin_token, &json!({"name": "team-b"})).await;
    assert_eq!(status, StatusCode::CREATED);
    let bob = env.member("team-b", "bob", "member").await;
    let (status, job) = env.post("/api/v1/jobs", &bob, &json!({"command": ["sh", "-c", script]})).await;
    assert_eq!(status, StatusCode::CREATED, "{job}");
    let b = job["id"].as_str().unwrap().to_string();
    env.wait_job_as(&bob, &b, Duration::from_secs(30), |j| j["state"] == "succeeded").await;
    let (_, log) = env.get(&format!("/api/v1/jobs/{b}/logs"), &bob).await;
    let log = log.as_str().unwrap_or_default().to_string();
    for (what, _) in &targets {
        assert!(log.contains(&format!("DENIED {what}")), "tenant B could reach A's {what}:\n{log}");
    }
    assert!(!log.contains("SECRET"), "nothing of A's shows:\n{log}");
}

/// A job that prints its own token (or a user's): every reader of the logs (a viewer through the
/// API, following, the dashboard's log file) sees it masked, and the token still works for the
/// job (the log on disk is as the job wrote it).
#[tokio::test(flavor = "multi_thread")]
async fn tokens_a_job_prints_are_masked_for_every_reader_of_its_logs() {
    let env = TestEnv::start().await;
    let viewer = env.member("default", "vera", "viewer").await;
    let script = format!(
        "echo token=$TRAINYARD_TOKEN; printf 'half=%s' \"$TRAINYARD_TOKEN\" | head -c 40; sleep 0.4; \
         printf '%s\\n' \"$(echo $TRAINYARD_TOKEN | cut -c 41-)\"; echo user={}; echo done",
        env.admin_token
    );
    let id = env.submit(json!({"command": ["sh", "-c", script]})).await;
    env.wait_state(&id, "succeeded", Duration::from_secs(30)).await;

    let (status, log) = env.get(&format!("/api/v1/jobs/{id}/logs"), &viewer).await;
    assert_eq!(status, StatusCode::OK);
    let log = log.as_str().unwrap_or_default().to_string();
    assert!(log.contains("token=tyj_[masked]\n"), "{log}");
    assert!(log.contains("user=tyd_[masked]\n"), "{log}");
    assert!(log.ends_with("done\n"), "{log}");
    assert!(!log.contains(&env.admin_token[4..20]), "the admin's token shows: {log}");
    let digits = regex::Regex::new("[0-9a-f]{16,}").unwrap();
    assert!(!digits.is_match(&log), "hex digits of a token show: {log}");

    // The dashboard's download of the log, for the same viewer.
    let web = trainyard_tests::web::WebClient::signed_in(&env.server.url, &viewer).await;
    let (status, text) = web.get(&format!("/jobs/{id}/log.txt")).await;
    assert_eq!(status, StatusCode::OK);
    assert_eq!(text, log);
}

/// Every admin token lost: whoever holds the database mints a new one for a platform admin
/// (`trainyard admin-token`), never for anyone else.
#[tokio::test(flavor = "multi_thread")]
async fn a_lost_admin_token_is_replaced_from_the_database_for_platform_admins_only() {
    let env = TestEnv::start().await;
    let minted = std::process::Command::new(trainyard_tests::bin("trainyard"))
        .args(["admin-token", "--user", "admin"])
        .env("TRAINYARD_DATABASE_URL", &env.db.url)
        .output()
        .unwrap();
    assert!(minted.status.success(), "{}", trainyard_tests::stderr(&minted));
    let token = String::from_utf8(minted.stdout).unwrap().trim().to_string();
    let (status, me) = env.get("/api/v1/me", &token).await;
    assert_eq!(status, StatusCode::OK, "{me}");
    assert_eq!(me["user"], "admin");
    // Neither the bootstrap token nor the recovery token lasts for ever: 30 days, like any admin's.
    let (status, tokens) = env.get("/api/v1/tokens", &token).await;
    assert_eq!(status, StatusCode::OK, "{tokens}");
    let tokens = tokens.as_array().expect("a list of tokens");
    let bootstrap = tokens.iter().find(|t| t["name"] == "bootstrap").expect("the bootstrap token is listed");
    let newest = tokens.iter().max_by_key(|t| t["created_at"].as_str().unwrap_or_default().to_string()).unwrap();
    assert_ne!(bootstrap["id"], newest["id"], "the recovery token is listed: {tokens:?}");
    for listed in [bootstrap, newest] {
        let expires: chrono::DateTime<chrono::Utc> =
            serde_json::from_value(listed["expires_at"].clone()).unwrap_or_else(|_| panic!("no expiry: {listed}"));
        let days = (expires - chrono::Utc::now()).num_hours() as f64 / 24.0;
        assert!((29.9..=30.1).contains(&days), "expires in {days:.2} days: {listed}");
    }

    env.member("default", "alice", "member").await;
    let refused = std::process::Command::new(trainyard_tests::bin("trainyard"))
        .args(["admin-token", "--user", "alice"])
        .env("TRAINYARD_DATABASE_URL", &env.db.url)
        .output()
        .unwrap();
    assert!(!refused.status.success());
    assert!(
        trainyard_tests::stderr(&refused).contains("no platform admin named \"alice\""),
        "{}",
        trainyard_tests::stderr(&refused)
    );
}

#[tokio::test(flavor = "multi_thread")]
async fn removing_a_tenant_stops_its_jobs_shuts_its_doors_and_keeps_its_records() {
    let env = TestEnv::start().await;
    let admin = env.admin_token.clone();
    let (status, _) = env.post("/api/v1/admin/tenants", &admin, &json!({"name": "team-x"})).await;
    assert_eq!(status, StatusCode::CREATED);
    let xena = env.member("team-x", "xena", "admin").await;
    // What the tenant has: a running job, a job that can only wait, a volume with data.
    let (status, volume) = env.post("/api/v1/volumes", &xena, &json!({"name": "scratch", "size": "1Mi"})).await;
    assert_eq!(status, StatusCode::CREATED, "{volume}");
    assert_eq!(volume["path"], "/volumes/scratch", "where its jobs see it, not the server's folder");
    let volume_dir = env.volume_folder("scratch");
    let (status, running) = env.post("/api/v1/jobs", &xena, &json!({"command": ["sleep", "600"]})).await;
    assert_eq!(status, StatusCode::CREATED, "{running}");
    let running = running["id"].as_str().unwrap().to_string();
    let (status, waiting) =
        env.post("/api/v1/jobs", &xena, &json!({"command": ["true"], "resources": {"gpus": 64}})).await;
    assert_eq!(status, StatusCode::CREATED, "{waiting}");
    let waiting = waiting["id"].as_str().unwrap().to_string();
    env.wait_job_as(&xena, &running, Duration::from_secs(30), |job| job["state"] == "running").await;
    let pid = env.replica_pids_from_db(&running).await;
    std::fs::write(volume_dir.join("data"), "team-x's data").unwrap();

    // Nobody removes their own credential's tenant, and only platform admins remove any.
    let (status, body) = env.call(Method::DELETE, "/api/v1/admin/tenants/default", Some(&admin), None).await;
    assert_eq!(status, StatusCode::CONFLICT, "{body}");
    assert!(body["error"]["message"].as_str().unwrap().contains("your credential belongs to tenant default"), "{body}");
    let (status, _) = env.call(Method::DELETE, "/api/v1/admin/tenants/team-x", Some(&xena), None).await;
    assert_eq!(status, StatusCode::FORBIDDEN, "a tenant's own admin cannot remove it");

    let (status, tenant) = env.call(Method::DELETE, "/api/v1/admin/tenants/team-x", Some(&admin), None).await;
    assert_eq!(status, StatusCode::ACCEPTED, "{tenant}");
    assert!(tenant["removal_requested_at"].is_string(), "{tenant}");
    // At once: its tokens no longer work, and nothing new gets in, by any path.
    let (status, _) = env.get("/api/v1/jobs", &xena).await;
    assert_eq!(status, StatusCode::UNAUTHORIZED);
    let (status, body) =
        env.post("/api/v1/admin/tenants/team-x/members", &admin, &json!({"user": "newcomer", "role": "member"})).await;
    assert_eq!(status, StatusCode::CONFLICT, "{body}");
    assert!(body["error"]["message"].as_str().unwrap().contains("team-x is being removed"), "{body}");
    let (status, body) = env
        .call(
            Method::PUT,
            "/api/v1/admin/tenants/team-x/quotas/simulated-gpu",
            Some(&admin),
            Some(&json!({"nominal": 4})),
        )
        .await;
    assert_eq!(status, StatusCode::CONFLICT, "{body}");

    // Its jobs are cancelled, the running one stopped; then the removal finishes by itself.
    let job_state = |id: String| {
        let env = &env;
        async move {
            let state: String = sqlx::query_scalar("SELECT state FROM jobs WHERE id = $1::uuid")
                .bind(&id)
                .fetch_one(&env.db.pool)
                .await
                .unwrap();
            state
        }
    };
    assert_eq!(job_state(waiting.clone()).await, "cancelled", "a job that never started is cancelled at once");
    let deadline = std::time::Instant::now() + Duration::from_secs(30);
    let tenant = loop {
        let (_, tenants) = env.get("/api/v1/admin/tenants", &admin).await;
        let tenant = tenants.as_array().unwrap().iter().find(|t| t["name"] == "team-x").unwrap().clone();
        if tenant["removed_at"].is_string() {
            break tenant;
        }
        assert!(std::time::Instant::now() < deadline, "the removal did not finish: {tenant}");
        tokio::time::sleep(Duration::from_millis(200)).await;
    };
    assert!(tenant["removal_requested_at"].is_string());
    assert_eq!(job_state(running.clone()).await, "cancelled");
    assert!(!trainyard_tests::group_alive(pid), "its running job's processes are gone");
    let reason: String = sqlx::query_scalar("SELECT reason FROM jobs WHERE id = $1::uuid")
        .bind(&running)
        .fetch_one(&env.db.pool)
        .await
        .unwrap();
    assert_eq!(reason, "cancelled: tenant team-x is being removed");
    assert!(!volume_dir.exists(), "its volumes' data is gone: {}", volume_dir.display());

    // Its records stay, its name is not handed out again, and the audit log says who did it.
    let jobs: i64 =
        sqlx::query_scalar("SELECT count(*) FROM jobs j JOIN tenants t ON t.id = j.tenant_id WHERE t.name = 'team-x'")
            .fetch_one(&env.db.pool)
            .await
            .unwrap();
    assert_eq!(jobs, 2);
    let (status, body) = env.post("/api/v1/admin/tenants", &admin, &json!({"name": "team-x"})).await;
    assert_eq!(status, StatusCode::CONFLICT, "{body}");
    let (status, audit) = env.get("/api/v1/audit?tenant=team-x&action=tenant.", &admin).await;
    assert_eq!(status, StatusCode::OK, "{audit}");
    let entries: Vec<(String, String)> = audit["items"]
        .as_array()
        .unwrap()
        .iter()
        .map(|e| (e["action"].as_str().unwrap().to_string(), e["actor"].as_str().unwrap().to_string()))
        .collect();
    assert!(entries.contains(&("tenant.remove".into(), "user:admin".into())), "{entries:?}");
    assert!(entries.contains(&("tenant.removed".into(), "trainyard:reconciler".into())), "{entries:?}");
    // The CLI shows it.
    let listed = env.yard(&admin, &["admin", "tenants"]);
    let listed = String::from_utf8_lossy(&listed.stdout);
    assert!(listed.contains("team-x: removed at "), "{listed}");
}

#[tokio::test(flavor = "multi_thread")]
async fn the_admin_page_removes_a_tenant_only_once_its_name_is_typed_again() {
    let env = TestEnv::start().await;
    let (status, _) = env.post("/api/v1/admin/tenants", &env.admin_token, &json!({"name": "team-y"})).await;
    assert_eq!(status, StatusCode::CREATED);
    let web = trainyard_tests::web::WebClient::signed_in(&env.server.url, &env.admin_token).await;
    let (_, page) = web.get("/admin").await;
    assert!(page.contains("Remove tenant"), "{page}");
    let csrf = trainyard_tests::web::csrf_of(&page);

    let (status, page) =
        web.post_form("/admin/tenants/remove", &[("csrf", &csrf), ("tenant", "team-y"), ("confirm", "team-")]).await;
    assert_eq!(status, StatusCode::UNPROCESSABLE_ENTITY, "{page}");
    assert!(page.contains("confirm: type the tenant&#39;s name to confirm"), "{page}");
    let (_, tenants) = env.get("/api/v1/admin/tenants", &env.admin_token).await;
    assert!(tenants.as_array().unwrap().iter().any(|t| t["name"] == "team-y" && t["removal_requested_at"].is_null()));

    let (status, page) =
        web.post_form("/admin/tenants/remove", &[("csrf", &csrf), ("tenant", "team-y"), ("confirm", "team-y")]).await;
    assert_eq!(status, StatusCode::OK, "{page}");
    assert!(page.contains("tenant team-y is being removed"), "{page}");
    let (_, tenants) = env.get("/api/v1/admin/tenants", &env.admin_token).await;
    assert!(tenants.as_array().unwrap().iter().any(|t| t["name"] == "team-y" && t["removal_requested_at"].is_string()));
}

#[tokio::test(flavor = "multi_thread")]
async fn a_tenant_removal_asked_for_just_before_a_crash_finishes_after_the_restart() {
    let mut env = TestEnv::start().await;
    let admin = env.admin_token.clone();
    let (status, _) = env.post("/api/v1/admin/tenants", &admin, &json!({"name": "team-z"})).await;
    assert_eq!(status, StatusCode::CREATED);
    let zoe = env.member("team-z", "zoe", "member").await;
    let (status, job) = env.post("/api/v1/jobs", &zoe, &json!({"command": ["sleep", "600"]})).await;
    assert_eq!(status, StatusCode::CREATED, "{job}");
    let job = job["id"].as_str().unwrap().to_string();
    env.wait_job_as(&zoe, &job, Duration::from_secs(30), |j| j["state"] == "running").await;
    let pid = env.replica_pids_from_db(&job).await;

    let (status, _) = env.call(Method::DELETE, "/api/v1/admin/tenants/team-z", Some(&admin), None).await;
    assert_eq!(status, StatusCode::ACCEPTED);
    env.restart_after_crash();

    let deadline = std::time::Instant::now() + Duration::from_secs(30);
    loop {
        let (_, tenants) = env.get("/api/v1/admin/tenants", &admin).await;
        if tenants.as_array().unwrap().iter().any(|t| t["name"] == "team-z" && t["removed_at"].is_string()) {
            break;
        }
        assert!(std::time::Instant::now() < deadline, "the removal did not finish after the restart: {tenants}");
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    let (state, restarts): (String, i32) = sqlx::query_as("SELECT state, restart_count FROM jobs WHERE id = $1::uuid")
        .bind(&job)
        .fetch_one(&env.db.pool)
        .await
        .unwrap();
    assert_eq!((state.as_str(), restarts), ("cancelled", 0));
    assert!(!trainyard_tests::group_alive(pid), "the job's processes were stopped, not left behind");
}

/// The link attack of issue 37, in its three variants. A member's job replaces its code files
/// with links (to a root-only file, to a folder outside every job, into another tenant's running
/// job) and fails; when the next attempt launches, the server, as root, must write none of them:
/// every file outside the job's folder stays as it was, and the attempt starts in a fresh folder
/// holding the code as shipped.
#[tokio::test(flavor = "multi_thread")]
async fn code_files_swapped_for_links_make_the_server_write_nothing_outside_the_job() {
    use std::os::unix::fs::PermissionsExt;
    let env = TestEnv::start().await;
    if !nix::unistd::geteuid().is_root() {
        panic!("this test needs root (as tests/run has it): the attack is on a root server");
    }
    let (status, _) = env.post("/api/v1/admin/tenants", &env.admin_token, &json!({"name": "team-b"})).await;
    assert_eq!(status, StatusCode::CREATED);
    let bob = env.member("team-b", "bob", "member").await;
    let mallory = env.member("default", "mallory", "member").await;

    // Another tenant's job, running while the attack goes on.
    let (status, job) = env.post("/api/v1/jobs", &bob, &json!({"command": ["sleep", "60"]})).await;
    assert_eq!(status, StatusCode::CREATED, "{job}");
    let b = job["id"].as_str().unwrap().to_string();
    env.wait_job_as(&bob, &b, Duration::from_secs(30), |j| j["state"] == "running").await;
    let b_workdir = env.data_dir().join("jobs").join(&b).join("work-1/replica-0");
    assert!(b_workdir.is_dir(), "{} is team-b's working folder", b_workdir.display());

    // Outside every job: a root-only file and a folder of root's.
    let outside = env.dir.path().join("outside");
    std::fs::create_dir_all(outside.join("folder")).unwrap();
    std::fs::set_permissions(&outside, std::fs::Permissions::from_mode(0o755)).unwrap();
    let secret = outside.join("root-only");
    std::fs::write(&secret, "root's own").unwrap();
    std::fs::set_permissions(&secret, std::fs::Permissions::from_mode(0o600)).unwrap();

    let project = env.dir.path().join("mallory");
    for folder in ["sub", "pkg"] {
        std::fs::create_dir_all(project.join(folder)).unwrap();
    }
    std::fs::write(project.join("code.txt"), "tenant content").unwrap();
    std::fs::write(project.join("sub/new-file.txt"), "created as root?").unwrap();
    std::fs::write(project.join("pkg/planted.txt"), "planted in team-b").unwrap();
    let script = format!(
        "if [ \"$TRAINYARD_ATTEMPT\" = 1 ]; then \
           touch attempt-1-was-here; \
           rm -f code.txt && ln -s {secret} code.txt; \
           rm -rf sub && ln -s {folder} sub; \
           rm -rf pkg && ln -s {b_workdir} pkg; \
           exit 1; \
         fi; \
         test ! -e attempt-1-was-here || {{ echo 'NOT FRESH'; exit 3; }}; \
         test -f code.txt && test ! -L code.txt && test \"$(cat code.txt)\" = 'tenant content' || {{ echo 'BAD CODE'; exit 4; }}; \
         test ! -L sub && test -f sub/new-file.txt && test ! -L pkg && test -f pkg/planted.txt || {{ echo 'BAD FOLDERS'; exit 5; }}; \
         echo 'attempt 2 clean'",
        secret = secret.display(),
        folder = outside.join("folder").display(),
        b_workdir = b_workdir.display(),
    );
    let submitted = env.yard_in(&project, &mallory, &["submit", "--max-restarts", "1", "--", "sh", "-c", &script]);
    assert!(submitted.status.success(), "{}", trainyard_tests::stderr(&submitted));
    let id = trainyard_tests::stdout(&submitted).trim().to_string();
    let job = env.wait_job(&id, Duration::from_secs(60), |j| j["finished_at"].is_string()).await;
    let log = trainyard_tests::stdout(&env.yard(&env.admin_token, &["logs", &id]));
    assert_eq!(job["state"], "succeeded", "attempt 2 ran from a fresh folder with the code as shipped: {job}\n{log}");
    assert_eq!(job["restart_count"], 1, "{job}");

    // Nothing outside the job changed.
    assert_eq!(std::fs::read_to_string(&secret).unwrap(), "root's own", "the root-only file was overwritten");
    assert_eq!(std::fs::metadata(&secret).unwrap().permissions().mode() & 0o777, 0o600, "its mode changed");
    assert_eq!(std::fs::read_dir(outside.join("folder")).unwrap().count(), 0, "a file was created outside the job");
    assert!(!b_workdir.join("planted.txt").exists(), "a file was planted in team-b's running job");
    // Attempt 1's folder went with it; attempt 2's holds what it was given.
    let job_dir = env.data_dir().join("jobs").join(&id);
    assert!(!job_dir.join("work-1").exists(), "attempt 1's working folder is removed");
    assert!(job_dir.join("work-2/replica-0/code.txt").is_file());
    env.post(&format!("/api/v1/jobs/{b}/cancel"), &bob, &json!({})).await;
}

/// A viewer who finds a job's token in its log in another form (capitals, percent-encoded,
/// base64 at any offset, URL-safe base64) cannot act as the job: every form is masked for every
/// reader. The log on disk keeps the forms, and the same search finds the token there, so the
/// search itself is shown to work.
#[tokio::test(flavor = "multi_thread")]
async fn a_viewer_cannot_act_as_a_job_with_any_encoding_of_its_token_in_the_log() {
    use base64::Engine;
    let env = TestEnv::start().await;
    let viewer = env.member("default", "vera", "viewer").await;
    let script = "import os, base64\n\
                  t = os.environ['TRAINYARD_TOKEN']\n\
                  print('upper', t.upper())\n\
                  print('percent', ''.join('%%%02X' % b for b in t.encode()))\n\
                  for lead in ['', 'x', 'u:']:\n\
                  \x20   print('b64', base64.b64encode((lead + t).encode()).decode())\n\
                  print('url', base64.urlsafe_b64encode(('ab' + t).encode()).decode().rstrip('='))\n\
                  import time; time.sleep(60)\n";
    let id = env.submit(json!({"command": ["/usr/bin/python3", "-c", script]})).await;
    env.wait_state(&id, "running", Duration::from_secs(30)).await;
    let on_disk = env.data_dir().join("jobs").join(&id).join("attempt-1/replica-0.log");
    let deadline = std::time::Instant::now() + Duration::from_secs(30);
    while !std::fs::read_to_string(&on_disk).is_ok_and(|log| log.contains("url ")) {
        assert!(std::time::Instant::now() < deadline, "the job never printed its forms");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }

    // Every token any word of a text decodes to, whatever its form.
    let tokens_in = |text: &str| -> std::collections::BTreeSet<String> {
        let token = regex::Regex::new("tyj_[0-9a-f]{64}").unwrap();
        let mut found = std::collections::BTreeSet::new();
        for word in text.split_whitespace() {
            let mut forms = vec![word.to_lowercase()];
            let bytes: Vec<u8> = word.as_bytes().to_vec();
            if word.starts_with('%') {
                let decoded = (0..bytes.len() / 3)
                    .filter_map(|i| {
                        u8::from_str_radix(std::str::from_utf8(&bytes[3 * i + 1..3 * i + 3]).ok()?, 16).ok()
                    })
                    .collect::<Vec<u8>>();
                forms.push(String::from_utf8_lossy(&decoded).into_owned());
            }
            for engine in [base64::engine::general_purpose::STANDARD, base64::engine::general_purpose::URL_SAFE_NO_PAD]
            {
                if let Ok(decoded) = engine.decode(word.trim_end_matches('=')).or_else(|_| engine.decode(word)) {
                    forms.push(String::from_utf8_lossy(&decoded).into_owned());
                }
            }
            for form in forms {
                found.extend(token.find_iter(&form).map(|m| m.as_str().to_string()));
            }
        }
        found
    };
    let written = tokens_in(&std::fs::read_to_string(&on_disk).unwrap());
    assert_eq!(written.len(), 1, "the search finds the job's token in the forms on disk: {written:?}");

    let (status, log) = env.get(&format!("/api/v1/jobs/{id}/logs"), &viewer).await;
    assert_eq!(status, StatusCode::OK);
    let log = log.as_str().unwrap_or_default().to_string();
    assert!(log.contains("upper ") && log.contains("url "), "{log}");
    let leaked = tokens_in(&log);
    assert!(leaked.is_empty(), "a viewer found the job's token in the log: {leaked:?}\n{log}");
    // And the token the job really has does work as the job, so nothing above passed by luck.
    let token = written.into_iter().next().unwrap();
    let metrics = json!({"points": [{"name": "loss", "step": 1, "value": 0.5}]});
    let (status, body) = env.post(&format!("/api/v1/jobs/{id}/metrics"), &token, &metrics).await;
    assert!(status.is_success(), "{body}");
    env.post(&format!("/api/v1/jobs/{id}/cancel"), &env.admin_token, &json!({})).await;
}

/// No type holding a secret prints it with `Debug`: no struct of the workspace that derives
/// `Debug` has a field named like a secret holding plain text (`String`, bytes): such types write
/// their own `Debug`, which redacts, and the crates' unit tests check each of them with a secret
/// in it. A field of a type that redacts itself (`TokenCreated`) is fine.
#[test]
fn no_type_that_derives_debug_holds_a_field_named_like_a_secret() {
    const SECRET_FIELDS: &[&str] =
        &["token", "secret", "password", "pkce_verifier", "nonce", "csrf", "client_secret", "signature"];
    let crates = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../crates");
    let derive = regex::Regex::new(r"#\[derive\([^\]]*\bDebug\b[^\]]*\)\]").unwrap();
    let struct_start = regex::Regex::new(r"^\s*(pub(\([^)]*\))? )?struct \w+").unwrap();
    let field = regex::Regex::new(r"^\s*(pub(\([^)]*\))? )?(\w+): (.*)$").unwrap();
    let plain_text = regex::Regex::new(r"\b(String|str|u8)\b").unwrap();
    let mut found = Vec::new();
    let mut files = 0;
    let mut stack = vec![crates];
    while let Some(dir) = stack.pop() {
        for entry in std::fs::read_dir(&dir).unwrap() {
            let path = entry.unwrap().path();
            if path.is_dir() {
                stack.push(path);
                continue;
            }
            if path.extension().is_none_or(|extension| extension != "rs") {
                continue;
            }
            files += 1;
            let text = std::fs::read_to_string(&path).unwrap();
            let lines: Vec<&str> = text.lines().collect();
            for (at, line) in lines.iter().enumerate() {
                if !derive.is_match(line) {
                    continue;
                }
                // The struct this derive is on (attributes and doc comments may lie between).
                let Some(start) = (at + 1..lines.len().min(at + 8)).find(|&i| struct_start.is_match(lines[i])) else {
                    continue;
                };
                if !lines[start].trim_end().ends_with('{') {
                    continue; // a tuple or unit struct
                }
                for (offset, body) in lines[start + 1..].iter().enumerate() {
                    if body.trim_start().starts_with('}') {
                        break;
                    }
                    if let Some(captures) = field.captures(body)
                        && SECRET_FIELDS.contains(&&captures[3])
                        && plain_text.is_match(&captures[4])
                    {
                        let name = &captures[3];
                        found.push(format!("{}:{}: {name}", path.display(), start + offset + 2));
                    }
                }
            }
        }
    }
    assert!(files > 50, "read only {files} source files under crates/");
    assert!(
        found.is_empty(),
        "types that derive Debug and hold a secret (write a redacting Debug instead):\n{}",
        found.join("\n")
    );
}

/// Request traces, at their most detailed, name the path but never the query: a download link's
/// signature or a sign-in's authorization code never reaches the server's log.
#[tokio::test(flavor = "multi_thread")]
async fn no_trace_holds_a_download_signature_or_a_sign_in_code() {
    let env = TestEnv::start_with_env(&[], &[("RUST_LOG".into(), "info,tower_http=trace".into())]).await;
    let client = reqwest::Client::new();
    for path in [
        "/api/v1/artifacts/download?key=t%2Fjob%2Fmodel.bin&expires=4102444800&sig=SIGSECRET0123456789abcdef",
        "/sso/callback?code=CODESECRET0123456789&state=STATESECRET0123456789",
    ] {
        let response = client.get(format!("{}{path}", env.server.url)).send().await.unwrap();
        assert!(response.status().is_client_error() || response.status().is_redirection(), "{path}: {response:?}");
    }
    tokio::time::sleep(Duration::from_millis(300)).await;
    let log = std::fs::read_to_string(env.data_dir().join("server.log")).unwrap();
    assert!(log.contains("/api/v1/artifacts/download"), "request traces are on, with the path:\n{log}");
    for secret in ["SIGSECRET", "CODESECRET", "STATESECRET"] {
        assert!(!log.contains(secret), "{secret} is in the server's log:\n{log}");
    }
}
