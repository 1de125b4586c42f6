//! Lineage: datasets produced by jobs (data-pack, registered from the job) and read by jobs
//! (through a `path` parameter given as NAME@VERSION or as a registered folder), artefacts
//! uploaded by jobs, reruns: `yard lineage` and the lineage page walk them both ways, and
//! another tenant reaches none of it.

use std::time::Duration;

use serde_json::{Value, json};
use trainyard_tests::{StatusCode, TestEnv, stderr, stdout};

/// A template that lists the folder its `data` parameter names (a `path`, as pytorch-ddp's is).
const COUNT: &str = "name: count\nversion: 1.0.0\ndescription: List a folder.\nparameters:\n  data: {type: path, required: true}\ncommand: [ls, \"{{ data }}\"]\n";

#[tokio::test(flavor = "multi_thread")]
async fn lineage_walks_from_a_dataset_to_the_jobs_that_made_it_and_read_it_and_stays_in_its_tenant() {
    let env = TestEnv::start().await;
    let token = env.admin_token.clone();
    let yard = |args: &[&str]| {
        let out = env.yard(&token, args);
        assert!(out.status.success(), "yard {args:?}: {}", stderr(&out));
        stdout(&out)
    };

    // raw@1 packed by job P1; photos@1 packed by P2 from raw@1's folder (an absolute path that
    // is a registered version's: P2 records that it read raw@1).
    let source = env.dir.path().join("raw-src");
    std::fs::create_dir_all(&source).unwrap();
    for i in 0..12 {
        std::fs::write(source.join(format!("s{i:02}.txt")), format!("sample {i}")).unwrap();
    }
    let raw_dir = env.dir.path().join("raw");
    let p1 = env.data_pack(&source, &raw_dir, &[])["id"].as_str().unwrap().to_string();
    yard(&["datasets", "register", "raw@1", "--from-job", &p1]);
    let photos_dir = env.dir.path().join("photos");
    let p2_job = env.data_pack(&raw_dir, &photos_dir, &[]);
    let p2 = p2_job["id"].as_str().unwrap().to_string();
    assert_eq!(p2_job["datasets"][0]["name"], "raw", "a registered folder given as a path is recorded: {p2_job}");
    assert_eq!(p2_job["datasets"][0]["param"], "source");
    yard(&["datasets", "register", "photos@1", "--from-job", &p2]);

    // T reads photos@1 through a path parameter given by name, uploads an artefact, and is rerun.
    let (status, body) = env.post("/api/v1/templates", &token, &json!({"manifest": COUNT})).await;
    assert_eq!(status, StatusCode::CREATED, "{body}");
    let (status, t) = env.post("/api/v1/templates/count/jobs", &token, &json!({"params": {"data": "photos@1"}})).await;
    assert_eq!(status, StatusCode::CREATED, "{t}");
    let t = t["id"].as_str().unwrap().to_string();
    let done = env.wait_state(&t, "succeeded", Duration::from_secs(30)).await;
    assert_eq!(done["spec"]["command"][1], photos_dir.display().to_string(), "the job got the version's folder");
    assert_eq!(
        (done["datasets"][0]["name"].as_str(), done["datasets"][0]["version"].as_str()),
        (Some("photos"), Some("1"))
    );
    env.artifact_put(&t, "model.bin", &token, "weights").await;
    let rerun = yard(&["rerun", &t]).trim().to_string();
    env.wait_state(&rerun, "succeeded", Duration::from_secs(30)).await;
    // A name that is no registered version is refused, saying how to name such a folder.
    let (status, body) =
        env.post("/api/v1/templates/count/jobs", &token, &json!({"params": {"data": "photos@9"}})).await;
    assert_eq!((status, body["error"]["field"].as_str()), (StatusCode::UNPROCESSABLE_ENTITY, Some("params.data")));
    assert!(body["error"]["message"].as_str().unwrap().contains("./photos@9"), "{body}");

    // From the dataset: upstream to P2, raw@1 and P1; downstream to T, its artefact, the rerun.
    let text = yard(&["lineage", "photos@1"]);
    let expected_up = format!(
        "upstream:\n  └─ produced by job {p2} data-pack (data-pack 1.0.0, succeeded)\n     └─ read dataset raw@1 ("
    );
    let start = text.find("upstream:").expect(&text);
    assert!(text[start..].starts_with(&expected_up[..expected_up.find("(data-pack").unwrap()]), "{text}");
    assert!(text.contains("└─ read dataset raw@1 (") && text.contains(") [source]\n"), "{text}");
    assert!(text.contains(&format!("        └─ produced by job {p1} ")), "{text}");
    assert!(text.contains(&format!("read by job {t} count (count 1.0.0, succeeded) [data]")), "{text}");
    assert!(text.contains("produced artefact model.bin (7 B, sha256:"), "{text}");
    assert!(text.contains(&format!("read by job {rerun} ")), "the rerun read photos@1 too:\n{text}");

    // From the job, as JSON: depths, and the edges the way data flowed.
    let json_text = yard(&["lineage", &t, "-o", "json"]);
    let lineage: Value = serde_json::from_str(&json_text).unwrap();
    let depth_of = |key: &str| {
        lineage["nodes"].as_array().unwrap().iter().find(|n| n["key"] == key).map(|n| n["depth"].as_i64().unwrap())
    };
    assert_eq!(depth_of(&format!("job:{t}")), Some(0));
    assert_eq!(depth_of("dataset:photos@1"), Some(-1));
    assert_eq!(depth_of(&format!("job:{p2}")), Some(-2));
    assert_eq!(depth_of("dataset:raw@1"), Some(-3));
    assert_eq!(depth_of(&format!("job:{p1}")), Some(-4));
    assert_eq!(depth_of(&format!("artifact:{t}/model.bin")), Some(1));
    assert_eq!(depth_of(&format!("job:{rerun}")), Some(1));
    let edges = lineage["edges"].as_array().unwrap();
    let edge = |from: &str, to: &str, relation: &str| {
        edges.iter().any(|e| e["from"] == from && e["to"] == to && e["relation"] == relation)
    };
    assert!(edge("dataset:photos@1", &format!("job:{t}"), "consumed"), "{lineage}");
    assert!(edge(&format!("job:{p2}"), "dataset:photos@1", "produced"), "{lineage}");
    assert!(edge(&format!("job:{t}"), &format!("job:{rerun}"), "reran"), "{lineage}");
    let rerun_node = lineage["nodes"].as_array().unwrap().iter().find(|n| n["key"] == format!("job:{rerun}")).unwrap();
    assert_eq!(rerun_node["via"]["note"], "exact", "an exact rerun: {rerun_node}");
    // One level: nothing further.
    let near: Value = serde_json::from_str(&yard(&["lineage", &t, "--depth", "1", "-o", "json"])).unwrap();
    assert!(near["nodes"].as_array().unwrap().iter().all(|n| n["depth"].as_i64().unwrap().abs() <= 1), "{near}");
    let (status, body) = env.get(&format!("/api/v1/jobs/{t}/lineage?depth=0"), &token).await;
    assert_eq!((status, body["error"]["field"].as_str()), (StatusCode::UNPROCESSABLE_ENTITY, Some("depth")));

    // The page: the same trees, each node a link.
    let web = trainyard_tests::web::WebClient::signed_in(&env.server.url, &token).await;
    let (status, page) = web.get("/datasets/photos/1/lineage").await;
    assert_eq!(status, StatusCode::OK, "{page}");
    assert!(page.contains(&format!("produced by job <a href=\"/jobs/{p2}\">{p2} data-pack</a>")), "{page}");
    assert!(page.contains("read dataset <a href=\"/datasets/raw/1/lineage\">raw@1</a>"), "{page}");
    assert!(page.contains(&format!("<a href=\"/jobs/{t}/artifacts/model.bin\">model.bin</a>")), "{page}");
    let (status, page) = web.get(&format!("/jobs/{t}")).await;
    assert_eq!(status, StatusCode::OK);
    assert!(page.contains(&format!("href=\"/jobs/{t}/lineage\" id=\"job-lineage\"")), "the job page links its lineage");

    // Tenant B, with a dataset of the same name and a job that read it: sees none of A's, and
    // A's walk reaches none of B's.
    env.post("/api/v1/admin/tenants", &token, &json!({"name": "team-b"})).await;
    let bob = env.member("team-b", "bob", "admin").await;
    let hash = format!("sha256:{}", "ab".repeat(32));
    let (status, body) = env
        .post("/api/v1/datasets", &bob, &json!({"name": "photos", "version": "1", "uri": "/tmp", "content_hash": hash}))
        .await;
    assert_eq!(status, StatusCode::CREATED, "{body}");
    env.post("/api/v1/templates", &bob, &json!({"manifest": COUNT})).await;
    let (status, b_job) =
        env.post("/api/v1/templates/count/jobs", &bob, &json!({"params": {"data": "photos@1"}})).await;
    assert_eq!(status, StatusCode::CREATED, "{b_job}");
    for path in [format!("/api/v1/jobs/{t}/lineage"), format!("/api/v1/jobs/{p1}/lineage")] {
        assert_eq!(env.get(&path, &bob).await.0, StatusCode::NOT_FOUND, "{path}");
    }
    let (_, b_lineage) = env.get("/api/v1/datasets/photos/1/lineage", &bob).await;
    let b_keys: Vec<&str> = b_lineage["nodes"].as_array().unwrap().iter().map(|n| n["key"].as_str().unwrap()).collect();
    assert_eq!(b_keys, ["dataset:photos@1".to_string(), format!("job:{}", b_job["id"].as_str().unwrap())], "only B's");
    let (_, a_lineage) = env.get("/api/v1/datasets/photos/1/lineage", &token).await;
    assert!(!a_lineage.to_string().contains(b_job["id"].as_str().unwrap()), "A's walk holds none of B's jobs");
    let out = env.yard(&bob, &["lineage", &t]);
    assert!(!out.status.success(), "{}", stdout(&out));
    let b_web = trainyard_tests::web::WebClient::signed_in(&env.server.url, &bob).await;
    assert_eq!(b_web.get(&format!("/jobs/{t}/lineage")).await.0, StatusCode::NOT_FOUND);
}

