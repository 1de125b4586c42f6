//! The dashboard: in a real headless Chromium (Debian's, through ChromeDriver) against the real
//! server and Postgres, and over plain HTTP for the rules every page must keep (tenancy, roles,
//! CSRF). Screenshots of the main pages at 1280 and 390 px land under
//! `target/test-output/screenshots/` for a reviewer.

use std::time::Duration;

use fantoccini::Locator;
use serde_json::json;
use trainyard_tests::web::{Browser, WebClient, browser_or_skip, csrf_of};
use trainyard_tests::{StatusCode, TestEnv};

/// Marks the page in the browser; the mark survives until the next full page load.
async fn mark_page(browser: &Browser) {
    browser.client.execute("window.__trainyardMark = 'still here'; return 1;", vec![]).await.unwrap();
}

async fn page_was_not_reloaded(browser: &Browser) -> bool {
    let mark = browser.client.execute("return window.__trainyardMark || null;", vec![]).await.unwrap();
    mark == json!("still here")
}

/// A shell command as the form's list parameter takes it: one argument per line.
fn lines(argv: &[&str]) -> String {
    argv.join("\n")
}

#[tokio::test(flavor = "multi_thread")]
async fn a_researcher_signs_in_submits_watches_and_signs_out_in_a_browser() {
    let Some(browser) = browser_or_skip("dashboard browser test").await else { return };
    let env = TestEnv::start_with(&["--simulate-gpus", "4", "--simulate-gpu-type", "sim-gpu"]).await;
    let quota = json!({"nominal": 4});
    let (status, body) = env
        .call(
            reqwest::Method::PUT,
            "/api/v1/admin/tenants/default/quotas/sim-gpu",
            Some(&env.admin_token),
            Some(&quota),
        )
        .await;
    assert!(status.is_success(), "{body}");
    let base = &env.server.url;
    let c = &browser.client;

    // Sign in with the admin token.
    c.goto(&format!("{base}/jobs")).await.unwrap();
    assert!(c.current_url().await.unwrap().path().ends_with("/login"), "signed-out visitors go to sign-in");
    browser.screenshot("login", 1280).await;
    browser.screenshot("login", 390).await;
    c.find(Locator::Id("token")).await.unwrap().send_keys(&env.admin_token).await.unwrap();
    c.find(Locator::Css("form button[type=submit]")).await.unwrap().click().await.unwrap();
    browser.wait_text("#who", Duration::from_secs(10), |t| t.contains("admin")).await;
    assert!(c.current_url().await.unwrap().path().ends_with("/jobs"));

    // A bad parameter: the server's message next to the field, and no job. The browser's own
    // checks would stop the form first, so they are turned off to reach the server's.
    c.goto(&format!("{base}/submit/shell")).await.unwrap();
    c.find(Locator::Id("p-command")).await.unwrap().send_keys("true").await.unwrap();
    let replicas = c.find(Locator::Id("p-replicas")).await.unwrap();
    replicas.clear().await.unwrap();
    replicas.send_keys("0").await.unwrap();
    c.execute("document.getElementById('submit-form').noValidate = true; return 1;", vec![]).await.unwrap();
    c.find(Locator::Id("submit")).await.unwrap().click().await.unwrap();
    let message = browser.wait_text("#p-replicas-error", Duration::from_secs(10), |t| !t.is_empty()).await;
    assert!(message.contains("at least 1"), "{message}");
    assert_eq!(env.jobs_in_db().await, 0, "a refused form creates no job");

    // The what-if preview, then a real submit with a parameter: the job prints two lines with
    // a pause between, and posts a loss curve with its job token.
    let script_path = env.dir.path().join("post_metrics.py");
    let script = "import json, os, sys, time, urllib.request\n\
        print('first line', flush=True)\n\
        points = [{'step': s, 'name': 'loss', 'value': 1.0 / (s + 1)} for s in range(5)]\n\
        request = urllib.request.Request(os.environ['TRAINYARD_URL'] + '/api/v1/jobs/' + os.environ['TRAINYARD_JOB_ID'] + '/metrics',\n\
            data=json.dumps({'points': points}).encode(), method='POST',\n\
            headers={'Authorization': 'Bearer ' + os.environ['TRAINYARD_TOKEN'], 'Content-Type': 'application/json'})\n\
        urllib.request.urlopen(request).read()\n\
        time.sleep(4)\n\
        print('second line', flush=True)\n\
        time.sleep(1)\n";
    std::fs::write(&script_path, script).unwrap();
    c.goto(&format!("{base}/submit/shell")).await.unwrap();
    let command = c.find(Locator::Id("p-command")).await.unwrap();
    command.clear().await.unwrap();
    command.send_keys(&lines(&["python3", script_path.to_str().unwrap()])).await.unwrap();
    c.find(Locator::Id("f-name")).await.unwrap().send_keys("browser-job").await.unwrap();
    c.find(Locator::Id("preview")).await.unwrap().click().await.unwrap();
    let what_if = browser.wait_text("#what-if", Duration::from_secs(10), |t| !t.is_empty()).await;
    assert!(what_if.contains("start now"), "{what_if}");
    browser.screenshot("submit", 1280).await;
    browser.screenshot("submit", 390).await;
    c.set_window_size(1280, 900).await.unwrap();
    c.find(Locator::Id("submit")).await.unwrap().click().await.unwrap();

    // The job's page: its log arrives line by line, without a reload, and the state follows.
    browser.wait_text("h1", Duration::from_secs(10), |t| t == "browser-job").await;
    mark_page(&browser).await;
    browser.wait_text("#log-0", Duration::from_secs(30), |t| t.contains("first line")).await;
    let log = c.find(Locator::Id("log-0")).await.unwrap().text().await.unwrap();
    assert!(!log.contains("second line"), "the first line shows while the job still sleeps: {log:?}");
    browser.wait_text("#log-0", Duration::from_secs(30), |t| t.contains("second line")).await;
    browser.wait_text("#job-state", Duration::from_secs(30), |t| t == "succeeded").await;
    browser.wait_text("#log-status-0", Duration::from_secs(10), |t| t.contains("whole log")).await;

    // The metrics it posted are drawn as a chart with those points.
    let chart = c.wait().at_most(Duration::from_secs(15)).for_element(Locator::Css("figure[data-metric=loss]")).await;
    let chart = chart.unwrap();
    assert_eq!(chart.attr("data-points").await.unwrap().as_deref(), Some("5"));
    assert!(c.find(Locator::Css("figure[data-metric=loss] canvas")).await.is_ok(), "uPlot drew a canvas");
    assert!(page_was_not_reloaded(&browser).await, "the page updated in place");
    browser.screenshot("job", 1280).await;
    browser.screenshot("job", 390).await;

    // The job list: a new job appears and reaches `succeeded` without a reload.
    c.goto(&format!("{base}/jobs")).await.unwrap();
    mark_page(&browser).await;
    let id = env
        .submit(
            json!({"name": "listed-live", "command": ["sleep", "2"], "resources": {"gpus": 1, "gpu_type": "sim-gpu"}}),
        )
        .await;
    let badge = format!("tr[data-job='{id}'] .badge");
    browser.wait_text(&badge, Duration::from_secs(30), |t| t == "succeeded").await;
    assert!(page_was_not_reloaded(&browser).await, "the list updated in place");
    browser.screenshot("jobs", 1280).await;
    browser.screenshot("jobs", 390).await;
    // On a phone the list fits: name, state and reason, no sideways scrolling.
    let widths = c
        .execute("const w = document.querySelector('.table-wrap'); return [w.scrollWidth, w.clientWidth];", vec![])
        .await
        .unwrap();
    assert!(widths[0].as_f64() <= widths[1].as_f64(), "the jobs list scrolls sideways at 390 px: {widths}");

    for (page, name) in [
        ("/templates", "templates"),
        ("/queue", "queue"),
        ("/quota", "quota"),
        ("/admin", "admin"),
        ("/tokens", "tokens"),
    ] {
        c.goto(&format!("{base}{page}")).await.unwrap();
        browser.wait_text("h1", Duration::from_secs(10), |t| !t.is_empty()).await;
        browser.screenshot(name, 1280).await;
        browser.screenshot(name, 390).await;
    }

    // Sign out: back to sign-in, and the old session opens nothing.
    c.set_window_size(1280, 900).await.unwrap();
    c.find(Locator::Id("sign-out")).await.unwrap().click().await.unwrap();
    browser.wait_text("h1", Duration::from_secs(10), |t| t.contains("Sign in")).await;
    c.goto(&format!("{base}/jobs")).await.unwrap();
    assert!(c.current_url().await.unwrap().path().ends_with("/login"));
    browser.close().await;
}

