//! The node cache agent (`trainyard cache-agent`, issue 23) end to end: the real binary beside a
//! server on the Kubernetes executor (the in-memory API server; the agent is what a node's
//! DaemonSet pod runs) and a real S3 server. A job's pods are told to read datasets through it;
//! with the job's token it serves a pushed version's files, fetching each shard from the server
//! once and then from the node's copy (the server counts what it sent), drops a copy damaged on
//! disk and fetches it again, and serves nothing the server would not: another tenant's job, a
//! member of another tenant and a request without a token get what the server gives them, even
//! for a file the node holds.

use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use serde_json::{Value, json};
use trainyard_tests::{FakeApiServer, StatusCode, TestEnv, bin};

use crate::storage::{Backend, start_with_env, tenant_of_job};
use crate::store_datasets::push_tiny;

/// The agent's process, ended when dropped.
struct Agent {
    child: Child,
    url: String,
    dir: PathBuf,
}

impl Agent {
    fn start(dir: &Path, listen: &str, server: &str, extra: &[&str]) -> Agent {
        let mut child = Command::new(bin("trainyard"))
            .args(["cache-agent", "--dir", dir.to_str().unwrap(), "--listen", listen, "--server", server])
            .args(["--budget-bytes", &(1u64 << 30).to_string()])
            .args(extra)
            .stdout(Stdio::piped())
            .spawn()
            .expect("start the cache agent");
        let mut line = String::new();
        BufReader::new(child.stdout.take().unwrap()).read_line(&mut line).expect("its first line");
        let url = line.trim().strip_prefix("trainyard: cache agent listening on ").expect("its address").to_string();
        Agent { child, url, dir: dir.to_path_buf() }
    }

    async fn get(&self, token: Option<&str>, dataset: &str, file: &str) -> reqwest::Response {
        let (name, version) = dataset.split_once('@').unwrap();
        let mut request =
            reqwest::Client::new().get(format!("{}/api/v1/datasets/{name}/{version}/files/{file}", self.url));
        if let Some(token) = token {
            request = request.bearer_auth(token);
        }
        request.send().await.unwrap()
    }

    /// The status, the cache header and the whole body (an error when it broke off).
    async fn read(
        &self,
        token: Option<&str>,
        dataset: &str,
        file: &str,
    ) -> (StatusCode, String, Result<Vec<u8>, String>) {
        let response = self.get(token, dataset, file).await;
        let status = response.status();
        let cache = response.headers().get("x-trainyard-cache").map(|v| v.to_str().unwrap().to_string());
        let body = response.bytes().await.map(|b| b.to_vec()).map_err(|err| format!("{err:?}"));
        (status, cache.unwrap_or_default(), body)
    }

    /// The whole body of a 200, or why there is none: the request or its body broke off (a
    /// body that breaks off before its first byte may take the response's head with it).
    async fn read_whole(&self, token: &str, dataset: &str, file: &str) -> Result<Vec<u8>, String> {
        let (name, version) = dataset.split_once('@').unwrap();
        let url = format!("{}/api/v1/datasets/{name}/{version}/files/{file}", self.url);
        let response = reqwest::Client::new().get(url).bearer_auth(token).send().await.map_err(|e| format!("{e:?}"))?;
        if response.status() != StatusCode::OK {
            return Err(format!("HTTP {}", response.status()));
        }
        response.bytes().await.map(|b| b.to_vec()).map_err(|e| format!("{e:?}"))
    }

    async fn metric(&self, name: &str) -> f64 {
        let text = reqwest::get(format!("{}/metrics", self.url)).await.unwrap().text().await.unwrap();
        text.lines().find_map(|line| line.strip_prefix(name)?.trim().parse().ok()).unwrap_or(0.0)
    }
}

