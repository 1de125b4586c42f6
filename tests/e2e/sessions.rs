//! Interactive sessions (issue 41): a notebook is an ordinary job of its tenant, reached through
//! the server's proxy at `/sessions/<id>/` on a host of its own (`s-<id>.localhost`), with a
//! cookie of its own that a one-time grant is exchanged for. A small HTTP and WebSocket server
//! stands in for JupyterLab as the session's program (`sessions/recorder.py`, run by the session
//! through a stand-in "python"), and records the headers each request reached it with.

use std::io::{Read, Write};
use std::net::TcpStream;
use std::os::unix::fs::PermissionsExt;
use std::time::Duration;

use serde_json::{Value, json};
use trainyard_tests::{StatusCode, TestEnv};

/// A folder every user may read (the session runs as its tenant's own user) holding a stand-in
/// for Python that runs the recorder, whatever it is asked to run.
fn recorder_python() -> (tempfile::TempDir, String) {
    let dir = tempfile::Builder::new().prefix("trainyard-session-").tempdir().unwrap();
    std::fs::set_permissions(dir.path(), std::fs::Permissions::from_mode(0o755)).unwrap();
    let recorder = dir.path().join("recorder.py");
    std::fs::write(&recorder, include_str!("sessions/recorder.py")).unwrap();
    let python = dir.path().join("python");
    std::fs::write(&python, format!("#!/bin/sh\nexec /usr/bin/python3 '{}'\n", recorder.display())).unwrap();
    for file in [&recorder, &python] {
        std::fs::set_permissions(file, std::fs::Permissions::from_mode(0o755)).unwrap();
    }
    let python = python.display().to_string();
    (dir, python)
}

/// The server's port.
fn port_of(env: &TestEnv) -> u16 {
    env.server.url.rsplit(':').next().unwrap().trim_end_matches('/').parse().unwrap()
}

/// The session's own host, as the server names it for a server reached at 127.0.0.1.
fn session_host(env: &TestEnv, id: &str) -> String {
    format!("s-{}.localhost:{}", id.replace('-', ""), port_of(env))
}

/// An HTTP client that reaches `host` (a session's) at the server, following no redirects.
fn client_for(env: &TestEnv, host: &str) -> reqwest::Client {
    let name = host.split(':').next().unwrap().to_string();
    reqwest::Client::builder()
        .redirect(reqwest::redirect::Policy::none())
        .resolve(&name, format!("127.0.0.1:{}", port_of(env)).parse().unwrap())
        .build()
        .unwrap()
}

/// Sends a WebSocket handshake for `path` on the session's host (with `cookie`, if any) and,
/// once switched, one text message; returns the status line and the reply.
fn websocket_roundtrip(env: &TestEnv, host: &str, path: &str, cookie: Option<&str>, message: &str) -> (String, String) {
    let mut stream = TcpStream::connect(("127.0.0.1", port_of(env))).unwrap();
    stream.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
    let cookie = cookie.map(|c| format!("Cookie: {c}\r\n")).unwrap_or_default();
    write!(
        stream,
        "GET {path} HTTP/1.1\r\nHost: {host}\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n\
         Sec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\nSec-WebSocket-Version: 13\r\n\
         Authorization: Bearer tyd_not_for_user_code\r\n{cookie}\r\n"
    )
    .unwrap();
    let mut head = Vec::new();
    let mut byte = [0u8; 1];
    while !head.ends_with(b"\r\n\r\n") {
        if stream.read(&mut byte).unwrap() == 0 {
            break;
        }
        head.push(byte[0]);
    }
    let head = String::from_utf8_lossy(&head).to_string();
    let status = head.lines().next().unwrap_or_default().to_string();
    if !status.contains(" 101 ") {
        return (status, String::new());
    }
    let mask = [1u8, 2, 3, 4];
    let mut frame = vec![0x81, 0x80 | message.len() as u8];
    frame.extend(mask);
    frame.extend(message.bytes().enumerate().map(|(i, b)| b ^ mask[i % 4]));
    stream.write_all(&frame).unwrap();
    let mut header = [0u8; 2];
    stream.read_exact(&mut header).unwrap();
    let mut reply = vec![0u8; usize::from(header[1] & 0x7f)];
    stream.read_exact(&mut reply).unwrap();
    (status, String::from_utf8(reply).unwrap())
}

