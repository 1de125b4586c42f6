//! Crashes inside launches: the control plane is killed (SIGKILL) at the worst moments and comes
//! back. Every replica writes a marker when it starts (`<job>.<attempt>.<rank>.<pid>`, holding
//! its start time and GPUs, then its end time), so the tests see from the outside what ran:
//! every job ends with its true outcome, no (job, attempt, rank) starts twice, none is missing,
//! no process is left, and no GPU is held by two live replicas at once.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use serde_json::{Value, json};
use trainyard_tests::{TestEnv, group_alive, job_process_groups};

const PAUSE: &str = "TRAINYARD_FAULT_LAUNCH_PAUSE";

/// A replica that leaves its marker, runs `seconds`, and notes its end.
fn marking(markers: &Path, replicas: u32, gpus: u32, seconds: f64) -> Value {
    let script = format!(
        "f='{}/'\"$TRAINYARD_JOB_ID.$TRAINYARD_ATTEMPT.$RANK.$$\"; echo \"$(date +%s%N) $CUDA_VISIBLE_DEVICES\" > \"$f\"; \
         sleep {seconds}; date +%s%N >> \"$f\"",
        markers.display()
    );
    json!({"command": ["sh", "-c", script], "replicas": replicas, "resources": {"cpu": 0.25, "gpus": gpus}})
}

/// One replica start as its marker tells it.
#[derive(Debug)]
struct Start {
    job: String,
    attempt: u32,
    rank: u32,
    started: u128,
    ended: Option<u128>,
    gpus: BTreeSet<String>,
}

fn starts(markers: &Path) -> Vec<Start> {
    let mut starts = Vec::new();
    for entry in std::fs::read_dir(markers).unwrap().flatten() {
        let name = entry.file_name().to_string_lossy().into_owned();
        let parts: Vec<&str> = name.split('.').collect();
        let text = std::fs::read_to_string(entry.path()).unwrap();
        let mut lines = text.lines();
        let mut first = lines.next().unwrap_or_default().split_whitespace();
        starts.push(Start {
            job: parts[0].to_string(),
            attempt: parts[1].parse().unwrap(),
            rank: parts[2].parse().unwrap(),
            started: first.next().and_then(|t| t.parse().ok()).unwrap_or(0),
            gpus: first.next().unwrap_or_default().split(',').filter(|g| !g.is_empty()).map(str::to_string).collect(),
            ended: lines.next().and_then(|t| t.trim().parse().ok()),
        });
    }
    starts
}

/// A folder every replica may write its marker into (replicas run as their tenant's user).
fn marker_dir(env: &TestEnv) -> PathBuf {
    let markers = env.dir.path().join("markers");
    std::fs::create_dir_all(&markers).unwrap();
    std::fs::set_permissions(&markers, std::os::unix::fs::PermissionsExt::from_mode(0o1777)).unwrap();
    markers
}

fn wait_for_file(path: &Path, timeout: Duration) {
    let deadline = Instant::now() + timeout;
    while !path.exists() {
        assert!(Instant::now() < deadline, "{} did not appear", path.display());
        std::thread::sleep(Duration::from_millis(20));
    }
}

fn attempt_dir(env: &TestEnv, job: &str, attempt: u32) -> PathBuf {
    env.data_dir().join("jobs").join(job).join(format!("attempt-{attempt}"))
}

/// Each (job, attempt, rank) started once; the ranks of every job's attempt all started.
fn assert_each_rank_started_once(markers: &Path, jobs: &BTreeMap<String, u32>) {
    let mut seen: BTreeMap<(String, u32, u32), usize> = BTreeMap::new();
    for start in starts(markers) {
        *seen.entry((start.job, start.attempt, start.rank)).or_default() += 1;
    }
    for (key, count) in &seen {
        assert_eq!(*count, 1, "{key:?} started {count} times");
    }
    for (job, replicas) in jobs {
        for rank in 0..*replicas {
            assert!(seen.contains_key(&(job.clone(), 1, rank)), "job {job} rank {rank} never started");
        }
        assert!(!seen.keys().any(|(j, attempt, _)| j == job && *attempt > 1), "job {job} needed a second attempt");
    }
}