impl Drop for Agent {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// A server on the Kubernetes executor (the in-memory API server, one node) with a real S3
/// store, whose pods are told to read through a node agent at `agent_url`; the agent starts
/// later ([`Cluster::agent`]), since it needs the server's address.
struct Cluster {
    scratch: tempfile::TempDir,
    fake: FakeApiServer,
    env: TestEnv,
    store: crate::storage::StoreUnderTest,
    agent_listen: String,
    agent_url: String,
}

impl Cluster {
    async fn start() -> Cluster {
        let scratch = tempfile::tempdir().unwrap();
        let fake = FakeApiServer::start(scratch.path(), &["1"]);
        let agent_listen = format!("127.0.0.1:{}", free_port());
        let agent_url = format!("http://{agent_listen}");
        let (env, store) = start_with_env(
            &Backend::S3,
            &["--executor", "kubernetes", "--kube-image", "registry.example/runtime:1"],
            &[
                ("KUBECONFIG".to_string(), fake.kubeconfig.display().to_string()),
                ("TRAINYARD_KUBE_CACHE_AGENT_URL".to_string(), agent_url.clone()),
            ],
        )
        .await;
        Cluster { scratch, fake, env, store, agent_listen, agent_url }
    }

    /// The node's agent (a 1 GiB cache and `extra` arguments), its cache in `node-cache` of the
    /// scratch folder.
    fn agent(&self, extra: &[&str]) -> Agent {
        Agent::start(&self.scratch.path().join("node-cache"), &self.agent_listen, &self.env.server.url, extra)
    }
}

/// A port free now (the agent's address must be known before the server starts).
fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port()
}

/// What the server counted as sent of the shards of the tenant named `tenant`.
async fn shard_bytes_served(env: &TestEnv, tenant: &str) -> u64 {
    let text = env.metrics_text().await;
    let series = format!("trainyard_dataset_bytes_served_total{{tenant=\"{tenant}\",kind=\"shard\"}} ");
    text.lines().find_map(|line| line.strip_prefix(&series)?.trim().parse().ok()).unwrap_or(0)
}

/// A CPU pytorch-ddp job of the caller's tenant reading `data` (on the in-memory API server its
/// pod just runs, so its token stays live); its id.
async fn reader(env: &TestEnv, token: &str, data: &str) -> String {
    let body = json!({"params": {"data": data, "gpus": 0, "cpu": 1, "memory": "1Gi", "checkpoint_volume": ""}});
    let (status, job) = env.post("/api/v1/templates/pytorch-ddp/jobs", token, &body).await;
    assert_eq!(status, StatusCode::CREATED, "{job}");
    let id = job["id"].as_str().unwrap().to_string();
    env.wait_job_as(token, &id, Duration::from_secs(30), |j| j["state"] == "running").await;
    id
}

/// The environment and token Trainyard gave the job's pod (its Job and Secret), as the engine
/// reads them.
async fn pod_env_and_token(fake: &FakeApiServer, job: &str) -> (Vec<Value>, String) {
    use base64::Engine;
    let of_job = |kind: &'static str| async move {
        let all: Value = reqwest::get(format!("{}/{kind}", fake.url)).await.unwrap().json().await.unwrap();
        let found =
            all["items"].as_array().unwrap().iter().find(|o| o["metadata"]["labels"]["trainyard.dev/job"] == job);
        found.unwrap_or_else(|| panic!("no {kind} of job {job}: {all}")).clone()
    };
    let batch_job = of_job("apis/batch/v1/jobs").await;
    let env = batch_job["spec"]["template"]["spec"]["containers"][0]["env"].as_array().unwrap().clone();
    let secret = of_job("api/v1/secrets").await;
    let token = secret["data"]["TRAINYARD_TOKEN"].as_str().unwrap();
    let token = String::from_utf8(base64::engine::general_purpose::STANDARD.decode(token).unwrap()).unwrap();
    (env, token)
}