#[tokio::test(flavor = "multi_thread")]
async fn pages_show_a_member_nothing_of_another_tenant() {
    let env = TestEnv::start().await;
    let (status, _) = env.post("/api/v1/admin/tenants", &env.admin_token, &json!({"name": "team-b"})).await;
    assert_eq!(status, StatusCode::CREATED);
    let bob = env.member("team-b", "bob", "member").await;
    let secret_job = env.submit(json!({"name": "default-secret-job", "command": ["true"]})).await;
    let bobs_job = {
        let (status, job) = env.post("/api/v1/jobs", &bob, &json!({"name": "bobs-job", "command": ["true"]})).await;
        assert_eq!(status, StatusCode::CREATED);
        job["id"].as_str().unwrap().to_string()
    };

    let web = WebClient::signed_in(&env.server.url, &bob).await;
    for page in ["/jobs", "/jobs/rows", "/templates", "/queue", "/quota", "/tokens", &format!("/jobs/{bobs_job}")] {
        let (status, html) = web.get(page).await;
        assert_eq!(status, StatusCode::OK, "{page}");
        assert!(!html.contains("default-secret-job") && !html.contains(&secret_job), "{page} leaks the other tenant");
        assert!(!html.contains("user:admin"), "{page} leaks the other tenant's people");
    }
    assert!(web.get("/jobs").await.1.contains("bobs-job"));
    for page in [
        format!("/jobs/{secret_job}"),
        format!("/jobs/{secret_job}/live"),
        format!("/jobs/{secret_job}/metrics.json"),
        format!("/jobs/{secret_job}/log.txt"),
        format!("/submit/shell?from={secret_job}"),
    ] {
        assert_eq!(web.get(&page).await.0, StatusCode::NOT_FOUND, "{page}");
    }
    // Not a platform admin: no admin page.
    assert_eq!(web.get("/admin").await.0, StatusCode::FORBIDDEN);
    let (_, jobs) = web.get("/jobs").await;
    let (status, _) = web.post_form(&format!("/jobs/{secret_job}/cancel"), &[("csrf", &csrf_of(&jobs))]).await;
    assert_eq!(status, StatusCode::NOT_FOUND);
    let (_, job) = env.get(&format!("/api/v1/jobs/{secret_job}"), &env.admin_token).await;
    assert_ne!(job["reason"].as_str().unwrap_or_default(), "cancelled by user:bob");
}

