//! Datasets on the object store (issue 23), end to end: `yard datasets push` uploads a packed
//! folder (each shard checked against its manifest while it streams) and registers a version;
//! pytorch-ddp jobs read it as `store:NAME@VERSION` from the server through the node's shard
//! cache, so the first job on a machine fetches every shard once and the next fetches none (the
//! server's `trainyard_dataset_bytes_served_total` says what it sent), a shard damaged in the
//! cache is fetched again, and the files are their tenant's alone: another tenant's members and
//! jobs get 404, like a job of the same tenant that did not record reading the version.

use std::path::{Path, PathBuf};
use std::time::Duration;

use serde_json::{Value, json};
use sha2::{Digest, Sha256};
use trainyard_tests::{StatusCode, TestEnv, bin, stderr, stdout};

use crate::storage::{Backend, start, start_with, tenant_of_job, walkdir};

fn sha256_hex(bytes: &[u8]) -> String {
    Sha256::digest(bytes).iter().map(|b| format!("{b:02x}")).collect()
}

/// The manifest's content hash of shards given as (name, samples, sha256): data-pack's rule.
fn content_hash(shards: &[(&str, u64, &str)]) -> String {
    let mut hasher = Sha256::new();
    for (name, samples, sha) in shards {
        hasher.update(format!("{name}\0{samples}\0{sha}\n"));
    }
    format!("sha256:{}", hasher.finalize().iter().map(|b| format!("{b:02x}")).collect::<String>())
}

/// PUT of one file of a push, as `yard datasets push` sends it.
async fn put_file(env: &TestEnv, token: &str, hex: &str, file: &str, body: Vec<u8>) -> (StatusCode, Value) {
    let response = reqwest::Client::new()
        .put(format!("{}/api/v1/dataset-content/{hex}/{file}", env.server.url))
        .bearer_auth(token)
        .header("content-type", "application/octet-stream")
        .body(body)
        .send()
        .await
        .unwrap();
    let status = response.status();
    (status, response.json().await.unwrap_or(Value::Null))
}

/// GET of one file of a registered version: the status and the bytes.
async fn get_file(env: &TestEnv, token: &str, dataset: &str, file: &str) -> (StatusCode, Vec<u8>) {
    let (name, version) = dataset.split_once('@').unwrap();
    let response = reqwest::Client::new()
        .get(format!("{}/api/v1/datasets/{name}/{version}/files/{file}", env.server.url))
        .bearer_auth(token)
        .send()
        .await
        .unwrap();
    (response.status(), response.bytes().await.unwrap().to_vec())
}

/// Pushes a one-shard dataset through the API and registers it as `name@version`; returns the
/// hex of its content hash. (A shard's bytes are not read as a tar by the server.)
pub(crate) async fn push_tiny(env: &TestEnv, token: &str, name: &str, version: &str) -> String {
    let hex = push_shard(env, token, format!("the one shard of {name}@{version}").into_bytes()).await;
    let hash = format!("sha256:{hex}");
    let (status, body) =
        env.post("/api/v1/datasets", token, &json!({"name": name, "version": version, "from_store": hash})).await;
    assert_eq!(status, StatusCode::CREATED, "{body}");
    hex
}

/// Pushes a one-shard dataset (its manifest, `shard`, an index) without registering a version;
/// the hex of its content hash.
async fn push_shard(env: &TestEnv, token: &str, shard: Vec<u8>) -> String {
    let sha = sha256_hex(&shard);
    let hash = content_hash(&[("data-000000.tar", 1, &sha)]);
    let manifest = json!({
        "format": "trainyard-shards-v1", "prefix": "data", "samples": 1, "bytes": shard.len(),
        "shards": [{"name": "data-000000.tar", "index": "data-000000.idx.json", "samples": 1,
                    "bytes": shard.len(), "sha256": sha}],
        "content_hash": hash, "created_by": "a test",
    });
    let hex = hash.trim_start_matches("sha256:").to_string();
    for (file, body) in [
        ("dataset.json", serde_json::to_vec(&manifest).unwrap()),
        ("data-000000.tar", shard),
        ("data-000000.idx.json", b"{}".to_vec()),
    ] {
        let (status, body) = put_file(env, token, &hex, file, body).await;
        assert_eq!(status, StatusCode::CREATED, "{file}: {body}");
    }
    hex
}

/// What the server counted as sent of `tenant`'s pushed datasets' shards.
async fn shard_bytes_served(env: &TestEnv, tenant: &str) -> u64 {
    let text = env.metrics_text().await;
    let series = format!("trainyard_dataset_bytes_served_total{{tenant=\"{tenant}\",kind=\"shard\"}} ");
    text.lines().find_map(|line| line.strip_prefix(&series)?.trim().parse().ok()).unwrap_or(0)
}

/// A short pytorch-ddp run on one CPU replica reading `data`, waited for; returns the job.
fn train(env: &TestEnv, data: &str) -> Value {
    train_as(env, &env.admin_token, data)
}

fn train_as(env: &TestEnv, token: &str, data: &str) -> Value {
    let python = crate::records::python();
    let mut args: Vec<String> = ["run", "pytorch-ddp"].iter().map(|s| s.to_string()).collect();
    let sets = [
        format!("data={data}"),
        format!("python={python}"),
        "seed=0".into(),
        "deterministic=true".into(),
        "replicas=1".into(),
        "cpu=1".into(),
        "memory=1Gi".into(),
        "batch_size=32".into(),
        "workers=0".into(),
        "epochs=1".into(),
        "max_steps=20".into(),
        "checkpoint_volume=".into(),
    ];
    for set in sets {
        args.extend(["--set".to_string(), set]);
    }
    args.extend(["--wait", "-o", "json"].map(String::from));
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    let ran = env.yard(token, &args);
    let job: Value = serde_json::from_slice(&ran.stdout)
        .unwrap_or_else(|_| panic!("yard run printed no job: {} {}", stdout(&ran), stderr(&ran)));
    let id = job["id"].as_str().unwrap();
    let log =
        std::fs::read_to_string(env.data_dir().join(format!("jobs/{id}/attempt-1/replica-0.log"))).unwrap_or_default();
    assert_eq!(job["state"], "succeeded", "{job}\n{log}");
    job
}