#[tokio::test(flavor = "multi_thread")]
async fn the_node_agent_fetches_each_shard_once_drops_a_damaged_copy_and_serves_only_what_the_server_allows() {
    let cluster = Cluster::start().await;
    let (env, fake, agent_url) = (&cluster.env, &cluster.fake, &cluster.agent_url);
    let admin = env.admin_token.clone();
    push_tiny(env, &admin, "tiny", "1").await;
    let agent = cluster.agent(&[]);

    // The job's pod is told to read through the agent, with its own token.
    let job = reader(env, &admin, "store:tiny@1").await;
    let (pod_env, token) = pod_env_and_token(fake, &job).await;
    assert!(
        pod_env.iter().any(|v| v["name"] == "TRAINYARD_DATASET_URL" && v["value"] == agent_url.as_str()),
        "{pod_env:?}"
    );
    let tenant = tenant_of_job(env, &job).await;
    let (_, direct) = env.get("/api/v1/datasets/tiny/1", &admin).await;
    assert!(direct["store_prefix"].is_string(), "{direct}");
    let shard = "data-000000.tar";
    let expected = b"the one shard of tiny@1".to_vec();

    // The first read fetches the shard from the server, the second finds it on the node.
    let before = shard_bytes_served(env, "default").await;
    let (status, cache, body) = agent.read(Some(&token), "tiny@1", shard).await;
    assert_eq!((status, cache.as_str(), body.as_deref()), (StatusCode::OK, "miss", Ok(&expected[..])));
    let after_first = shard_bytes_served(env, "default").await;
    assert_eq!(after_first - before, expected.len() as u64, "fetched from the server once");
    for _ in 0..2 {
        let (status, cache, body) = agent.read(Some(&token), "tiny@1", shard).await;
        assert_eq!((status, cache.as_str(), body.as_deref()), (StatusCode::OK, "hit", Ok(&expected[..])));
    }
    assert_eq!(shard_bytes_served(env, "default").await, after_first, "the node's copy: nothing from the server");
    let (status, cache, index) = agent.read(Some(&token), "tiny@1", "data-000000.idx.json").await;
    assert_eq!((status, cache.as_str(), index.as_deref()), (StatusCode::OK, "miss", Ok(&b"{}"[..])));
    assert_eq!(agent.read(Some(&token), "tiny@1", "data-000000.idx.json").await.1, "hit");
    let (status, _, manifest) = agent.read(Some(&token), "tiny@1", "dataset.json").await;
    assert_eq!(status, StatusCode::OK);
    assert!(String::from_utf8(manifest.unwrap()).unwrap().contains("trainyard-shards-v1"));

    // Copies live in the tenant's folder, by content, where the sweep looks.
    let sha: String = {
        use sha2::Digest;
        sha2::Sha256::digest(&expected).iter().map(|b| format!("{b:02x}")).collect()
    };
    let copy = agent.dir.join(&tenant).join(&sha[..2]).join(&sha);
    assert_eq!(std::fs::read(&copy).unwrap(), expected);

    // A copy damaged on disk (same size): that response breaks off, the copy is dropped, the
    // next read fetches it again and is whole.
    let mut damaged = expected.clone();
    damaged[3] ^= 0xFF;
    std::fs::write(&copy, &damaged).unwrap();
    let body = agent.read_whole(&token, "tiny@1", shard).await;
    assert!(body.is_err(), "a damaged copy must not arrive whole: {body:?}");
    assert_eq!(agent.metric("trainyard_cache_agent_damaged_total").await, 1.0);
    let (status, cache, body) = agent.read(Some(&token), "tiny@1", shard).await;
    assert_eq!((status, cache.as_str(), body.as_deref()), (StatusCode::OK, "miss", Ok(&expected[..])));
    let after_damage = shard_bytes_served(env, "default").await;
    assert_eq!(after_damage - after_first, expected.len() as u64, "fetched again, once");

    // A shard damaged in the object store (same size) never arrives whole from the agent, and
    // is not kept; once the store holds it whole again it is fetched and kept.
    let broken_hex = push_tiny(env, &admin, "broken", "1").await;
    let broken_job = reader(env, &admin, "store:broken@1").await;
    let (_, broken_token) = pod_env_and_token(fake, &broken_job).await;
    let key = format!("tenants/{tenant}/datasets/content/{broken_hex}/{shard}");
    let whole = cluster.store.read(&key);
    let mut damaged_in_store = whole.clone();
    damaged_in_store[0] ^= 0xFF;
    cluster.store.overwrite(&key, &damaged_in_store);
    let body = agent.read_whole(&broken_token, "broken@1", shard).await;
    assert!(body.is_err(), "a shard the store damaged must not arrive whole: {body:?}");
    let broken_sha: String = {
        use sha2::Digest;
        sha2::Sha256::digest(&whole).iter().map(|b| format!("{b:02x}")).collect()
    };
    assert!(!agent.dir.join(&tenant).join(&broken_sha[..2]).join(&broken_sha).exists(), "not kept");
    cluster.store.overwrite(&key, &whole);
    let (status, cache, body) = agent.read(Some(&broken_token), "broken@1", shard).await;
    assert_eq!((status, cache.as_str(), body.as_deref()), (StatusCode::OK, "miss", Ok(&whole[..])));
    let after_broken = shard_bytes_served(env, "default").await;

    // Nothing the server would refuse, though the node holds it: another tenant's job and
    // member, a job of this tenant that does not read it, no token.
    let (status, body) = env.post("/api/v1/admin/tenants", &admin, &json!({"name": "team-b"})).await;
    assert_eq!(status, StatusCode::CREATED, "{body}");
    let bob = env.member("team-b", "bob", "admin").await;
    push_tiny(env, &bob, "tiny", "1").await; // the same name and content, in tenant B
    let bobs_job = reader(env, &bob, "store:tiny@1").await;
    let (_, bobs_token) = pod_env_and_token(fake, &bobs_job).await;
    let (plain_status, plain) = env.post("/api/v1/jobs", &admin, &json!({"command": ["sleep", "300"]})).await;
    assert_eq!(plain_status, StatusCode::CREATED, "{plain}");
    let plain_job = plain["id"].as_str().unwrap().to_string();
    env.wait_job(&plain_job, Duration::from_secs(30), |j| j["state"] == "running").await;
    let (_, idle_token) = pod_env_and_token(fake, &plain_job).await;
    let viewer_b = env.member("team-b", "vic", "viewer").await;
    for (who, caller, expected_status) in [
        ("a job of this tenant not reading it", Some(idle_token.as_str()), StatusCode::NOT_FOUND),
        ("no token", None, StatusCode::UNAUTHORIZED),
        ("a made-up token", Some("tyj_not-a-token"), StatusCode::UNAUTHORIZED),
    ] {
        let (status, _, body) = agent.read(caller, "tiny@1", shard).await;
        assert_eq!(status, expected_status, "{who}: {body:?}");
    }
    // Tenant B's job reads tenant B's tiny@1 (same content): its own copy, fetched from the
    // server for B, never A's.
    let bobs_tenant = tenant_of_job(env, &bobs_job).await;
    let (status, cache, body) = agent.read(Some(&bobs_token), "tiny@1", shard).await;
    assert_eq!((status, cache.as_str(), body.as_deref()), (StatusCode::OK, "miss", Ok(&expected[..])));
    assert_eq!(shard_bytes_served(env, "team-b").await, expected.len() as u64, "B's bytes, from the server");
    assert!(agent.dir.join(&bobs_tenant).join(&sha[..2]).join(&sha).is_file());
    // A member of B with an API token asking for a version of A that B does not have: 404.
    let (status, _, _) = agent.read(Some(&viewer_b), "tiny@9", shard).await;
    assert_eq!(status, StatusCode::NOT_FOUND);
    assert_eq!(shard_bytes_served(env, "default").await, after_broken, "A's files: nothing more sent");
}

