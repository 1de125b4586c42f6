//! Jobs confined on the node (issue 37): every process a replica starts lives and dies in its
//! cgroup, memory and process counts are held to the job's limits, and the server and other jobs
//! carry on. These need root and cgroups, as tests/run has them; without, they fail and say why.

use std::time::{Duration, Instant};

use serde_json::json;
use trainyard_tests::{StatusCode, TestEnv};

fn require_root() {
    assert!(
        nix::unistd::geteuid().is_root(),
        "this test needs root (as tests/run has it): only root makes cgroups and switches users"
    );
}

/// Pids of live processes whose command line contains `needle`.
fn processes_running(needle: &str) -> Vec<u32> {
    let mut found = Vec::new();
    for entry in std::fs::read_dir("/proc").unwrap().flatten() {
        let Some(pid) = entry.file_name().to_str().and_then(|n| n.parse::<u32>().ok()) else { continue };
        let Ok(cmdline) = std::fs::read(format!("/proc/{pid}/cmdline")) else { continue };
        let line = String::from_utf8_lossy(&cmdline).replace('\0', " ");
        let zombie = std::fs::read_to_string(format!("/proc/{pid}/stat")).is_ok_and(|s| s.contains(") Z "));
        if line.contains(needle) && !zombie {
            found.push(pid);
        }
    }
    found
}

/// The escape of issue 37: a 1-GPU job leaves processes behind in every way a shell can (a new
/// session, a double fork, `nohup`) and exits 0. All of them are gone within the grace period
/// of its end, and the GPU goes to the next job (another tenant's) only once they are. Without
/// PID namespaces (the cgroup alone holds them; the next job looks for them in /proc), then with
/// (the default: they end with the replica's namespace).
#[tokio::test(flavor = "multi_thread")]
async fn processes_a_job_leaves_behind_end_with_it_before_its_gpu_is_given_again() {
    require_root();
    escape_and_next_job(&["--no-pid-namespace"]).await;
    escape_and_next_job(&[]).await;
}