/// Killed after the launch's intent is stored and before its first replica starts, the server
/// comes back and the job runs once, in its first attempt, and succeeds.
#[tokio::test(flavor = "multi_thread")]
async fn a_crash_before_the_first_replica_starts_runs_the_job_once() {
    let mut env = TestEnv::start_with_env(&[], &[(PAUSE.into(), "0:60000".into())]).await;
    let markers = marker_dir(&env);
    let id = env.submit(marking(&markers, 2, 0, 0.5)).await;
    wait_for_file(&attempt_dir(&env, &id, 1).join("intent.json"), Duration::from_secs(30));
    env.restart_after_crash_with_env(&[]);
    let job = env.wait_state(&id, "succeeded", Duration::from_secs(30)).await;
    assert_eq!(job["restart_count"], 0, "nothing was charged to the job: {job}");
    assert_each_rank_started_once(&markers, &BTreeMap::from([(id.clone(), 2)]));
}

/// Killed after replica 0 started and before replica 1: the restarted server adopts rank 0 and
/// starts only rank 1, in the same attempt, at the same rendezvous.
#[tokio::test(flavor = "multi_thread")]
async fn a_crash_between_two_replicas_starts_the_missing_rank_only() {
    let mut env = TestEnv::start_with_env(&[], &[(PAUSE.into(), "1:60000".into())]).await;
    let markers = marker_dir(&env);
    let id = env.submit(marking(&markers, 2, 0, 2.0)).await;
    wait_for_file(&attempt_dir(&env, &id, 1).join("replica-0.pid"), Duration::from_secs(30));
    env.restart_after_crash_with_env(&[]);
    let job = env.wait_state(&id, "succeeded", Duration::from_secs(30)).await;
    assert_eq!(job["restart_count"], 0, "{job}");
    assert_each_rank_started_once(&markers, &BTreeMap::from([(id.clone(), 2)]));
    let (_, attempts) = env.get(&format!("/api/v1/jobs/{id}/attempts"), &env.admin_token).await;
    let placement = &attempts[0]["placement"];
    assert_eq!(placement["replicas"].as_array().unwrap().len(), 2, "both ranks in the one attempt: {attempts}");
}

