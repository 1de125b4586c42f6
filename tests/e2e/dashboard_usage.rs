//! The usage and audit pages in a real headless Chromium against the real server: GPU-hours drawn
//! as one line per tenant the caller may see, and the audit log only for those who may read it.
//! Screenshots of both pages at 1280 and 390 px land under `target/test-output/screenshots/`.

use std::time::Duration;

use fantoccini::Locator;
use serde_json::{Value, json};
use trainyard_tests::web::{Browser, browser_or_skip};
use trainyard_tests::{StatusCode, TestEnv};

const WAIT: Duration = Duration::from_secs(15);

async fn sign_in(browser: &Browser, base: &str, token: &str, user: &str) {
    let c = &browser.client;
    c.goto(&format!("{base}/login")).await.unwrap();
    c.find(Locator::Id("token")).await.unwrap().send_keys(token).await.unwrap();
    c.find(Locator::Css("form button[type=submit]")).await.unwrap().click().await.unwrap();
    browser.wait_text("#who", WAIT, |t| t.starts_with(user)).await;
}

async fn sign_out(browser: &Browser) {
    browser.client.find(Locator::Id("sign-out")).await.unwrap().click().await.unwrap();
    browser.wait_text("h1", WAIT, |t| t.contains("Sign in")).await;
}

/// The usage chart once drawn: per legend entry, the tenant it names, its label, its marker's
/// colour and the highest GPU-hours of its line; and how many lines uPlot holds.
async fn usage_chart(browser: &Browser) -> Value {
    let c = &browser.client;
    c.wait().at_most(WAIT).for_element(Locator::Css("#usage-chart[data-series] canvas")).await.unwrap();
    let read = "const box = document.getElementById('usage-chart');\n\
        const rows = [...box.querySelectorAll('.u-legend .u-series')].slice(1);\n\
        const lines = rows.filter((row) => row.dataset.tenant).map((row) => ({\n\
          tenant: row.dataset.tenant, label: row.querySelector('.u-label').textContent,\n\
          colour: getComputedStyle(row.querySelector('.u-marker')).borderColor,\n\
          peak: Math.max(...box.plot.data[rows.indexOf(row) + 1]) }));\n\
        return { lines, plotted: box.plot.series.length - 1 };";
    c.execute(read, vec![]).await.unwrap()
}

fn tenants_of(chart: &Value) -> Vec<String> {
    chart["lines"].as_array().unwrap().iter().map(|line| line["tenant"].as_str().unwrap().to_string()).collect()
}

