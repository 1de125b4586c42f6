//! The `data-pack` template: N replicas pack in parallel on the local executor, replica 0
//! merges, and the job records the dataset's content hash.

use std::time::Duration;

use serde_json::{Value, json};
use trainyard_core::resources::human_memory;
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

#[tokio::test(flavor = "multi_thread")]
async fn a_packed_dataset_is_registered_and_jobs_record_the_exact_version_they_used() {
    let env = TestEnv::start().await;
    let token = env.admin_token.clone();
    let pack = |name: &str, samples: usize| {
        let source = env.dir.path().join(format!("{name}-src"));
        for i in 0..samples {
            std::fs::create_dir_all(&source).unwrap();
            std::fs::write(source.join(format!("s{i:03}.txt")), format!("{name} {i}")).unwrap();
        }
        let dest = env.dir.path().join(name);
        env.data_pack(&source, &dest, &[])["id"].as_str().unwrap().to_string()
    };
    let first = pack("photos-a", 20);
    let registered = env.yard(&token, &["datasets", "register", "photos@1", "--from-job", &first, "-o", "json"]);
    assert!(registered.status.success(), "{}", stderr(&registered));
    let dataset: Value = serde_json::from_slice(&registered.stdout).unwrap();
    let (_, outputs) = env.get(&format!("/api/v1/jobs/{first}/outputs"), &token).await;
    assert_eq!(dataset["content_hash"], outputs["dataset"]["content_hash"]);
    assert_eq!(dataset["samples"], 20);

    // The same version with other content is refused; a new version is fine.
    let second = pack("photos-b", 25);
    let again = env.yard(&token, &["datasets", "register", "photos@1", "--from-job", &second]);
    assert!(!again.status.success());
    assert!(stderr(&again).contains("registered with other content"), "{}", stderr(&again));
    assert!(env.yard(&token, &["datasets", "register", "photos@2", "--from-job", &second]).status.success());
    let listed = stdout(&env.yard(&token, &["datasets", "ls"]));
    assert!(
        listed.contains("DATASET") && listed.contains("photos@1") && listed.contains("photos@2"),
        "a table: {listed}"
    );
    let shown = stdout(&env.yard(&token, &["datasets", "show", "photos@1"]));
    assert!(shown.contains("samples:      20") && shown.contains(dataset["content_hash"].as_str().unwrap()), "{shown}");
    // Its size in human units, as everywhere a person reads one (`-o json` has the bytes).
    let size = human_memory(dataset["size_bytes"].as_u64().expect("a packed dataset's size"));
    assert!(shown.contains(&format!("size:         {size}\n")), "{shown}");
    assert!(listed.lines().any(|l| l.contains("photos@1") && l.contains(&size)), "{listed}");

    // A template with a dataset parameter: the job gets the dataset's path and records it.
    let manifest = "name: count\nversion: 1.0.0\ndescription: Count a dataset's shards.\nparameters:\n  data: {type: dataset, required: true}\ncommand: [ls, \"{{ data }}\"]\n";
    let (status, body) = env.post("/api/v1/templates", &token, &json!({"manifest": manifest})).await;
    assert_eq!(status, trainyard_tests::StatusCode::CREATED, "{body}");
    let (status, job) =
        env.post("/api/v1/templates/count/jobs", &token, &json!({"params": {"data": "photos@1"}})).await;
    assert_eq!(status, trainyard_tests::StatusCode::CREATED, "{job}");
    assert_eq!(job["datasets"][0]["version"], "1");
    assert_eq!(job["datasets"][0]["content_hash"], dataset["content_hash"]);
    assert_eq!(job["spec"]["command"][1], dataset["uri"], "the job reads the registered location");
    let done = env.wait_state(job["id"].as_str().unwrap(), "succeeded", Duration::from_secs(30)).await;
    assert_eq!(done["datasets"], job["datasets"]);
    let (status, body) =
        env.post("/api/v1/templates/count/jobs", &token, &json!({"params": {"data": "photos@9"}})).await;
    assert_eq!(
        (status, body["error"]["field"].as_str()),
        (trainyard_tests::StatusCode::UNPROCESSABLE_ENTITY, Some("params.data"))
    );

    // Another tenant sees none of it.
    env.post("/api/v1/admin/tenants", &token, &json!({"name": "team-b"})).await;
    let bob = env.member("team-b", "bob", "member").await;
    assert_eq!(env.get("/api/v1/datasets", &bob).await.1, json!([]));
    assert_eq!(env.get("/api/v1/datasets/photos/1", &bob).await.0, trainyard_tests::StatusCode::NOT_FOUND);
}