/// A bounded chaos run: two dozen short jobs of one and two replicas on 4 simulated GPUs, the
/// server killed five times at random moments while every two-replica launch pauses between its
/// ranks (so that kills land inside launches). Every job succeeds in its first attempt, no rank
/// starts twice or never, no GPU is held by two live replicas at once, no process is left.
#[tokio::test(flavor = "multi_thread")]
async fn chaos_kills_inside_launches_lose_and_duplicate_nothing() {
    let fault = vec![(PAUSE.to_string(), "1:700".to_string())];
    let mut env = TestEnv::start_with_env(&["--simulate-gpus", "4"], &fault).await;
    let quota = json!({"nominal": 4});
    let (status, body) = env
        .call(
            reqwest::Method::PUT,
            "/api/v1/admin/tenants/default/quotas/simulated-gpu",
            Some(&env.admin_token),
            Some(&quota),
        )
        .await;
    assert!(status.is_success(), "{body}");
    let markers = marker_dir(&env);
    let seed = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap().as_nanos() as u64;
    println!("chaos seed {seed}");
    let mut rng = seed | 1;
    let mut next = move |below: u64| {
        rng ^= rng << 13;
        rng ^= rng >> 7;
        rng ^= rng << 17;
        rng % below
    };
    let mut jobs = BTreeMap::new();
    for i in 0..24 {
        let replicas = 1 + (i % 2);
        let seconds = 0.2 + next(6) as f64 / 10.0;
        let id = env.submit(marking(&markers, replicas, 1, seconds)).await;
        jobs.insert(id, replicas);
    }
    for kill in 0..5 {
        tokio::time::sleep(Duration::from_millis(200 + next(800))).await;
        if kill % 2 == 0 {
            // Inside a launch: rank 0 started, rank 1 not yet.
            let two_replica: Vec<&String> = jobs.iter().filter(|(_, r)| **r == 2).map(|(id, _)| id).collect();
            let deadline = Instant::now() + Duration::from_secs(10);
            while !two_replica.iter().any(|id| {
                let dir = attempt_dir(&env, id, 1);
                dir.join("replica-0.pid").exists() && !dir.join("replica-1.pid").exists()
            }) {
                assert!(Instant::now() < deadline, "no launch paused between its ranks");
                tokio::time::sleep(Duration::from_millis(10)).await;
            }
        }
        env.restart_after_crash_with_env(&fault);
    }
    for id in jobs.keys() {
        let job = env.wait_state(id, "succeeded", Duration::from_secs(120)).await;
        assert_eq!(job["restart_count"], 0, "a crash of the control plane is not the job's failure: {job}");
    }
    assert_each_rank_started_once(&markers, &jobs);

    let starts = starts(&markers);
    for (i, a) in starts.iter().enumerate() {
        for b in &starts[i + 1..] {
            let overlap = a.started < b.ended.unwrap_or(u128::MAX) && b.started < a.ended.unwrap_or(u128::MAX);
            let shared: Vec<&String> = a.gpus.intersection(&b.gpus).collect();
            assert!(!overlap || shared.is_empty(), "GPU {shared:?} held at once by {a:?} and {b:?}");
        }
    }
    let log = std::fs::read_to_string(env.data_dir().join("server.log")).unwrap();
    assert!(log.contains("resumed an interrupted launch"), "a kill landed inside a launch");
    tokio::time::sleep(Duration::from_millis(300)).await;
    let left: Vec<u32> = job_process_groups(&env.data_dir()).into_iter().filter(|g| group_alive(*g)).collect();
    assert!(left.is_empty(), "processes left behind: {left:?}");
}

/// The state of a job, read from the database (the server may be paused).
async fn state_of(env: &TestEnv, id: &str) -> String {
    sqlx::query_scalar("SELECT state FROM jobs WHERE id = $1::uuid").bind(id).fetch_one(&env.db.pool).await.unwrap()
}

