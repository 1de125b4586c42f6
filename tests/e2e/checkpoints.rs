//! Checkpoints as first-class outputs (issue 43): a short pytorch-ddp run's checkpoints listed
//! through the API, `yard checkpoints ls`, `yard jobs show` and the job page; one downloaded and
//! compared with the file on the volume; a run fine-tuned from one (`init_from=JOB:STEP`) that
//! starts from its weights at step 0, recorded in its run record and lineage. A link planted in
//! the checkpoint folder is never followed; another tenant gets 404s; a bad `init_from` is a 422
//! naming the parameter.

use serde_json::{Value, json};
use trainyard_tests::web::WebClient;
use trainyard_tests::{StatusCode, TestEnv, stderr, stdout};

use crate::training::packed_dataset_by;

/// `yard run pytorch-ddp --name NAME` on one replica with `extra` settings, waited for; the job
/// as JSON.
fn train(env: &TestEnv, data: &str, name: &str, extra: &[&str]) -> Value {
    let python = std::env::var("TRAINYARD_TEST_PYTHON").expect("TRAINYARD_TEST_PYTHON: run through tests/run");
    let mut args: Vec<String> = vec!["run".into(), "pytorch-ddp".into(), "--name".into(), name.into()];
    let sets = [format!("data={data}"), format!("python={python}")];
    let fixed = ["replicas=1", "cpu=1", "memory=1Gi", "batch_size=32", "workers=1", "precision=bf16"];
    for set in sets.iter().map(String::as_str).chain(fixed).chain(extra.iter().copied()) {
        args.extend(["--set".to_string(), set.to_string()]);
    }
    args.extend(["--wait", "-o", "json"].map(String::from));
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    let out = env.yard(&env.admin_token, &args);
    assert!(out.status.success(), "{} {}", stdout(&out), stderr(&out));
    let job: Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(job["state"], "succeeded", "{job}");
    job
}

/// A metric's points as (step, value).
async fn series(env: &TestEnv, job: &str, name: &str) -> Vec<(i64, f64)> {
    let (status, metrics) = env.get(&format!("/api/v1/jobs/{job}/metrics"), &env.admin_token).await;
    assert_eq!(status, StatusCode::OK, "{metrics}");
    let Some(series) = metrics["series"].as_array().unwrap().iter().find(|s| s["name"] == name) else {
        return Vec::new();
    };
    let steps = series["steps"].as_array().unwrap().iter().map(|s| s.as_i64().unwrap());
    steps.zip(series["values"].as_array().unwrap().iter().map(|v| v.as_f64().unwrap())).collect()
}