/// Waits until the session's program answers through the proxy (it listens a moment after
/// its job is running; until then the proxy answers 503).
async fn wait_answering(http: &reqwest::Client, url: &str, cookie: &str) {
    let deadline = std::time::Instant::now() + Duration::from_secs(90);
    loop {
        let response = http.get(url).header("cookie", cookie).send().await;
        if response.as_ref().is_ok_and(|r| r.status() == StatusCode::OK) {
            return;
        }
        assert!(std::time::Instant::now() < deadline, "the session's program never answered: {response:?}");
        tokio::time::sleep(Duration::from_millis(300)).await;
    }
}

async fn wait_running(env: &TestEnv, token: &str, id: &str) {
    env.wait_job_as(token, id, Duration::from_secs(60), |job| {
        assert!(!["failed", "cancelled", "succeeded"].contains(&job["state"].as_str().unwrap()), "{job}");
        job["state"] == "running"
    })
    .await;
}

#[tokio::test(flavor = "multi_thread")]
async fn only_the_sessions_user_reaches_it_through_its_own_host_and_user_code_sees_no_platform_credential() {
    let env = TestEnv::start().await;
    let (_dir, python) = recorder_python();
    let owner = env.member("default", "olga", "member").await;
    let colleague = env.member("default", "max", "member").await;
    let viewer = env.member("default", "vera", "viewer").await;
    let (status, _) = env.post("/api/v1/admin/tenants", &env.admin_token, &json!({"name": "team-b"})).await;
    assert_eq!(status, StatusCode::CREATED);
    let other = env.member("team-b", "bob", "admin").await;

    // Bad input: every bad field named at once; a viewer may not open one.
    let (status, body) =
        env.post("/api/v1/sessions", &owner, &json!({"kind": "tensorboard", "gpus": 1, "memory": "lots"})).await;
    assert_eq!(status, StatusCode::UNPROCESSABLE_ENTITY, "{body}");
    assert!(body.to_string().contains("kind"), "{body}");
    let (status, body) = env.post("/api/v1/sessions", &viewer, &json!({})).await;
    assert_eq!(status, StatusCode::FORBIDDEN, "{body}");
    // A user name as long as allowed, with an '@', still makes a session (its job's name is cut).
    let long_name = env.member("default", &format!("{}@example.org", "a".repeat(110)), "member").await;
    let (status, body) = env.post("/api/v1/sessions", &long_name, &json!({"gpus": 64})).await;
    assert_eq!(status, StatusCode::CREATED, "{body}");
    let (status, body) =
        env.post(&format!("/api/v1/jobs/{}/cancel", body["id"].as_str().unwrap()), &long_name, &json!({})).await;
    assert!(status.is_success(), "{body}");

    // The session is a job of the tenant: queued, then running.
    let (status, session) = env.post("/api/v1/sessions", &owner, &json!({"python": python})).await;
    assert_eq!(status, StatusCode::CREATED, "{session}");
    let id = session["id"].as_str().unwrap().to_string();
    assert_eq!(session["kind"], "notebook");
    assert_eq!(session["user"], "olga");
    let (status, job) = env.get(&format!("/api/v1/jobs/{id}"), &owner).await;
    assert_eq!(status, StatusCode::OK, "{job}");
    assert_eq!(job["spec"]["template"]["name"], "notebook", "{job}");
    wait_running(&env, &owner, &id).await;

    // Links: only for the session's user (or the tenant's admins); another tenant sees nothing.
    let link_path = format!("/api/v1/sessions/{id}/link");
    for (who, token, want) in [
        ("a colleague", &colleague, StatusCode::FORBIDDEN),
        ("a viewer", &viewer, StatusCode::FORBIDDEN),
        ("another tenant's admin", &other, StatusCode::NOT_FOUND),
    ] {
        let (status, body) = env.post(&link_path, token, &json!({})).await;
        assert_eq!(status, want, "{who}: {body}");
    }
    let (status, _) = env.call(reqwest::Method::POST, &link_path, None, Some(&json!({}))).await;
    assert_eq!(status, StatusCode::UNAUTHORIZED, "anonymous");
    let (status, link) = env.post(&link_path, &owner, &json!({})).await;
    assert_eq!(status, StatusCode::OK, "{link}");
    let url = link["url"].as_str().unwrap().to_string();
    let host = session_host(&env, &id);
    assert!(url.starts_with(&format!("http://{host}/sessions/{id}/")), "{url}");
    assert!(!url.contains(&owner), "the link carries a grant, not the user's token: {url}");
    let session_client = client_for(&env, &host);

    // On the dashboard's host no session is served, with or without the grant.
    let on_dashboard = url.replace(&host, &format!("127.0.0.1:{}", port_of(&env)));
    let response = reqwest::Client::new().get(&on_dashboard).send().await.unwrap();
    assert_eq!(response.status(), StatusCode::NOT_FOUND);

    // The grant is exchanged, once, for the session's own cookie, scoped to its path.
    let response = session_client.get(&url).send().await.unwrap();
    assert_eq!(response.status(), StatusCode::OK);
    let set_cookie = response.headers()["set-cookie"].to_str().unwrap().to_string();
    let page = response.text().await.unwrap();
    assert!(page.contains(&format!("url=/sessions/{id}/lab")), "the page moves on to JupyterLab: {page}");
    for attribute in [format!("Path=/sessions/{id}/"), "HttpOnly".into(), "SameSite=Strict".into()] {
        assert!(set_cookie.contains(&attribute), "{attribute} in {set_cookie}");
    }
    assert!(!set_cookie.to_ascii_lowercase().contains("domain="), "host-only: {set_cookie}");
    let cookie = set_cookie.split(';').next().unwrap().to_string();
    let again = session_client.get(&url).send().await.unwrap();
    assert_eq!(again.status(), StatusCode::UNAUTHORIZED, "a grant works once");

    // Through the proxy: the program gets neither the platform's cookie nor any token, only
    // the session's upstream secret (it refuses requests without it).
    let proxied = format!("http://{host}/sessions/{id}/api/echo?x=1");
    wait_answering(&session_client, &proxied, &cookie).await;
    let response = session_client
        .post(&proxied)
        .header("cookie", format!("trainyard_session=platform-secret; {cookie}; _xsrf=kept"))
        .bearer_auth(&owner)
        .body("hello")
        .send()
        .await
        .unwrap();
    assert_eq!(response.status(), StatusCode::OK);
    let csp = response.headers()["content-security-policy"].to_str().unwrap().to_string();
    assert!(csp.contains("object-src 'none'") && !csp.contains('*'), "the proxy's policy, not the program's: {csp}");
    let seen: Value = response.json().await.unwrap();
    assert_eq!(seen["path"], format!("/sessions/{id}/api/echo?x=1"));
    assert_eq!(seen["body"], "hello");
    let headers = seen["headers"].as_array().unwrap();
    let all = serde_json::to_string(headers).unwrap();
    assert!(!all.contains(&owner) && !all.contains("tyd_") && !all.contains("tyj_"), "{all}");
    assert!(!all.contains("trainyard_session") && !all.contains("trainyard_notebook"), "{all}");
    assert!(!all.contains("platform-secret") && !all.contains(cookie.split('=').nth(1).unwrap()), "{all}");
    let header = |name: &str| headers.iter().find(|h| h[0] == name).map(|h| h[1].as_str().unwrap().to_string());
    assert_eq!(header("cookie").as_deref(), Some("_xsrf=kept"), "the program's own cookies pass");
    assert!(header("authorization").unwrap().starts_with("token "), "{all}");
    assert_eq!(
        header("host").as_deref(),
        Some(host.as_str()),
        "the browser's host, which Jupyter checks Origin against"
    );

    // WebSockets: upgraded through the proxy with the cookie, refused without.
    let ws_path = format!("/sessions/{id}/api/kernels/k/channels");
    let (status, reply) = websocket_roundtrip(&env, &host, &ws_path, Some(&cookie), "ping");
    assert!(status.contains(" 101 "), "{status}");
    assert_eq!(reply, "echo:ping");
    let (status, _) = websocket_roundtrip(&env, &host, &ws_path, None, "ping");
    assert!(status.contains(" 401 "), "{status}");

    // Refusals on proxied paths, HTTP and WebSocket: no cookie, the user's own API token, a
    // made-up cookie, the right cookie on the dashboard's host.
    for path in [format!("/sessions/{id}/"), format!("/sessions/{id}/lab"), format!("/sessions/{id}/api/kernels")] {
        let url = format!("http://{host}{path}");
        let bare = session_client.get(&url).send().await.unwrap();
        assert_eq!(bare.status(), StatusCode::UNAUTHORIZED, "{path} anonymous");
        let token = session_client.get(&url).bearer_auth(&owner).send().await.unwrap();
        assert_eq!(token.status(), StatusCode::UNAUTHORIZED, "{path} with an API token");
        let forged = session_client.get(&url).header("cookie", "trainyard_notebook=00ff").send().await.unwrap();
        assert_eq!(forged.status(), StatusCode::UNAUTHORIZED, "{path} with a made-up cookie");
        let dashboard = format!("{}{path}", env.server.url);
        let misplaced = reqwest::Client::new().get(&dashboard).header("cookie", &cookie).send().await.unwrap();
        assert_eq!(misplaced.status(), StatusCode::NOT_FOUND, "{path} on the dashboard's host");
    }

    // Activity counts once authenticated (at most one write a second): refused requests made
    // after this moment leave the session's last activity where it was, a good one moves it.
    tokio::time::sleep(Duration::from_millis(1100)).await;
    let (_, before) = env.get(&format!("/api/v1/sessions/{id}"), &owner).await;
    let refused = session_client.get(&proxied).send().await.unwrap();
    assert_eq!(refused.status(), StatusCode::UNAUTHORIZED);
    let (_, unmoved) = env.get(&format!("/api/v1/sessions/{id}"), &owner).await;
    assert_eq!(unmoved["last_activity_at"], before["last_activity_at"], "an anonymous request is no activity");
    let good = session_client.get(&proxied).header("cookie", &cookie).send().await.unwrap();
    assert_eq!(good.status(), StatusCode::OK);
    let (status, seen) = env.get(&format!("/api/v1/sessions/{id}"), &owner).await;
    assert_eq!(status, StatusCode::OK, "{seen}");
    assert_eq!(seen["state"], "running");
    assert!(seen["last_activity_at"].as_str().unwrap() > before["last_activity_at"].as_str().unwrap(), "{seen}");
    let (status, _) = env.get(&format!("/api/v1/sessions/{id}"), &other).await;
    assert_eq!(status, StatusCode::NOT_FOUND, "another tenant's session is unknown");

    // The cookie is worth no more than the token it was granted to: revoked, it stops.
    let (_, tokens) = env.get("/api/v1/tokens", &owner).await;
    let token_id = tokens[0]["id"].as_str().unwrap().to_string();
    let (status, _) =
        env.call(reqwest::Method::DELETE, &format!("/api/v1/tokens/{token_id}"), Some(&owner), None).await;
    assert!(status.is_success(), "{status}");
    let after = session_client.get(&proxied).header("cookie", &cookie).send().await.unwrap();
    assert_eq!(after.status(), StatusCode::UNAUTHORIZED, "after the token's revocation");
    let (status, body) = env.post(&format!("/api/v1/jobs/{id}/cancel"), &env.admin_token, &json!({})).await;
    assert!(status.is_success(), "{body}");
}