#[tokio::test(flavor = "multi_thread")]
async fn a_viewer_gets_no_buttons_and_form_posts_need_role_and_csrf() {
    let env = TestEnv::start().await;
    let vera = env.member("default", "vera", "viewer").await;
    let id = env.submit(json!({"name": "long", "command": ["sleep", "600"]})).await;

    let viewer = WebClient::signed_in(&env.server.url, &vera).await;
    let (status, page) = viewer.get(&format!("/jobs/{id}")).await;
    assert_eq!(status, StatusCode::OK);
    assert!(!page.contains("id=\"cancel\"") && !page.contains("submit-again"), "a viewer sees no buttons");
    assert!(!viewer.get("/jobs").await.1.contains("href=\"/submit\""), "no submit link for a viewer");
    assert_eq!(viewer.get("/submit/shell").await.0, StatusCode::FORBIDDEN);
    let csrf = csrf_of(&page);
    let (status, _) = viewer.post_form(&format!("/jobs/{id}/cancel"), &[("csrf", &csrf)]).await;
    assert_eq!(status, StatusCode::FORBIDDEN, "the server refuses a viewer's cancel anyway");
    let (status, _) = viewer.post_form("/submit/shell", &[("csrf", &csrf), ("p.command", "true")]).await;
    assert_eq!(status, StatusCode::FORBIDDEN);
    assert_eq!(env.jobs_in_db().await, 1);

    // A member's cancel without the session's CSRF token (as a forged cross-site form would
    // post it) is refused and changes nothing; with it, the job is cancelled.
    let admin = WebClient::signed_in(&env.server.url, &env.admin_token).await;
    let (_, page) = admin.get(&format!("/jobs/{id}")).await;
    assert!(page.contains("id=\"cancel\""), "a member sees the cancel button");
    assert_eq!(admin.post_form(&format!("/jobs/{id}/cancel"), &[]).await.0, StatusCode::FORBIDDEN);
    let forged = "0".repeat(64);
    assert_eq!(admin.post_form(&format!("/jobs/{id}/cancel"), &[("csrf", &forged)]).await.0, StatusCode::FORBIDDEN);
    let (_, job) = env.get(&format!("/api/v1/jobs/{id}"), &env.admin_token).await;
    assert!(job["cancel_requested_at"].is_null(), "{job}");
    let (status, _) = admin.post_form(&format!("/jobs/{id}/cancel"), &[("csrf", &csrf_of(&page))]).await;
    assert_eq!(status, StatusCode::SEE_OTHER);
    env.wait_state(&id, "cancelled", Duration::from_secs(30)).await;

    // The submit form takes the number of restarts; a bad one is refused next to its field.
    let (_, form) = admin.get("/submit/shell").await;
    assert!(form.contains("id=\"f-max-restarts\""), "the form has a restarts field");
    let form_csrf = csrf_of(&form);
    let fields = |restarts: &'static str| {
        [("csrf", form_csrf.clone()), ("p.command", "true".into()), ("max_restarts", restarts.into())]
    };
    let (status, page) =
        admin.post_form("/submit/shell", &fields("many").each_ref().map(|(k, v)| (*k, v.as_str()))).await;
    assert_eq!(status, StatusCode::UNPROCESSABLE_ENTITY);
    assert!(
        page.contains("id=\"f-max-restarts-error\" role=\"alert\">must be a whole number"),
        "the message next to its field: {page}"
    );
    let (status, _) = admin.post_form("/submit/shell", &fields("2").each_ref().map(|(k, v)| (*k, v.as_str()))).await;
    assert_eq!(status, StatusCode::SEE_OTHER);
    let (_, jobs) = env.get("/api/v1/jobs?limit=1", &env.admin_token).await;
    assert_eq!(jobs["items"][0]["max_restarts"], 2, "{jobs}");

    // Another session's CSRF value is worth nothing in this one; and sign-in itself is
    // protected by a double-submit cookie.
    assert_eq!(admin.post_form("/logout", &[("csrf", &csrf)]).await.0, StatusCode::FORBIDDEN);
    let stranger = WebClient::new(&env.server.url);
    let (status, _) = stranger.post_form("/login", &[("csrf", &forged), ("token", &env.admin_token)]).await;
    assert_eq!(status, StatusCode::FORBIDDEN);
}

