//! The end-to-end test harness: a fresh Postgres database per test (with every migration
//! applied), the real `trainyard` server binary on port 0, the real `yard` binary, plain HTTP.
//!
//! The Postgres cluster itself is started once per test run by `tests/run`
//! (`trainyard postgres start --throwaway`), which exports its admin URL as
//! `TRAINYARD_TEST_DATABASE_URL`. Each test creates its own database in it.

use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output, Stdio};
use std::time::{Duration, Instant};

use serde_json::Value;
use sqlx::PgPool;
use sqlx::postgres::PgPoolOptions;
use trainyard_store::Store;

pub use reqwest::StatusCode;

pub mod oidc;
pub mod proxy;
pub mod web;

/// The folder holding the workspace's built binaries (next to this test executable).
pub fn bin(name: &str) -> PathBuf {
    let exe = std::env::current_exe().expect("test executable path");
    // target/<profile>/deps/<test>-<hash> -> target/<profile>/<name>
    let path = exe.parent().and_then(Path::parent).expect("target dir").join(name);
    assert!(
        path.is_file(),
        "{} is missing: build the binaries first (`cargo build --workspace`; tests/run does)",
        path.display()
    );
    path
}

/// The PATH jobs see: the test Python's folder first (it has torch and webdataset), when set.
fn job_path() -> String {
    let path = std::env::var("PATH").unwrap_or_default();
    match std::env::var("TRAINYARD_TEST_PYTHON") {
        Ok(python) => match Path::new(&python).parent() {
            Some(dir) => format!("{}:{path}", dir.display()),
            None => path,
        },
        Err(_) => path,
    }
}

/// A database of its own for one test, with all migrations applied. Dropped when its test
/// passes (a full run makes hundreds, about 10 MB each: enough to fill a small CI disk); a
/// failed test's database stays for a look.
pub struct TestDb {
    pub url: String,
    pub pool: PgPool,
    name: String,
}

impl TestDb {
    pub async fn fresh() -> TestDb {
        let admin_url = std::env::var("TRAINYARD_TEST_DATABASE_URL").expect(
            "TRAINYARD_TEST_DATABASE_URL is not set: run the tests through tests/run, which starts a throwaway Postgres",
        );
        let name = format!("t_{}", uuid::Uuid::new_v4().simple());
        let admin =
            PgPoolOptions::new().max_connections(1).connect(&admin_url).await.expect("connect to the test cluster");
        sqlx::query(sqlx::AssertSqlSafe(format!("CREATE DATABASE {name}")))
            .execute(&admin)
            .await
            .expect("create database");
        admin.close().await;
        let (base, _) = admin_url.rsplit_once('/').expect("database URL ends with /<database>");
        let url = format!("{base}/{name}");
        let store = Store::connect(&url, 4).await.expect("connect to the fresh database");
        store.migrate().await.expect("every migration applies to an empty database");
        TestDb { url, pool: store.pool().clone(), name }
    }
}

impl Drop for TestDb {
    fn drop(&mut self) {
        if std::thread::panicking() {
            return;
        }
        let Ok(admin_url) = std::env::var("TRAINYARD_TEST_DATABASE_URL") else { return };
        let name = self.name.clone();
        // Drop runs inside the test's runtime, which cannot block on a future: a thread with
        // a runtime of its own does the work. FORCE ends the sessions still open on it.
        let dropped = std::thread::spawn(move || -> Result<(), sqlx::Error> {
            let runtime = tokio::runtime::Builder::new_current_thread().enable_all().build()?;
            runtime.block_on(async {
                let admin = PgPoolOptions::new().max_connections(1).connect(&admin_url).await?;
                sqlx::query(sqlx::AssertSqlSafe(format!("DROP DATABASE IF EXISTS {name} WITH (FORCE)")))
                    .execute(&admin)
                    .await?;
                admin.close().await;
                Ok(())
            })
        })
        .join();
        if let Ok(Err(e)) = dropped {
            eprintln!("could not drop the test database {}: {e}", self.name);
        }
    }
}

/// A running `trainyard serve` process.
pub struct ServerProcess {
    child: Child,
    pub url: String,
    extra: Vec<String>,
    env: Vec<(String, String)>,
}

impl ServerProcess {
    pub fn start(db_url: &str, data_dir: &Path) -> ServerProcess {
        ServerProcess::start_with(db_url, data_dir, &[])
    }

