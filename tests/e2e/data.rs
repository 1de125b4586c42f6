//! The `data-pack` template: N replicas pack in parallel on the local executor, replica 0
//! merges, and the job records the dataset's content hash.

use std::time::Duration;

use serde_json::Value;
use trainyard_tests::{TestEnv, bin, stderr, stdout};

#[tokio::test(flavor = "multi_thread")]
async fn data_pack_with_two_workers_records_the_same_dataset_as_one_worker() {
    let env = TestEnv::start().await;
    let source = env.dir.path().join("photos");
    for i in 0..200 {
        let sub = source.join(format!("batch{}", i % 3));
        std::fs::create_dir_all(&sub).unwrap();
        std::fs::write(sub.join(format!("p{i:04}.jpg")), vec![(i % 251) as u8; 1000 + i * 40]).unwrap();
        std::fs::write(sub.join(format!("p{i:04}.cls")), format!("{}", i % 10)).unwrap();
    }
    let dest = env.dir.path().join("packed");
    let set = |k: &str, v: &std::path::Path| format!("{k}={}", v.display());
    let ran = env.yard(
        &env.admin_token,
        &[
            "run",
            "data-pack",
            "--set",
            &set("source", &source),
            "--set",
            &set("destination", &dest),
            "--set",
            "workers=2",
            "--set",
            "shard_size=64Ki",
            "--set",
            "threads=1",
            "--wait",
            "-o",
            "json",
        ],
    );
    assert!(ran.status.success(), "{} {}", stdout(&ran), stderr(&ran));
    let job: Value = serde_json::from_slice(&ran.stdout).unwrap();
    assert_eq!(job["spec"]["replicas"], 2);
    let id = job["id"].as_str().unwrap();
    let (_, outputs) = env.get(&format!("/api/v1/jobs/{id}/outputs"), &env.admin_token).await;
    let recorded = outputs["dataset"]["content_hash"].as_str().expect("the job recorded its dataset").to_string();
    assert_eq!(outputs["dataset"]["samples"], 200);

    // The same input packed by one worker, outside Trainyard, has the same content hash.
    let alone = std::process::Command::new(bin("yard-data"))
        .args(["pack", "--shard-size", "64Ki", "--prefix", "data"])
        .arg(&source)
        .arg(env.dir.path().join("alone"))
        .output()
        .unwrap();
    assert!(alone.status.success(), "{}", stderr(&alone));
    let alone: Value = serde_json::from_slice(&alone.stdout).unwrap();
    assert_eq!(alone["content_hash"], recorded.as_str());
    let verified = std::process::Command::new(bin("yard-data")).arg("verify").arg(&dest).output().unwrap();
    assert!(verified.status.success(), "{}", stderr(&verified));

    // Packing into the same destination again is refused unless told to overwrite.
    let (status, again) = env
        .post(
            "/api/v1/templates/data-pack/jobs",
            &env.admin_token,
            &serde_json::json!({"params": {"source": source, "destination": dest}}),
        )
        .await;
    assert_eq!(status, trainyard_tests::StatusCode::CREATED);
    let again = env.wait_job(again["id"].as_str().unwrap(), Duration::from_secs(60), |j| j["state"] == "failed").await;
    let (_, log) = env.get(&format!("/api/v1/jobs/{}/logs", again["id"].as_str().unwrap()), &env.admin_token).await;
    assert!(log.as_str().unwrap_or_default().contains("already holds a dataset"), "{log}");
}