#[tokio::test(flavor = "multi_thread")]
async fn checkpoints_are_listed_downloaded_and_fine_tuned_from() {
    let env = TestEnv::start().await;
    let (data, _) = packed_dataset_by(&env).await;
    let data = data.to_str().unwrap();
    let source = train(&env, data, "base", &["max_steps=30", "checkpoint_every=10", "keep_checkpoints=0"]);
    let id = source["id"].as_str().unwrap();
    // A short id, long enough not to name the data-pack job started a moment before too.
    let short = &id[..13];
    let folder = env.volume_folder("checkpoints").join("jobs").join(id).join("checkpoints");

    // Listed through the API: each step with its size, time and path as the job saw it.
    let (status, listed) = env.get(&format!("/api/v1/jobs/{id}/checkpoints"), &env.admin_token).await;
    assert_eq!(status, StatusCode::OK, "{listed}");
    let steps: Vec<u64> =
        listed["checkpoints"].as_array().unwrap().iter().map(|c| c["step"].as_u64().unwrap()).collect();
    assert_eq!(steps, [10, 20, 30], "{listed}");
    let at_20 = &listed["checkpoints"][1];
    let file = folder.join("ckpt-00000020.pt");
    let bytes = std::fs::read(&file).unwrap();
    assert_eq!(at_20["size_bytes"].as_u64().unwrap(), bytes.len() as u64);
    let seen_path = at_20["path"].as_str().unwrap().to_string();
    assert!(seen_path.ends_with(&format!("/jobs/{id}/checkpoints/ckpt-00000020.pt")), "{seen_path}");
    assert!(at_20["saved_at"].as_str().is_some_and(|t| t.starts_with("20")), "{at_20}");

    // A link planted in the folder (as the tenant's job could) is not followed: not listed, not
    // downloadable, not a checkpoint to fine-tune from.
    let outside = env.dir.path().join("outside-secret.pt");
    std::fs::write(&outside, "not this tenant's checkpoint").unwrap();
    std::os::unix::fs::symlink(&outside, folder.join("ckpt-00000099.pt")).unwrap();
    let (_, again) = env.get(&format!("/api/v1/jobs/{id}/checkpoints"), &env.admin_token).await;
    assert_eq!(again["checkpoints"].as_array().unwrap().len(), 3, "the link is not listed: {again}");
    let (status, _) = env.get(&format!("/api/v1/jobs/{id}/checkpoints/99"), &env.admin_token).await;
    assert_eq!(status, StatusCode::NOT_FOUND);

    // The CLI: `checkpoints ls`, `jobs show`, and downloads whose bytes are the file's.
    let out = env.yard(&env.admin_token, &["checkpoints", "ls", short]);
    assert!(out.status.success(), "{}", stderr(&out));
    let table = stdout(&out);
    for step in [10, 20, 30] {
        let row =
            table.lines().find(|l| l.contains(&format!("ckpt-{step:08}.pt"))).unwrap_or_else(|| panic!("{table}"));
        assert!(row.contains(&format!(" {step} ")) && row.contains("KiB"), "{row}");
    }
    assert!(!table.contains("ckpt-00000099"), "{table}");
    let out = env.yard(&env.admin_token, &["jobs", "show", short]);
    let shown = stdout(&out);
    assert!(shown.contains(&format!("checkpoints: {}", seen_path.trim_end_matches("/ckpt-00000020.pt"))), "{shown}");
    assert!(shown.lines().any(|l| l.trim_start().starts_with("step") && l.contains(" 20 ")), "{shown}");
    let saved = env.dir.path().join("at-20.pt");
    let out =
        env.yard(&env.admin_token, &["checkpoints", "download", &format!("{short}:20"), "-O", saved.to_str().unwrap()]);
    assert!(out.status.success(), "{}", stderr(&out));
    assert!(std::fs::read(&saved).unwrap() == bytes, "the download is the file, byte for byte");
    let out = env.yard(&env.admin_token, &["checkpoints", "download", short]);
    assert!(out.status.success(), "{}", stderr(&out));
    let newest = env.dir.path().join("yard-cwd/ckpt-00000030.pt");
    assert!(std::fs::read(newest).unwrap() == std::fs::read(folder.join("ckpt-00000030.pt")).unwrap());
    let response = reqwest::Client::new()
        .get(format!("{}/api/v1/jobs/{id}/checkpoints/20", env.server.url))
        .bearer_auth(&env.admin_token)
        .send()
        .await
        .unwrap();
    assert_eq!(response.status(), StatusCode::OK);
    assert!(response.bytes().await.unwrap().as_ref() == bytes.as_slice());

    // The job page lists them, each a download.
    let web = WebClient::signed_in(&env.server.url, &env.admin_token).await;
    let (status, page) = web.get(&format!("/jobs/{id}")).await;
    assert_eq!(status, StatusCode::OK);
    assert!(
        page.contains("id=\"checkpoints\"") && page.contains(&format!("href=\"/jobs/{id}/checkpoints/20\"")),
        "{page}"
    );

    // Bad init_from values: a 422 naming the parameter, before anything is queued.
    let python = std::env::var("TRAINYARD_TEST_PYTHON").unwrap();
    let run_with =
        |init_from: &str| json!({"params": {"data": data, "python": python, "init_from": init_from, "max_steps": 10}});
    for (init_from, says) in [
        ("no-such-job:20", "no job of your tenant is named no-such-job".to_string()),
        (&format!("{short}:7") as &str, "has no checkpoint at step 7; it has steps 10, 20, 30".to_string()),
        (&format!("{short}:99"), "has no checkpoint at step 99".to_string()),
        ("base:latest", "the step a whole number".to_string()),
    ] {
        let (status, refused) =
            env.post("/api/v1/templates/pytorch-ddp/jobs", &env.admin_token, &run_with(init_from)).await;
        assert_eq!(status, StatusCode::UNPROCESSABLE_ENTITY, "{init_from}: {refused}");
        assert_eq!(refused["error"]["field"], "params.init_from", "{refused}");
        assert!(refused["error"]["message"].as_str().unwrap().contains(&says), "{init_from}: {refused}");
    }

    // Another tenant: its admin sees none of it, and cannot fine-tune from it.
    env.post("/api/v1/admin/tenants", &env.admin_token, &json!({"name": "team-b"})).await;
    let bob = env.member("team-b", "bob", "admin").await;
    for path in [format!("/api/v1/jobs/{id}/checkpoints"), format!("/api/v1/jobs/{id}/checkpoints/20")] {
        let (status, body) = env.get(&path, &bob).await;
        assert_eq!(status, StatusCode::NOT_FOUND, "{path}: {body}");
    }
    let (status, refused) = env.post("/api/v1/templates/pytorch-ddp/jobs", &bob, &run_with(&format!("{id}:20"))).await;
    assert_eq!(status, StatusCode::UNPROCESSABLE_ENTITY, "{refused}");
    assert_eq!(refused["error"]["field"], "params.init_from");
    assert!(refused["error"]["message"].as_str().unwrap().contains("no job of your tenant"), "{refused}");

    // Fine-tuning from step 20, by the source's name: the weights only, from step 0.
    let tune = train(&env, data, "tuned", &["max_steps=10", "init_from=base:20"]);
    let tuned = tune["id"].as_str().unwrap();
    assert_eq!(tune["init_from"], json!({"job_id": id, "step": 20}), "{tune}");
    let log = env.yard(&env.admin_token, &["logs", tuned]);
    let log = stdout(&log);
    assert!(log.contains(&format!("fine-tuning from {seen_path} (the model weights of its step 20)")), "{log}");
    assert!(!log.contains("resuming from"), "{log}");
    assert_eq!(series(&env, tuned, "init_from_step").await, [(0, 20.0)], "reported at step 0");
    let tuned_loss = series(&env, tuned, "loss").await;
    assert_eq!(tuned_loss.iter().map(|(s, _)| *s).collect::<Vec<_>>(), [10], "ten steps of its own: {tuned_loss:?}");
    let source_loss = series(&env, id, "loss").await;
    assert_eq!(source_loss[0].0, 10, "{source_loss:?}");
    // After ten steps from trained weights the loss is below the source's after ten from fresh ones.
    assert!(tuned_loss[0].1 < source_loss[0].1 * 0.8, "tuned {tuned_loss:?} vs source {source_loss:?}");

    // The run record and the lineage keep the source job and step.
    let (_, records) = env.get(&format!("/api/v1/jobs/{tuned}/record"), &env.admin_token).await;
    assert_eq!(records["attempts"][0]["record"]["init_from"], json!({"job_id": id, "step": 20}), "{records}");
    let (_, lineage) = env.get(&format!("/api/v1/jobs/{tuned}/lineage"), &env.admin_token).await;
    let edge = lineage["edges"]
        .as_array()
        .unwrap()
        .iter()
        .find(|e| e["relation"] == "fine_tuned")
        .unwrap_or_else(|| panic!("no fine-tune edge: {lineage}"));
    assert_eq!(edge["from"], format!("job:{id}"));
    assert_eq!(edge["to"], format!("job:{tuned}"));
    assert_eq!(edge["note"], "checkpoint step 20");
    let out = env.yard(&env.admin_token, &["lineage", short]);
    let tree = stdout(&out);
    assert!(tree.contains("fine-tuned as") && tree.contains(&tuned[..8]), "{tree}");
    // A rerun starts from exactly that checkpoint again.
    let (status, rerun) =
        env.post(&format!("/api/v1/jobs/{tuned}/rerun"), &env.admin_token, &json!({"accept_unpinned": true})).await;
    assert!(status.is_success(), "{rerun}");
    assert_eq!(rerun["init_from"], json!({"job_id": id, "step": 20}), "{rerun}");
    let rerun_id = rerun["id"].as_str().unwrap();
    env.post(&format!("/api/v1/jobs/{rerun_id}/cancel"), &env.admin_token, &json!({})).await;
    let (_, page) = web.get(&format!("/jobs/{tuned}")).await;
    assert!(page.contains(&format!("id=\"init-from\">{id}</a>'s checkpoint at step 20")), "{page}");
}