/// Follows a fresh link to the session as `token`'s user with a plain HTTP client; returns the
/// session's cookie (`name=value`).
async fn session_cookie(env: &TestEnv, token: &str, id: &str) -> String {
    let (status, link) = env.post(&format!("/api/v1/sessions/{id}/link"), token, &json!({})).await;
    assert_eq!(status, StatusCode::OK, "{link}");
    let response = client_for(env, &session_host(env, id)).get(link["url"].as_str().unwrap()).send().await.unwrap();
    assert_eq!(response.status(), StatusCode::OK);
    response.headers()["set-cookie"].to_str().unwrap().split(';').next().unwrap().to_string()
}

#[tokio::test(flavor = "multi_thread")]
async fn a_notebook_opened_from_the_dashboard_runs_a_cell_over_the_proxied_kernel_websocket() {
    let Some(browser) = trainyard_tests::web::browser_or_skip("notebook browser test").await else { return };
    let python = std::env::var("TRAINYARD_TEST_PYTHON")
        .expect("TRAINYARD_TEST_PYTHON: a Python with jupyterlab (tests/python-requirements.txt; tests/run sets it)");
    let env = TestEnv::start().await;
    let owner = env.member("default", "olga", "member").await;
    let (status, session) = env.post("/api/v1/sessions", &owner, &json!({"python": python})).await;
    assert_eq!(status, StatusCode::CREATED, "{session}");
    let id = session["id"].as_str().unwrap().to_string();
    wait_running(&env, &owner, &id).await;
    let host = session_host(&env, &id);

    // JupyterLab answers through the proxy once it listens; a notebook with one cell is made
    // through its contents API (the proxy sends the session's secret upstream).
    let cookie = session_cookie(&env, &owner, &id).await;
    let http = client_for(&env, &host);
    wait_answering(&http, &format!("http://{host}/sessions/{id}/api/status"), &cookie).await;
    let notebook = json!({"type": "notebook", "content": {
        "nbformat": 4, "nbformat_minor": 5,
        "metadata": {"kernelspec": {"name": "python3", "display_name": "Python 3", "language": "python"}},
        "cells": [{"cell_type": "code", "id": "c1", "metadata": {}, "execution_count": null, "outputs": [],
                   "source": "print('hello from ' + 'the kernel', 6 * 7)"}]}});
    let made = http
        .put(format!("http://{host}/sessions/{id}/api/contents/hello.ipynb"))
        .header("cookie", &cookie)
        .json(&notebook)
        .send()
        .await
        .unwrap();
    assert!(made.status().is_success(), "{:?}", made.text().await);

    // In the browser: sign in to the dashboard, open the notebook from the session's job page.
    let c = &browser.client;
    c.goto(&format!("{}/login", env.server.url)).await.unwrap();
    c.find(fantoccini::Locator::Id("token")).await.unwrap().send_keys(&owner).await.unwrap();
    c.find(fantoccini::Locator::Css("form button[type=submit]")).await.unwrap().click().await.unwrap();
    browser.wait_text("#who", Duration::from_secs(10), |t| t.contains("olga")).await;
    c.goto(&format!("{}/jobs/{id}", env.server.url)).await.unwrap();
    c.find(fantoccini::Locator::Id("open-notebook")).await.unwrap().click().await.unwrap();
    browser.wait_text("#jp-main-dock-panel, .jp-LabShell", Duration::from_secs(60), |_| true).await;
    let at = c.current_url().await.unwrap();
    assert_eq!(at.host_str(), Some(host.split(':').next().unwrap()), "JupyterLab runs on the session's own host: {at}");
    assert!(at.path().starts_with(&format!("/sessions/{id}/lab")), "{at}");
    // No platform cookie on the session's host: the browser holds only the session's.
    let cookies = c.get_all_cookies().await.unwrap();
    assert!(cookies.iter().all(|c| c.name() != "trainyard_session"), "{cookies:?}");

    // Run the cell: its output comes back over the kernel's WebSocket, through the proxy.
    c.goto(&format!("http://{host}/sessions/{id}/lab/tree/hello.ipynb")).await.unwrap();
    browser.wait_text(".jp-Notebook .jp-Cell .cm-content", Duration::from_secs(60), |t| t.contains("hello from")).await;
    let deadline = std::time::Instant::now() + Duration::from_secs(90);
    let output = loop {
        // Under load JupyterLab may ask which kernel to use (its default is the notebook's own).
        if let Ok(accept) = c.find(fantoccini::Locator::Css(".jp-Dialog .jp-mod-accept")).await {
            let _ = accept.click().await;
        }
        if let Ok(cell) = c.find(fantoccini::Locator::Css(".jp-Notebook .jp-Cell .cm-content")).await {
            let _ = cell.click().await;
            let _ = cell.send_keys("\u{E008}\u{E007}").await;
        }
        tokio::time::sleep(Duration::from_secs(2)).await;
        if let Ok(out) = c.find(fantoccini::Locator::Css(".jp-OutputArea-output")).await
            && let Ok(text) = out.text().await
            && text.contains("hello from the kernel 42")
        {
            break text;
        }
        if std::time::Instant::now() > deadline {
            browser.screenshot("notebook-no-output", 1280).await;
            panic!("the cell's output never appeared (screenshot notebook-no-output)");
        }
    };
    assert!(output.contains("hello from the kernel 42"), "{output}");
    browser.screenshot("notebook", 1280).await;
    browser.close().await;
    let (status, body) = env.post(&format!("/api/v1/jobs/{id}/cancel"), &owner, &json!({})).await;
    assert!(status.is_success(), "{body}");
}