/// The engine's own reader (`engine/remote.py`, a replica's `--data store:...` view) in a
/// process of its own with `env`; what it printed.
fn engine_view(env: &[(&str, String)], dataset: &str) -> String {
    let python = std::env::var("TRAINYARD_TEST_PYTHON")
        .expect("TRAINYARD_TEST_PYTHON: a Python with the engine's packages (tests/run sets it)");
    let engine = Path::new(env!("CARGO_MANIFEST_DIR")).join("../templates/pytorch-ddp/engine");
    let (name, version) = dataset.split_once('@').unwrap();
    let script = format!(
        "import sys, os; sys.path.insert(0, {engine:?}); import remote\n\
         view = remote.dataset_view(remote.DatasetRef({name:?}, {version:?}))\n\
         print('files', len(os.listdir(view.folder)))\n\
         view.close()\n",
        engine = engine.display().to_string()
    );
    let output = Command::new(python)
        .arg("-c")
        .arg(script)
        .env_clear()
        .env("PATH", std::env::var("PATH").unwrap_or_default())
        .env("TMPDIR", std::env::temp_dir())
        .envs(env.iter().map(|(k, v)| (*k, v.as_str())))
        .output()
        .expect("run the engine's reader");
    let text = format!("{}{}", String::from_utf8_lossy(&output.stdout), String::from_utf8_lossy(&output.stderr));
    assert!(output.status.success(), "the engine's reader failed:\n{text}");
    text
}