/// The lineage page in a real Chromium: the two trees, a node's link leads to its page, and the
/// page fits a phone's width without scrolling sideways. Screenshots land under
/// `target/test-output/screenshots/`.
#[tokio::test(flavor = "multi_thread")]
async fn the_lineage_page_draws_both_trees_and_fits_a_phone() {
    use fantoccini::Locator;
    let Some(browser) = trainyard_tests::web::browser_or_skip("lineage browser test").await else { return };
    let env = TestEnv::start().await;
    let token = env.admin_token.clone();
    let source = env.dir.path().join("src");
    std::fs::create_dir_all(&source).unwrap();
    for i in 0..6 {
        std::fs::write(source.join(format!("s{i}.txt")), format!("sample {i}")).unwrap();
    }
    let pack = env.data_pack(&source, &env.dir.path().join("photos"), &[])["id"].as_str().unwrap().to_string();
    let registered = env.yard(&token, &["datasets", "register", "photos@1", "--from-job", &pack]);
    assert!(registered.status.success(), "{}", stderr(&registered));
    let (status, body) = env.post("/api/v1/templates", &token, &json!({"manifest": COUNT})).await;
    assert_eq!(status, StatusCode::CREATED, "{body}");
    let (_, reader) = env.post("/api/v1/templates/count/jobs", &token, &json!({"params": {"data": "photos@1"}})).await;
    let reader = reader["id"].as_str().unwrap().to_string();
    env.wait_state(&reader, "succeeded", Duration::from_secs(30)).await;

    let c = &browser.client;
    let base = &env.server.url;
    c.goto(&format!("{base}/login")).await.unwrap();
    c.find(Locator::Id("token")).await.unwrap().send_keys(&token).await.unwrap();
    c.find(Locator::Css("form button[type=submit]")).await.unwrap().click().await.unwrap();
    browser.wait_text("#who", Duration::from_secs(15), |t| t.starts_with("admin")).await;
    // From the datasets page, the version's name leads to its lineage.
    c.goto(&format!("{base}/datasets")).await.unwrap();
    c.find(Locator::LinkText("photos@1")).await.unwrap().click().await.unwrap();
    browser.wait_text("h1", Duration::from_secs(15), |t| t == "Lineage of dataset photos@1").await;
    let upstream = c.find(Locator::Css("#upstream li")).await.unwrap().text().await.unwrap();
    assert!(upstream.contains(&format!("produced by job {pack} data-pack")), "{upstream}");
    let downstream = c.find(Locator::Css("#downstream li")).await.unwrap().text().await.unwrap();
    assert!(downstream.contains(&format!("read by job {reader} count")) && downstream.contains("data"), "{downstream}");
    browser.screenshot("lineage", 1280).await;
    browser.screenshot("lineage", 390).await;
    let overflow = c
        .execute("return document.documentElement.scrollWidth - document.documentElement.clientWidth;", vec![])
        .await
        .unwrap();
    assert!(overflow.as_i64().unwrap() <= 0, "the page scrolls sideways at 390 px by {overflow} px");
    c.set_window_size(1280, 900).await.unwrap();
    // A job's link opens its page, whose "Lineage" link walks from it.
    c.find(Locator::LinkText(&format!("{reader} count"))).await.unwrap().click().await.unwrap();
    c.find(Locator::Id("job-lineage")).await.unwrap().click().await.unwrap();
    browser.wait_text("h1", Duration::from_secs(15), |t| t.starts_with("Lineage of job")).await;
    let upstream = c.find(Locator::Css("#upstream")).await.unwrap().text().await.unwrap();
    assert!(upstream.contains("read dataset photos@1") && upstream.contains("produced by job"), "{upstream}");
    browser.close().await;
}
