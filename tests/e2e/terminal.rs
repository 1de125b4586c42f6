//! `yard`'s tables in the terminal they are printed in (issue 43): one line a row within 80 or
//! 120 columns, long names and reasons cut with `…`, no word broken; plain fixed columns when
//! piped; `-o wide` with every value whole.

use std::time::Duration;

use serde_json::json;
use trainyard_tests::{StatusCode, TestEnv, stderr, stdout};

const GPU: &str = "sim-a100";

#[tokio::test(flavor = "multi_thread")]
async fn jobs_queue_and_nodes_fit_80_and_120_columns_one_line_a_row_and_wide_shows_them_whole() {
    let env = TestEnv::start_with(&["--simulate-gpus", "2", "--simulate-gpu-type", GPU]).await;
    let admin = env.admin_token.clone();
    let submit = |name: &str, command: &[&str], gpus: u32, spare: bool| {
        let body = json!({"name": name, "command": command, "spare": spare,
                          "resources": {"gpus": gpus, "cpu": 0.1, "memory": "64Mi"}});
        let env = &env;
        let admin = admin.clone();
        async move {
            let (status, job) = env.post("/api/v1/jobs", &admin, &body).await;
            assert_eq!(status, StatusCode::CREATED, "{job}");
            job["id"].as_str().unwrap().to_string()
        }
    };
    let long = "a-rather-long-job-name-that-no-narrow-terminal-holds";
    let mut ids = Vec::new();
    for i in 0..4 {
        ids.push(submit(&format!("ok-{i}"), &["true"], 0, false).await);
    }
    ids.push(submit("broken", &["false"], 0, false).await);
    ids.push(submit(long, &["sleep", "600"], 0, false).await);
    let cancelled = submit("to-cancel", &["sleep", "600"], 0, false).await;
    ids.push(cancelled.clone());
    // On spare room, each of these takes both GPUs: one runs, the others wait saying why at length.
    for i in 0..6 {
        ids.push(submit(&format!("sweep-{i}"), &["sleep", "600"], 2, true).await);
    }
    for id in &ids[..5] {
        env.wait_job_as(&admin, id, Duration::from_secs(60), |j| {
            ["succeeded", "failed"].contains(&j["state"].as_str().unwrap())
        })
        .await;
    }
    env.wait_job_as(&admin, &ids[5], Duration::from_secs(60), |j| j["state"] == "running").await;
    let cancel = env.yard(&admin, &["cancel", &cancelled]);
    assert!(cancel.status.success(), "{}", stderr(&cancel));
    env.wait_job_as(&admin, &cancelled, Duration::from_secs(60), |j| j["state"] == "cancelled").await;
    let (_, waiting) = env.get(&format!("/api/v1/jobs/{}", ids[12]), &admin).await;
    let reason = waiting["reason"].as_str().unwrap_or_default().to_string();
    assert!(reason.len() > 80, "a reason too long for a narrow column: {reason:?}");

    for width in [80u16, 120] {
        let listed = env.yard_at_width(&admin, Some(width), &["jobs", "ls"]);
        assert!(listed.status.success(), "{}", stderr(&listed));
        let text = stdout(&listed);
        for line in text.lines() {
            assert!(
                line.chars().count() <= usize::from(width),
                "{} columns at {width}: {line}\n{text}",
                line.chars().count()
            );
        }
        for id in &ids {
            let rows = text.lines().filter(|l| l.contains(&id[..13])).count();
            assert_eq!(rows, 1, "job {id} on one line at {width} columns:\n{text}");
        }
        for state in ["succeeded", "failed", "cancelled", "running", "queued"] {
            assert!(text.split_whitespace().any(|word| word == state), "{state} whole at {width} columns:\n{text}");
        }
        assert!(text.contains('…'), "long names and reasons are cut, marked:\n{text}");
        let header = text.lines().find(|l| l.contains("ID")).unwrap();
        for column in ["NAME", "USER", "STATE", "SUBMITTED", "ELAPSED", "REASON"] {
            assert!(header.split_whitespace().any(|w| w == column), "header {column} whole at {width}:\n{text}");
        }

        let queue = env.yard_at_width(&admin, Some(width), &["queue"]);
        let text = stdout(&queue);
        for line in text.lines() {
            assert!(line.chars().count() <= usize::from(width), "queue at {width}: {line}\n{text}");
        }
        for id in &ids[8..] {
            assert_eq!(text.lines().filter(|l| l.contains(&id[..13])).count(), 1, "queue at {width}:\n{text}");
        }

        let nodes = env.yard_at_width(&admin, Some(width), &["nodes"]);
        let text = stdout(&nodes);
        assert!(
            text.contains(GPU) && text.lines().all(|l| l.chars().count() <= usize::from(width)),
            "nodes at {width}:\n{text}"
        );
        assert!(text.split_whitespace().any(|w| w == "CACHED"), "header whole at {width}:\n{text}");
    }

    // Piped: plain columns without borders, 80 wide, one line a job.
    let piped = stdout(&env.yard_at_width(&admin, None, &["jobs", "ls"]));
    assert!(piped.lines().all(|l| l.chars().count() <= 80), "{piped}");
    assert!(!piped.contains('│') && !piped.contains('─'), "no borders when piped:\n{piped}");
    assert_eq!(piped.lines().count(), 1 + ids.len(), "a header and a line a job:\n{piped}");
    assert_eq!(piped.lines().next().unwrap().split_whitespace().next(), Some("ID"));

    // -o wide: every value whole, however wide.
    let wide = stdout(&env.yard_at_width(&admin, Some(80), &["jobs", "ls", "-o", "wide"]));
    assert!(wide.contains(long) && wide.contains(&reason), "{wide}");
}

/// The short id `yard` prints opens the job's dashboard page, and the dashboard's jobs table shows
/// it (issue 43: one way to name a job everywhere).
#[tokio::test(flavor = "multi_thread")]
async fn the_short_id_yard_prints_opens_the_jobs_page_and_the_jobs_table_shows_it() {
    let env = TestEnv::start().await;
    let (status, job) =
        env.post("/api/v1/jobs", &env.admin_token, &json!({"name": "named", "command": ["true"]})).await;
    assert_eq!(status, StatusCode::CREATED, "{job}");
    let id = job["id"].as_str().unwrap();
    let listed = stdout(&env.yard(&env.admin_token, &["jobs", "ls"]));
    assert!(listed.contains(&id[..13]), "{listed}");

    let web = trainyard_tests::web::WebClient::signed_in(&env.server.url, &env.admin_token).await;
    let (status, location) = web.redirect_of(&format!("/jobs/{}", &id[..13])).await;
    assert!(status.is_redirection(), "{status}");
    assert_eq!(location.as_deref(), Some(format!("/jobs/{id}").as_str()));
    let (status, page) = web.get(location.as_deref().unwrap()).await;
    assert_eq!(status, StatusCode::OK);
    assert!(page.contains("named"), "the job's page");
    let (status, _) = web.get("/jobs/ffffffffffff").await;
    assert_eq!(status, StatusCode::NOT_FOUND, "a short id of no job of the tenant");
    let (_, table) = web.get("/jobs").await;
    assert!(table.contains(&format!("<code>{}</code>", &id[..13])), "the jobs table shows the short id");
}