/// A member of the default tenant, whose quota is one `sim-gpu`.
async fn member_with_one_gpu_of_quota(env: &TestEnv) -> String {
    let owner = env.member("default", "olga", "member").await;
    let (status, body) = env
        .call(
            reqwest::Method::PUT,
            "/api/v1/admin/tenants/default/quotas/sim-gpu",
            Some(&env.admin_token),
            Some(&json!({"nominal": 1})),
        )
        .await;
    assert!(status.is_success(), "{body}");
    owner
}

#[tokio::test(flavor = "multi_thread")]
async fn yard_notebook_waits_in_the_queue_saying_why_then_prints_a_link_that_opens_it() {
    let env = TestEnv::start_with(&["--simulate-gpus", "2", "--simulate-gpu-type", "sim-gpu"]).await;
    let (_dir, python) = recorder_python();
    let owner = member_with_one_gpu_of_quota(&env).await;
    // The tenant's one GPU is taken by a job that runs for at most two minutes.
    let (status, sleeper) = env
        .post(
            "/api/v1/jobs",
            &owner,
            &json!({"command": ["sleep", "300"], "time_limit_seconds": 120,
                    "resources": {"gpus": 1, "gpu_type": "sim-gpu"}}),
        )
        .await;
    assert_eq!(status, StatusCode::CREATED, "{sleeper}");
    let sleeper = sleeper["id"].as_str().unwrap().to_string();
    wait_running(&env, &owner, &sleeper).await;

    // The notebook waits like any job, and says why.
    let waited =
        env.yard(&owner, &["notebook", "--gpus", "1", "--gpu-type", "sim-gpu", "--python", &python, "--timeout", "3"]);
    let said = trainyard_tests::stderr(&waited);
    assert_eq!(waited.status.code(), Some(124), "{said}");
    let id = said.split("opened notebook session ").nth(1).unwrap().split_whitespace().next().unwrap().to_string();
    assert!(said.contains("gave up waiting") && said.contains("queued"), "{said}");
    assert!(said.to_lowercase().contains("quota"), "the reason names the quota: {said}");
    let (status, schedule) = env.get(&format!("/api/v1/jobs/{id}/schedule"), &owner).await;
    assert_eq!(status, StatusCode::OK, "{schedule}");
    assert!(schedule["reason"].as_str().unwrap().to_lowercase().contains("quota"), "{schedule}");
    assert!(schedule["estimated_start"].is_string(), "until when: {schedule}");

    // Once the GPU is free it runs; the link opens it.
    let (status, body) = env.post(&format!("/api/v1/jobs/{sleeper}/cancel"), &owner, &json!({})).await;
    assert!(status.is_success(), "{body}");
    let opened = env.yard(&owner, &["notebook", "--link", &id, "--timeout", "60"]);
    assert!(opened.status.success(), "{}", trainyard_tests::stderr(&opened));
    let url = trainyard_tests::stdout(&opened).trim().to_string();
    let host = session_host(&env, &id);
    assert!(url.starts_with(&format!("http://{host}/sessions/{id}/_trainyard/enter?grant=")), "{url}");
    let http = client_for(&env, &host);
    let entered = http.get(&url).send().await.unwrap();
    assert_eq!(entered.status(), StatusCode::OK);
    let cookie = entered.headers()["set-cookie"].to_str().unwrap().split(';').next().unwrap().to_string();
    wait_answering(&http, &format!("http://{host}/sessions/{id}/api/echo"), &cookie).await;
    let (status, body) = env.post(&format!("/api/v1/jobs/{id}/cancel"), &owner, &json!({})).await;
    assert!(status.is_success(), "{body}");
}