    /// Starts with extra `trainyard serve` arguments (e.g. `--simulate-gpus 8`).
    pub fn start_with(db_url: &str, data_dir: &Path, extra: &[&str]) -> ServerProcess {
        ServerProcess::start_with_env(db_url, data_dir, extra, &[])
    }

    /// Also with extra environment variables (e.g. object store credentials).
    pub fn start_with_env(db_url: &str, data_dir: &Path, extra: &[&str], env: &[(String, String)]) -> ServerProcess {
        std::fs::create_dir_all(data_dir).unwrap();
        let log = std::fs::OpenOptions::new().create(true).append(true).open(data_dir.join("server.log")).unwrap();
        // The tests' settings, each unless the test gives its own: a few connections each, as
        // many servers run at once against one Postgres.
        let defaults = [("--cpus", "8"), ("--grace-seconds", "2"), ("--max-connections", "8")];
        let defaults =
            defaults.iter().filter(|(flag, _)| !extra.contains(flag)).flat_map(|(flag, value)| [*flag, *value]);
        // A given `--listen` (a restart on the same address) replaces the default: port 0.
        let listen: &[&str] = if extra.contains(&"--listen") { &[] } else { &["--listen", "127.0.0.1:0"] };
        let mut child = Command::new(bin("trainyard"))
            .arg("serve")
            .args(listen)
            .args(defaults)
            .arg("--data-dir")
            .arg(data_dir)
            .args(extra)
            .env("PATH", job_path())
            .env("TRAINYARD_DATABASE_URL", db_url)
            .env("RUST_LOG", "info,sqlx=warn")
            .envs(env.iter().map(|(k, v)| (k.as_str(), v.as_str())))
            .stdout(Stdio::piped())
            .stderr(log)
            .spawn()
            .expect("start trainyard serve");
        let stdout = child.stdout.take().unwrap();
        let mut lines = BufReader::new(stdout).lines();
        let url = loop {
            match lines.next() {
                Some(Ok(line)) => {
                    if let Some(url) = line.strip_prefix("trainyard: listening on ") {
                        break url.trim().to_string();
                    }
                }
                _ => panic!(
                    "trainyard serve exited before listening; its log: {}",
                    std::fs::read_to_string(data_dir.join("server.log")).unwrap_or_default()
                ),
            }
        };
        // Keep reading so that the server never writes into a closed pipe.
        std::thread::spawn(move || lines.for_each(drop));
        ServerProcess { child, url, extra: extra.iter().map(|s| s.to_string()).collect(), env: env.to_vec() }
    }

    /// The server's process id (to pause it with SIGSTOP, say).
    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    /// SIGKILL: the server dies without any cleanup, as in a crash.
    pub fn kill_hard(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }

    /// SIGTERM and wait for a clean exit.
    pub fn stop(&mut self) -> std::process::ExitStatus {
        let pid = nix::unistd::Pid::from_raw(self.child.id() as i32);
        let _ = nix::sys::signal::kill(pid, nix::sys::signal::Signal::SIGTERM);
        self.child.wait().unwrap()
    }
}

impl Drop for ServerProcess {
    fn drop(&mut self) {
        self.kill_hard();
    }
}

/// Marks a [`TestEnv`] whose server refuses jobs larger than the cluster (not a server argument).
const FIXED_CLUSTER: &str = "(fixed cluster)";

/// One test's world: its database, data directory, server, and an admin token.
pub struct TestEnv {
    pub db: TestDb,
    pub dir: tempfile::TempDir,
    pub server: ServerProcess,
    pub admin_token: String,
    /// The database URL the server uses (the test's database, or a proxy in front of it).
    server_db_url: String,
    http: reqwest::Client,
}

impl TestEnv {
    pub async fn start() -> TestEnv {
        TestEnv::start_with(&[]).await
    }

    /// A server started with extra `trainyard serve` arguments.
    pub async fn start_with(extra: &[&str]) -> TestEnv {
        TestEnv::start_with_env(extra, &[]).await
    }

    /// A server started with extra arguments and environment variables.
    pub async fn start_with_env(extra: &[&str], env: &[(String, String)]) -> TestEnv {
        TestEnv::start_inner(extra, env, None).await
    }

