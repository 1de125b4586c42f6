//! The dashboard on a phone (390 px, Chromium): the quota page's text is never clipped, and the
//! audit and volumes tables stay usable (they fit, or scroll inside their own frame while the
//! page itself never scrolls sideways).

use serde_json::{Value, json};
use trainyard_tests::TestEnv;
use trainyard_tests::web::browser_or_skip;

/// What a reader at this width would trip over on the current page.
const LAYOUT_PROBLEMS: &str = r#"
const vw = document.documentElement.clientWidth;
const main = document.getElementById('main');
const label = (e) => `${e.tagName.toLowerCase()}${e.id ? '#' + e.id : ''}${e.className ? '.' + e.className : ''}: ${e.textContent.trim().slice(0, 50)}`;
// Screen-reader-only text is hidden on purpose.
const all = [...main.querySelectorAll('*')].filter((e) => !e.closest('.sr-only'));
// Text cut off by its box: overflow hidden (or clipped) with more content than room.
const clipped = all.filter((e) => {
  const s = getComputedStyle(e);
  return ['hidden', 'clip'].includes(s.overflowX) && e.scrollWidth > e.clientWidth + 1 && e.textContent.trim();
}).map(label);
// Text that runs past the window's right edge outside a frame that scrolls.
const scrolls = (e) => ['auto', 'scroll'].includes(getComputedStyle(e).overflowX);
const inFrame = (e) => { for (let p = e.parentElement; p && p !== main; p = p.parentElement) if (scrolls(p)) return true; return false; };
const offscreen = all.filter((e) => e.children.length === 0 && e.textContent.trim() && !inFrame(e))
  .filter((e) => e.getBoundingClientRect().right > vw + 1).map(label);
const tables = [...main.querySelectorAll('table')].map((t) => ({
  rows: t.rows.length,
  usable: t.getBoundingClientRect().width <= vw + 1 || inFrame(t),
}));
return { pageScroll: document.documentElement.scrollWidth - vw, clipped, offscreen, tables };
"#;

#[tokio::test(flavor = "multi_thread")]
async fn the_quota_audit_and_volumes_pages_read_on_a_phone() {
    let Some(browser) = browser_or_skip("390 px dashboard pages").await else { return };
    let env = TestEnv::start_with(&["--simulate-gpus", "4", "--simulate-gpu-type", "sim-gpu"]).await;
    let put = |body: Value| {
        let env = &env;
        async move {
            let (status, body) = env
                .call(
                    reqwest::Method::PUT,
                    "/api/v1/admin/tenants/default/quotas/sim-gpu",
                    Some(&env.admin_token),
                    Some(&body),
                )
                .await;
            assert!(status.is_success(), "{body}");
        }
    };
    put(json!({"nominal": 4, "borrowing_limit": 2, "lending_limit": 1})).await;
    put(json!({"nominal": 3})).await;
    for name in ["scratch", "a-volume-with-a-rather-long-name-for-a-phone"] {
        let (status, body) = env.post("/api/v1/volumes", &env.admin_token, &json!({"name": name, "size": "1Gi"})).await;
        assert!(status.is_success(), "{body}");
    }
    env.submit(
        json!({"name": "holds-two", "command": ["sleep", "30"], "resources": {"gpus": 2, "gpu_type": "sim-gpu"}}),
    )
    .await;

    let base = &env.server.url;
    browser.sign_in(base, &env.admin_token, "admin").await;
    browser.client.set_window_size(390, 900).await.unwrap();
    for (page, must_show, tables) in
        [("/quota", "sim-gpu", 0), ("/audit", "quota", 1), ("/volumes", "a-volume-with-a-rather-long-name", 1)]
    {
        browser.client.goto(&format!("{base}{page}")).await.unwrap();
        browser.wait_text("#main", std::time::Duration::from_secs(10), |t| t.contains(must_show)).await;
        browser.screenshot(&format!("narrow{}", page.replace('/', "-")), 390).await;
        let found = browser.client.execute(LAYOUT_PROBLEMS, vec![]).await.unwrap();
        assert!(found["pageScroll"].as_f64().unwrap() <= 1.0, "{page} scrolls sideways at 390 px: {found}");
        assert_eq!(found["clipped"], json!([]), "{page}: clipped text at 390 px: {found}");
        assert_eq!(found["offscreen"], json!([]), "{page}: text past the window's edge at 390 px: {found}");
        let shown = found["tables"].as_array().unwrap();
        assert!(shown.len() >= tables, "{page}: expected a table: {found}");
        for table in shown {
            assert!(table["usable"] == true, "{page}: a table neither fits nor scrolls in its frame: {found}");
            assert!(table["rows"].as_u64().unwrap() >= 2, "{page}: a table with no rows: {found}");
        }
    }
    browser.close().await;
}
