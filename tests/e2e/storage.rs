//! Object storage, end to end, with the same tests against both backends: a local directory
//! (a temporary folder) and S3 (a real S3-compatible server, `s3s-fs`, started on loopback; it
//! checks SigV4 signatures and the expiry of pre-signed URLs). Logs archived when attempts end
//! and read back after the local files are gone, retention by age, signed download links,
//! multipart uploads, path traversal, tenancy, volumes under the storage quota.

use std::net::TcpListener;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use reqwest::Method;
use serde_json::{Value, json};
use sha2::{Digest, Sha256};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use trainyard_core::resources::human_memory;
use trainyard_tests::web::{WebClient, csrf_of};
use trainyard_tests::{StatusCode, TestEnv, stderr, stdout};

const BUCKET: &str = "trainyard";
const PREFIX: &str = "cluster-a";
const PART_SIZE: usize = 5 * 1024 * 1024;

/// Where the tests' objects go.
pub(crate) enum Backend {
    Local,
    S3,
}

/// A store for one test: the temporary folder the bytes end up in (the local store's root, or
/// the S3 server's), and the S3 server when there is one.
pub(crate) struct StoreUnderTest {
    root: tempfile::TempDir,
    s3: Option<S3Server>,
}

struct S3Server {
    child: Child,
    port: u16,
}

impl Drop for S3Server {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

const ACCESS_KEY: &str = "trainyard-test";
const SECRET_KEY: &str = "trainyard-test-secret-key";

/// The `s3s-fs` binary: `$TRAINYARD_TEST_S3S_FS`, else on PATH (tests/run installs it).
fn s3s_fs() -> PathBuf {
    if let Ok(path) = std::env::var("TRAINYARD_TEST_S3S_FS") {
        return PathBuf::from(path);
    }
    std::env::var_os("PATH")
        .and_then(|paths| std::env::split_paths(&paths).map(|d| d.join("s3s-fs")).find(|p| p.is_file()))
        .expect("s3s-fs is not installed: run the tests through tests/run, which installs it")
}

/// Starts `s3s-fs` serving `root` on `port`, and waits until it listens.
fn spawn_s3s_fs(root: &Path, port: u16) -> Child {
    let child = Command::new(s3s_fs())
        .args(["--host", "127.0.0.1", "--port", &port.to_string()])
        .args(["--access-key", ACCESS_KEY, "--secret-key", SECRET_KEY])
        .arg(root)
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .expect("start s3s-fs");
    let deadline = Instant::now() + Duration::from_secs(10);
    while std::net::TcpStream::connect(("127.0.0.1", port)).is_err() {
        assert!(Instant::now() < deadline, "s3s-fs did not listen on {port}");
        std::thread::sleep(Duration::from_millis(50));
    }
    child
}

fn free_port() -> u16 {
    TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port()
}

impl StoreUnderTest {
    fn start(backend: &Backend) -> StoreUnderTest {
        let root = tempfile::Builder::new().prefix("trainyard-objects-").tempdir().unwrap();
        let s3 = match backend {
            Backend::Local => None,
            Backend::S3 => {
                std::fs::create_dir_all(root.path().join(BUCKET)).unwrap();
                let port = free_port();
                Some(S3Server { child: spawn_s3s_fs(root.path(), port), port })
            }
        };
        StoreUnderTest { root, s3 }
    }

    /// Stops the S3 server (the store becomes unreachable).
    fn s3_stop(&mut self) {
        let s3 = self.s3.as_mut().expect("an S3 store");
        s3.child.kill().unwrap();
        s3.child.wait().unwrap();
    }

    /// Starts the S3 server again, on the same port over the same files.
    fn s3_restart(&mut self) {
        let s3 = self.s3.as_mut().expect("an S3 store");
        s3.child = spawn_s3s_fs(self.root.path(), s3.port);
    }

    /// `trainyard serve` arguments and environment for this store.
    fn server_config(&self) -> (Vec<String>, Vec<(String, String)>) {
        let mut args: Vec<String> =
            ["--object-store-part-size", "5Mi", "--retention-sweep-seconds", "1"].map(String::from).to_vec();
        let mut env = Vec::new();
        match &self.s3 {
            None => {
                args.push("--object-store".into());
                args.push(format!("file://{}/objects", self.root.path().display()));
            }
            Some(s3) => {
                args.push("--object-store".into());
                args.push(format!("s3://{BUCKET}/{PREFIX}"));
                args.push("--object-store-endpoint".into());
                args.push(format!("http://127.0.0.1:{}", s3.port));
                env.push(("AWS_ACCESS_KEY_ID".into(), ACCESS_KEY.into()));
                env.push(("AWS_SECRET_ACCESS_KEY".into(), SECRET_KEY.into()));
                env.push(("AWS_REGION".into(), "us-east-1".into()));
            }
        }
        (args, env)
    }

    /// Where keys start on disk.
    fn key_root(&self) -> PathBuf {
        match &self.s3 {
            None => self.root.path().join("objects"),
            Some(_) => self.root.path().join(BUCKET).join(PREFIX),
        }
    }

    /// Every stored key (files under the key root), sorted.
    pub(crate) fn keys(&self) -> Vec<String> {
        fn walk(dir: &Path, root: &Path, out: &mut Vec<String>) {
            for entry in std::fs::read_dir(dir).into_iter().flatten().flatten() {
                let path = entry.path();
                if path.is_dir() {
                    walk(&path, root, out);
                } else if let Ok(rel) = path.strip_prefix(root) {
                    out.push(rel.to_string_lossy().into_owned());
                }
            }
        }
        let mut keys = Vec::new();
        walk(&self.key_root(), &self.key_root(), &mut keys);
        // The S3 server keeps its own bookkeeping next to objects; only keys count.
        keys.retain(|k| k.starts_with("tenants/") && !k.contains(".s3s-fs"));
        keys.sort();
        keys
    }

