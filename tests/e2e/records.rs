//! Run records (issue #20): a pytorch-ddp job on CPU records the full package lock of the
//! Python it ran (torch and what torch depends on, each at the version installed), the content
//! hash of the dataset it read, the world size and the seed, beside what the server recorded
//! when the attempt began (template and its files, parameters, spec and its hash). A record is
//! posted once (a second post is 409), is its tenant's alone (404 for another), and two runs of
//! the same parameters hash equal while a changed parameter changes the hash. The job's page
//! shows it in brief.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::time::Duration;

use serde_json::{Value, json};
use trainyard_tests::{StatusCode, TestEnv, stderr, stdout};

/// The 1,200 8x8 images of `training.rs`, packed by data-pack and registered as `digits@1`.
/// Returns the folder and the registered dataset.
pub(crate) async fn registered_dataset(env: &TestEnv) -> (PathBuf, Value) {
    let (dest, from_job) = crate::training::packed_dataset_by(env).await;
    let from_job = from_job.as_str();
    let registered =
        env.yard(&env.admin_token, &["datasets", "register", "digits@1", "--from-job", from_job, "-o", "json"]);
    assert!(registered.status.success(), "{}", stderr(&registered));
    (dest, serde_json::from_slice(&registered.stdout).unwrap())
}

pub(crate) fn python() -> String {
    std::env::var("TRAINYARD_TEST_PYTHON").expect("TRAINYARD_TEST_PYTHON: run through tests/run")
}

/// Submits a short pytorch-ddp run on 2 CPU replicas; returns its id.
fn train(env: &TestEnv, data: &Path, seed: u32) -> String {
    let mut args: Vec<String> = ["run", "pytorch-ddp"].iter().map(|s| s.to_string()).collect();
    let sets = [
        format!("data={}", data.display()),
        format!("python={}", python()),
        format!("seed={seed}"),
        "replicas=2".into(),
        "cpu=0.5".into(),
        "memory=1Gi".into(),
        "batch_size=32".into(),
        "workers=0".into(),
        "epochs=1".into(),
        "max_steps=2".into(),
    ];
    for set in sets {
        args.extend(["--set".to_string(), set]);
    }
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    let out = env.yard(&env.admin_token, &args);
    assert!(out.status.success(), "{} {}", stdout(&out), stderr(&out));
    stdout(&out).trim().lines().last().unwrap().to_string()
}

/// Every distribution the test's Python has, by normalized name (PEP 503), the first of a name
/// on its path winning: what the engine's record must list. And the names torch requires.
fn venv_packages() -> (BTreeMap<String, String>, Vec<String>) {
    let script = r#"
import importlib.metadata as m, json, re
norm = lambda n: re.sub(r"[-_.]+", "-", n).lower()
lock = {}
for d in m.distributions():
    if d.metadata["Name"] and d.version:
        lock.setdefault(norm(d.metadata["Name"]), d.version)
requires = [norm(re.split(r"[ ;<>=!~\[(]", r, maxsplit=1)[0]) for r in (m.requires("torch") or []) if "extra ==" not in r]
print(json.dumps({"lock": lock, "requires": requires}))
"#;
    // -s: no user site-packages, as in the replicas (a virtualenv has none either).
    let out = std::process::Command::new(python()).args(["-s", "-c", script]).output().expect("run the test's Python");
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let value: Value = serde_json::from_slice(&out.stdout).unwrap();
    (serde_json::from_value(value["lock"].clone()).unwrap(), serde_json::from_value(value["requires"].clone()).unwrap())
}

fn sha256_of(bytes: &[u8]) -> String {
    use sha2::Digest;
    format!("sha256:{}", hex_of(&sha2::Sha256::digest(bytes)))
}