#[tokio::test(flavor = "multi_thread")]
async fn an_idle_notebook_is_warned_then_stopped_and_its_gpus_given_back() {
    let env = TestEnv::start_with(&["--simulate-gpus", "1", "--simulate-gpu-type", "sim-gpu"]).await;
    let (_dir, python) = recorder_python();
    let owner = member_with_one_gpu_of_quota(&env).await;
    let policy = |seconds: u32| json!({"session_idle_timeout_seconds": seconds});
    let (status, body) = env
        .call(reqwest::Method::PATCH, "/api/v1/admin/tenants/default", Some(&env.admin_token), Some(&policy(5)))
        .await;
    assert_eq!(status, StatusCode::UNPROCESSABLE_ENTITY, "{body}");
    assert_eq!(body["error"]["field"], "session_idle_timeout_seconds", "{body}");
    let (status, body) = env
        .call(reqwest::Method::PATCH, "/api/v1/admin/tenants/default", Some(&env.admin_token), Some(&policy(30)))
        .await;
    assert!(status.is_success(), "{body}");

    let (status, session) =
        env.post("/api/v1/sessions", &owner, &json!({"python": python, "gpus": 1, "gpu_type": "sim-gpu"})).await;
    assert_eq!(status, StatusCode::CREATED, "{session}");
    let id = session["id"].as_str().unwrap().to_string();
    wait_running(&env, &owner, &id).await;
    let host = session_host(&env, &id);
    let cookie = session_cookie(&env, &owner, &id).await;
    wait_answering(&client_for(&env, &host), &format!("http://{host}/sessions/{id}/api/echo"), &cookie).await;
    let used = std::time::Instant::now();

    // Warned while still running, half-way through the timeout; then stopped once idle for all of it.
    let warned = env
        .wait_job_as(&owner, &id, Duration::from_secs(40), |job| {
            job["reason"].as_str().is_some_and(|r| r.starts_with("idle:")) || job["state"] != "running"
        })
        .await;
    let warned_after = used.elapsed();
    assert_eq!(warned["state"], "running", "warned before the stop: {warned}");
    assert!(warned["reason"].as_str().unwrap().contains("stops at"), "{warned}");
    assert!(warned_after >= Duration::from_secs(14), "not before half of the timeout: {warned_after:?}");
    let stopped = env.wait_job_as(&owner, &id, Duration::from_secs(40), |job| job["state"] == "cancelled").await;
    let stopped_after = used.elapsed();
    assert!(stopped_after >= Duration::from_secs(29), "not before the timeout: {stopped_after:?} {stopped}");
    let (_, events) = env.get(&format!("/api/v1/jobs/{id}/events"), &owner).await;
    let idle: Vec<&str> = events
        .as_array()
        .unwrap()
        .iter()
        .filter(|e| e["actor"] == "control:idle")
        .map(|e| e["reason"].as_str().unwrap())
        .collect();
    assert_eq!(idle.len(), 2, "a warning and a stop: {events}");
    assert!(idle[0].starts_with("idle:") && idle[1].starts_with("stopped: idle for 30 s"), "{idle:?}");

    // Its GPU is free again: a job asking for it runs.
    let (status, job) = env
        .post("/api/v1/jobs", &owner, &json!({"command": ["true"], "resources": {"gpus": 1, "gpu_type": "sim-gpu"}}))
        .await;
    assert_eq!(status, StatusCode::CREATED, "{job}");
    env.wait_job_as(&owner, job["id"].as_str().unwrap(), Duration::from_secs(30), |j| j["state"] == "succeeded").await;
}