#[tokio::test(flavor = "multi_thread")]
async fn a_session_is_worth_no_more_than_its_token() {
    let env = TestEnv::start().await;
    let (status, created) = env.post("/api/v1/tokens", &env.admin_token, &json!({"name": "short"})).await;
    assert_eq!(status, StatusCode::CREATED, "{created}");
    let token = created["token"].as_str().unwrap();
    let web = WebClient::signed_in(&env.server.url, token).await;
    assert_eq!(web.get("/jobs").await.0, StatusCode::OK);

    // Session cookies are HttpOnly and SameSite, and Secure behind TLS.
    let client = reqwest::Client::builder().redirect(reqwest::redirect::Policy::none()).build().unwrap();
    let login =
        client.get(format!("{}/login", env.server.url)).header("x-forwarded-proto", "https").send().await.unwrap();
    let cookie = login.headers()["set-cookie"].to_str().unwrap().to_string();
    assert!(cookie.contains("HttpOnly") && cookie.contains("SameSite=Lax") && cookie.contains("Secure"), "{cookie}");

    // Revoking the token ends the session at once.
    let id = created["id"].as_str().unwrap();
    let (status, _) =
        env.call(reqwest::Method::DELETE, &format!("/api/v1/tokens/{id}"), Some(&env.admin_token), None).await;
    assert_eq!(status, StatusCode::NO_CONTENT);
    let (status, _) = web.get("/jobs").await;
    assert_eq!(status, StatusCode::SEE_OTHER, "back to sign-in");

    // A wrong token gets a message on the form, no session.
    let stranger = WebClient::new(&env.server.url);
    let (_, page) = stranger.get("/login").await;
    let (status, page) = stranger.post_form("/login", &[("csrf", &csrf_of(&page)), ("token", "tyd_0000")]).await;
    assert_eq!(status, StatusCode::UNAUTHORIZED);
    assert!(page.contains("token-error"), "{page}");
}