    /// A server that refuses jobs larger than its cluster (the default outside the tests:
    /// every other test server runs with `--cluster-grows`, so that a job asking for more than
    /// the test machine has stays queued, which many tests rely on).
    pub async fn start_with_fixed_cluster(extra: &[&str]) -> TestEnv {
        let mut args = vec![FIXED_CLUSTER];
        args.extend_from_slice(extra);
        TestEnv::start_inner(&args, &[], None).await
    }

    /// A server that reaches its database through a [`proxy::DbProxy`] (returned), so that the
    /// test can cut the database away from it.
    pub async fn start_behind_proxy(extra: &[&str], env: &[(String, String)]) -> (TestEnv, proxy::DbProxy) {
        let db = TestDb::fresh().await;
        let proxy = proxy::DbProxy::start(&db.url).await;
        let env = TestEnv::start_inner(extra, env, Some((db, proxy.url.clone()))).await;
        (env, proxy)
    }

    async fn start_inner(extra: &[&str], env: &[(String, String)], db: Option<(TestDb, String)>) -> TestEnv {
        let (db, server_db_url) = match db {
            Some((db, url)) => (db, url),
            None => {
                let db = TestDb::fresh().await;
                let url = db.url.clone();
                (db, url)
            }
        };
        let dir = tempfile::Builder::new().prefix("trainyard-test-").tempdir().unwrap();
        // Replicas run as their tenant's unprivileged user (when the tests run as root): like
        // /tmp, the test's scratch folder is theirs to read and write in; the server's data
        // directory inside it is closed to them.
        std::fs::set_permissions(dir.path(), std::os::unix::fs::PermissionsExt::from_mode(0o1777)).unwrap();
        let output = Command::new(bin("trainyard"))
            .arg("bootstrap")
            .env("TRAINYARD_DATABASE_URL", &db.url)
            .output()
            .expect("run trainyard bootstrap");
        assert!(output.status.success(), "bootstrap failed: {}", String::from_utf8_lossy(&output.stderr));
        let admin_token = String::from_utf8(output.stdout).unwrap().trim().to_string();
        // Test servers queue what the test machine cannot hold (see `start_with_fixed_cluster`).
        let mut args: Vec<&str> = extra.iter().copied().filter(|a| *a != FIXED_CLUSTER).collect();
        if !extra.contains(&FIXED_CLUSTER) {
            args.push("--cluster-grows");
        }
        // Restarts wait half a second in the tests (10 s by default) unless a test says.
        if !extra.contains(&"--restart-backoff-seconds") {
            args.extend(["--restart-backoff-seconds", "0.5"]);
        }
        let server = ServerProcess::start_with_env(&server_db_url, &dir.path().join("data"), &args, env);
        TestEnv { db, dir, server, admin_token, server_db_url, http: reqwest::Client::new() }
    }

    pub fn data_dir(&self) -> PathBuf {
        self.dir.path().join("data")
    }

    /// The server's folder of volume `name` (`<data>/volumes/<tenant id>/<name>`), which jobs
    /// see at `/volumes/<name>`; exactly one tenant may have a volume of that name.
    pub fn volume_folder(&self, name: &str) -> PathBuf {
        let folders: Vec<PathBuf> = std::fs::read_dir(self.data_dir().join("volumes"))
            .expect("the volumes folder")
            .flatten()
            .map(|tenant| tenant.path().join(name))
            .filter(|folder| folder.is_dir())
            .collect();
        assert_eq!(folders.len(), 1, "one tenant has a volume {name}: {folders:?}");
        folders[0].clone()
    }

    pub fn restart_after_crash(&mut self) {
        let env = self.server.env.clone();
        self.restart_after_crash_with_env(&env);
    }

    /// Kills the server hard and starts it again on the same address, as a server restarted by
    /// its supervisor is: the jobs it launched reach it again at the URL they were given.
    pub fn restart_after_crash_on_the_same_address(&mut self) {
        self.server.kill_hard();
        let address = self.server.url.trim_start_matches("http://").to_string();
        let mut extra: Vec<String> = self.server.extra.clone();
        if !extra.iter().any(|a| a == "--listen") {
            extra.extend(["--listen".to_string(), address]);
        }
        let extra: Vec<&str> = extra.iter().map(String::as_str).collect();
        let env = self.server.env.clone();
        self.server = ServerProcess::start_with_env(&self.server_db_url, &self.data_dir(), &extra, &env);
    }