#[tokio::test(flavor = "multi_thread")]
async fn a_notebooks_script_reads_neither_the_dashboard_nor_another_session_in_the_browser() {
    let Some(browser) = trainyard_tests::web::browser_or_skip("session origin browser test").await else { return };
    let env = TestEnv::start().await;
    let (_dir, python) = recorder_python();
    let owner = env.member("default", "olga", "member").await;
    let mut sessions = Vec::new();
    for _ in 0..2 {
        let (status, session) = env.post("/api/v1/sessions", &owner, &json!({"python": python})).await;
        assert_eq!(status, StatusCode::CREATED, "{session}");
        sessions.push(session["id"].as_str().unwrap().to_string());
    }
    for id in &sessions {
        wait_running(&env, &owner, id).await;
        let cookie = session_cookie(&env, &owner, id).await;
        let host = session_host(&env, id);
        wait_answering(&client_for(&env, &host), &format!("http://{host}/sessions/{id}/api/echo"), &cookie).await;
    }
    let (a, b) = (&sessions[0], &sessions[1]);
    let (host_a, host_b) = (session_host(&env, a), session_host(&env, b));

    // The browser holds every credential at stake: the dashboard's session and both notebooks'.
    let c = &browser.client;
    c.goto(&format!("{}/login", env.server.url)).await.unwrap();
    c.find(fantoccini::Locator::Id("token")).await.unwrap().send_keys(&owner).await.unwrap();
    c.find(fantoccini::Locator::Css("form button[type=submit]")).await.unwrap().click().await.unwrap();
    browser.wait_text("#who", Duration::from_secs(10), |t| t.contains("olga")).await;
    for id in &sessions {
        let (status, link) = env.post(&format!("/api/v1/sessions/{id}/link"), &owner, &json!({})).await;
        assert_eq!(status, StatusCode::OK, "{link}");
        c.goto(link["url"].as_str().unwrap()).await.unwrap();
        browser.wait_text("body", Duration::from_secs(20), |t| t.contains("/lab")).await;
    }

    // Session A's page tries to read its own API (it can), the dashboard and session B (it
    // cannot: other origins, no CORS).
    let own = format!("http://{host_a}/sessions/{a}/api/echo");
    let dashboard = format!("{}/jobs", env.server.url);
    let other = format!("http://{host_b}/sessions/{b}/api/echo");
    let attack = reqwest::Url::parse_with_params(
        &format!("http://{host_a}/sessions/{a}/attack.html"),
        [("t", own.as_str()), ("t", dashboard.as_str()), ("t", other.as_str())],
    )
    .unwrap();
    c.goto(attack.as_str()).await.unwrap();
    let result = browser.wait_text("#result", Duration::from_secs(20), |t| t != "running").await;
    let outcomes: Vec<&str> = result.split(" | ").collect();
    assert_eq!(outcomes.len(), 3, "{result}");
    assert!(outcomes[0].starts_with("read 200") && outcomes[0].contains("/api/echo"), "its own API: {result}");
    assert_eq!(outcomes[1], "refused", "the dashboard: {result}");
    assert_eq!(outcomes[2], "refused", "another session: {result}");
    browser.close().await;
}