#[tokio::test(flavor = "multi_thread")]
async fn an_admin_sets_a_quota_in_the_admin_page_and_the_quota_page_draws_its_use() {
    let env = TestEnv::start_with(&["--simulate-gpus", "4", "--simulate-gpu-type", "sim-gpu"]).await;
    let admin = WebClient::signed_in(&env.server.url, &env.admin_token).await;
    let (status, page) = admin.get("/admin").await;
    assert_eq!(status, StatusCode::OK);
    assert!(page.contains("<td>sim-gpu</td><td>4</td>"), "the node inventory lists the 4 GPUs: {page}");
    let csrf = csrf_of(&page);

    // A bad number names its field and sets nothing.
    let form = [("csrf", csrf.as_str()), ("tenant", "default"), ("flavor", "sim-gpu"), ("nominal", "four")];
    let (status, page) = admin.post_form("/admin/quota", &form).await;
    assert_eq!(status, StatusCode::UNPROCESSABLE_ENTITY);
    assert!(page.contains("nominal: must be a whole number"), "{page}");
    assert!(admin.get("/quota").await.1.contains("no GPU quota yet"));

    let form = [("csrf", csrf.as_str()), ("tenant", "default"), ("flavor", "sim-gpu"), ("nominal", "4")];
    let (status, page) = admin.post_form("/admin/quota", &form).await;
    assert_eq!(status, StatusCode::OK, "{page}");
    assert!(page.contains("quota of default for sim-gpu set to 4 GPUs"), "{page}");

    let id = env.submit(json!({"command": ["sleep", "600"], "resources": {"gpus": 2, "gpu_type": "sim-gpu"}})).await;
    env.wait_state(&id, "running", Duration::from_secs(30)).await;
    let (_, quota) = admin.get("/quota").await;
    assert!(quota.contains("aria-label=\"2 GPUs used of 4 nominal; 0 borrowed, 0 lent\""), "{quota}");
    assert!(quota.contains("style=\"width: 50%\""), "half the bar is in use: {quota}");

    // Members are added from the same page; the new member's token is shown once and works.
    let form = [("csrf", csrf.as_str()), ("tenant", "default"), ("user", "mia"), ("role", "viewer")];
    let (status, page) = admin.post_form("/admin/members", &form).await;
    assert_eq!(status, StatusCode::OK, "{page}");
    let token =
        regex::Regex::new(r"tyd_[0-9a-f]{64}").unwrap().find(&page).expect("the new token").as_str().to_string();
    let mia = WebClient::signed_in(&env.server.url, &token).await;
    assert!(mia.get("/jobs").await.1.contains("mia · default (viewer)"));
    let (_, quota) = mia.get("/quota").await;
    assert!(quota.contains("2 GPUs used of 4 nominal"), "members see their tenant's use");
    let cancel = env.post(&format!("/api/v1/jobs/{id}/cancel"), &env.admin_token, &json!({})).await;
    assert_eq!(cancel.0, StatusCode::OK);
}