    /// Kills the server hard and starts it again with the same arguments and this environment
    /// (e.g. without a fault injected into the first one).
    pub fn restart_after_crash_with_env(&mut self, env: &[(String, String)]) {
        self.server.kill_hard();
        let extra: Vec<String> = self.server.extra.clone();
        let extra: Vec<&str> = extra.iter().map(String::as_str).collect();
        self.server = ServerProcess::start_with_env(&self.server_db_url, &self.data_dir(), &extra, env);
    }

    /// Sends a request; returns the status and the JSON body (Null when there is none).
    pub async fn call(
        &self,
        method: reqwest::Method,
        path: &str,
        token: Option<&str>,
        body: Option<&Value>,
    ) -> (StatusCode, Value) {
        let mut request = self.http.request(method, format!("{}{path}", self.server.url));
        if let Some(token) = token {
            request = request.bearer_auth(token);
        }
        if let Some(body) = body {
            request = request.json(body);
        }
        let response = request.send().await.expect("HTTP request");
        let status = response.status();
        let text = response.text().await.unwrap();
        (status, serde_json::from_str(&text).unwrap_or(Value::String(text)))
    }

    /// Uploads `body` as artefact `path` of `job` with `token`; panics unless it is stored.
    pub async fn artifact_put(&self, job: &str, path: &str, token: &str, body: &'static str) {
        let response = self
            .http
            .put(format!("{}/api/v1/jobs/{job}/artifacts/{path}", self.server.url))
            .bearer_auth(token)
            .header("content-type", "application/octet-stream")
            .body(body)
            .send()
            .await
            .expect("HTTP request");
        assert!(response.status().is_success(), "uploading {path}: {}", response.status());
    }

    pub async fn get(&self, path: &str, token: &str) -> (StatusCode, Value) {
        self.call(reqwest::Method::GET, path, Some(token), None).await
    }

    pub async fn post(&self, path: &str, token: &str, body: &Value) -> (StatusCode, Value) {
        self.call(reqwest::Method::POST, path, Some(token), Some(body)).await
    }

    /// Submits as the admin and returns the job id.
    pub async fn submit(&self, body: Value) -> String {
        let (status, job) = self.post("/api/v1/jobs", &self.admin_token, &body).await;
        assert_eq!(status, StatusCode::CREATED, "{job}");
        job["id"].as_str().unwrap().to_string()
    }

    /// Polls a job until `done` says so; panics with the last state after `timeout`.
    pub async fn wait_job(&self, id: &str, timeout: Duration, done: impl Fn(&Value) -> bool) -> Value {
        self.wait_job_as(&self.admin_token, id, timeout, done).await
    }