async fn record_of(env: &TestEnv, job: &Value) -> Value {
    let (status, record) =
        env.get(&format!("/api/v1/jobs/{}/record", job["id"].as_str().unwrap()), &env.admin_token).await;
    assert_eq!(status, StatusCode::OK, "{record}");
    record["attempts"][0].clone()
}

/// The loss series a job reported (every 10 steps).
async fn loss(env: &TestEnv, job: &Value) -> Vec<f64> {
    let id = job["id"].as_str().unwrap();
    let (status, metrics) = env.get(&format!("/api/v1/jobs/{id}/metrics?name=loss"), &env.admin_token).await;
    assert_eq!(status, StatusCode::OK, "{metrics}");
    metrics["series"][0]["values"].as_array().map_or_else(Vec::new, |v| v.iter().filter_map(Value::as_f64).collect())
}

/// The last value of an engine metric of a job.
async fn metric(env: &TestEnv, job: &Value, name: &str) -> Option<f64> {
    let id = job["id"].as_str().unwrap();
    let (_, metrics) = env.get(&format!("/api/v1/jobs/{id}/metrics"), &env.admin_token).await;
    let series = metrics["series"].as_array()?.iter().find(|s| s["name"] == name)?;
    series["values"].as_array()?.last()?.as_f64()
}