    /// Replaces the bytes stored under a key behind the server's back (damage in the store).
    pub(crate) fn overwrite(&self, key: &str, bytes: &[u8]) {
        std::fs::write(self.key_root().join(key), bytes).unwrap_or_else(|err| panic!("{key}: {err}"))
    }

    /// The bytes stored under a key, as the store keeps them on disk.
    pub(crate) fn read(&self, key: &str) -> Vec<u8> {
        std::fs::read(self.key_root().join(key)).unwrap_or_else(|err| panic!("{key}: {err}"))
    }

    /// Every file the store holds anywhere under its root (to prove nothing landed outside).
    fn all_files(&self) -> Vec<String> {
        let mut files = Vec::new();
        for entry in walkdir(self.root.path()) {
            files.push(entry.strip_prefix(self.root.path()).unwrap().to_string_lossy().into_owned());
        }
        files
    }
}

pub(crate) fn walkdir(dir: &Path) -> Vec<PathBuf> {
    let mut out = Vec::new();
    for entry in std::fs::read_dir(dir).into_iter().flatten().flatten() {
        let path = entry.path();
        if path.is_dir() {
            out.extend(walkdir(&path));
        } else {
            out.push(path);
        }
    }
    out
}

/// A test server whose object store is `backend`'s.
pub(crate) async fn start(backend: &Backend) -> (TestEnv, StoreUnderTest) {
    start_with(backend, &[]).await
}

/// [`start`] with more `trainyard serve` arguments.
pub(crate) async fn start_with(backend: &Backend, extra: &[&str]) -> (TestEnv, StoreUnderTest) {
    start_with_env(backend, extra, &[]).await
}

/// [`start_with`] with more environment for the server.
pub(crate) async fn start_with_env(
    backend: &Backend,
    extra: &[&str],
    extra_env: &[(String, String)],
) -> (TestEnv, StoreUnderTest) {
    let store = StoreUnderTest::start(backend);
    let (args, mut env) = store.server_config();
    let mut args: Vec<&str> = args.iter().map(String::as_str).collect();
    args.extend_from_slice(extra);
    env.extend_from_slice(extra_env);
    (TestEnv::start_with_env(&args, &env).await, store)
}

pub(crate) async fn tenant_of_job(env: &TestEnv, job: &str) -> String {
    sqlx::query_scalar::<_, uuid::Uuid>("SELECT tenant_id FROM jobs WHERE id = $1::uuid")
        .bind(job)
        .fetch_one(&env.db.pool)
        .await
        .unwrap()
        .to_string()
}

/// Moves a finished job's end `days` into the past (retention counts from the end).
async fn age_job(env: &TestEnv, job: &str, days: f64) {
    sqlx::query("UPDATE jobs SET finished_at = now() - make_interval(secs => $2) WHERE id = $1::uuid")
        .bind(job)
        .bind(days * 86_400.0)
        .execute(&env.db.pool)
        .await
        .unwrap();
}

async fn text_of(env: &TestEnv, path: &str, token: &str) -> (StatusCode, String) {
    let response =
        reqwest::Client::new().get(format!("{}{path}", env.server.url)).bearer_auth(token).send().await.unwrap();
    (response.status(), response.text().await.unwrap())
}

async fn upload(env: &TestEnv, token: &str, job: &str, path: &str, body: Vec<u8>) -> (StatusCode, Value) {
    let response = reqwest::Client::new()
        .put(format!("{}/api/v1/jobs/{job}/artifacts/{path}", env.server.url))
        .bearer_auth(token)
        .body(body)
        .send()
        .await
        .unwrap();
    let status = response.status();
    (status, response.json().await.unwrap_or(Value::Null))
}

/// A request sent byte for byte, so that `..` and escapes reach the server as written (HTTP
/// clients normalise them away). Returns the status code and the body.
async fn raw_request(env: &TestEnv, method: &str, target: &str, token: &str, body: &[u8]) -> (u16, String) {
    let address = env.server.url.trim_start_matches("http://");
    let mut stream = tokio::net::TcpStream::connect(address).await.unwrap();
    let head = format!(
        "{method} {target} HTTP/1.1\r\nHost: {address}\r\nAuthorization: Bearer {token}\r\n\
         Content-Length: {}\r\nConnection: close\r\n\r\n",
        body.len()
    );
    stream.write_all(head.as_bytes()).await.unwrap();
    stream.write_all(body).await.unwrap();
    let mut response = Vec::new();
    stream.read_to_end(&mut response).await.unwrap();
    let text = String::from_utf8_lossy(&response).into_owned();
    let status = text.split_whitespace().nth(1).and_then(|s| s.parse().ok()).unwrap_or(0);
    (status, text)
}

async fn finished_job(env: &TestEnv, command: Value, replicas: u32) -> String {
    let id = env.submit(json!({"command": command, "replicas": replicas})).await;
    env.wait_state(&id, "succeeded", Duration::from_secs(30)).await;
    id
}

async fn wait_until<F: std::future::Future<Output = bool>>(
    what: &str,
    timeout: Duration,
    mut check: impl FnMut() -> F,
) {
    let deadline = Instant::now() + timeout;
    while !check().await {
        assert!(Instant::now() < deadline, "{what}: not within {timeout:?}");
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

async fn logs_outlive_the_local_files(backend: Backend) {
    let (env, store) = start(&backend).await;
    let id = finished_job(&env, json!(["sh", "-c", "echo rank $RANK says hello-archive"]), 2).await;
    let tenant = tenant_of_job(&env, &id).await;
    // Each replica's log is archived under the tenant's prefix, in the background, once the
    // attempt has ended.
    let expected =
        [format!("tenants/{tenant}/jobs/{id}/logs/1/0.log"), format!("tenants/{tenant}/jobs/{id}/logs/1/1.log")];
    wait_until("logs archived", Duration::from_secs(10), || async { store.keys() == expected }).await;
    // The executor's copies go (a pod deleted, a data directory wiped); the API reads the archive.
    std::fs::remove_dir_all(env.data_dir().join("jobs").join(&id).join("attempt-1")).unwrap();
    for rank in 0..2 {
        let (status, text) = text_of(&env, &format!("/api/v1/jobs/{id}/logs?replica={rank}"), &env.admin_token).await;
        assert_eq!(status, StatusCode::OK, "{text}");
        assert_eq!(text, format!("rank {rank} says hello-archive\n"));
    }
    let logs = env.yard(&env.admin_token, &["logs", &id, "--replica", "1"]);
    assert!(stdout(&logs).contains("rank 1 says hello-archive"), "{} {}", stdout(&logs), stderr(&logs));
}

/// With the object store away, a job still ends at once (archiving never holds up the control
/// loop), its logs are read from the executor's copy, and they are archived once the store is
/// back. S3 only: a local directory cannot go away.
#[tokio::test(flavor = "multi_thread")]
async fn archiving_waits_out_an_unreachable_store() {
    let (env, mut store) = start(&Backend::S3).await;
    store.s3_stop();
    let started = Instant::now();
    let id = finished_job(&env, json!(["echo", "said-while-the-store-was-away"]), 1).await;
    assert!(started.elapsed() < Duration::from_secs(15), "the job's end waited {:?}", started.elapsed());
    let (status, text) = text_of(&env, &format!("/api/v1/jobs/{id}/logs"), &env.admin_token).await;
    assert_eq!((status, text.as_str()), (StatusCode::OK, "said-while-the-store-was-away\n"));

    let tries = || async {
        sqlx::query_as::<_, (bool, i32)>(
            "SELECT logs_archived_at IS NOT NULL, logs_archive_failures FROM job_attempts WHERE job_id = $1::uuid",
        )
        .bind(&id)
        .fetch_one(&env.db.pool)
        .await
        .unwrap()
    };
    wait_until("a failed try recorded", Duration::from_secs(30), || async { tries().await.1 >= 1 }).await;
    assert!(store.keys().is_empty());
    assert!(!tries().await.0, "not archived while the store is away");

    store.s3_restart();
    let tenant = tenant_of_job(&env, &id).await;
    let key = format!("tenants/{tenant}/jobs/{id}/logs/1/0.log");
    wait_until("archived once the store is back", Duration::from_secs(60), || async { store.keys() == [key.clone()] })
        .await;
    wait_until("recorded as archived", Duration::from_secs(10), || async { tries().await.0 }).await;
    std::fs::remove_dir_all(env.data_dir().join("jobs").join(&id).join("attempt-1")).unwrap();
    let (status, text) = text_of(&env, &format!("/api/v1/jobs/{id}/logs"), &env.admin_token).await;
    assert_eq!((status, text.as_str()), (StatusCode::OK, "said-while-the-store-was-away\n"), "read from the archive");
}

async fn retention_removes_at_the_configured_age_and_not_before(backend: Backend) {
    let (env, store) = start(&backend).await;
    let policy = json!({"log_retention_days": 2, "artifact_retention_days": 5});
    let (status, body) =
        env.call(Method::PUT, "/api/v1/admin/tenants/default/storage", Some(&env.admin_token), Some(&policy)).await;
    assert_eq!(status, StatusCode::NO_CONTENT, "{body}");
    let id = finished_job(&env, json!(["echo", "kept-for-two-days"]), 1).await;
    let (status, _) = upload(&env, &env.admin_token, &id, "model.pt", b"weights".to_vec()).await;
    assert_eq!(status, StatusCode::CREATED);
    let tenant = tenant_of_job(&env, &id).await;
    let log_key = format!("tenants/{tenant}/jobs/{id}/logs/1/0.log");
    let artifact_key = format!("tenants/{tenant}/jobs/{id}/artifacts/model.pt");
    let both = [artifact_key.clone(), log_key.clone()];
    wait_until("log archived", Duration::from_secs(10), || async { store.keys() == both }).await;

    // Just under two days after the end: several sweeps (one a second) leave everything.
    age_job(&env, &id, 2.0 - 0.01).await;
    tokio::time::sleep(Duration::from_secs(3)).await;
    assert_eq!(store.keys(), [artifact_key.clone(), log_key.clone()], "removed before its time");
    let (status, text) = text_of(&env, &format!("/api/v1/jobs/{id}/logs"), &env.admin_token).await;
    assert_eq!((status, text.as_str()), (StatusCode::OK, "kept-for-two-days\n"));

    // Past two days: the logs go (archive and local file), the artefacts stay.
    age_job(&env, &id, 2.0 + 0.01).await;
    wait_until("logs removed", Duration::from_secs(15), || async { store.keys() == [artifact_key.clone()] }).await;
    let (status, _) = text_of(&env, &format!("/api/v1/jobs/{id}/logs"), &env.admin_token).await;
    assert_eq!(status, StatusCode::NOT_FOUND);
    assert!(!env.data_dir().join("jobs").join(&id).join("attempt-1").join("replica-0.log").exists());
    let (_, list) = env.get(&format!("/api/v1/jobs/{id}/artifacts"), &env.admin_token).await;
    assert_eq!(list.as_array().unwrap().len(), 1);

    // Past five days: the artefacts go too.
    age_job(&env, &id, 5.0 + 0.01).await;
    wait_until("artefacts removed", Duration::from_secs(15), || async { store.keys().is_empty() }).await;
    let (_, list) = env.get(&format!("/api/v1/jobs/{id}/artifacts"), &env.admin_token).await;
    assert_eq!(list, json!([]));
    let (status, _) = upload(&env, &env.admin_token, &id, "late.pt", b"x".to_vec()).await;
    assert_eq!(status, StatusCode::CONFLICT, "nothing new under a swept job, which retention never revisits");
}

async fn signed_links_work_until_expiry_and_refuse_tampering(backend: Backend) {
    let (env, _store) = start(&backend).await;
    let id = finished_job(&env, json!(["true"]), 1).await;
    let content = b"checkpoint bytes".to_vec();
    let (status, _) = upload(&env, &env.admin_token, &id, "ckpt/step 1.pt", content.clone()).await;
    assert_eq!(status, StatusCode::CREATED);
    let (status, link) =
        env.get(&format!("/api/v1/jobs/{id}/artifacts/ckpt/step%201.pt?expires_in=3"), &env.admin_token).await;
    assert_eq!(status, StatusCode::OK, "{link}");
    assert_eq!(link["size_bytes"], content.len());
    let base = reqwest::Url::parse(&env.server.url).unwrap();
    let url = base.join(link["url"].as_str().unwrap()).unwrap();
    let http = reqwest::Client::new();

    // Before expiry, with no credentials: the bytes.
    let response = http.get(url.clone()).send().await.unwrap();
    assert_eq!(response.status(), StatusCode::OK);
    if matches!(backend, Backend::Local) {
        // Saved under its own name, not `download`.
        let disposition = response.headers()["content-disposition"].to_str().unwrap().to_string();
        assert_eq!(disposition, "attachment; filename=\"step 1.pt\"");
    }
    assert_eq!(response.bytes().await.unwrap().to_vec(), content);

    // Any change to what was signed is refused.
    let signature_param = if matches!(backend, Backend::Local) { "sig" } else { "X-Amz-Signature" };
    let tamper = |name: &str, change: &dyn Fn(&str) -> String| {
        let mut changed = url.clone();
        let pairs: Vec<(String, String)> = url
            .query_pairs()
            .map(|(k, v)| if k == name { (k.to_string(), change(&v)) } else { (k.to_string(), v.to_string()) })
            .collect();
        changed.query_pairs_mut().clear().extend_pairs(pairs);
        changed
    };
    let flip = |v: &str| format!("{}{}", if v.starts_with('0') { "1" } else { "0" }, &v[1..]);
    let forged = [
        tamper(signature_param, &flip),
        tamper(if matches!(backend, Backend::Local) { "expires" } else { "X-Amz-Expires" }, &|_| "999999".into()),
    ];
    for forged in forged {
        let status = http.get(forged.clone()).send().await.unwrap().status();
        assert_eq!(status, StatusCode::FORBIDDEN, "{forged}");
    }
    if matches!(backend, Backend::Local) {
        let other_key = tamper("key", &|k| k.replace("step 1.pt", "other.pt"));
        assert_eq!(http.get(other_key).send().await.unwrap().status(), StatusCode::FORBIDDEN);
    }

    // Links are short-lived: more than 15 minutes is refused, naming the parameter.
    let (status, body) =
        env.get(&format!("/api/v1/jobs/{id}/artifacts/ckpt/step%201.pt?expires_in=901"), &env.admin_token).await;
    assert_eq!(status, StatusCode::UNPROCESSABLE_ENTITY, "{body}");
    assert_eq!(body["error"]["field"], "expires_in", "{body}");

    if matches!(backend, Backend::Local) {
        // The key that signs them is in a file only the server's user reads, not in the
        // database (where a dump would let anyone sign links).
        let key_file = env.data_dir().join("signing.key");
        let mode = std::fs::metadata(&key_file).unwrap().permissions();
        assert_eq!(std::os::unix::fs::PermissionsExt::mode(&mode) & 0o777, 0o600);
        let secrets_in_db: bool =
            sqlx::query_scalar("SELECT EXISTS (SELECT 1 FROM pg_tables WHERE tablename = 'server_secrets')")
                .fetch_one(&env.db.pool)
                .await
                .unwrap();
        assert!(!secrets_in_db);
    }

    // After expiry: refused.
    tokio::time::sleep(Duration::from_secs(4)).await;
    let response = http.get(url).send().await.unwrap();
    assert_eq!(response.status(), StatusCode::FORBIDDEN);
}

async fn multipart_upload_round_trips(backend: Backend) {
    let (env, _store) = start(&backend).await;
    let id = finished_job(&env, json!(["true"]), 1).await;
    // Larger than two parts, not a multiple of the part size, not a repeating pattern.
    let size = 2 * PART_SIZE + 777_777;
    let mut data = Vec::with_capacity(size);
    let mut x: u64 = 0x9E37_79B9_7F4A_7C15;
    while data.len() < size {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        data.extend_from_slice(&x.to_le_bytes());
    }
    data.truncate(size);
    let sha = hex(&Sha256::digest(&data));
    let file = env.dir.path().join("big.bin");
    std::fs::write(&file, &data).unwrap();

    let put =
        env.yard(&env.admin_token, &["-o", "json", "artifacts", "put", &id, "weights/big.bin", file.to_str().unwrap()]);
    assert!(put.status.success(), "{}", stderr(&put));
    let uploaded: Value = serde_json::from_slice(&put.stdout).unwrap();
    assert_eq!(uploaded["parts"], 3, "{uploaded}");
    assert_eq!(uploaded["sha256"], sha.as_str());

    // A table like every list: the size in human units, the hash cut short; JSON has both whole.
    let ls = stdout(&env.yard(&env.admin_token, &["artifacts", "ls", &id]));
    let row = ls.lines().find(|l| l.contains("weights/big.bin")).unwrap_or_else(|| panic!("{ls}"));
    assert!(ls.contains("PATH") && ls.contains("SHA-256") && !ls.contains('\t'), "{ls}");
    assert!(row.contains(&human_memory(size as u64)) && row.contains(&sha[..12]) && !row.contains(&sha), "{row}");
    let json = env.yard(&env.admin_token, &["artifacts", "ls", &id, "-o", "json"]);
    let json: Value = serde_json::from_slice(&json.stdout).unwrap();
    assert_eq!((json[0]["size_bytes"].as_u64(), json[0]["sha256"].as_str()), (Some(size as u64), Some(sha.as_str())));
    let back = env.dir.path().join("back.bin");
    let get = env.yard(&env.admin_token, &["artifacts", "get", &id, "weights/big.bin", "-O", back.to_str().unwrap()]);
    assert!(get.status.success(), "{}", stderr(&get));
    assert_eq!(hex(&Sha256::digest(std::fs::read(&back).unwrap())), sha);
}

/// An upload cut off midway (the client gone after two parts went up) leaves no part behind on
/// the store: the multipart upload is aborted when the request is dropped, not left for a
/// lifecycle rule (on S3 its parts would stay, unseen and billed).
async fn an_upload_cut_off_midway_leaves_no_parts_on_the_store(backend: Backend) {
    let (env, store) = start(&backend).await;
    let id = finished_job(&env, json!(["true"]), 1).await;
    // What the store holds once the job's log is archived (files unchanged for a second).
    let mut baseline = store.all_files();
    loop {
        tokio::time::sleep(Duration::from_secs(1)).await;
        let now = store.all_files();
        if now == baseline {
            break;
        }
        baseline = now;
    }
    let address = env.server.url.trim_start_matches("http://").to_string();
    let mut stream = tokio::net::TcpStream::connect(&address).await.unwrap();
    let total = 4 * PART_SIZE;
    let head = format!(
        "PUT /api/v1/jobs/{id}/artifacts/cut/off.bin HTTP/1.1\r\nHost: {address}\r\nAuthorization: Bearer {}\r\n\
         Content-Type: application/octet-stream\r\nContent-Length: {total}\r\n\r\n",
        env.admin_token
    );
    stream.write_all(head.as_bytes()).await.unwrap();
    let sent = 2 * PART_SIZE + 4096;
    stream.write_all(&vec![7u8; sent]).await.unwrap();
    wait_until("the first part on the store", Duration::from_secs(20), || {
        let now = store.all_files();
        let grew = now.len() > baseline.len();
        async move { grew }
    })
    .await;
    let in_progress: Vec<String> = store.all_files().into_iter().filter(|f| !baseline.contains(f)).collect();
    drop(stream);
    let deadline = Instant::now() + Duration::from_secs(15);
    loop {
        let left: Vec<String> = store.all_files().into_iter().filter(|f| !baseline.contains(f)).collect();
        if left.is_empty() {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "the cut-off upload's parts are still on the store: {left:?} (while it went up: {in_progress:?})"
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    let (_, list) = env.get(&format!("/api/v1/jobs/{id}/artifacts"), &env.admin_token).await;
    assert_eq!(list, json!([]), "no artefact recorded");
}

async fn a_job_uploads_its_artefacts_with_its_job_token(backend: Backend) {
    let (env, _store) = start(&backend).await;
    // The engine's side: TRAINYARD_URL, TRAINYARD_TOKEN and TRAINYARD_JOB_ID are in its
    // environment. Python's standard library stands in for an engine.
    let script = r#"
import os, urllib.request
url = f"{os.environ['TRAINYARD_URL']}/api/v1/jobs/{os.environ['TRAINYARD_JOB_ID']}/artifacts/out/result.txt"
request = urllib.request.Request(url, data=b"result 42\n", method="PUT",
    headers={"Authorization": f"Bearer {os.environ['TRAINYARD_TOKEN']}"})
print(urllib.request.urlopen(request).status)
"#;
    let python = std::env::var("TRAINYARD_TEST_PYTHON").unwrap_or_else(|_| "python3".into());
    let id = finished_job(&env, json!([python, "-c", script]), 1).await;
    let (_, logs) = text_of(&env, &format!("/api/v1/jobs/{id}/logs"), &env.admin_token).await;
    assert_eq!(logs.trim(), "201");
    let (_, list) = env.get(&format!("/api/v1/jobs/{id}/artifacts"), &env.admin_token).await;
    assert_eq!(list[0]["path"], "out/result.txt");
    assert_eq!(list[0]["sha256"], hex(&Sha256::digest(b"result 42\n")).as_str());
}

async fn path_traversal_is_refused_and_reads_nothing(backend: Backend) {
    let (env, store) = start(&backend).await;
    let id = finished_job(&env, json!(["true"]), 1).await;
    let tenant = tenant_of_job(&env, &id).await;
    let (status, _) = upload(&env, &env.admin_token, &id, "real.txt", b"real".to_vec()).await;
    assert_eq!(status, StatusCode::CREATED);
    // The job's log is archived in the background: wait for it, so that it is not taken for
    // something the attacks wrote.
    let log_key = format!("tenants/{tenant}/jobs/{id}/logs/1/0.log");
    let artifact_key = format!("tenants/{tenant}/jobs/{id}/artifacts/real.txt");
    let both = [artifact_key, log_key];
    wait_until("log archived", Duration::from_secs(10), || async { store.keys() == both }).await;
    let before = store.all_files();

    let attacks = [
        "../real.txt",
        "../../logs/1/0.log",
        "a/../../../../../etc/passwd",
        "%2e%2e/%2e%2e/x",
        "%2E%2E%2F%2E%2E%2Fx",
        "a%2f..%2f..%2fx",
        "%252e%252e%252fx",
        "..%5c..%5cx",
        "a\\..\\x",
        "/etc/passwd",
        "a//b",
        "a/./b",
        "x%00y",
        "",
    ];
    for attack in attacks {
        let target = format!("/api/v1/jobs/{id}/artifacts/{attack}");
        let (status, answer) = raw_request(&env, "PUT", &target, &env.admin_token, b"evil").await;
        assert!((400..500).contains(&status), "PUT {attack:?} got {status}: {answer}");
        let (status, answer) = raw_request(&env, "GET", &target, &env.admin_token, b"").await;
        assert!((400..500).contains(&status), "GET {attack:?} got {status}: {answer}");
        assert!(!answer.contains("\"url\""), "GET {attack:?} made a link: {answer}");
    }
    // A download URL naming any key without our signature reads nothing.
    for key in ["../../etc/passwd", &format!("tenants/{tenant}/jobs/{id}/artifacts/real.txt")] {
        let query = format!("key={}&expires=9999999999&sig=00", key.replace('/', "%2F"));
        let (status, answer) = raw_request(&env, "GET", &format!("/api/v1/artifacts/download?{query}"), "x", b"").await;
        assert_eq!(status, 403, "{answer}");
        assert!(!answer.contains("real"), "{answer}");
    }
    // Volume names become directories: the same rules.
    for name in ["../x", "..", "a/b", "%2e%2e"] {
        let (status, body) = env.post("/api/v1/volumes", &env.admin_token, &json!({"name": name, "size": "1Gi"})).await;
        assert_eq!(status, StatusCode::UNPROCESSABLE_ENTITY, "{name}: {body}");
        assert_eq!(body["error"]["field"], "name");
    }
    assert_eq!(store.all_files(), before, "nothing was written anywhere");
    let (_, list) = env.get(&format!("/api/v1/jobs/{id}/artifacts"), &env.admin_token).await;
    assert_eq!(list.as_array().unwrap().len(), 1);
}

async fn tenants_cannot_reach_each_others_artifacts_or_volumes(backend: Backend) {
    let (env, _store) = start(&backend).await;
    let (status, _) = env.post("/api/v1/admin/tenants", &env.admin_token, &json!({"name": "team-b"})).await;
    assert_eq!(status, StatusCode::CREATED);
    let bob = env.member("team-b", "bob", "admin").await;
    let id = finished_job(&env, json!(["true"]), 1).await;
    let (status, _) = upload(&env, &env.admin_token, &id, "secret.bin", b"tenant-a-secret".to_vec()).await;
    assert_eq!(status, StatusCode::CREATED);
    let (status, _) = env.post("/api/v1/volumes", &env.admin_token, &json!({"name": "shared", "size": "1Gi"})).await;
    assert_eq!(status, StatusCode::CREATED);

    for path in [format!("/api/v1/jobs/{id}/artifacts"), format!("/api/v1/jobs/{id}/artifacts/secret.bin")] {
        let (status, body) = env.get(&path, &bob).await;
        assert_eq!(status, StatusCode::NOT_FOUND, "{path}: {body}");
        assert!(!body.to_string().contains("secret"), "{body}");
    }
    let (status, _) = upload(&env, &bob, &id, "secret.bin", b"overwritten".to_vec()).await;
    assert_eq!(status, StatusCode::NOT_FOUND);
    let (_, volumes) = env.get("/api/v1/volumes", &bob).await;
    assert_eq!(volumes, json!([]));
    let (status, _) = env.call(Method::DELETE, "/api/v1/volumes/shared", Some(&bob), None).await;
    assert_eq!(status, StatusCode::NOT_FOUND);
    let ls = env.yard(&bob, &["artifacts", "ls", &id]);
    assert!(!ls.status.success());

    // Tenant A's artefact is untouched.
    let (_, list) = env.get(&format!("/api/v1/jobs/{id}/artifacts"), &env.admin_token).await;
    assert_eq!(list[0]["size_bytes"], b"tenant-a-secret".len());
}

async fn volumes_stay_within_the_storage_quota(backend: Backend) {
    let (env, _store) = start(&backend).await;
    let set =
        env.yard(&env.admin_token, &["storage", "set", "default", "--quota", "10Gi", "--log-retention-days", "7"]);
    assert!(set.status.success(), "{}", stderr(&set));

    let create =
        env.yard(&env.admin_token, &["volumes", "create", "data", "--size", "6Gi", "--access-mode", "ReadWriteMany"]);
    assert!(create.status.success(), "{}", stderr(&create));
    let (_, volumes) = env.get("/api/v1/volumes", &env.admin_token).await;
    // Where jobs see it, as on Kubernetes: never the server's own folders.
    assert_eq!(volumes[0]["path"], "/volumes/data");
    assert!(!volumes.to_string().contains(env.data_dir().to_str().unwrap()), "{volumes}");
    let path = env.volume_folder("data");
    assert!(path.is_dir(), "{}", path.display());

    let over = env.yard(&env.admin_token, &["volumes", "create", "more", "--size", "5Gi"]);
    assert!(!over.status.success());
    assert!(stderr(&over).contains("storage quota"), "{}", stderr(&over));
    let (status, body) = env.post("/api/v1/volumes", &env.admin_token, &json!({"name": "more", "size": "5Gi"})).await;
    assert_eq!(status, StatusCode::UNPROCESSABLE_ENTITY);
    assert_eq!(body["error"]["field"], "size");
    let (_, report) = env.get("/api/v1/storage", &env.admin_token).await;
    assert_eq!(report["volume_bytes"], 6u64 << 30, "the refused volume took nothing");

    let delete = env.yard(&env.admin_token, &["volumes", "delete", "data"]);
    assert!(delete.status.success(), "{}", stderr(&delete));
    assert!(!path.exists());
    let (status, _) = env.post("/api/v1/volumes", &env.admin_token, &json!({"name": "more", "size": "5Gi"})).await;
    assert_eq!(status, StatusCode::CREATED);
    let ls = stdout(&env.yard(&env.admin_token, &["volumes", "ls"]));
    let row = ls.lines().find(|l| l.contains("more")).unwrap_or_else(|| panic!("{ls}"));
    assert!(ls.contains("ACCESS MODE") && row.contains("5 GiB") && row.contains("ReadWriteOnce"), "{ls}");
    assert!(row.contains("ready"), "{row}");
    let show = env.yard(&env.admin_token, &["storage", "show"]);
    assert!(
        stdout(&show).contains("logs kept 7 days") && stdout(&show).contains("5 GiB of 10 GiB"),
        "{}",
        stdout(&show)
    );
}

async fn the_dashboard_shows_artefacts_datasets_and_volumes(backend: Backend) {
    let (env, _store) = start(&backend).await;
    let id = finished_job(&env, json!(["true"]), 1).await;
    let content = b"dashboard artefact".to_vec();
    let (status, _) = upload(&env, &env.admin_token, &id, "eval/report 1.txt", content.clone()).await;
    assert_eq!(status, StatusCode::CREATED);
    let web = WebClient::signed_in(&env.server.url, &env.admin_token).await;

    // The job's page lists the artefact with its hash; its link is a fresh signed download.
    let (status, page) = web.get(&format!("/jobs/{id}")).await;
    assert_eq!(status, StatusCode::OK);
    assert!(page.contains("eval/report 1.txt") && page.contains(&hex(&Sha256::digest(&content))), "{page}");
    let href = format!("/jobs/{id}/artifacts/eval/report%201.txt");
    assert!(page.contains(&format!("href=\"{href}\"")), "{page}");
    let (status, location) = web.redirect_of(&href).await;
    assert_eq!(status, StatusCode::SEE_OTHER);
    let url = reqwest::Url::parse(&env.server.url).unwrap().join(&location.unwrap()).unwrap();
    assert_eq!(reqwest::get(url).await.unwrap().bytes().await.unwrap().to_vec(), content);

    let (status, page) = web.get("/datasets").await;
    assert_eq!(status, StatusCode::OK);
    assert!(page.contains("No datasets registered yet") && page.contains("href=\"/volumes\""), "{page}");

    // Volumes: create, over the quota (the message on the page), delete.
    let policy = json!({"storage_quota_bytes": 3u64 << 30});
    env.call(Method::PUT, "/api/v1/admin/tenants/default/storage", Some(&env.admin_token), Some(&policy)).await;
    let (_, page) = web.get("/volumes").await;
    let csrf = csrf_of(&page);
    let form = |name: &'static str, size: &'static str| {
        vec![
            ("csrf", csrf.clone()),
            ("name", name.into()),
            ("size", size.into()),
            ("access_mode", "ReadWriteMany".into()),
        ]
    };
    let post = |fields: Vec<(&'static str, String)>| {
        let web = &web;
        async move {
            let fields: Vec<(&str, &str)> = fields.iter().map(|(k, v)| (*k, v.as_str())).collect();
            web.post_form("/volumes", &fields).await
        }
    };
    assert_eq!(post(form("scratch", "2Gi")).await.0, StatusCode::SEE_OTHER);
    let (status, page) = post(form("too-big", "2Gi")).await;
    assert_eq!(status, StatusCode::UNPROCESSABLE_ENTITY);
    assert!(page.contains("storage quota"), "{page}");
    let (_, page) = web.get("/volumes").await;
    assert!(page.contains("scratch") && page.contains("ReadWriteMany") && !page.contains("too-big"), "{page}");
    assert!(page.contains("<td>2 GiB</td>") && page.contains("<span id=\"volume-quota\">3 GiB</span>"), "{page}");
    let (status, _) = web.post_form("/volumes/scratch/delete", &[("csrf", &csrf)]).await;
    assert_eq!(status, StatusCode::SEE_OTHER);
    assert!(web.get("/volumes").await.1.contains("No volumes yet"));

    // Another tenant's member gets nothing of it.
    env.post("/api/v1/admin/tenants", &env.admin_token, &json!({"name": "team-b"})).await;
    let bob = WebClient::signed_in(&env.server.url, &env.member("team-b", "bob", "admin").await).await;
    assert_eq!(bob.redirect_of(&href).await.0, StatusCode::NOT_FOUND);
}

/// A `volume` template parameter takes a volume's name; the job gets its directory. Not
/// backend-specific, so it runs once.
#[tokio::test(flavor = "multi_thread")]
async fn a_volume_parameter_mounts_the_named_volume() {
    let (env, _store) = start(&Backend::Local).await;
    push_volume_template(&env, "writer", "echo from-the-job > \\\"$0/out.txt\\\" && ls /volumes > \\\"$0/seen.txt\\\"");

    let (status, body) =
        env.post("/api/v1/templates/writer/jobs", &env.admin_token, &json!({"params": {"scratch": "nope"}})).await;
    assert_eq!(status, StatusCode::UNPROCESSABLE_ENTITY, "{body}");
    assert_eq!(body["error"]["field"], "params.scratch");

    let (status, volume) =
        env.post("/api/v1/volumes", &env.admin_token, &json!({"name": "scratch", "size": "1Gi"})).await;
    assert_eq!(status, StatusCode::CREATED, "{volume}");
    // The job writes to /volumes/scratch, bound in its own mount namespace to the folder the
    // server keeps for the volume.
    assert_eq!(volume["path"], "/volumes/scratch", "{volume}");
    let (status, _) = env.post("/api/v1/volumes", &env.admin_token, &json!({"name": "unused", "size": "1Gi"})).await;
    assert_eq!(status, StatusCode::CREATED);
    let ran = env.yard(&env.admin_token, &["run", "writer", "--set", "scratch=scratch", "--wait"]);
    assert!(ran.status.success(), "{} {}", stdout(&ran), stderr(&ran));
    let written = env.volume_folder("scratch").join("out.txt");
    assert_eq!(std::fs::read_to_string(written).unwrap(), "from-the-job\n");
    let seen = std::fs::read_to_string(env.volume_folder("scratch").join("seen.txt")).unwrap();
    assert_eq!(seen, "scratch\n", "the job sees the volumes it uses, no other");
    // The spec records the volume and where the job was told it is, for a cluster to mount.
    let (_, jobs) = env.get("/api/v1/jobs?template=writer", &env.admin_token).await;
    assert_eq!(jobs["items"][0]["spec"]["volumes"], json!([{"name": "scratch", "path": volume["path"]}]));

    // While an unfinished job mounts it the volume cannot be deleted (its data would vanish
    // under the job); once the job has ended it can.
    push_volume_template(&env, "holder", "sleep 600");
    let (status, job) =
        env.post("/api/v1/templates/holder/jobs", &env.admin_token, &json!({"params": {"scratch": "scratch"}})).await;
    assert_eq!(status, StatusCode::CREATED, "{job}");
    let id = job["id"].as_str().unwrap();
    env.wait_state(id, "running", Duration::from_secs(30)).await;
    let (status, body) = env.call(Method::DELETE, "/api/v1/volumes/scratch", Some(&env.admin_token), None).await;
    assert_eq!(status, StatusCode::CONFLICT, "{body}");
    let message = body["error"]["message"].as_str().unwrap();
    assert!(message.contains("mounted by 1 unfinished job(s)") && message.contains(id), "{message}");
    let refused = env.yard(&env.admin_token, &["volumes", "delete", "scratch"]);
    assert!(!refused.status.success() && stderr(&refused).contains(id), "{}", stderr(&refused));
    let kept = env.volume_folder("scratch").join("out.txt");
    assert_eq!(std::fs::read_to_string(&kept).unwrap(), "from-the-job\n", "nothing was removed");
    assert_eq!(env.get("/api/v1/volumes", &env.admin_token).await.1[0]["name"], "scratch");

    let cancelled = env.yard(&env.admin_token, &["cancel", id]);
    assert!(cancelled.status.success(), "{}", stderr(&cancelled));
    env.wait_state(id, "cancelled", Duration::from_secs(15)).await;
    let deleted = env.yard(&env.admin_token, &["volumes", "delete", "scratch"]);
    assert!(deleted.status.success(), "{}", stderr(&deleted));
    assert!(!kept.exists(), "the volume's data went with it");
}

/// Publishes a template `name` with one required `volume` parameter, `scratch`, that runs
/// `script` under `sh -c` with the volume's directory as `$0`.
fn push_volume_template(env: &TestEnv, name: &str, script: &str) {
    let folder = env.dir.path().join(name);
    std::fs::create_dir_all(&folder).unwrap();
    std::fs::write(
        folder.join("template.yaml"),
        format!(
            "name: {name}\nversion: 1.0.0\ndescription: Uses a volume.\n\
             parameters:\n  scratch:\n    type: volume\n    required: true\n    help: The volume.\n\
             command:\n  - sh\n  - -c\n  - \"{script}\"\n  - \"{{{{ scratch }}}}\"\n"
        ),
    )
    .unwrap();
    let pushed = env.yard(&env.admin_token, &["templates", "push", folder.to_str().unwrap()]);
    assert!(pushed.status.success(), "{}", stderr(&pushed));
}

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

/// A file and a folder cannot share a name, on either store: a path beneath an artefact, or one
/// that is a folder of artefacts, is a 409 naming the clash (the local store answered 500), a
/// read beneath an artefact is a 404, and a segment too long once stored is a 422.
async fn a_file_and_a_folder_cannot_share_a_name(backend: Backend) {
    let (env, _store) = start(&backend).await;
    let id = finished_job(&env, json!(["true"]), 1).await;
    let (status, _) = upload(&env, &env.admin_token, &id, "out/model.bin", b"weights".to_vec()).await;
    assert_eq!(status, StatusCode::CREATED);
    // The same path again replaces it (not a clash with itself).
    let (status, body) = upload(&env, &env.admin_token, &id, "out/model.bin", b"weights 2".to_vec()).await;
    assert_eq!(status, StatusCode::CREATED, "{body}");

    let (status, body) = upload(&env, &env.admin_token, &id, "out/model.bin/child", b"x".to_vec()).await;
    assert_eq!(status, StatusCode::CONFLICT, "{body}");
    assert!(body["error"]["message"].as_str().unwrap().contains("out/model.bin is an artefact"), "{body}");
    let (status, body) = upload(&env, &env.admin_token, &id, "out", b"x".to_vec()).await;
    assert_eq!(status, StatusCode::CONFLICT, "{body}");
    assert!(body["error"]["message"].as_str().unwrap().contains("folder of artefacts"), "{body}");

    let (status, body) = env.get(&format!("/api/v1/jobs/{id}/artifacts/out/model.bin/child"), &env.admin_token).await;
    assert_eq!(status, StatusCode::NOT_FOUND, "{body}");
    for long in ["a".repeat(254), "%C3%A9".repeat(100)] {
        let (status, body) = upload(&env, &env.admin_token, &id, &long, b"x".to_vec()).await;
        assert_eq!(status, StatusCode::UNPROCESSABLE_ENTITY, "{body}");
        assert_eq!(body["error"]["field"], "path", "{body}");
    }
    let (_, list) = env.get(&format!("/api/v1/jobs/{id}/artifacts"), &env.admin_token).await;
    let paths: Vec<&str> = list.as_array().unwrap().iter().map(|a| a["path"].as_str().unwrap()).collect();
    assert_eq!(paths, ["out/model.bin"], "nothing else was stored");
}

/// Each test, once per backend.
macro_rules! on_both_backends {
    ($($test:ident),* $(,)?) => {
        mod local {
            $(#[tokio::test(flavor = "multi_thread")]
            async fn $test() { super::$test(super::Backend::Local).await })*
        }
        mod s3 {
            $(#[tokio::test(flavor = "multi_thread")]
            async fn $test() { super::$test(super::Backend::S3).await })*
        }
    };
}

on_both_backends!(
    logs_outlive_the_local_files,
    retention_removes_at_the_configured_age_and_not_before,
    signed_links_work_until_expiry_and_refuse_tampering,
    multipart_upload_round_trips,
    an_upload_cut_off_midway_leaves_no_parts_on_the_store,
    a_job_uploads_its_artefacts_with_its_job_token,
    path_traversal_is_refused_and_reads_nothing,
    tenants_cannot_reach_each_others_artifacts_or_volumes,
    volumes_stay_within_the_storage_quota,
    the_dashboard_shows_artefacts_datasets_and_volumes,
    a_file_and_a_folder_cannot_share_a_name,
);