/// The server killed (-9) and started again on its address while a notebook runs: the session
/// keeps running in its first attempt and the browser's cookie still reaches it through the
/// new server's proxy. Then its program dies: the session ends as a failed job, saying so.
#[tokio::test(flavor = "multi_thread")]
async fn a_session_outlives_a_server_restart_and_a_dead_program_fails_its_job() {
    let mut env = TestEnv::start().await;
    let (dir, python) = recorder_python();
    let owner = env.member("default", "olga", "member").await;
    let (status, session) = env.post("/api/v1/sessions", &owner, &json!({"python": python})).await;
    assert_eq!(status, StatusCode::CREATED, "{session}");
    let id = session["id"].as_str().unwrap().to_string();
    wait_running(&env, &owner, &id).await;
    let cookie = session_cookie(&env, &owner, &id).await;
    let host = session_host(&env, &id);
    let echo = format!("http://{host}/sessions/{id}/api/echo");
    wait_answering(&client_for(&env, &host), &echo, &cookie).await;

    env.restart_after_crash_on_the_same_address();
    wait_answering(&client_for(&env, &host), &echo, &cookie).await;
    let (_, attempts) = env.get(&format!("/api/v1/jobs/{id}/attempts"), &owner).await;
    assert_eq!(attempts.as_array().map(Vec::len), Some(1), "the same attempt runs on: {attempts}");
    let (_, job) = env.get(&format!("/api/v1/jobs/{id}"), &owner).await;
    assert_eq!(job["state"], "running", "{job}");

    let recorder = dir.path().join("recorder.py");
    let killed = std::process::Command::new("pkill").args(["-KILL", "-f"]).arg(&recorder).status().unwrap();
    assert!(killed.success(), "the session's program was found and killed");
    let ended = env.wait_job_as(&owner, &id, Duration::from_secs(60), |job| !job["finished_at"].is_null()).await;
    assert_eq!(ended["state"], "failed", "{ended}");
    assert!(ended["reason"].as_str().is_some_and(|r| !r.is_empty()), "it says why: {ended}");
}
