//! Comparing runs: `GET /api/v1/compare` by section, only within the caller's tenant, `yard
//! diff` of three runs, and the compare page in a real headless Chromium: only the differing
//! fields by default, all of them after the toggle (without JavaScript: a link), and one chart
//! with a line per run. Screenshots land under `target/test-output/screenshots/`.

use std::time::Duration;

use fantoccini::Locator;
use serde_json::{Value, json};
use trainyard_tests::web::{Browser, browser_or_skip};
use trainyard_tests::{StatusCode, TestEnv};

const WAIT: Duration = Duration::from_secs(15);

/// Posts five `loss` points with the job's token (scaled by `$LR`) in two posts 0.4 s apart, as
/// an engine reports while it trains, then ends.
const REPORTER: &str = r#"
import json, os, time, urllib.request
url, token, job = os.environ["TRAINYARD_URL"], os.environ["TRAINYARD_TOKEN"], os.environ["TRAINYARD_JOB_ID"]
lr = float(os.environ["LR"])
def post(points):
    request = urllib.request.Request(f"{url}/api/v1/jobs/{job}/metrics", data=json.dumps({"points": points}).encode(),
        headers={"Authorization": "Bearer " + token, "Content-Type": "application/json"})
    print(urllib.request.urlopen(request).read().decode(), flush=True)
post([{"step": i, "name": "loss", "value": lr * (5 - i)} for i in range(3)]
     + [{"step": i, "name": "accuracy", "value": 0.2 * i} for i in range(5)])
time.sleep(0.4)
post([{"step": i, "name": "loss", "value": lr * (5 - i)} for i in range(3, 5)])
"#;

/// A run of the reporter with this learning rate, finished.
async fn run(env: &TestEnv, lr: &str) -> String {
    let id = env.submit(json!({"name": "sweep", "command": ["python3", "-c", REPORTER], "env": {"LR": lr}})).await;
    env.wait_state(&id, "succeeded", Duration::from_secs(60)).await;
    id
}

/// Every field listed in a comparison, as `(section, field, values, differs)`.
fn listed(comparison: &Value) -> Vec<(String, String, Value, bool)> {
    let mut out = vec![];
    for section in comparison["sections"].as_array().unwrap() {
        for field in section["fields"].as_array().unwrap() {
            let name = field["field"].as_str().unwrap().to_string();
            out.push((
                section["name"].as_str().unwrap().into(),
                name,
                field["values"].clone(),
                field["differs"] == true,
            ));
        }
    }
    out
}