/// A job of the tenant `token` acts in that hands its job token to the test and keeps running.
async fn job_token_of(env: &TestEnv, token: &str, file: &str) -> String {
    let token_file = env.dir.path().join(file);
    let script = format!("echo \"$TRAINYARD_TOKEN\" > '{}'; sleep 300", token_file.display());
    let (status, body) = env.post("/api/v1/jobs", token, &json!({"command": ["sh", "-c", script]})).await;
    assert_eq!(status, StatusCode::CREATED, "{body}");
    let deadline = std::time::Instant::now() + Duration::from_secs(30);
    loop {
        if let Ok(text) = std::fs::read_to_string(&token_file)
            && text.trim().starts_with("tyj_")
        {
            return text.trim().to_string();
        }
        assert!(std::time::Instant::now() < deadline, "the job never wrote its token");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn a_store_dataset_is_fetched_once_per_machine_cached_refetched_when_damaged_and_kept_to_its_tenant() {
    let (env, store) = start(&Backend::S3).await;
    let token = env.admin_token.clone();
    let (packed, pack_job) = crate::training::packed_dataset_by(&env).await;
    let manifest: Value = serde_json::from_slice(&std::fs::read(packed.join("dataset.json")).unwrap()).unwrap();
    let shards = manifest["shards"].as_array().unwrap().clone();
    assert!(shards.len() >= 2, "{manifest}");
    let shard_bytes: u64 = shards.iter().map(|s| s["bytes"].as_u64().unwrap()).sum();

    let pushed = env.yard(&token, &["datasets", "push", "digits", packed.to_str().unwrap(), "-o", "json"]);
    assert!(pushed.status.success(), "{} {}", stdout(&pushed), stderr(&pushed));
    let dataset: Value = serde_json::from_slice(&pushed.stdout).unwrap();
    assert_eq!((dataset["name"].as_str(), dataset["version"].as_str()), (Some("digits"), Some("1")));
    assert_eq!(dataset["uri"], "store:digits@1");
    assert_eq!(dataset["content_hash"], manifest["content_hash"]);
    assert_eq!(dataset["size_bytes"].as_u64(), Some(shard_bytes));
    // In the tenant's part of the store, by content.
    let tenant = tenant_of_job(&env, &pack_job).await;
    let hex = manifest["content_hash"].as_str().unwrap().trim_start_matches("sha256:").to_string();
    let prefix = format!("tenants/{tenant}/datasets/content/{hex}/");
    let keys = store.keys();
    for shard in &shards {
        for file in [&shard["name"], &shard["index"]] {
            assert!(keys.contains(&format!("{prefix}{}", file.as_str().unwrap())), "{file} in {keys:?}");
        }
    }
    assert!(keys.contains(&format!("{prefix}dataset.json")), "{keys:?}");
    // Pushing the same content again registers nothing new.
    let again = env.yard(&token, &["datasets", "push", "digits", packed.to_str().unwrap()]);
    assert!(again.status.success() && stderr(&again).contains("digits@1 holds this content"), "{}", stderr(&again));
    // A registered version's files cannot change: an index (which the manifest does not hash)
    // pushed again is refused, and the stored one stays.
    let index = shards[0]["index"].as_str().unwrap();
    let stored_index = store.read(&format!("{prefix}{index}"));
    let (status, body) = put_file(&env, &token, &hex, index, b"{\"samples\": []}".to_vec()).await;
    assert_eq!(status, StatusCode::CONFLICT, "{body}");
    assert!(body["error"]["message"].as_str().unwrap().contains("cannot change"), "{body}");
    assert_eq!(store.read(&format!("{prefix}{index}")), stored_index, "the index is as it was");
    // The same content under another name: registered, nothing uploaded again.
    let other = env.yard(&token, &["datasets", "push", "digits-copy", packed.to_str().unwrap(), "-o", "json"]);
    assert!(other.status.success(), "{} {}", stdout(&other), stderr(&other));
    let copy: Value = serde_json::from_slice(&other.stdout).unwrap();
    assert_eq!(
        (copy["uri"].as_str(), copy["store_prefix"].as_str()),
        (Some("store:digits-copy@1"), dataset["store_prefix"].as_str())
    );

    // NAME@VERSION of a pushed version reaches the engine as store:NAME@VERSION.
    let python = crate::records::python();
    let (status, dry) = env
        .post(
            "/api/v1/templates/pytorch-ddp/jobs?dry_run=true",
            &token,
            &json!({"params": {"data": "digits@1", "python": python}}),
        )
        .await;
    assert_eq!(status, StatusCode::OK, "{dry}");
    assert!(dry["spec"]["args"].as_array().unwrap().contains(&json!("--data=store:digits@1")), "{dry}");

    // The first job fetches every shard once; the second, on the same machine, none.
    let before = shard_bytes_served(&env, "default").await;
    let first = train(&env, "store:digits@1");
    let after_first = shard_bytes_served(&env, "default").await;
    assert_eq!(after_first - before, shard_bytes, "the first job fetched each shard once");
    let second = train(&env, "store:digits@1");
    let after_second = shard_bytes_served(&env, "default").await;
    assert_eq!(after_second, after_first, "the second job read every shard from the node's cache");
    assert_eq!(metric(&env, &second, "data/bytes_fetched").await, Some(0.0));
    assert_eq!(metric(&env, &second, "data/cache_hits").await, Some(shards.len() as f64));
    assert_eq!(metric(&env, &first, "data/bytes_fetched").await, Some(shard_bytes as f64));
    // Both recorded the version as a folder version is recorded, and trained on the same data.
    let used = json!([{"param": "data", "name": "digits", "version": "1", "uri": "store:digits@1",
                       "content_hash": manifest["content_hash"]}]);
    assert_eq!(first["datasets"], used);
    assert_eq!(second["datasets"], used);
    let (one, two) = (record_of(&env, &first).await, record_of(&env, &second).await);
    assert_eq!(one["record"]["data"]["path"], "store:digits@1");
    assert_eq!(one["record"]["data"]["content_hash"], manifest["content_hash"]);
    assert!(one["record"]["data"]["assignment"]["ranks"].is_array(), "{}", one["record"]["data"]);
    assert_eq!(one["record"]["data"], two["record"]["data"], "the same samples, in the same order");
    assert_eq!(one["record_hash"], two["record_hash"], "identical runs hash equal");
    let trained = loss(&env, &first).await;
    assert!(trained.len() >= 2, "{trained:?}");
    assert_eq!(trained, loss(&env, &second).await, "the same samples train the same model, loss for loss");

    // A shard damaged in the cache is fetched again (its bytes, no more), and the job succeeds.
    let damaged = &shards[0];
    let sha = damaged["sha256"].as_str().unwrap();
    // The tenant's cache folder is named by its id, not its name.
    let cached: PathBuf = env.data_dir().join("shard-cache").join(&tenant).join(&sha[..2]).join(sha);
    let mut bytes = std::fs::read(&cached).unwrap_or_else(|err| panic!("{}: {err}", cached.display()));
    bytes[600] ^= 0xff;
    std::fs::write(&cached, bytes).unwrap();
    let third = train(&env, "store:digits@1");
    let after_third = shard_bytes_served(&env, "default").await;
    assert_eq!(after_third - after_second, damaged["bytes"].as_u64().unwrap(), "only the damaged shard");
    assert_eq!(sha256_hex(&std::fs::read(&cached).unwrap()), sha, "the cache holds the shard again");
    assert_eq!(metric(&env, &third, "data/cache_refetched").await, Some(1.0));
    assert_eq!(loss(&env, &third).await, trained, "trained on the shard's own bytes again");

    // Members read the files; another tenant's member and job, and a job of this tenant that
    // did not record the version, get 404 like a version that does not exist.
    let viewer = env.member("default", "vera", "viewer").await;
    let (status, served) = get_file(&env, &viewer, "digits@1", "dataset.json").await;
    assert_eq!(status, StatusCode::OK);
    assert_eq!(served, std::fs::read(packed.join("dataset.json")).unwrap());
    let shard_name = damaged["name"].as_str().unwrap();
    assert_eq!(get_file(&env, &viewer, "digits@1", shard_name).await.0, StatusCode::OK);
    assert_eq!(get_file(&env, &viewer, "digits@1", "dataset.wids.json").await.0, StatusCode::NOT_FOUND);
    assert_eq!(get_file(&env, &viewer, "digits@9", "dataset.json").await.0, StatusCode::NOT_FOUND);
    let (status, _) = env.post("/api/v1/admin/tenants", &token, &json!({"name": "team-b"})).await;
    assert_eq!(status, StatusCode::CREATED);
    let bob = env.member("team-b", "bob", "admin").await;
    let bobs_job = job_token_of(&env, &bob, "b-token").await;
    let idle_job = job_token_of(&env, &token, "a-token").await;
    for (who, caller) in
        [("tenant B's admin", &bob), ("tenant B's job", &bobs_job), ("a job not reading it", &idle_job)]
    {
        for file in ["dataset.json", shard_name] {
            let (status, body) = get_file(&env, caller, "digits@1", file).await;
            assert_eq!(status, StatusCode::NOT_FOUND, "{who}, {file}: {}", String::from_utf8_lossy(&body));
        }
    }
    // Tenant B cannot name it in a job either.
    let (status, body) = env
        .post("/api/v1/templates/pytorch-ddp/jobs?dry_run=true", &bob, &json!({"params": {"data": "store:digits@1"}}))
        .await;
    assert_eq!(
        (status, body["error"]["field"].as_str()),
        (StatusCode::UNPROCESSABLE_ENTITY, Some("params.data")),
        "{body}"
    );
    let after_all = shard_bytes_served(&env, "default").await;
    assert_eq!(after_all - after_third, damaged["bytes"].as_u64().unwrap(), "the viewer's one shard, nothing else");
}

/// A folder packed by `yard-data pack` (no job): 40 samples in shards of 8Ki.
pub(crate) fn packed_here(env: &TestEnv, name: &str) -> PathBuf {
    let source = env.dir.path().join(format!("{name}-src"));
    std::fs::create_dir_all(&source).unwrap();
    for i in 0..40 {
        std::fs::write(source.join(format!("s{i:03}.txt")), format!("{name} sample {i} ").repeat(40)).unwrap();
    }
    pack_here(&source, &env.dir.path().join(name), "8Ki")
}

/// `source` packed into `dest` by `yard-data pack` (no job), in shards of `shard_size`.
fn pack_here(source: &Path, dest: &Path, shard_size: &str) -> PathBuf {
    let packed = std::process::Command::new(bin("yard-data"))
        .args(["pack", "--shard-size", shard_size, "--prefix", "data"])
        .arg(source)
        .arg(dest)
        .output()
        .unwrap();
    assert!(packed.status.success(), "{}", stderr(&packed));
    dest.to_path_buf()
}

fn manifest_of(folder: &Path) -> Value {
    serde_json::from_slice(&std::fs::read(folder.join("dataset.json")).unwrap()).unwrap()
}

#[tokio::test(flavor = "multi_thread")]
async fn a_store_dataset_push_with_a_wrong_shard_is_refused_naming_it_and_nothing_registers_early() {
    let env = TestEnv::start().await;
    let token = env.admin_token.clone();
    let folder = packed_here(&env, "photos");
    let manifest = manifest_of(&folder);
    let shards = manifest["shards"].as_array().unwrap().clone();
    assert!(shards.len() >= 3, "{manifest}");
    let hex = manifest["content_hash"].as_str().unwrap().trim_start_matches("sha256:").to_string();

    // One shard's bytes changed after packing (its size kept): the push is refused, naming it.
    let wrong = shards[1]["name"].as_str().unwrap().to_string();
    let original = std::fs::read(folder.join(&wrong)).unwrap();
    let mut changed = original.clone();
    changed[100] ^= 0xff;
    std::fs::write(folder.join(&wrong), &changed).unwrap();
    let pushed = env.yard(&token, &["datasets", "push", "photos", folder.to_str().unwrap()]);
    assert!(!pushed.status.success(), "{}", stdout(&pushed));
    let said = stderr(&pushed);
    assert!(said.contains(&format!("shard {wrong} does not match the manifest")), "{said}");
    assert_eq!(env.get("/api/v1/datasets", &token).await.1, json!([]), "nothing registered");
    // Through the API: a typed 422 on `file`, and nothing stored under the shard's name.
    let (status, body) = put_file(&env, &token, &hex, &wrong, changed.clone()).await;
    assert_eq!((status, body["error"]["field"].as_str()), (StatusCode::UNPROCESSABLE_ENTITY, Some("file")), "{body}");
    assert!(body["error"]["message"].as_str().unwrap().contains(&wrong), "{body}");
    let objects = env.data_dir().join("objects");
    let stored: Vec<PathBuf> = walkdir(&objects);
    assert!(stored.iter().any(|p| p.ends_with("dataset.json")), "the manifest went first: {stored:?}");
    assert!(!stored.iter().any(|p| p.ends_with(&wrong)), "the wrong shard was never stored: {stored:?}");
    // A file the manifest does not name, and a manifest under another content hash.
    let (status, body) = put_file(&env, &token, &hex, "extra.tar", b"x".to_vec()).await;
    assert_eq!(status, StatusCode::UNPROCESSABLE_ENTITY, "{body}");
    let raw = std::fs::read(folder.join("dataset.json")).unwrap();
    let (status, body) = put_file(&env, &token, &"0".repeat(64), "dataset.json", raw).await;
    assert_eq!(status, StatusCode::UNPROCESSABLE_ENTITY, "{body}");
    assert!(body["error"]["message"].as_str().unwrap().contains("not the sha256:0000"), "{body}");
    // A manifest of the same content hash with a wrong size (sizes are not hashed): while no
    // version is registered on the content it replaces the one pushed before, and the right
    // one replaces it again, so a push that went wrong never blocks its content for good.
    let mut wrong_size = manifest.clone();
    wrong_size["shards"][0]["bytes"] = json!(shards[0]["bytes"].as_u64().unwrap() + 1);
    wrong_size["bytes"] = json!(manifest["bytes"].as_u64().unwrap() + 1);
    let wrong_size = serde_json::to_vec(&wrong_size).unwrap();
    for body in [wrong_size.clone(), std::fs::read(folder.join("dataset.json")).unwrap()] {
        let (status, answer) = put_file(&env, &token, &hex, "dataset.json", body.clone()).await;
        assert_eq!(status, StatusCode::CREATED, "{answer}");
        assert_eq!(answer["sha256"].as_str(), Some(sha256_hex(&body).as_str()), "{answer}");
    }

    // Registering before every file is there is refused, naming the missing file: the push
    // above stored every file but the wrong shard.
    let register = json!({"name": "photos", "version": "1", "from_store": manifest["content_hash"]});
    let (status, body) = env.post("/api/v1/datasets", &token, &register).await;
    assert_eq!(
        (status, body["error"]["field"].as_str()),
        (StatusCode::UNPROCESSABLE_ENTITY, Some("from_store")),
        "{body}"
    );
    let message = |body: &Value| body["error"]["message"].as_str().unwrap_or_default().to_string();
    assert!(message(&body).contains(&format!("shard {wrong} was not uploaded")), "{body}");
    // Another dataset uploaded through the API but for its last index: refused, naming it.
    let maps = packed_here(&env, "maps");
    let maps_manifest = manifest_of(&maps);
    let maps_hex = maps_manifest["content_hash"].as_str().unwrap().trim_start_matches("sha256:").to_string();
    let maps_shards = maps_manifest["shards"].as_array().unwrap().clone();
    let last_index = maps_shards.last().unwrap()["index"].as_str().unwrap().to_string();
    let upload = |file: String| {
        let (env, token, maps, maps_hex) = (&env, &token, &maps, &maps_hex);
        async move {
            let (status, body) = put_file(env, token, maps_hex, &file, std::fs::read(maps.join(&file)).unwrap()).await;
            assert_eq!(status, StatusCode::CREATED, "{file}: {body}");
        }
    };
    upload("dataset.json".into()).await;
    for shard in &maps_shards {
        for file in [shard["name"].as_str().unwrap(), shard["index"].as_str().unwrap()] {
            if file != last_index {
                upload(file.to_string()).await;
            }
        }
    }
    let maps_register = json!({"name": "maps", "version": "1", "from_store": maps_manifest["content_hash"]});
    let (status, body) = env.post("/api/v1/datasets", &token, &maps_register).await;
    assert_eq!(status, StatusCode::UNPROCESSABLE_ENTITY, "{body}");
    assert!(message(&body).contains(&format!("index {last_index} was not uploaded")), "{body}");
    assert_eq!(env.get("/api/v1/datasets", &token).await.1, json!([]), "nothing registered");
    upload(last_index.clone()).await;
    let (status, body) = env.post("/api/v1/datasets", &token, &maps_register).await;
    assert_eq!(status, StatusCode::CREATED, "{body}");
    assert_eq!(body["uri"], "store:maps@1");

    std::fs::write(folder.join(&wrong), &original).unwrap();
    // With every file right, the push goes through, as photos@1.
    let pushed = env.yard(&token, &["datasets", "push", "photos", folder.to_str().unwrap(), "-o", "json"]);
    assert!(pushed.status.success(), "{} {}", stdout(&pushed), stderr(&pushed));
    let dataset: Value = serde_json::from_slice(&pushed.stdout).unwrap();
    assert_eq!((dataset["version"].as_str(), dataset["uri"].as_str()), (Some("1"), Some("store:photos@1")));
    assert_eq!(dataset["samples"], 40);
    // Registered now: a manifest naming other sizes under its content hash is refused.
    let (status, body) = put_file(&env, &token, &hex, "dataset.json", wrong_size).await;
    assert_eq!(status, StatusCode::CONFLICT, "{body}");
    assert!(body["error"]["message"].as_str().unwrap().contains("cannot change"), "{body}");
    // The version is immutable: the same content again is harmless, other content a conflict.
    let (status, _) = env.post("/api/v1/datasets", &token, &register).await;
    assert_eq!(status, StatusCode::OK);
    let other = push_tiny(&env, &token, "other", "1").await;
    let (status, body) = env
        .post(
            "/api/v1/datasets",
            &token,
            &json!({"name": "photos", "version": "1", "from_store": format!("sha256:{other}")}),
        )
        .await;
    assert_eq!(status, StatusCode::CONFLICT, "{body}");
    // A folder dataset cannot be named as a store one.
    let (status, body) = env
        .post(
            "/api/v1/datasets",
            &token,
            &json!({"name": "folder", "version": "1", "uri": "/data/x",
            "content_hash": manifest["content_hash"]}),
        )
        .await;
    assert_eq!(status, StatusCode::CREATED, "{body}");
    let (status, body) = env
        .post("/api/v1/templates/pytorch-ddp/jobs?dry_run=true", &token, &json!({"params": {"data": "store:folder@1"}}))
        .await;
    assert_eq!(status, StatusCode::UNPROCESSABLE_ENTITY, "{body}");
    assert!(body["error"]["message"].as_str().unwrap().contains("not on Trainyard's object store"), "{body}");
}

/// Images packed here by `yard-data pack` (no job), distinct content per `seed`.
fn images_packed_here(dir: &Path, name: &str, seed: u32) -> PathBuf {
    let source = dir.join(format!("{name}-src"));
    crate::training::write_images(&source, seed, 300);
    pack_here(&source, &dir.join(name), "32Ki")
}

/// Every cached shard file under the machine's shard cache: (sha256, size).
fn cached_shards(env: &TestEnv) -> Vec<(String, u64)> {
    walkdir(&env.data_dir().join("shard-cache"))
        .into_iter()
        .filter_map(|path| {
            let name = path.file_name()?.to_str()?.to_string();
            (name.len() == 64 && name.bytes().all(|b| b.is_ascii_hexdigit()))
                .then(|| (name, std::fs::metadata(&path).unwrap().len()))
        })
        .collect()
}

/// The machine's shard cache under three jobs at once on three datasets, its budget set to hold
/// those three and half of a fourth read before: the fourth's shards are evicted (no job reads
/// them), none of the three's (each job fetches each of its shards once and succeeds), and the
/// cache ends within its budget. Tenant B's job finds nothing of tenant A's in the cache it can
/// read: not A's folder's listing, not a shard by its path. B's own data takes the machine's
/// cache over its budget (B's engine sees only B's part), and the server sweeps it back.
#[tokio::test(flavor = "multi_thread")]
async fn the_machine_cache_keeps_its_budget_under_three_jobs_and_evicts_no_shard_in_use() {
    // The budget depends on the datasets' sizes, known only once they are packed: pack first,
    // then start the server with it.
    let scratch = tempfile::tempdir().unwrap();
    let folders: Vec<PathBuf> =
        (0..4).map(|i| images_packed_here(scratch.path(), &format!("set{i}"), 1000 + i as u32)).collect();
    let bytes: Vec<u64> = folders.iter().map(|f| manifest_of(f)["bytes"].as_u64().unwrap()).collect();
    let budget = bytes[1] + bytes[2] + bytes[3] + bytes[0] / 2;
    let budget_arg = budget.to_string();
    // A tenant's share above the whole budget: set, and bounding nothing here.
    let (env, _store) =
        start_with(&Backend::S3, &["--shard-cache-bytes", &budget_arg, "--shard-cache-tenant-bytes", "99000000"]).await;
    let token = env.admin_token.clone();
    for (i, folder) in folders.iter().enumerate() {
        let pushed = env.yard(&token, &["datasets", "push", &format!("set{i}@1"), folder.to_str().unwrap()]);
        assert!(pushed.status.success(), "{} {}", stdout(&pushed), stderr(&pushed));
    }
    let shards_of = |i: usize| -> Vec<String> {
        manifest_of(&folders[i])["shards"]
            .as_array()
            .unwrap()
            .iter()
            .map(|s| s["sha256"].as_str().unwrap().to_string())
            .collect()
    };

    // set0 is read first and stays cached, in nobody's use.
    let first = train(&env, "store:set0@1");
    assert_eq!(metric(&env, &first, "data/bytes_fetched").await, Some(bytes[0] as f64));
    let cached: Vec<String> = cached_shards(&env).into_iter().map(|(sha, _)| sha).collect();
    assert!(shards_of(0).iter().all(|sha| cached.contains(sha)), "set0 is cached: {cached:?}");

    // Three jobs at once on set1, set2, set3.
    let jobs: Vec<Value> = std::thread::scope(|scope| {
        let runs: Vec<_> = (1..4)
            .map(|i| {
                scope.spawn({
                    let env = &env;
                    move || train(env, &format!("store:set{i}@1"))
                })
            })
            .collect();
        runs.into_iter().map(|run| run.join().unwrap()).collect()
    });
    for (i, job) in (1..4).zip(&jobs) {
        // Each shard fetched once: none was evicted under the job and fetched again.
        assert_eq!(metric(&env, job, "data/bytes_fetched").await, Some(bytes[i] as f64), "set{i}");
        assert_eq!(metric(&env, job, "data/cache_refetched").await, Some(0.0), "set{i}");
    }
    let cached = cached_shards(&env);
    let total: u64 = cached.iter().map(|(_, size)| size).sum();
    assert!(total <= budget, "the cache holds {total} bytes, over its budget of {budget}");
    let held: Vec<&str> = cached.iter().map(|(sha, _)| sha.as_str()).collect();
    for i in 1..4 {
        assert!(shards_of(i).iter().all(|sha| held.contains(&sha.as_str())), "set{i} was evicted: {held:?}");
    }
    let set0_left = shards_of(0).iter().filter(|sha| held.contains(&sha.as_str())).count();
    assert!(set0_left < shards_of(0).len(), "set0 (in no job's use) made room");

    // Tenant B's job, on the same machine, tries tenant A's part of the cache.
    let tenant_a = tenant_of_job(&env, first["id"].as_str().unwrap()).await;
    let (status, _) = env.post("/api/v1/admin/tenants", &token, &json!({"name": "team-b"})).await;
    assert_eq!(status, StatusCode::CREATED);
    let bob = env.member("team-b", "bob", "admin").await;
    let sha = &shards_of(1)[0];
    let script = format!(
        "echo \"SETTINGS $TRAINYARD_CACHE_BUDGET_BYTES $TRAINYARD_CACHE_TENANT_BUDGET_BYTES $TRAINYARD_CACHE_PRIVATE\"; \
         ls \"$TRAINYARD_CACHE_DIR\"; ls \"$TRAINYARD_CACHE_DIR/{tenant_a}\" && echo LISTED; \
         cat \"$TRAINYARD_CACHE_DIR/{tenant_a}/{}/{sha}\" > /dev/null && echo READ; true",
        &sha[..2]
    );
    let (status, body) = env.post("/api/v1/jobs", &bob, &json!({"command": ["sh", "-c", script]})).await;
    assert_eq!(status, StatusCode::CREATED, "{body}");
    let id = body["id"].as_str().unwrap().to_string();
    env.wait_job_as(&bob, &id, Duration::from_secs(30), |j| j["state"] == "succeeded").await;
    let log = std::fs::read_to_string(env.data_dir().join(format!("jobs/{id}/attempt-1/replica-0.log"))).unwrap();
    assert!(!log.contains("LISTED") && !log.contains("READ"), "tenant B reached tenant A's cache: {log}");
    assert!(log.contains("Permission denied"), "{log}");
    // What the machine's settings gave the replica: the budgets, and that its namespace is its own.
    assert!(log.contains(&format!("SETTINGS {budget} 99000000 1")), "{log}");

    // Tenant B trains on its own copy of set0. Its engine sees only B's namespace, which is
    // within the budget, so it evicts nothing, and the machine's cache goes over it; the server,
    // which reads every namespace, evicts the least recently used (tenant A's) once B's job ends.
    let pushed = env.yard(&bob, &["datasets", "push", "set0@1", folders[0].to_str().unwrap()]);
    assert!(pushed.status.success(), "{} {}", stdout(&pushed), stderr(&pushed));
    let b_job = train_as(&env, &bob, "store:set0@1");
    let deadline = std::time::Instant::now() + Duration::from_secs(15);
    loop {
        let total: u64 = cached_shards(&env).iter().map(|(_, size)| size).sum();
        if total <= budget {
            break;
        }
        assert!(std::time::Instant::now() < deadline, "the machine's cache stayed at {total} bytes, over {budget}");
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    let tenant_b = tenant_of_job(&env, b_job["id"].as_str().unwrap()).await;
    assert_ne!(tenant_b, tenant_a);
    let held: Vec<String> = walkdir(&env.data_dir().join("shard-cache").join(&tenant_b))
        .iter()
        .filter_map(|p| Some(p.file_name()?.to_str()?.to_string()))
        .collect();
    assert!(shards_of(0).iter().all(|sha| held.contains(sha)), "B's shards, the newest, stay: {held:?}");
}

/// Pushes one shard of `size` bytes made from `seed` without registering a version; the
/// content hash's hex.
async fn push_unregistered(env: &TestEnv, token: &str, seed: u8, size: usize) -> String {
    push_shard(env, token, (0..size).map(|i| (i as u8).wrapping_mul(31).wrapping_add(seed)).collect()).await
}

fn register(hex: &str, name: &str) -> Value {
    json!({"name": name, "version": "1", "from_store": format!("sha256:{hex}")})
}

#[tokio::test(flavor = "multi_thread")]
async fn pushed_datasets_count_against_the_storage_quota_and_what_is_abandoned_or_removed_leaves_the_store() {
    let (env, store) = start(&Backend::S3).await;
    let admin = env.admin_token.clone();
    let mib = 1usize << 20;
    let quota = |bytes: usize| json!({"storage_quota_bytes": bytes});
    let set_quota = |bytes: usize| {
        let env = &env;
        let admin = admin.clone();
        async move {
            let path = "/api/v1/admin/tenants/default/storage";
            let (status, body) = env.call(reqwest::Method::PUT, path, Some(&admin), Some(&quota(bytes))).await;
            assert!(status.is_success(), "{body}");
        }
    };
    set_quota(3 * mib).await;

    // A registered push of 2 MiB counts; a second of 2 MiB, or a 2 MiB volume, would pass 3 MiB.
    let kept = push_unregistered(&env, &admin, 1, 2 * mib).await;
    let (status, body) = env.post("/api/v1/datasets", &admin, &register(&kept, "kept")).await;
    assert_eq!(status, StatusCode::CREATED, "{body}");
    let (_, report) = env.get("/api/v1/storage", &admin).await;
    assert_eq!(report["dataset_bytes"], 2 * mib, "{report}");
    let over = {
        let shard = vec![9u8; 2 * mib];
        let sha = sha256_hex(&shard);
        let hash = content_hash(&[("data-000000.tar", 1, &sha)]);
        json!({"format": "trainyard-shards-v1", "prefix": "data", "samples": 1, "bytes": 2 * mib,
            "shards": [{"name": "data-000000.tar", "index": "data-000000.idx.json", "samples": 1, "bytes": 2 * mib, "sha256": sha}],
            "content_hash": hash, "created_by": "a test"})
    };
    let over_hex = over["content_hash"].as_str().unwrap().trim_start_matches("sha256:").to_string();
    let (status, body) = put_file(&env, &admin, &over_hex, "dataset.json", serde_json::to_vec(&over).unwrap()).await;
    assert_eq!(status, StatusCode::UNPROCESSABLE_ENTITY, "{body}");
    assert_eq!(body["error"]["field"], "file", "{body}");
    assert!(body["error"]["message"].as_str().unwrap().contains("storage quota"), "{body}");
    let (status, body) = env.post("/api/v1/volumes", &admin, &json!({"name": "big", "size": "2Mi"})).await;
    assert_eq!(status, StatusCode::UNPROCESSABLE_ENTITY, "{body}");
    assert!(body["error"]["message"].as_str().unwrap().contains("pushed datasets"), "{body}");
    let shown = env.yard(&admin, &["storage", "show"]);
    assert!(stdout(&shown).contains("pushed datasets: 2 MiB; 2 MiB of 3 MiB"), "{}", stdout(&shown));

    // A push never registered is removed a day after its last upload, objects and all; the
    // registered one, as old, stays; registering the removed one now asks for a new push.
    set_quota(100 * mib).await;
    let abandoned = push_unregistered(&env, &admin, 2, mib).await;
    let keys_of = |hex: &str| {
        let marker = format!("/datasets/content/{hex}/");
        store.keys().into_iter().filter(|k| k.contains(&marker)).count()
    };
    assert_eq!((keys_of(&kept), keys_of(&abandoned)), (3, 3));
    sqlx::query("UPDATE dataset_pushes SET pushed_at = now() - interval '25 hours'")
        .execute(&env.db.pool)
        .await
        .unwrap();
    let deadline = std::time::Instant::now() + Duration::from_secs(30);
    while keys_of(&abandoned) > 0 {
        assert!(std::time::Instant::now() < deadline, "the abandoned push is still in the store");
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    assert_eq!(keys_of(&kept), 3, "a registered push stays");
    let (_, report) = env.get("/api/v1/storage", &admin).await;
    assert_eq!(report["dataset_bytes"], 2 * mib, "the removed push no longer counts: {report}");
    let (status, body) = env.post("/api/v1/datasets", &admin, &register(&abandoned, "late")).await;
    assert_eq!(status, StatusCode::UNPROCESSABLE_ENTITY, "{body}");
    assert_eq!(body["error"]["field"], "from_store", "{body}");
    assert!(body["error"]["message"].as_str().unwrap().contains(&abandoned), "{body}");
    // A push removed while its files are still there (the sweep deletes the row first): the
    // registration is refused by the database, whatever the store still holds.
    let racing = push_unregistered(&env, &admin, 3, mib).await;
    sqlx::query("DELETE FROM dataset_pushes WHERE store_prefix LIKE '%' || $1")
        .bind(&racing)
        .execute(&env.db.pool)
        .await
        .unwrap();
    let (status, body) = env.post("/api/v1/datasets", &admin, &register(&racing, "racing")).await;
    assert_eq!(status, StatusCode::UNPROCESSABLE_ENTITY, "{body}");
    assert!(body["error"]["message"].as_str().unwrap().contains("push it again"), "{body}");
    // Pushed again, it registers.
    push_unregistered(&env, &admin, 2, mib).await;
    let (status, body) = env.post("/api/v1/datasets", &admin, &register(&abandoned, "late")).await;
    assert_eq!(status, StatusCode::CREATED, "{body}");

    // A removed tenant's objects leave the store: its datasets, code and artefacts.
    let (status, body) = env.post("/api/v1/admin/tenants", &admin, &json!({"name": "team-gone"})).await;
    assert_eq!(status, StatusCode::CREATED, "{body}");
    let gone = env.member("team-gone", "gil", "admin").await;
    push_tiny(&env, &gone, "theirs", "1").await;
    let (status, job) = env.post("/api/v1/jobs", &gone, &json!({"command": ["true"]})).await;
    assert_eq!(status, StatusCode::CREATED, "{job}");
    let job = job["id"].as_str().unwrap().to_string();
    env.wait_job_as(&gone, &job, Duration::from_secs(30), |j| j["state"] == "succeeded").await;
    let gone_tenant = crate::storage::tenant_of_job(&env, &job).await;
    let theirs = |store: &crate::storage::StoreUnderTest| {
        store.keys().into_iter().filter(|k| k.starts_with(&format!("tenants/{gone_tenant}/"))).count()
    };
    assert!(theirs(&store) >= 3, "{:?}", store.keys());
    let (status, body) = env.call(reqwest::Method::DELETE, "/api/v1/admin/tenants/team-gone", Some(&admin), None).await;
    assert!(status.is_success(), "{body}");
    let deadline = std::time::Instant::now() + Duration::from_secs(30);
    while theirs(&store) > 0 {
        assert!(std::time::Instant::now() < deadline, "the removed tenant's objects are still in the store");
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    assert_eq!(keys_of(&kept), 3, "another tenant's objects stay");
}

#[tokio::test(flavor = "multi_thread")]
async fn an_index_upload_racing_a_registration_lands_before_it_or_is_refused() {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let (env, store) = start(&Backend::S3).await;
    let admin = env.admin_token.clone();
    let hex = push_unregistered(&env, &admin, 4, 1000).await;
    let prefix: String =
        sqlx::query_scalar("SELECT store_prefix FROM dataset_pushes WHERE store_prefix LIKE '%' || $1")
            .bind(&hex)
            .fetch_one(&env.db.pool)
            .await
            .unwrap();
    let index_key = format!("{prefix}/data-000000.idx.json");
    assert_eq!(store.read(&index_key), b"{}");

    // An index upload under way: past its checks (no version yet), its body still coming.
    let body = b"{\"changed\": true}";
    let address = env.server.url.trim_start_matches("http://").to_string();
    let mut stream = tokio::net::TcpStream::connect(&address).await.unwrap();
    let head = format!(
        "PUT /api/v1/dataset-content/{hex}/data-000000.idx.json HTTP/1.1\r\nHost: {address}\r\n\
         Authorization: Bearer {admin}\r\nContent-Type: application/octet-stream\r\nContent-Length: {}\r\n\
         Connection: close\r\n\r\n",
        body.len()
    );
    stream.write_all(head.as_bytes()).await.unwrap();
    stream.write_all(&body[..5]).await.unwrap();
    tokio::time::sleep(Duration::from_millis(700)).await;

    // Meanwhile a registration: it holds the push's row, as POST /api/v1/datasets does, and
    // records the version.
    #[allow(clippy::disallowed_methods)] // awaited to its end: nothing cancels this begin
    let mut registration = env.db.pool.begin().await.unwrap();
    sqlx::query("SELECT 1 FROM dataset_pushes WHERE store_prefix = $1 FOR UPDATE")
        .bind(&prefix)
        .execute(&mut *registration)
        .await
        .unwrap();
    sqlx::query(
        "INSERT INTO datasets (tenant_id, name, version, uri, format, content_hash, created_by, store_prefix)
         SELECT p.tenant_id, 'raced', '1', 'store:raced@1', 'trainyard-shards-v1', $2,
                (SELECT id FROM users ORDER BY created_at LIMIT 1), p.store_prefix
         FROM dataset_pushes p WHERE p.store_prefix = $1",
    )
    .bind(&prefix)
    .bind(format!("sha256:{hex}"))
    .execute(&mut *registration)
    .await
    .unwrap();

    // The rest of the body: the upload waits for the registration to end...
    stream.write_all(&body[5..]).await.unwrap();
    let answer = tokio::spawn(async move {
        let mut response = Vec::new();
        stream.read_to_end(&mut response).await.unwrap();
        String::from_utf8_lossy(&response).into_owned()
    });
    tokio::time::sleep(Duration::from_secs(1)).await;
    assert!(!answer.is_finished(), "the index is not put in place while a registration is under way");
    assert_eq!(store.read(&index_key), b"{}");
    registration.commit().await.unwrap();
    // ... and is refused: the version reads the index it was registered with.
    let answer = answer.await.unwrap();
    assert!(answer.starts_with("HTTP/1.1 409"), "{answer}");
    assert_eq!(store.read(&index_key), b"{}");
    assert!(store.keys().iter().all(|k| !k.contains("/datasets/incoming/")), "{:?}", store.keys());
}