#[tokio::test(flavor = "multi_thread")]
async fn the_engine_reads_through_its_nodes_agent_and_the_next_job_on_the_node_fetches_nothing() {
    let cluster = Cluster::start().await;
    let (env, fake) = (&cluster.env, &cluster.fake);
    let admin = env.admin_token.clone();
    let packed = crate::store_datasets::packed_here(env, "words");
    let pushed = env.yard(&admin, &["datasets", "push", "words", packed.to_str().unwrap()]);
    assert!(pushed.status.success(), "{}", trainyard_tests::stderr(&pushed));
    let manifest: Value = serde_json::from_slice(&std::fs::read(packed.join("dataset.json")).unwrap()).unwrap();
    let shards = manifest["shards"].as_array().unwrap();
    let shard_bytes: u64 = shards.iter().map(|s| s["bytes"].as_u64().unwrap()).sum();
    assert!(shards.len() >= 2, "{manifest}");
    let agent = cluster.agent(&[]);

    // Two jobs on the node, one after the other, each reading words@1 as a replica does: with
    // the environment its pod gets (the agent's URL, its node, its token).
    let mut served = Vec::new();
    for round in 0..2 {
        let job = reader(env, &admin, "store:words@1").await;
        let (pod_env, token) = pod_env_and_token(fake, &job).await;
        let given = |name: &str| {
            pod_env.iter().find(|v| v["name"] == name).and_then(|v| v["value"].as_str()).unwrap_or_default().to_string()
        };
        let (_, job_row) = env.get(&format!("/api/v1/jobs/{job}"), &admin).await;
        let node = job_row["nodes"][0].as_str().map(str::to_string).unwrap_or_else(|| "fake-node-0".into());
        let printed = engine_view(
            &[
                ("TRAINYARD_URL", env.server.url.clone()),
                ("TRAINYARD_TOKEN", token),
                ("TRAINYARD_JOB_ID", job.clone()),
                ("TRAINYARD_DATASET_URL", given("TRAINYARD_DATASET_URL")),
                ("TRAINYARD_NODE", node.clone()),
            ],
            "words@1",
        );
        assert!(!printed.contains("cache agent"), "read through the agent, never past it: {printed}");
        assert!(printed.contains(&format!("node {node} caches all of words@1")), "round {round}: {printed}");
        served.push(shard_bytes_served(env, "default").await);
    }
    assert_eq!(served[0], shard_bytes, "the first job's shards came from the server, through the agent");
    assert_eq!(served[1], served[0], "the second job's came from the node's agent: nothing more from the server");
    assert_eq!(
        agent.metric("trainyard_cache_agent_origin_bytes_total").await as u64,
        shard_bytes + manifest_indexes(&packed)
    );
    assert_eq!(
        agent.metric("trainyard_cache_agent_requests_total{outcome=\"hit\"}").await as usize,
        2 * shards.len(),
        "each shard and index a hit the second time"
    );
    let (_, dataset) = env.get("/api/v1/datasets/words/1", &admin).await;
    assert_eq!(dataset["cached_on"], json!(["fake-node-0"]), "{dataset}");
}