#[tokio::test(flavor = "multi_thread")]
async fn the_api_compares_runs_by_section_within_the_callers_tenant() {
    let env = TestEnv::start().await;
    let (a, b, c) = (run(&env, "0.1").await, run(&env, "0.01").await, run(&env, "0.1").await);
    let admin = &env.admin_token;

    let (status, comparison) = env.get(&format!("/api/v1/compare?jobs={a},{b}"), admin).await;
    assert_eq!(status, StatusCode::OK, "{comparison}");
    let differing: Vec<(String, String)> = listed(&comparison).into_iter().map(|(s, f, ..)| (s, f)).collect();
    assert_eq!(
        differing,
        [("spec".into(), "spec.env.LR".into()), ("outcome".into(), "metrics.loss.last".into())],
        "the variable and the loss it led to, nothing else: {comparison}"
    );
    assert_eq!(listed(&comparison)[0].2, json!(["0.1", "0.01"]), "a value per run, in the order asked");
    assert_eq!(comparison["metrics"], json!(["accuracy", "loss"]));
    assert_eq!(comparison["runs"][0]["id"], a.as_str());
    assert!(comparison["same"].as_u64().unwrap() > 10, "{comparison}");

    // Every field on asking, the ids among them.
    let (_, every) = env.get(&format!("/api/v1/compare?jobs={a},{b}&all=true"), admin).await;
    let every = listed(&every);
    assert!(every.iter().any(|(s, f, _, differs)| s == "run" && f == "id" && *differs));
    assert!(every.iter().any(|(_, f, _, differs)| f == "metrics.loss.points" && !*differs), "the same count of points");

    // Three runs: a field differs when any one disagrees.
    let (_, three) = env.get(&format!("/api/v1/compare?jobs={a},{c},{b}"), admin).await;
    let lr = listed(&three).into_iter().find(|(_, f, ..)| f == "spec.env.LR").unwrap();
    assert_eq!(lr.2, json!(["0.1", "0.1", "0.01"]));
    let (_, two_alike) = env.get(&format!("/api/v1/compare?jobs={a},{c}"), admin).await;
    assert_eq!(two_alike["differ"], 0, "same inputs, same loss: {two_alike}");

    // Input that names no comparison: 422 naming `jobs`; a text that is no id names no job.
    for query in ["", "jobs=", &format!("jobs={a}"), &format!("jobs={}", [a.as_str(); 9].join(","))] {
        let (status, body) = env.get(&format!("/api/v1/compare?{query}"), admin).await;
        assert_eq!(status, StatusCode::UNPROCESSABLE_ENTITY, "{query}: {body}");
        assert_eq!(body["error"]["field"], "jobs", "{body}");
    }
    let (status, _) = env.get(&format!("/api/v1/compare?jobs={a},nope"), admin).await;
    assert_eq!(status, StatusCode::NOT_FOUND);

    // Another tenant's caller: A's jobs do not exist for them, alone or beside their own.
    let (status, body) = env.post("/api/v1/admin/tenants", admin, &json!({"name": "team-b"})).await;
    assert_eq!(status, StatusCode::CREATED, "{body}");
    let bob = env.member("team-b", "bob", "admin").await;
    let (status, body) = env.post("/api/v1/jobs", &bob, &json!({"command": ["true"]})).await;
    assert_eq!(status, StatusCode::CREATED, "{body}");
    let own = body["id"].as_str().unwrap().to_string();
    for query in [format!("jobs={a},{b}"), format!("jobs={own},{a}")] {
        let (status, body) = env.get(&format!("/api/v1/compare?{query}"), &bob).await;
        assert_eq!(status, StatusCode::NOT_FOUND, "{query}: {body}");
        assert!(!body.to_string().contains("sweep"), "nothing of A's jobs: {body}");
    }
    // A viewer of A may compare.
    let vera = env.member("default", "vera", "viewer").await;
    let (status, _) = env.get(&format!("/api/v1/compare?jobs={a},{b}"), &vera).await;
    assert_eq!(status, StatusCode::OK);

    // `yard diff` of three runs by short ids: a table per section that has a difference.
    let out = env.yard(admin, &["diff", &a[..18], &c[..18], &b[..18]]);
    let table = String::from_utf8_lossy(&out.stdout).to_string();
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    assert!(table.contains("spec (1 differ") && table.contains("outcome (1 differ"), "{table}");
    assert!(table.contains(&format!("C {}", &b[..13])), "a column per run: {table}");
    assert!(!table.contains("parameters ("), "no section without a difference: {table}");
    assert!(table.contains("2 fields differ"), "{table}");
}

/// The compare page's chart once drawn: its series' labels and runs, and how many lines it holds.
async fn compare_chart(browser: &Browser) -> Value {
    let c = &browser.client;
    c.wait().at_most(WAIT).for_element(Locator::Css("#compare-chart[data-series] canvas")).await.unwrap();
    let read = "const box = document.getElementById('compare-chart');\n\
        const rows = [...box.querySelectorAll('.u-legend .u-series')].slice(1);\n\
        return { runs: rows.map((row) => row.dataset.run), labels: rows.map((row) => row.querySelector('.u-label').textContent),\n\
          colours: rows.map((row) => getComputedStyle(row.querySelector('.u-marker')).borderColor),\n\
          plotted: box.plot.series.length - 1, steps: box.plot.data[0].length };";
    c.execute(read, vec![]).await.unwrap()
}

async fn row_count(browser: &Browser, css: &str) -> usize {
    browser.client.find_all(Locator::Css(css)).await.unwrap().len()
}