/// Leadership is a lease with a fencing epoch. The leader is paused (SIGSTOP) in the middle of a
/// launch, past its lease; the standby (same machine, same data directory) takes over and runs
/// new work. When the old leader resumes it abandons its launch, or finishes it and the database
/// refuses its write (each counted on its /readyz); the standby adopts what it started: every
/// rank once.
#[tokio::test(flavor = "multi_thread")]
async fn a_leader_paused_past_its_lease_is_fenced_and_nothing_runs_twice() {
    // The default lease (3 s): the takeover asserted below is the one users get.
    let env = TestEnv::start_with_env(&[], &[(PAUSE.into(), "1:6000".into())]).await;
    // The first server leads before the standby starts (else the standby may win the lease,
    // and the server paused below would not be the one launching: a CI run saw that).
    let deadline = Instant::now() + Duration::from_secs(15);
    while env.call(reqwest::Method::GET, "/readyz", None, None).await.1["leader"] != true {
        assert!(Instant::now() < deadline, "the first server never took the lead");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let standby = trainyard_tests::ServerProcess::start(&env.db.url, &env.data_dir());
    let markers = marker_dir(&env);

    let paused = env.submit(marking(&markers, 2, 0, 1.0)).await;
    wait_for_file(&attempt_dir(&env, &paused, 1).join("replica-0.pid"), Duration::from_secs(30));
    let leader = nix::unistd::Pid::from_raw(env.server.pid() as i32);
    nix::sys::signal::kill(leader, nix::sys::signal::Signal::SIGSTOP).unwrap();
    let stopped_at = Instant::now();

    // Submitted through the standby while the leader is paused: the standby takes over and runs it.
    let response = reqwest::Client::new()
        .post(format!("{}/api/v1/jobs", standby.url))
        .bearer_auth(&env.admin_token)
        .json(&marking(&markers, 1, 0, 0.1))
        .send()
        .await
        .unwrap();
    assert_eq!(response.status(), reqwest::StatusCode::CREATED);
    let other = response.json::<Value>().await.unwrap()["id"].as_str().unwrap().to_string();
    while state_of(&env, &other).await == "queued" {
        assert!(stopped_at.elapsed() < Duration::from_secs(15), "the standby never took over");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let takeover = stopped_at.elapsed();
    println!("takeover (leader paused -> first admission by the new leader): {takeover:?}");
    assert!(takeover < Duration::from_secs(5), "takeover took {takeover:?}");
    tokio::time::sleep(Duration::from_secs(1)).await;
    nix::sys::signal::kill(leader, nix::sys::signal::Signal::SIGCONT).unwrap();

    let deadline = Instant::now() + Duration::from_secs(30);
    for id in [&paused, &other] {
        while state_of(&env, id).await != "succeeded" {
            assert!(Instant::now() < deadline, "job {id} is {}", state_of(&env, id).await);
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }
    assert_each_rank_started_once(&markers, &BTreeMap::from([(paused.clone(), 2), (other.clone(), 1)]));
    // The old leader's launch either went on and its write was refused (fencing), or it was
    // cut short when the leader found its lease lost; which one depends on which of the two woke
    // first after SIGCONT. Either way it wrote nothing, and the standby adopted rank 0.
    let (_, readiness) = env.call(reqwest::Method::GET, "/readyz", None, None).await;
    let (fenced, abandoned) =
        (readiness["fenced_writes"].as_u64().unwrap(), readiness["abandoned_launches"].as_u64().unwrap());
    println!("old leader: {fenced} writes refused, {abandoned} launches abandoned");
    assert!(fenced + abandoned >= 1, "the old leader's launch was refused or abandoned: {readiness}");
    assert_eq!(readiness["leader"], false, "{readiness}");
}

/// The database goes away for 10 s (every connection cut, new ones refused, through a proxy)
/// while a launch is under way and clients keep submitting: submits are answered 503 while it
/// is away and none acknowledged is lost; no job fails because of it; the interrupted launch
/// is resumed with a note naming the error, and every rank runs once.
#[tokio::test(flavor = "multi_thread")]
async fn a_database_outage_during_launches_and_submits_fails_nothing() {
    let (env, proxy) = TestEnv::start_behind_proxy(&[], &[(PAUSE.into(), "1:1500".into())]).await;
    let markers = marker_dir(&env);
    let mut jobs = BTreeMap::new();
    for _ in 0..3 {
        jobs.insert(env.submit(marking(&markers, 2, 0, 0.5)).await, 2);
    }
    let first = jobs.keys().next().unwrap().clone();
    wait_for_file(&attempt_dir(&env, &first, 1).join("replica-0.pid"), Duration::from_secs(30));
    proxy.cut();
    let cut_at = Instant::now();
    let mut refused = 0;
    while cut_at.elapsed() < Duration::from_secs(10) {
        let (status, body) = env.post("/api/v1/jobs", &env.admin_token, &marking(&markers, 1, 0, 0.1)).await;
        match status {
            trainyard_tests::StatusCode::CREATED => {
                jobs.insert(body["id"].as_str().unwrap().to_string(), 1);
            }
            trainyard_tests::StatusCode::SERVICE_UNAVAILABLE => refused += 1,
            other => panic!("a submit during the outage got {other}: {body}"),
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    proxy.restore();
    assert!(refused > 0, "the database was away and submits said so");
    for id in jobs.keys() {
        let job = env.wait_state(id, "succeeded", Duration::from_secs(60)).await;
        assert_eq!(job["restart_count"], 0, "the outage is not the job's failure: {job}");
    }
    assert_each_rank_started_once(&markers, &jobs);
    let (_, events) = env.get(&format!("/api/v1/jobs/{first}/events"), &env.admin_token).await;
    assert!(
        events
            .as_array()
            .unwrap()
            .iter()
            .any(|e| e["reason"].as_str().is_some_and(|r| r.contains("control-plane error"))),
        "the interrupted launch's job names the retried error: {events}"
    );
}

/// After a restart the local executor knows nothing held until it sees attempts. The launch of
/// an interrupted attempt is resumed as a task of its own, so the pass first tells the executor
/// (`Executor::launch_resuming`), which holds the GPUs the launch's intent chose from that
/// moment: a new launch beside it cannot take them. (A chaos run once found two jobs on one GPU
/// when the hold came only with the resumed task.) Two executors on one data directory stand
/// for the server before and after its restart.
#[tokio::test(flavor = "multi_thread")]
async fn a_resumed_launch_holds_its_gpus_before_any_launch_beside_it() {
    use trainyard_executor::local::{LocalConfig, LocalExecutor};
    use trainyard_executor::{AttemptRef, Executor, LaunchRequest};
    use uuid::Uuid;
    let dir = tempfile::tempdir().unwrap();
    let config = || LocalConfig {
        data_dir: dir.path().to_path_buf(),
        supervisor: trainyard_tests::bin("trainyard-shim"),
        cpus: Some(4.0),
        memory_bytes: None,
        simulated_gpus: Some((2, "simulated-gpu".into())),
        shard_cache_bytes: None,
        shard_cache_tenant_bytes: None,
        pids_limit: trainyard_executor::local::DEFAULT_PIDS_LIMIT,
        cpu_hard_limit: false,
        cgroups: true,
        pid_namespace: true,
    };
    let request = |job: u128| LaunchRequest {
        job_id: Uuid::from_u128(job),
        tenant_id: Uuid::from_u128(1),
        tenant: "default".into(),
        attempt: 1,
        spec: serde_json::from_value(json!({"command": ["sleep", "30"], "args": [], "env": {},
            "resources": {"cpu": 0.25, "memory": "64Mi", "gpus": 2}, "replicas": 1}))
        .unwrap(),
        files: BTreeMap::new(),
        env: BTreeMap::new(),
        env_by_rank: Vec::new(),
        code: Vec::new(),
        nodes: Vec::new(),
    };
    let before = LocalExecutor::new(config()).unwrap();
    let placement = before.launch(&request(10)).await.expect("the first job takes both GPUs");
    drop(before);

    let after = LocalExecutor::new(config()).unwrap();
    after.launch_resuming(Uuid::from_u128(10), 1);
    let refused = after.launch(&request(11)).await.expect_err("both GPUs are the resumed attempt's");
    assert!(refused.to_string().contains("not free"), "{refused}");
    let attempt = AttemptRef { job_id: Uuid::from_u128(10), attempt: 1, replicas: 1, placement: Some(placement) };
    after.terminate(&attempt, Duration::from_secs(1)).await;
    let deadline = Instant::now() + Duration::from_secs(10);
    while after.observe(&attempt).await.contains(&trainyard_executor::ReplicaStatus::Running) {
        assert!(Instant::now() < deadline, "the first job's replica did not stop");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    after.release(&attempt).await;
}

/// Servers of several data directories on one machine share its cgroups (tests do, and so may
/// two deployments): one's garbage collection takes none of the other's replicas, however long
/// they have run, and its own strays only once their launch has settled and their supervisor
/// ended.
#[tokio::test(flavor = "multi_thread")]
async fn garbage_collection_takes_no_replica_of_another_data_directory() {
    use trainyard_executor::local::{LocalConfig, LocalExecutor};
    use trainyard_executor::{AttemptRef, Executor, LaunchRequest, ReplicaStatus};
    use uuid::Uuid;
    let config = |dir: &Path| LocalConfig {
        data_dir: dir.to_path_buf(),
        supervisor: trainyard_tests::bin("trainyard-shim"),
        cpus: Some(4.0),
        memory_bytes: None,
        simulated_gpus: None,
        shard_cache_bytes: None,
        shard_cache_tenant_bytes: None,
        pids_limit: trainyard_executor::local::DEFAULT_PIDS_LIMIT,
        cpu_hard_limit: false,
        cgroups: true,
        pid_namespace: true,
    };
    let (mine, theirs) = (tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());
    let (mine, theirs) =
        (LocalExecutor::new(config(mine.path())).unwrap(), LocalExecutor::new(config(theirs.path())).unwrap());
    let job = Uuid::now_v7();
    let request = LaunchRequest {
        job_id: job,
        tenant_id: Uuid::from_u128(1),
        tenant: "default".into(),
        attempt: 1,
        spec: serde_json::from_value(json!({"command": ["sleep", "30"], "args": [], "env": {},
            "resources": {"cpu": 0.25, "memory": "64Mi"}, "replicas": 1}))
        .unwrap(),
        files: BTreeMap::new(),
        env: BTreeMap::new(),
        env_by_rank: Vec::new(),
        code: Vec::new(),
        nodes: Vec::new(),
    };
    let placement = theirs.launch(&request).await.unwrap();
    let attempt = AttemptRef { job_id: job, attempt: 1, replicas: 1, placement: Some(placement) };
    // Nothing is live for `mine`: everything on the machine is someone else's or a stray.
    assert_eq!(mine.garbage_collect(&[]).await, 0, "another data directory's replica is not a stray");
    assert_eq!(theirs.garbage_collect(&[]).await, 0, "a launch that has not settled is not a stray");
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert_eq!(theirs.observe(&attempt).await, [ReplicaStatus::Running]);
    theirs.terminate(&attempt, Duration::from_millis(200)).await;
    let deadline = Instant::now() + Duration::from_secs(10);
    while theirs.observe(&attempt).await.contains(&ReplicaStatus::Running) {
        assert!(Instant::now() < deadline, "the replica did not stop");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    theirs.release(&attempt).await;
}

/// `yard` goes on through a short database outage: a listing, and a submit with the code it
/// ships, are answered 503 while the database is away; yard sends them again after the
/// server's `Retry-After` (doubling), saying so, and both succeed once it is back. The submit
/// carries an idempotency key yard made, so however often it was sent, one job exists.
#[tokio::test(flavor = "multi_thread")]
async fn yard_tries_again_through_a_short_database_outage_and_submits_once() {
    let (env, proxy) = TestEnv::start_behind_proxy(&[], &[]).await;
    proxy.cut();
    let token = env.admin_token.clone();
    let (listed, submitted) = tokio::task::block_in_place(|| {
        std::thread::scope(|threads| {
            let listed = threads.spawn(|| env.yard(&token, &["jobs", "ls"]));
            let submitted = threads.spawn(|| env.yard(&token, &["submit", "--name", "through", "--", "true"]));
            std::thread::sleep(Duration::from_millis(2500));
            proxy.restore();
            (listed.join().unwrap(), submitted.join().unwrap())
        })
    });
    for (what, ran) in [("jobs ls", &listed), ("submit", &submitted)] {
        let err = trainyard_tests::stderr(ran);
        assert!(ran.status.success(), "yard {what} gave up: {err}");
        assert!(err.contains("the database is not answering") && err.contains("trying again in"), "{what}: {err}");
    }
    let (_, jobs) = env.get("/api/v1/jobs?name=through", &env.admin_token).await;
    let items = jobs["items"].as_array().unwrap();
    assert_eq!(items.len(), 1, "one job however often its submit was sent: {jobs}");
    assert!(items[0]["idempotency_key"].as_str().is_some_and(|k| k.starts_with("yard-")), "{jobs}");
}

/// The leadership fault of issue 37, repeated: the leader launches GPU jobs, is paused past its
/// lease while the other server sees them end, resumes (now a standby, its own table still
/// holding their GPUs), and the other is killed, so the first leads again. Every GPU job it then
/// admits runs: what a server holds follows the attempts that are not over in the database, not
/// what it remembers. Twice over, 0 healthy jobs may fail.
#[tokio::test(flavor = "multi_thread")]
async fn a_leader_that_regains_the_lead_fails_no_healthy_job() {
    let gpus = ["--simulate-gpus", "2"];
    let env = TestEnv::start_with(&gpus).await;
    let path = "/api/v1/admin/tenants/default/quotas/simulated-gpu";
    let (status, body) =
        env.call(reqwest::Method::PUT, path, Some(&env.admin_token), Some(&json!({"nominal": 2}))).await;
    assert!(status.is_success(), "{body}");
    let leader_of = |url: String| async move {
        reqwest::get(format!("{url}/readyz")).await.unwrap().json::<Value>().await.unwrap()["leader"] == true
    };
    let wait_leading = |url: String, what: &'static str| async move {
        let deadline = Instant::now() + Duration::from_secs(20);
        while !leader_of(url.clone()).await {
            assert!(Instant::now() < deadline, "{what} never took the lead");
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    };
    let gpu_job = json!({"command": ["sleep", "1"], "resources": {"gpus": 1, "cpu": 0.1}});
    let mut all = Vec::new();
    for round in 0..2 {
        wait_leading(env.server.url.clone(), "the first server").await;
        let mut other = trainyard_tests::ServerProcess::start_with(&env.db.url, &env.data_dir(), &gpus);
        // The first server launches two GPU jobs, then is paused past its lease.
        let held: Vec<String> = vec![env.submit(gpu_job.clone()).await, env.submit(gpu_job.clone()).await];
        for id in &held {
            while state_of(&env, id).await != "running" {
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
        }
        let first = nix::unistd::Pid::from_raw(env.server.pid() as i32);
        nix::sys::signal::kill(first, nix::sys::signal::Signal::SIGSTOP).unwrap();
        // The other server takes the lead and sees them end.
        let deadline = Instant::now() + Duration::from_secs(30);
        for id in &held {
            while state_of(&env, id).await != "succeeded" {
                assert!(Instant::now() < deadline, "round {round}: {id} is {}", state_of(&env, id).await);
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
        }
        nix::sys::signal::kill(first, nix::sys::signal::Signal::SIGCONT).unwrap();
        tokio::time::sleep(Duration::from_secs(1)).await;
        other.kill_hard();
        // The first server leads again and runs new GPU jobs on the GPUs it once held.
        wait_leading(env.server.url.clone(), "the first server, again").await;
        let mut fresh = Vec::new();
        for _ in 0..4 {
            fresh.push(env.submit(gpu_job.clone()).await);
        }
        for id in &fresh {
            let job = env.wait_job(id, Duration::from_secs(60), |j| j["finished_at"].is_string()).await;
            assert_eq!(
                job["state"], "succeeded",
                "round {round}: a healthy job failed after the lead came back: {job}"
            );
        }
        all.extend(held);
        all.extend(fresh);
    }
    for id in &all {
        assert_eq!(state_of(&env, id).await, "succeeded");
    }
}

/// Every kind of write the control loops make beside launching and observing (log archiving,
/// the retention sweep, finishing a tenant's removal, the pending reasons and notes) carries the
/// leader's epoch: a leader deposed by a takeover has each refused as fenced, and the new leader
/// makes the same calls. The check before deleting objects or a tenant's namespace likewise.
#[tokio::test(flavor = "multi_thread")]
async fn every_control_write_of_a_deposed_leader_is_refused_and_the_new_leaders_goes_through() {
    use trainyard_core::Error;
    use trainyard_store::{Store, audit::Audit, storage::RetentionDue};
    let db = trainyard_tests::TestDb::fresh().await;
    let (old, new) = (Store::from_pool(db.pool.clone()), Store::from_pool(db.pool.clone()));
    old.bootstrap("default", "admin").await.unwrap();
    let deposed = old.leadership_try(uuid::Uuid::now_v7(), Duration::from_millis(300)).await.unwrap().unwrap();
    tokio::time::sleep(Duration::from_millis(500)).await;
    let leader = new.leadership_try(uuid::Uuid::now_v7(), Duration::from_secs(60)).await.unwrap();
    let leader = leader.expect("the expired lease is taken over");
    assert!(leader.epoch() > deposed.epoch(), "a takeover increments the epoch");
    assert_eq!(old.control_epoch(), deposed.epoch(), "the deposed leader does not know it yet");

    let (job, tenant) = (uuid::Uuid::now_v7(), uuid::Uuid::now_v7());
    let due = RetentionDue { job_id: job, tenant_id: tenant, logs: true, artifacts: true };
    let audit = Audit::control_loop("tenant.removed", "tenant:gone");
    let mut refused = Vec::new();
    for store in [&old, &new] {
        let results: Vec<(&str, Result<(), Error>)> = vec![
            ("control_fence_check", store.control_fence_check().await),
            ("attempts_logs_archived", store.attempts_logs_archived(&[(job, 1)]).await),
            ("attempt_logs_archive_failed", store.attempt_logs_archive_failed(job, 1, Duration::from_secs(10)).await),
            ("retention_done", store.retention_done(&due).await),
            ("dataset_pushes_abandoned", store.dataset_pushes_abandoned(chrono::Duration::days(1), 10).await.map(drop)),
            ("node_datasets_forget_stale", store.node_datasets_forget_stale().await.map(drop)),
            ("tenant_removed", store.tenant_removed(tenant, &audit).await.map(drop)),
            ("tenant_objects_removed", store.tenant_objects_removed(tenant).await),
            ("job_note", store.job_note(job, "a note", "test").await.map(drop)),
            ("job_pending_reasons_set", store.job_pending_reasons_set(&[job], &["a reason".into()]).await),
        ];
        for (write, result) in results {
            if std::ptr::eq(store, &old) {
                match result {
                    Err(Error::Fenced(_)) => refused.push(write),
                    other => panic!("the deposed leader's {write} was not refused as fenced: {other:?}"),
                }
            } else {
                assert!(result.is_ok(), "the new leader's {write} failed: {result:?}");
            }
        }
    }
    println!("refused for the deposed leader: {}", refused.join(", "));
}

/// The completeness of the test above: every store function the control loops call that writes
/// (an INSERT, UPDATE or DELETE in its body) is fenced (`control_fence` in its body).
#[test]
fn every_store_write_the_control_loops_call_is_fenced() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("..");
    let read_all = |dir: &Path| -> Vec<String> {
        let mut texts = Vec::new();
        for entry in std::fs::read_dir(dir).unwrap() {
            let path = entry.unwrap().path();
            if path.extension().is_some_and(|e| e == "rs") {
                texts.push(std::fs::read_to_string(&path).unwrap());
            }
        }
        texts
    };
    let called = regex::Regex::new(r"store\s*\.\s*(\w+)\(").unwrap();
    let mut calls = BTreeSet::new();
    for text in read_all(&root.join("crates/server/src/control")) {
        calls.extend(called.captures_iter(&text).map(|c| c[1].to_string()));
    }
    // Each store function's body: from its `pub async fn` to the next one.
    let mut bodies = BTreeMap::new();
    let starts = regex::Regex::new(r"pub async fn (\w+)").unwrap();
    for text in read_all(&root.join("crates/store/src")) {
        let found: Vec<_> =
            starts.captures_iter(&text).map(|c| (c.get(0).unwrap().start(), c[1].to_string())).collect();
        for (i, (at, name)) in found.iter().enumerate() {
            let end = found.get(i + 1).map_or(text.len(), |next| next.0);
            bodies.insert(name.clone(), text[*at..end].to_string());
        }
    }
    let writes = regex::Regex::new(r"\b(INSERT INTO|UPDATE \w+( \w+)? SET|DELETE FROM)\b").unwrap();
    // Taking the lease is how an epoch starts; it cannot carry one.
    let unfenceable = ["leadership_try"];
    let unfenced: Vec<&String> = calls
        .iter()
        .filter(|name| !unfenceable.contains(&name.as_str()))
        .filter(|name| bodies.get(*name).is_some_and(|body| writes.is_match(body) && !body.contains("control_fence")))
        .collect();
    assert!(calls.len() > 15, "found only {} store calls in the control loops: {calls:?}", calls.len());
    assert!(unfenced.is_empty(), "control-loop writes without the leader's fence: {unfenced:?}");
}