#[tokio::test(flavor = "multi_thread")]
async fn usage_draws_a_line_per_tenant_and_the_audit_log_is_for_admins() {
    let Some(browser) = browser_or_skip("usage browser test").await else { return };
    let env = TestEnv::start_with(&["--simulate-gpus", "4", "--simulate-gpu-type", "sim-gpu"]).await;
    let (status, body) = env.post("/api/v1/admin/tenants", &env.admin_token, &json!({"name": "team-b"})).await;
    assert_eq!(status, StatusCode::CREATED, "{body}");
    for tenant in ["default", "team-b"] {
        let (status, body) = env
            .call(
                reqwest::Method::PUT,
                &format!("/api/v1/admin/tenants/{tenant}/quotas/sim-gpu"),
                Some(&env.admin_token),
                Some(&json!({"nominal": 2})),
            )
            .await;
        assert!(status.is_success(), "{body}");
    }
    let amy = env.member("default", "amy", "member").await;
    let vera = env.member("default", "vera", "viewer").await;
    let bob = env.member("team-b", "bob", "member").await;
    let base = &env.server.url;
    let c = &browser.client;

    // Before any job ran, the window says so in words instead of drawing an empty chart.
    sign_in(&browser, base, &env.admin_token, "admin").await;
    c.goto(&format!("{base}/usage?from=24h")).await.unwrap();
    let empty = browser.wait_text("#usage-empty", WAIT, |t| !t.is_empty()).await;
    assert!(empty.contains("No GPUs were held in the last 24 hours"), "{empty}");
    assert!(c.find(Locator::Id("usage-chart")).await.is_err(), "no chart for an empty window");

    // A short job in each tenant, on one GPU in A and two in B; a viewer's submit is refused
    // (and audited as refused).
    let job = |gpus: u32| json!({"name": "gpu-sleep", "command": ["sleep", "2"], "resources": {"gpus": gpus, "gpu_type": "sim-gpu"}});
    let mut jobs = vec![];
    for (token, gpus) in [(&amy, 1), (&bob, 2)] {
        let (status, body) = env.post("/api/v1/jobs", token, &job(gpus)).await;
        assert_eq!(status, StatusCode::CREATED, "{body}");
        jobs.push((token, body["id"].as_str().unwrap().to_string()));
    }
    let (status, _) = env.post("/api/v1/jobs", &vera, &job(1)).await;
    assert_eq!(status, StatusCode::FORBIDDEN);
    for (token, id) in &jobs {
        env.wait_job_as(token, id, Duration::from_secs(30), |job| job["state"] == "succeeded").await;
    }

    // The platform admin: one line per tenant, each in its own colour, named in the legend.
    c.goto(&format!("{base}/usage?from=24h")).await.unwrap();
    let chart = usage_chart(&browser).await;
    assert_eq!(tenants_of(&chart), ["default", "team-b"], "{chart}");
    assert_eq!(chart["plotted"], 2, "exactly one series per tenant: {chart}");
    let lines = chart["lines"].as_array().unwrap();
    assert_eq!(lines[0]["label"], "default", "{chart}");
    assert_eq!(lines[1]["label"], "team-b", "{chart}");
    assert_ne!(lines[0]["colour"], lines[1]["colour"], "the tenants' lines differ in colour: {chart}");
    let peak = |line: &Value| line["peak"].as_f64().unwrap();
    assert!(peak(&lines[0]) > 0.0, "A's GPU-hours are drawn: {chart}");
    assert!(peak(&lines[1]) > peak(&lines[0]), "B held twice the GPUs for as long: {chart}");
    let table = c.find(Locator::Css("#usage tbody")).await.unwrap().text().await.unwrap();
    assert!(table.contains("default") && table.contains("team-b"), "{table}");
    assert!(c.find(Locator::Css("nav a[href='/audit']")).await.is_ok(), "admins have the Audit link");
    browser.screenshot("usage", 1280).await;
    browser.screenshot("usage", 390).await;
    c.set_window_size(1280, 900).await.unwrap();
    // Grouped by tenant and user, from the form: a row per submitter, the chart still per tenant.
    c.find(Locator::Css("input[name=by][value=user]")).await.unwrap().click().await.unwrap();
    c.find(Locator::Css("form.filters button[type=submit]")).await.unwrap().click().await.unwrap();
    browser.wait_text("#usage thead", WAIT, |t| t.contains("User")).await;
    let table = c.find(Locator::Css("#usage tbody")).await.unwrap().text().await.unwrap();
    assert!(table.contains("default amy") && table.contains("team-b bob"), "{table}");
    assert_eq!(tenants_of(&usage_chart(&browser).await), ["default", "team-b"]);

    // The audit log: both submits, and the viewer's refusal marked as one.
    c.goto(&format!("{base}/audit")).await.unwrap();
    browser.wait_text("h1", WAIT, |t| t == "Audit log").await;
    let submits = c.find_all(Locator::Css("#audit tr[data-action='job.submit']")).await.unwrap();
    assert_eq!(submits.len(), 3, "two submits and one refusal");
    let refused = c.find(Locator::Css("#audit tr.refused[data-action='job.submit']")).await.unwrap();
    let text = refused.text().await.unwrap();
    assert!(text.contains("user:vera") && text.contains("denied"), "{text}");
    browser.screenshot("audit", 1280).await;
    browser.screenshot("audit", 390).await;
    c.set_window_size(1280, 900).await.unwrap();
    // Filtered by actor and action: bob's submit alone, in his tenant.
    c.find(Locator::Id("a-actor")).await.unwrap().send_keys("bob").await.unwrap();
    c.find(Locator::Id("a-action")).await.unwrap().send_keys("job.submit").await.unwrap();
    c.find(Locator::Css("form.filters button[type=submit]")).await.unwrap().click().await.unwrap();
    browser.wait_text("#audit tbody", WAIT, |t| !t.contains("user:amy")).await;
    let rows = c.find_all(Locator::Css("#audit tbody tr")).await.unwrap();
    assert_eq!(rows.len(), 1);
    let text = rows[0].text().await.unwrap();
    assert!(text.contains("team-b") && text.contains("user:bob") && text.contains("ok"), "{text}");
    sign_out(&browser).await;

    // A member of tenant A: only A's line, no Audit link, and the audit log is refused.
    sign_in(&browser, base, &amy, "amy").await;
    c.goto(&format!("{base}/usage?from=24h")).await.unwrap();
    let chart = usage_chart(&browser).await;
    assert_eq!(tenants_of(&chart), ["default"], "{chart}");
    assert_eq!(chart["plotted"], 1, "{chart}");
    assert!(!c.source().await.unwrap().contains("team-b"), "the other tenant's name is nowhere on the page");
    assert!(c.find(Locator::Css("nav a[href='/audit']")).await.is_err(), "members have no Audit link");
    c.goto(&format!("{base}/audit")).await.unwrap();
    let title = browser.wait_text("h1", WAIT, |t| !t.is_empty()).await;
    assert_eq!(title, "403 · Forbidden");
    assert!(c.find(Locator::Id("audit")).await.is_err(), "no entries for a member");
    browser.close().await;
}