#[tokio::test(flavor = "multi_thread")]
async fn the_compare_page_shows_only_differences_then_all_and_a_line_per_run() {
    let Some(browser) = browser_or_skip("compare browser test").await else { return };
    let env = TestEnv::start().await;
    let (a, b) = (run(&env, "0.1").await, run(&env, "0.01").await);
    let base = &env.server.url;
    let c = &browser.client;
    c.goto(&format!("{base}/login")).await.unwrap();
    c.find(Locator::Id("token")).await.unwrap().send_keys(&env.admin_token).await.unwrap();
    c.find(Locator::Css("form button[type=submit]")).await.unwrap().click().await.unwrap();
    browser.wait_text("#who", WAIT, |t| t.starts_with("admin")).await;

    // From A's page: "compare with" B by a short id.
    c.goto(&format!("{base}/jobs/{a}")).await.unwrap();
    c.find(Locator::Id("compare-with")).await.unwrap().send_keys(&b[..18]).await.unwrap();
    c.find(Locator::Css("form.compare-with button[type=submit]")).await.unwrap().click().await.unwrap();
    browser.wait_text("h1", WAIT, |t| t == "Compare runs").await;

    // Only the differences: the variable and the loss, each row highlighted.
    assert_eq!(row_count(&browser, "table.compare tbody tr").await, 2);
    assert_eq!(row_count(&browser, "table.compare tbody tr.differs").await, 2);
    let fields = c.find(Locator::Css("tr[data-field='spec.env.LR']")).await.unwrap().text().await.unwrap();
    assert!(fields.contains("0.1") && fields.contains("0.01"), "{fields}");
    assert!(c.find(Locator::Css("tr[data-field='metrics.loss.last']")).await.is_ok());

    // One line per run on the default metric (loss), each named by the run in its own colour.
    let chart = compare_chart(&browser).await;
    assert_eq!(chart["plotted"], 2, "{chart}");
    assert_eq!(chart["runs"], json!([a, b]), "{chart}");
    assert_eq!(chart["steps"], 5, "aligned by step: {chart}");
    let labels: Vec<&str> = chart["labels"].as_array().unwrap().iter().map(|l| l.as_str().unwrap()).collect();
    assert_eq!(labels, [format!("sweep ({})", &a[..13]), format!("sweep ({})", &b[..13])]);
    assert_ne!(chart["colours"][0], chart["colours"][1], "{chart}");
    let selected = c.find(Locator::Css("#c-metric option[selected]")).await.unwrap().text().await.unwrap();
    assert_eq!(selected, "loss");
    browser.screenshot("compare", 1280).await;
    browser.screenshot("compare", 390).await;
    c.set_window_size(1280, 900).await.unwrap();

    // Every field after the toggle (a plain link), the two differences still marked.
    c.find(Locator::Id("toggle-all")).await.unwrap().click().await.unwrap();
    browser.wait_text("#toggle-all", WAIT, |t| t == "Only the differences").await;
    assert!(row_count(&browser, "table.compare tbody tr").await > 10);
    assert_eq!(row_count(&browser, "section:not([data-section=run]) tr.differs").await, 2, "ids and times aside");
    assert!(c.find(Locator::Css("section[data-section=run]")).await.is_ok(), "ids and times appear");

    // Another metric from the select: still one line per run.
    c.find(Locator::Css("#c-metric option[value=accuracy]")).await.unwrap().click().await.unwrap();
    c.find(Locator::Css("form.filters button[type=submit]")).await.unwrap().click().await.unwrap();
    browser.wait_text("#compare-chart h3", WAIT, |t| t == "accuracy").await;
    assert_eq!(compare_chart(&browser).await["plotted"], 2);
    assert!(c.current_url().await.unwrap().as_str().contains("all=true"), "the choice of all fields is kept");

    // Loss lined up by wall time: seconds since each run's first point; the points of one post
    // share its time, so each run has a point at 0 s and one about 0.4 s later.
    c.find(Locator::Css("#c-metric option[value=loss]")).await.unwrap().click().await.unwrap();
    c.find(Locator::Css("#c-x option[value=time]")).await.unwrap().click().await.unwrap();
    c.find(Locator::Css("form.filters button[type=submit]")).await.unwrap().click().await.unwrap();
    browser.wait_text("#compare-chart h3", WAIT, |t| t == "loss").await;
    assert!(c.current_url().await.unwrap().as_str().contains("x=time"), "{:?}", c.current_url().await);
    assert_eq!(compare_chart(&browser).await["plotted"], 2);
    let read = "return JSON.parse(document.getElementById('compare-chart').dataset.compare);";
    let data = c.execute(read, vec![]).await.unwrap();
    assert_eq!(data["x_label"], "seconds since the run's first point", "{data}");
    let x: Vec<f64> = data["x"].as_array().unwrap().iter().map(|v| v.as_f64().unwrap()).collect();
    assert_eq!(x[0], 0.0, "{data}");
    assert!((0.3..5.0).contains(x.last().unwrap()), "the second post's time: {data}");
    for series in data["series"].as_array().unwrap() {
        let points = series["values"].as_array().unwrap().iter().filter(|v| !v.is_null()).count();
        assert_eq!(points, 2, "one point per post, at its last step: {series}");
    }
    let selected = c.find(Locator::Css("#c-x option[selected]")).await.unwrap().text().await.unwrap();
    assert_eq!(selected, "wall time");
    browser.close().await;
}