fn hex_of(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

async fn record_of(env: &TestEnv, id: &str) -> Value {
    let (status, record) = env.get(&format!("/api/v1/jobs/{id}/record"), &env.admin_token).await;
    assert_eq!(status, StatusCode::OK, "{record}");
    record
}

#[tokio::test(flavor = "multi_thread")]
async fn a_training_run_records_every_package_its_data_and_seeds_and_identical_runs_hash_equal() {
    let env = TestEnv::start().await;
    let (data, dataset) = registered_dataset(&env).await;
    let first = train(&env, &data, 0);
    let same = train(&env, &data, 0);
    let other_seed = train(&env, &data, 1);
    for id in [&first, &same, &other_seed] {
        let job = env.wait_job(id, Duration::from_secs(240), |j| j["finished_at"].is_string()).await;
        assert_eq!(job["state"], "succeeded", "{job}");
    }

    let record = record_of(&env, &first).await;
    assert_eq!(record["job_id"], first.as_str());
    let attempts = record["attempts"].as_array().unwrap();
    assert_eq!(attempts.len(), 1, "{record}");
    let attempt = &attempts[0];
    assert_eq!(attempt["attempt"], 1);
    assert!(attempt["engine_recorded_at"].is_string(), "the engine completed the record: {attempt}");
    let r = &attempt["record"];

    // The full package lock: every distribution of the Python that ran, torch and its own
    // dependencies included, at exactly the installed versions.
    let (lock, torch_requires) = venv_packages();
    let packages: BTreeMap<String, String> = serde_json::from_value(r["environment"]["packages"].clone()).unwrap();
    assert_eq!(packages, lock, "the record lists every installed distribution");
    assert_eq!(packages.get("torch"), lock.get("torch"));
    let dependency =
        torch_requires.iter().find(|name| lock.contains_key(*name)).expect("an installed dependency of torch");
    assert_eq!(packages.get(dependency), lock.get(dependency), "torch's dependency {dependency}");
    assert!(r["environment"]["python"]["executable"].as_str().is_some_and(|e| !e.is_empty()), "{r}");

    // The data: the registered dataset's content, and which shards each of the 2 ranks read.
    assert_eq!(r["data"]["content_hash"], dataset["content_hash"]);
    assert_eq!(r["data"]["path"], data.to_str().unwrap());
    let ranks = r["data"]["assignment"]["ranks"].as_array().expect("each rank's shards");
    assert_eq!(ranks.len(), 2);
    let mut shards: Vec<u64> =
        ranks.iter().flat_map(|r| r["shards"].as_array().unwrap()).map(|s| s.as_u64().unwrap()).collect();
    shards.sort();
    shards.dedup();
    assert_eq!(shards.len() as u64, r["data"]["shards"].as_u64().unwrap(), "between them the ranks read every shard");
    // Hardware and seeds.
    assert_eq!(r["hardware"]["world_size"], 2);
    assert_eq!(r["hardware"]["backend"], "gloo");
    assert!(r["hardware"]["cpu_count"].as_u64().is_some_and(|n| n > 0));
    assert_eq!(r["seeds"]["seed"], 0);
    assert_eq!(r["seeds"]["rank_seeds"].as_array().map(Vec::len), Some(2));
    assert_eq!(r["engine"]["name"], "pytorch-ddp");

    // The server's part: template and each file as run, parameters, the spec and its hash.
    let (_, job) = env.get(&format!("/api/v1/jobs/{first}"), &env.admin_token).await;
    assert_eq!(r["template"]["name"], "pytorch-ddp");
    assert_eq!(r["template"]["digest"], job["spec"]["template"]["digest"]);
    let train_py = Path::new(env!("CARGO_MANIFEST_DIR")).join("../templates/pytorch-ddp/engine/train.py");
    assert_eq!(r["template"]["files"]["engine/train.py"], sha256_of(&std::fs::read(train_py).unwrap()).as_str());
    assert_eq!(r["params"], job["params"]);
    assert_eq!(r["spec"], job["spec"]);
    let spec: trainyard_core::job::JobSpec = serde_json::from_value(job["spec"].clone()).unwrap();
    assert_eq!(r["spec_hash"], trainyard_core::record::spec_hash(&spec).as_str());
    assert_eq!((r["executor"].as_str(), r["image"].as_str()), (Some("local"), Some("local")));
    assert!(r["trainyard"]["version"].is_string());

    // Two runs of the same parameters hash equal (the job id, attempt and times are outside
    // the hash); another seed hashes differently.
    let again = record_of(&env, &same).await;
    let other = record_of(&env, &other_seed).await;
    assert_eq!(again["attempts"][0]["record"]["spec_hash"], r["spec_hash"], "the spec hash is stable");
    assert_eq!(again["attempts"][0]["record_hash"], attempt["record_hash"], "{r}\n{}", again["attempts"][0]["record"]);
    assert_ne!(other["attempts"][0]["record_hash"], attempt["record_hash"]);
    assert_ne!(other["attempts"][0]["record"]["spec_hash"], r["spec_hash"]);
    assert_eq!(other["attempts"][0]["record"]["seeds"]["seed"], 1);

    // `yard jobs show --record`: sections for people, the whole record with -o json.
    let shown = env.yard(&env.admin_token, &["jobs", "show", &first, "--record"]);
    assert!(shown.status.success(), "{}", stderr(&shown));
    let text = stdout(&shown);
    let torch = format!("torch {}", lock["torch"]);
    for section in [
        "template:",
        "parameters:",
        "spec hash:",
        "code:",
        "data:",
        "environment:",
        "hardware:",
        "seeds:",
        "trainyard:",
    ] {
        assert!(text.contains(section), "{section} in:\n{text}");
    }
    assert!(text.contains(&torch) && text.contains(&format!("{} packages", lock.len())), "{text}");
    assert!(text.contains(dataset["content_hash"].as_str().unwrap()), "{text}");
    // workers=0 pins the input pipeline: decoding in the training process, nothing tuned.
    assert!(text.contains("input:       0 workers × prefetch") && text.contains("(pinned)"), "{text}");
    let json_out = env.yard(&env.admin_token, &["jobs", "show", &first, "--record", "-o", "json"]);
    let printed: Value = serde_json::from_slice(&json_out.stdout).unwrap();
    assert_eq!(printed, record);

    // The job's page shows the record in brief (its hash, every package) and links the whole.
    let web = trainyard_tests::web::WebClient::signed_in(&env.server.url, &env.admin_token).await;
    let (status, page) = web.get(&format!("/jobs/{first}")).await;
    assert_eq!(status, StatusCode::OK, "{page}");
    let hash = attempt["record_hash"].as_str().unwrap();
    assert!(page.contains(&format!("id=\"record-hash\">{hash}</code>")), "the record hash on the job page:\n{page}");
    assert!(page.contains(&format!("{} installed packages", lock.len())), "{page}");
    assert!(page.contains(&format!("<td>torch</td><td><code>{}</code>", lock["torch"])), "{page}");
    assert!(page.contains(dataset["content_hash"].as_str().unwrap()), "{page}");
    assert!(page.contains("<dt>Input pipeline</dt><dd>0 workers × prefetch"), "{page}");
    let (status, whole) = web.get(&format!("/jobs/{first}/record.json")).await;
    assert_eq!(status, StatusCode::OK);
    assert_eq!(serde_json::from_str::<Value>(&whole).unwrap(), record, "the page's JSON is the API's");

    // Another tenant sees nothing of it; a viewer of this tenant reads it.
    let (status, _) = env.post("/api/v1/admin/tenants", &env.admin_token, &json!({"name": "team-b"})).await;
    assert_eq!(status, StatusCode::CREATED);
    let bob = env.member("team-b", "bob", "admin").await;
    let (status, body) = env.get(&format!("/api/v1/jobs/{first}/record"), &bob).await;
    assert_eq!(status, StatusCode::NOT_FOUND, "{body}");
    let vera = env.member("default", "vera", "viewer").await;
    assert_eq!(env.get(&format!("/api/v1/jobs/{first}/record"), &vera).await.0, StatusCode::OK);
}

#[tokio::test(flavor = "multi_thread")]
async fn an_engine_completes_its_attempts_record_once_and_never_again() {
    let env = TestEnv::start().await;
    // A job that hands its job token to the test and waits.
    let token_file = env.dir.path().join("job-token");
    let script = format!("echo \"$TRAINYARD_TOKEN\" > '{}'; sleep 300", token_file.display());
    let id = env.submit(json!({"command": ["sh", "-c", script]})).await;
    let deadline = std::time::Instant::now() + Duration::from_secs(30);
    let token = loop {
        if let Ok(text) = std::fs::read_to_string(&token_file)
            && text.trim().starts_with("tyj_")
        {
            break text.trim().to_string();
        }
        assert!(std::time::Instant::now() < deadline, "the job never wrote its token");
        tokio::time::sleep(Duration::from_millis(100)).await;
    };
    // The server's part is there from the start: a direct submit has no template.
    let before = record_of(&env, &id).await;
    assert_eq!(before["attempts"][0]["record"]["template"], Value::Null);
    assert_eq!(before["attempts"][0]["record"]["environment"], Value::Null);
    assert_eq!(before["attempts"][0]["engine_recorded_at"], Value::Null);

    let path = format!("/api/v1/jobs/{id}/record");
    let body = json!({"environment": {"packages": {"torch": "2.15.0", "filelock": "3.20.0"}, "platform": "Linux"},
                      "hardware": {"world_size": 1}, "seeds": {"seed": 4}});
    // Unknown fields are refused by name; a user's token cannot post; nor can a token for
    // another job's record.
    let (status, refused) = env.post(&path, &token, &json!({"environment": {"packages": {}}, "colour": "red"})).await;
    assert_eq!(status, StatusCode::UNPROCESSABLE_ENTITY, "{refused}");
    assert_eq!(refused["error"]["field"], "colour");
    assert_eq!(env.post(&path, &env.admin_token, &body).await.0, StatusCode::UNAUTHORIZED);
    let elsewhere = format!("/api/v1/jobs/{}/record", uuid::Uuid::now_v7());
    assert_eq!(env.post(&elsewhere, &token, &body).await.0, StatusCode::NOT_FOUND);

    let (status, posted) = env.post(&path, &token, &body).await;
    assert_eq!(status, StatusCode::NO_CONTENT, "{posted}");
    let (status, again) = env.post(&path, &token, &json!({"environment": {"packages": {"torch": "9.9.9"}}})).await;
    assert_eq!(status, StatusCode::CONFLICT, "a record is posted once: {again}");

    let after = record_of(&env, &id).await;
    let attempt = &after["attempts"][0];
    assert_eq!(attempt["record"]["environment"]["packages"]["torch"], "2.15.0", "the first post stands");
    assert_eq!(attempt["record"]["seeds"]["seed"], 4);
    assert!(attempt["engine_recorded_at"].is_string());
    assert_ne!(attempt["record_hash"], before["attempts"][0]["record_hash"], "the engine's part is hashed too");
    // Not even the database lets it change.
    let changed = sqlx::query("UPDATE run_records SET server = '{}'::jsonb WHERE job_id = $1::uuid")
        .bind(&id)
        .execute(&env.db.pool)
        .await
        .unwrap_err();
    assert!(changed.to_string().contains("a run record is immutable"), "{changed}");

    let cancelled = env.yard(&env.admin_token, &["cancel", &id]);
    assert!(cancelled.status.success(), "{}", stderr(&cancelled));
    env.wait_state(&id, "cancelled", Duration::from_secs(30)).await;
}