/// Four charts (a loss in the thousands, a learning rate around 0.001, an accuracy, a
/// throughput) at 1280 and 390 px: every chart's canvas lies inside its card, the x axis reaches
/// the last step, and hovering a chart shows the value under the cursor in its legend.
#[tokio::test(flavor = "multi_thread")]
async fn metric_charts_fit_their_cards_reach_the_last_step_and_show_values_on_hover() {
    let Some(browser) = browser_or_skip("chart browser test").await else { return };
    let env = TestEnv::start().await;
    let script_path = env.dir.path().join("post_four.py");
    let script = r#"
import json, os, urllib.request
points = []
for s in range(200):
    points += [{'step': s, 'name': 'loss', 'value': 15000.0 - 60 * s},
               {'step': s, 'name': 'lr', 'value': 0.001 + 0.00001 * s},
               {'step': s, 'name': 'accuracy', 'value': s / 200.0},
               {'step': s, 'name': 'samples_per_s', 'value': 120000.0 + 10 * s}]
url = os.environ['TRAINYARD_URL'] + '/api/v1/jobs/' + os.environ['TRAINYARD_JOB_ID'] + '/metrics'
headers = {'Authorization': 'Bearer ' + os.environ['TRAINYARD_TOKEN'], 'Content-Type': 'application/json'}
urllib.request.urlopen(urllib.request.Request(url, data=json.dumps({'points': points}).encode(), method='POST', headers=headers)).read()
"#;
    std::fs::write(&script_path, script).unwrap();
    let job = env.submit(json!({"name": "four-charts", "command": ["python3", script_path.to_str().unwrap()]})).await;
    env.wait_state(&job, "succeeded", Duration::from_secs(30)).await;

    let c = &browser.client;
    let base = &env.server.url;
    browser.sign_in(base, &env.admin_token, "admin").await;
    c.goto(&format!("{base}/jobs/{job}")).await.unwrap();
    for metric in ["loss", "lr", "accuracy", "samples_per_s"] {
        let css = format!("figure[data-metric={metric}][data-points='200'] canvas");
        c.wait().at_most(Duration::from_secs(15)).for_element(Locator::Css(&css)).await.unwrap();
    }

    let measure = "const out = [];\n\
        for (const box of document.querySelectorAll('figure.chart')) {\n\
          const card = box.getBoundingClientRect();\n\
          const canvas = box.querySelector('canvas').getBoundingClientRect();\n\
          out.push({ metric: box.dataset.metric, card: [card.left, card.right], canvas: [canvas.left, canvas.right],\n\
                     xMax: box.plot.scales.x.max, lastStep: box.series.steps.at(-1) });\n\
        }\n\
        return out;";
    for width in [1280, 390] {
        c.set_window_size(width, 900).await.unwrap();
        tokio::time::sleep(Duration::from_millis(600)).await;
        let charts = c.execute(measure, vec![]).await.unwrap();
        let charts = charts.as_array().unwrap();
        assert_eq!(charts.len(), 4, "{charts:?}");
        for chart in charts {
            let (card, canvas) = (&chart["card"], &chart["canvas"]);
            let (card_left, card_right) = (card[0].as_f64().unwrap(), card[1].as_f64().unwrap());
            let (left, right) = (canvas[0].as_f64().unwrap(), canvas[1].as_f64().unwrap());
            assert!(
                left >= card_left - 0.5 && right <= card_right + 0.5,
                "at {width} px the chart leaves its card: {chart}"
            );
            assert!(right - left > (card_right - card_left) * 0.8, "at {width} px the chart uses its card: {chart}");
            assert!(chart["xMax"].as_f64() >= chart["lastStep"].as_f64(), "the last step is shown: {chart}");
        }
        c.execute("document.getElementById('metrics-h').scrollIntoView(); return 1;", vec![]).await.unwrap();
        browser.screenshot("charts", width).await;
    }

    // Hover the middle of the loss chart: its legend shows the value there.
    let hover = "const box = document.querySelector('figure[data-metric=loss]');\n\
        const over = box.querySelector('.u-over');\n\
        const r = over.getBoundingClientRect();\n\
        over.dispatchEvent(new MouseEvent('mousemove', { clientX: r.left + r.width / 2, clientY: r.top + r.height / 2, bubbles: true }));\n\
        return box.querySelector('.u-legend .u-series:nth-child(2) .u-value').textContent;";
    let value = c.execute(hover, vec![]).await.unwrap();
    let value = value.as_str().unwrap_or_default().replace(',', "");
    let number: f64 = value.trim().parse().unwrap_or_else(|_| panic!("the legend shows a value on hover: {value:?}"));
    assert!((3000.0..=15000.0).contains(&number), "a loss value from the middle of the run: {number}");
    browser.close().await;
}