    /// [`TestEnv::wait_job`] with the token of the job's tenant.
    pub async fn wait_job_as(&self, token: &str, id: &str, timeout: Duration, done: impl Fn(&Value) -> bool) -> Value {
        let deadline = Instant::now() + timeout;
        loop {
            let (status, job) = self.get(&format!("/api/v1/jobs/{id}"), token).await;
            assert_eq!(status, StatusCode::OK, "{job}");
            if done(&job) {
                return job;
            }
            assert!(Instant::now() < deadline, "job {id} did not get there in {timeout:?}; it is {job}");
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }

    /// The server's `/metrics` exposition, read as the platform admin.
    pub async fn metrics_text(&self) -> String {
        let response =
            self.http.get(format!("{}/metrics", self.server.url)).bearer_auth(&self.admin_token).send().await.unwrap();
        assert_eq!(response.status(), StatusCode::OK);
        response.text().await.unwrap()
    }

    pub async fn wait_state(&self, id: &str, state: &str, timeout: Duration) -> Value {
        self.wait_job(id, timeout, |job| job["state"] == state).await
    }

    /// Invites the new user `user` into `tenant` with `role` and returns their first token.
    pub async fn member(&self, tenant: &str, user: &str, role: &str) -> String {
        let (status, added) = self
            .post(
                &format!("/api/v1/admin/tenants/{tenant}/members"),
                &self.admin_token,
                &serde_json::json!({"user": user, "role": role}),
            )
            .await;
        assert_eq!(status, StatusCode::CREATED, "{added}");
        added["token"]["token"].as_str().unwrap().to_string()
    }

    /// Runs the real `yard` binary against this server with `token`.
    /// `yard` run in an empty folder of the test's own (so `yard submit` ships no files).
    pub fn yard(&self, token: &str, args: &[&str]) -> Output {
        let cwd = self.dir.path().join("yard-cwd");
        std::fs::create_dir_all(&cwd).expect("the folder yard runs in");
        self.yard_in(&cwd, token, args)
    }

    /// `yard` run in `dir` (what `yard submit` ships as the job's code). Its tables are as wide
    /// as their values (`COLUMNS=1000`): tests read whole values; [`TestEnv::yard_at_width`]
    /// prints them as a terminal of some width would.
    pub fn yard_in(&self, dir: &Path, token: &str, args: &[&str]) -> Output {
        self.yard_command(dir, token, args).env("COLUMNS", "1000").output().expect("run yard")
    }

    /// `yard` as printed to a terminal `columns` wide (`COLUMNS`), or piped when `None`.
    pub fn yard_at_width(&self, token: &str, columns: Option<u16>, args: &[&str]) -> Output {
        let cwd = self.dir.path().join("yard-cwd");
        std::fs::create_dir_all(&cwd).expect("the folder yard runs in");
        let mut command = self.yard_command(&cwd, token, args);
        match columns {
            Some(columns) => command.env("COLUMNS", columns.to_string()),
            None => command.env_remove("COLUMNS"),
        };
        command.output().expect("run yard")
    }

    fn yard_command(&self, dir: &Path, token: &str, args: &[&str]) -> Command {
        let mut command = Command::new(bin("yard"));
        command
            .current_dir(dir)
            .args(args)
            .env("HOME", self.dir.path())
            .env_remove("XDG_CONFIG_HOME")
            .env("TRAINYARD_URL", &self.server.url)
            .env("TRAINYARD_TOKEN", token);
        command
    }

    /// Packs `source` into `dest` with the `data-pack` template through `yard run ... --wait`
    /// (extra `--set key=value` pairs in `sets`); returns the finished job as JSON.
    pub fn data_pack(&self, source: &Path, dest: &Path, sets: &[&str]) -> Value {
        let (source, dest) = (format!("source={}", source.display()), format!("destination={}", dest.display()));
        let mut args = vec!["run", "data-pack", "--set", source.as_str(), "--set", dest.as_str()];
        for set in sets {
            args.extend(["--set", set]);
        }
        args.extend(["--wait", "-o", "json"]);
        let ran = self.yard(&self.admin_token, &args);
        assert!(ran.status.success(), "data-pack: {} {}", stdout(&ran), stderr(&ran));
        serde_json::from_slice(&ran.stdout).expect("yard run -o json prints the job")
    }

    /// Process ids (also process-group ids) of a job's replicas in one attempt.
    pub async fn replica_pids(&self, id: &str, attempt: usize) -> Vec<u32> {
        let (_, attempts) = self.get(&format!("/api/v1/jobs/{id}/attempts"), &self.admin_token).await;
        attempts[attempt - 1]["placement"]["replicas"]
            .as_array()
            .expect("placement with replicas")
            .iter()
            .map(|r| r["pid"].as_u64().unwrap() as u32)
            .collect()
    }

    /// The first replica's pid of a job's latest attempt, read from Postgres (works while the
    /// server is down).
    pub async fn replica_pids_from_db(&self, id: &str) -> u32 {
        let placement: serde_json::Value = sqlx::query_scalar(
            "SELECT placement FROM job_attempts WHERE job_id = $1::uuid ORDER BY attempt DESC LIMIT 1",
        )
        .bind(id)
        .fetch_one(&self.db.pool)
        .await
        .unwrap();
        placement["replicas"][0]["pid"].as_u64().unwrap() as u32
    }

    pub async fn jobs_in_db(&self) -> i64 {
        sqlx::query_scalar("SELECT count(*) FROM jobs").fetch_one(&self.db.pool).await.unwrap()
    }
}

impl Drop for TestEnv {
    /// Leaves no job process behind, whatever the test did.
    fn drop(&mut self) {
        self.server.kill_hard();
        if std::thread::panicking() {
            // The test failed: what the server said is the first thing to read, and a CI run
            // keeps no data directory.
            let log = std::fs::read_to_string(self.data_dir().join("server.log")).unwrap_or_default();
            let tail: Vec<&str> = log.lines().rev().take(SERVER_LOG_TAIL).collect();
            eprintln!("--- the last {} lines of the server's log ---", tail.len());
            for line in tail.iter().rev() {
                eprintln!("{line}");
            }
        }
        for pgid in job_process_groups(&self.data_dir()) {
            if let Ok(raw) = i32::try_from(pgid) {
                let _ = nix::sys::signal::killpg(nix::unistd::Pid::from_raw(raw), nix::sys::signal::Signal::SIGKILL);
            }
        }
    }
}

/// How much of the server's log a failed test prints.
const SERVER_LOG_TAIL: usize = 150;

/// Every replica supervisor pid recorded under a data directory.
pub fn job_process_groups(data_dir: &Path) -> Vec<u32> {
    let mut pids = Vec::new();
    let Ok(jobs) = std::fs::read_dir(data_dir.join("jobs")) else {
        return pids;
    };
    for job in jobs.flatten() {
        for attempt in std::fs::read_dir(job.path()).into_iter().flatten().flatten() {
            for file in std::fs::read_dir(attempt.path()).into_iter().flatten().flatten() {
                if file.path().extension().is_some_and(|e| e == "pid")
                    && let Some(pid) = std::fs::read_to_string(file.path())
                        .ok()
                        .and_then(|t| t.split_whitespace().next()?.parse().ok())
                {
                    pids.push(pid);
                }
            }
        }
    }
    pids
}

/// True while a live (not zombie) process is in the group.
pub fn group_alive(pgid: u32) -> bool {
    trainyard_executor::local::process::group_has_live_members(pgid)
}

pub fn stdout(output: &Output) -> String {
    String::from_utf8_lossy(&output.stdout).into_owned()
}

pub fn stderr(output: &Output) -> String {
    String::from_utf8_lossy(&output.stderr).into_owned()
}

/// The in-memory API server's process (`crates/kube/examples/fake_apiserver.rs`), ended when
/// dropped (a failed assertion included).
pub struct FakeApiServer {
    child: Child,
    /// Its address, for a test that reads what Trainyard applied (`/api/v1/pods`, ...).
    pub url: String,
    /// A kubeconfig for it, to give `trainyard serve --executor kubernetes` as `KUBECONFIG`.
    pub kubeconfig: PathBuf,
}

impl FakeApiServer {
    /// Starts the in-memory API server of the executor's tests, served over HTTP by its example
    /// binary (it also places and runs the pods; see its arguments there), and writes a
    /// kubeconfig for it in `dir`.
    pub fn start(dir: &Path, args: &[&str]) -> FakeApiServer {
        let binary = bin("examples/fake_apiserver");
        let mut child =
            Command::new(binary).args(args).stdout(Stdio::piped()).spawn().expect("start the fake API server");
        let stdout = child.stdout.take().expect("its stdout");
        let mut line = String::new();
        BufReader::new(stdout).read_line(&mut line).expect("its first line");
        let url = line.trim().strip_prefix("listening on ").expect("its address").to_string();
        let kubeconfig = dir.join("kubeconfig");
        std::fs::write(
            &kubeconfig,
            format!(
                "apiVersion: v1\nkind: Config\nclusters:\n- name: fake\n  cluster: {{server: \"{url}\"}}\nusers:\n- name: t\n  user: {{token: \"t\"}}\ncontexts:\n- name: fake\n  context: {{cluster: fake, user: t}}\ncurrent-context: fake\n"
            ),
        )
        .expect("the kubeconfig");
        FakeApiServer { child, url, kubeconfig }
    }
}

/// The scheduler and kubelets of a real API server with no machines
/// (`crates/kube/examples/kubelet_standin.rs`): registers its nodes, binds and runs the pods the
/// Job controller makes. Ended when dropped.
pub struct KubeletStandin {
    child: Child,
}

impl KubeletStandin {
    /// Starts it with an admin's `kubeconfig` and `args` (see the example), once it says its
    /// nodes exist and it watches pods.
    pub fn start(kubeconfig: &Path, args: &[&str]) -> KubeletStandin {
        let mut child = Command::new(bin("examples/kubelet_standin"))
            .arg("--kubeconfig")
            .arg(kubeconfig)
            .args(args)
            .stdout(Stdio::piped())
            .spawn()
            .expect("start the kubelet stand-in");
        let mut line = String::new();
        BufReader::new(child.stdout.take().expect("its stdout")).read_line(&mut line).expect("its first line");
        assert!(line.starts_with("ready:"), "the kubelet stand-in did not get ready: {line:?}");
        KubeletStandin { child }
    }
}

impl Drop for KubeletStandin {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

impl Drop for FakeApiServer {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}