/// The bytes of a packed folder's indexes.
fn manifest_indexes(packed: &Path) -> u64 {
    let manifest: Value = serde_json::from_slice(&std::fs::read(packed.join("dataset.json")).unwrap()).unwrap();
    manifest["shards"]
        .as_array()
        .unwrap()
        .iter()
        .map(|s| std::fs::metadata(packed.join(s["index"].as_str().unwrap())).unwrap().len())
        .sum()
}

#[tokio::test(flavor = "multi_thread")]
async fn a_tenants_share_of_the_agents_cache_evicts_its_own_copies_and_no_one_elses() {
    let cluster = Cluster::start().await;
    let env = &cluster.env;
    let admin = env.admin_token.clone();
    let (status, body) = env.post("/api/v1/admin/tenants", &admin, &json!({"name": "team-b"})).await;
    assert_eq!(status, StatusCode::CREATED, "{body}");
    let bob = env.member("team-b", "bob", "admin").await;
    push_tiny(env, &bob, "theirs", "1").await;
    for version in ["1", "2", "3"] {
        push_tiny(env, &admin, "ours", version).await;
    }
    // Each version is a shard of 23 bytes and an index of 2: a share of 60 bytes holds two.
    let agent = cluster.agent(&["--tenant-budget-bytes", "60"]);
    let shard = "data-000000.tar";
    let (status, _, _) = agent.read(Some(&bob), "theirs@1", shard).await;
    assert_eq!(status, StatusCode::OK);
    for version in ["1", "2", "3"] {
        tokio::time::sleep(Duration::from_millis(50)).await; // distinct access times
        for file in [shard, "data-000000.idx.json"] {
            let (status, _, body) = agent.read(Some(&admin), &format!("ours@{version}"), file).await;
            assert_eq!(status, StatusCode::OK, "ours@{version} {file}: {body:?}");
        }
    }
    // The share holds: tenant A's oldest copies went, tenant B's (older than all) stayed.
    let tenant_id = |name: &'static str| async move {
        let id: uuid::Uuid = sqlx::query_scalar("SELECT id FROM tenants WHERE name = $1")
            .bind(name)
            .fetch_one(&env.db.pool)
            .await
            .unwrap();
        id.to_string()
    };
    let (ours, theirs) = (agent.dir.join(tenant_id("default").await), agent.dir.join(tenant_id("team-b").await));
    let bytes = |dir: &Path| walk(dir).iter().map(|p| p.metadata().map(|m| m.len()).unwrap_or(0)).sum::<u64>();
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    while bytes(&ours) > 60 {
        assert!(std::time::Instant::now() < deadline, "tenant A's share is not held: {} bytes", bytes(&ours));
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert_eq!(
        bytes(&theirs),
        "the one shard of theirs@1".len() as u64,
        "tenant B's copy, older than all of A's, stays"
    );
    // The latest version is still a hit; the first was evicted.
    assert_eq!(agent.read(Some(&admin), "ours@3", shard).await.1, "hit");
    assert_eq!(agent.read(Some(&admin), "ours@1", shard).await.1, "miss");
    assert_eq!(agent.read(Some(&bob), "theirs@1", shard).await.1, "hit", "the other tenant's copy stayed");
}

/// Every file under `dir`.
fn walk(dir: &Path) -> Vec<PathBuf> {
    crate::storage::walkdir(dir)
}