async fn escape_and_next_job(extra: &[&str]) {
    let env = TestEnv::start_with(&[&["--simulate-gpus", "1"], extra].concat()).await;
    let (_, ready) = env.get("/readyz", &env.admin_token).await;
    // Fully confined here; without PID namespaces, this machine's /proc may show every user's
    // processes (a mount option of the host's, which the server reports and does not change).
    let warnings = ready["node_warnings"].as_array().cloned().unwrap_or_default();
    if extra.is_empty() {
        assert_eq!(warnings, Vec::<serde_json::Value>::new(), "{ready}");
    } else {
        assert!(warnings.iter().all(|w| w.as_str().is_some_and(|w| w.contains("hidepid"))), "{ready}");
    }
    // Both tenants may use the one GPU (quota 1 each), one at a time.
    let (status, _) = env.post("/api/v1/admin/tenants", &env.admin_token, &json!({"name": "team-b"})).await;
    assert_eq!(status, StatusCode::CREATED);
    for tenant in ["default", "team-b"] {
        let path = format!("/api/v1/admin/tenants/{tenant}/quotas/simulated-gpu");
        let (status, body) =
            env.call(reqwest::Method::PUT, &path, Some(&env.admin_token), Some(&json!({"nominal": 1}))).await;
        assert!(status.is_success(), "{body}");
    }
    let marker = format!("trainyard-escape-{}", std::process::id());
    let script = format!(
        "setsid bash -c 'exec -a {marker}-setsid sleep 300' & \
         (bash -c 'exec -a {marker}-double sleep 300' &) ; \
         nohup bash -c 'exec -a {marker}-nohup sleep 300' >/dev/null 2>&1 & \
         sleep 0.5; echo left three behind"
    );
    let a = env.submit(json!({"command": ["bash", "-c", script], "resources": {"gpus": 1, "cpu": 0.25}})).await;
    // Another tenant's 1-GPU job waits for the GPU, and looks for the strays when it starts.
    let bob = env.member("team-b", "bob", "member").await;
    // `[t]rainyard-...` matches the strays' names, not this script's or grep's own command line.
    let pattern = format!("[t]{}", &marker[1..]);
    let check = format!("if grep -qs '{pattern}' /proc/[0-9]*/cmdline; then echo STRAYS LIVE; exit 9; fi; echo clean");
    let (status, job) = env
        .post("/api/v1/jobs", &bob, &json!({"command": ["sh", "-c", check], "resources": {"gpus": 1, "cpu": 0.25}}))
        .await;
    assert_eq!(status, StatusCode::CREATED, "{job}");
    let b = job["id"].as_str().unwrap().to_string();

    let job_a = env.wait_state(&a, "succeeded", Duration::from_secs(60)).await;
    let ended = Instant::now();
    while !processes_running(&marker).is_empty() {
        assert!(
            ended.elapsed() < Duration::from_secs(15),
            "strays outlived their job {job_a}: {:?}",
            processes_running(&marker)
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let job_b = env.wait_job_as(&bob, &b, Duration::from_secs(60), |j| j["finished_at"].is_string()).await;
    assert_eq!(job_b["state"], "succeeded", "team-b's job found A's strays alive on the GPU: {job_b}");
}

/// A job over its memory request is OOM-killed with a reason that names the limit; a fork bomb
/// stops at the process limit; the server answers throughout and another job runs beside them.
#[tokio::test(flavor = "multi_thread")]
async fn a_job_is_held_to_its_memory_and_process_limits() {
    require_root();
    let env = TestEnv::start_with(&["--pids-limit", "64"]).await;
    // Debian's Python: every tenant's user can run it.
    let python = "/usr/bin/python3";
    let hog = env
        .submit(json!({
            "command": [python, "-c", "b = bytearray(600 << 20); print('held', len(b))"],
            "resources": {"memory": "128Mi", "cpu": 0.5},
        }))
        .await;
    let bomb_marker = format!("trainyard-bomb-{}", std::process::id());
    let bomb = env
        .submit(json!({
            "command": [python, "-c", format!(
                "import os, time\n\
                 # {bomb_marker}\n\
                 forked = 0\n\
                 for _ in range(300):\n\
                 \x20   try:\n\
                 \x20       pid = os.fork()\n\
                 \x20   except OSError as err:\n\
                 \x20       print('fork refused:', err.strerror)\n\
                 \x20       break\n\
                 \x20   if pid == 0:\n\
                 \x20       time.sleep(60)\n\
                 \x20       os._exit(0)\n\
                 \x20   forked += 1\n\
                 print(f'live={{forked}}')\n")],
            "resources": {"cpu": 0.5},
        }))
        .await;
    let bystander = env.submit(json!({"command": ["sh", "-c", "echo still fine"], "resources": {"cpu": 0.25}})).await;

    let job = env.wait_job(&hog, Duration::from_secs(60), |j| j["finished_at"].is_string()).await;
    assert_eq!(job["state"], "failed", "{job}");
    let reason = job["reason"].as_str().unwrap_or_default();
    assert!(
        reason.contains("OOMKilled") && reason.contains("128 MiB"),
        "the reason names the kill and the limit: {job}"
    );

    env.wait_state(&bomb, "succeeded", Duration::from_secs(60)).await;
    let log = trainyard_tests::stdout(&env.yard(&env.admin_token, &["logs", &bomb]));
    let live: u32 = log
        .lines()
        .find_map(|l| l.strip_prefix("live="))
        .and_then(|n| n.trim().parse().ok())
        .unwrap_or_else(|| panic!("the bomb's log: {log}"));
    assert!(live < 64 && log.contains("fork refused"), "the bomb stopped at the process limit: {log}");
    let ended = Instant::now();
    while !processes_running(&bomb_marker).is_empty() {
        assert!(ended.elapsed() < Duration::from_secs(15), "the bomb's sleepers outlived it");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }

    env.wait_state(&bystander, "succeeded", Duration::from_secs(60)).await;
    let (status, _) = env.get("/readyz", &env.admin_token).await;
    assert_eq!(status, StatusCode::OK, "the server is unaffected");
}

/// A running job whose row no longer decodes (its stored spec as a later version might write
/// it): its GPU stays its own (another job waits, counted by the scheduler and held by the
/// executor), and a cancel still stops its processes, ends it `cancelled` and frees the GPU.
#[tokio::test(flavor = "multi_thread")]
async fn a_running_job_whose_row_no_longer_decodes_keeps_its_gpu_and_can_be_cancelled() {
    let env = TestEnv::start_with(&["--simulate-gpus", "1"]).await;
    let path = "/api/v1/admin/tenants/default/quotas/simulated-gpu";
    let (status, body) =
        env.call(reqwest::Method::PUT, path, Some(&env.admin_token), Some(&json!({"nominal": 1}))).await;
    assert!(status.is_success(), "{body}");
    let marker = format!("trainyard-unreadable-{}", std::process::id());
    let script = format!("exec -a {marker} sleep 300");
    let a = env.submit(json!({"command": ["bash", "-c", script], "resources": {"gpus": 1, "cpu": 0.25}})).await;
    env.wait_state(&a, "running", Duration::from_secs(30)).await;
    let id: uuid::Uuid = a.parse().unwrap();
    let state = |id: uuid::Uuid| {
        let pool = env.db.pool.clone();
        async move {
            sqlx::query_as::<_, (String, Option<String>)>("SELECT state, reason FROM jobs WHERE id = $1")
                .bind(id)
                .fetch_one(&pool)
                .await
                .unwrap()
        }
    };
    sqlx::query("UPDATE jobs SET spec = jsonb_set(spec, '{command}', '\"no longer a list\"') WHERE id = $1")
        .bind(id)
        .execute(&env.db.pool)
        .await
        .unwrap();
    let noted = Instant::now();
    while !state(id).await.1.unwrap_or_default().contains("cannot be handled") {
        assert!(noted.elapsed() < Duration::from_secs(15), "the unreadable row is not noted: {:?}", state(id).await);
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let b = env.submit(json!({"command": ["true"], "resources": {"gpus": 1, "cpu": 0.25}})).await;
    tokio::time::sleep(Duration::from_secs(3)).await;
    let waiting = state(b.parse().unwrap()).await;
    assert_eq!(waiting.0, "queued", "the next job must wait for the GPU the unreadable one holds: {waiting:?}");
    assert!(!processes_running(&marker).is_empty(), "the unreadable job runs on");

    let (status, body) = env.post(&format!("/api/v1/jobs/{a}/cancel"), &env.admin_token, &json!({})).await;
    assert!(status.is_success(), "{status} {body}");
    let asked = Instant::now();
    while state(id).await.0 != "cancelled" || !processes_running(&marker).is_empty() {
        assert!(
            asked.elapsed() < Duration::from_secs(30),
            "the unreadable job did not stop: {:?}, processes {:?}",
            state(id).await,
            processes_running(&marker)
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    println!("cancelled after {:?}: {:?}", asked.elapsed(), state(id).await);
    env.wait_state(&b, "succeeded", Duration::from_secs(30)).await;
}

/// A replica in its own PID namespace, as the local executor starts it as root: it is PID 2
/// (its supervisor is 1) and its `/proc` lists its own processes only; a signal ends it as
/// before (recorded as that signal); what it leaves running, even in a session of its own, ends
/// with it.
#[tokio::test(flavor = "multi_thread")]
async fn a_replica_in_its_own_pid_namespace_sees_only_its_processes_and_leaves_nothing_behind() {
    use trainyard_executor::local::{DEFAULT_PIDS_LIMIT, LocalConfig, LocalExecutor};
    use trainyard_executor::{AttemptRef, Executor, LaunchRequest, ReplicaStatus};
    require_root();
    let dir = tempfile::tempdir().unwrap();
    let executor = LocalExecutor::new(LocalConfig {
        data_dir: dir.path().to_path_buf(),
        supervisor: trainyard_tests::bin("trainyard-shim"),
        cpus: Some(2.0),
        memory_bytes: None,
        simulated_gpus: None,
        shard_cache_bytes: None,
        shard_cache_tenant_bytes: None,
        pids_limit: DEFAULT_PIDS_LIMIT,
        cpu_hard_limit: false,
        cgroups: true,
        pid_namespace: true,
    })
    .unwrap();
    assert_eq!(executor.node_warnings(), Vec::<String>::new(), "fully confined here, PID namespaces too");
    let run = |script: String| {
        let executor = &executor;
        let data = dir.path().to_path_buf();
        async move {
            let spec = serde_json::from_value(json!({"command": ["sh", "-c", script], "args": [], "env": {},
                "resources": {"cpu": 0.5, "memory": "256Mi"}, "replicas": 1}))
            .unwrap();
            let request = LaunchRequest {
                job_id: uuid::Uuid::now_v7(),
                tenant_id: uuid::Uuid::from_u128(7),
                tenant: "pidns".into(),
                attempt: 1,
                spec,
                files: Default::default(),
                env: Default::default(),
                env_by_rank: Vec::new(),
                code: Vec::new(),
                nodes: Vec::new(),
            };
            let placement = executor.launch(&request).await.unwrap();
            let attempt = AttemptRef { job_id: request.job_id, attempt: 1, replicas: 1, placement: Some(placement) };
            let started = Instant::now();
            let status = loop {
                match executor.observe(&attempt).await[..] {
                    [ReplicaStatus::Running] => {
                        assert!(started.elapsed() < Duration::from_secs(20), "the replica did not end");
                        tokio::time::sleep(Duration::from_millis(20)).await;
                    }
                    [status] => break status,
                    ref other => panic!("{other:?}"),
                }
            };
            let log = std::fs::read_to_string(data.join(format!("jobs/{}/attempt-1/replica-0.log", request.job_id)));
            (status, log.unwrap_or_default(), attempt)
        }
    };
    let (status, log, attempt) = run("echo pid $$; echo listed $(ls /proc | grep -c '^[0-9]')".into()).await;
    executor.release(&attempt).await;
    assert_eq!(status, ReplicaStatus::Exited(0), "{log}");
    assert!(log.contains("pid 2\n"), "the replica is PID 2 of its namespace: {log}");
    let listed: u32 = log.split("listed ").nth(1).and_then(|rest| rest.trim().parse().ok()).unwrap_or(99);
    assert!(listed <= 5, "its /proc lists its supervisor, sh, ls and grep, not the machine's: {log}");
    let (status, log, attempt) = run("kill -TERM $$".into()).await;
    executor.release(&attempt).await;
    assert_eq!(status, ReplicaStatus::Exited(143), "a signal ends it as before: {log}");

    let marker = format!("trainyard-pidns-{}", std::process::id());
    let (status, log, attempt) = run(format!("setsid sh -c 'exec -a {marker} sleep 300' & sleep 0.3; exit 0")).await;
    assert_eq!(status, ReplicaStatus::Exited(0), "{log}");
    // Before the release kills its cgroup: the namespace's end alone took them.
    let ended = Instant::now();
    while !processes_running(&marker).is_empty() {
        assert!(
            ended.elapsed() < Duration::from_secs(2),
            "left running after the replica: {:?}",
            processes_running(&marker)
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    executor.release(&attempt).await;
}
