//! Kueue's scheduler benchmark (`test/performance/scheduler/configs/baseline`), reduced, end to
//! end through the whole control plane (issue #22): the real `trainyard serve` on a real
//! Postgres, tenants in cohorts with quotas made through the admin API, every job submitted
//! over HTTP at its arrival time by its tenant's own client, real processes on the local
//! executor that sleep their runtime, and the figures Kueue publishes computed from what the
//! server recorded.
//!
//! The reduced workload: 2 cohorts x 3 tenants, nominal 20 GPUs each with a borrowing limit of
//! 100, reclaim within the cohort and lower-priority preemption within a tenant; per tenant 70
//! small (1 GPU, 200 ms, one every 100 ms), 20 medium (5 GPUs, 500 ms, every 500 ms) and 10
//! large (20 GPUs, 1 s, every 1.2 s): 600 jobs. Layout (`Layout`): on the local executor one
//! simulated node with the cohorts' total (120 GPUs; Kueue's baseline has no topology either);
//! on the Kubernetes executor each cohort has nodes of its own, with a GPU type of its own, as
//! the simulator lays Kueue's baseline out (two of 30 GPUs per cohort here, three of 40 in the
//! whole baseline).
//!
//! Every replica writes a marker named `<job>.<attempt>.<rank>` when it starts and appends `end`
//! when it finishes, so the harness sees each attempt that ran and whether it was cut short.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use chrono::{DateTime, Utc};
use serde_json::{Value, json};
use trainyard_tests::{ServerProcess, StatusCode, TestEnv};

const GPU: &str = "sim-gpu";

/// The simulator's figures on each layout (`cargo run --release -p trainyard-scheduler --example
/// simulate -- kueue-baseline[-one-node]`, docs/PERFORMANCE.md), printed beside the replays':
/// launches as fast as admitted, and at most 300 a second (`--launches-per-s 300`, the rate
/// this 2-core machine launches at on the local replay when launches are what limits it).
const SIMULATOR_ONE_NODE: &str = "Trainyard's simulator, one 600-GPU node: wall 75.7 s; admission small 55.0 s, medium 39.6 s, large 0.2 s; \
     at 300 launches a second: 107.5 s; 70.6 / 41.2 / 0.2 s";
const SIMULATOR_NODES_PER_COHORT: &str = "Trainyard's simulator, three 40-GPU nodes per cohort: wall 66.3 s; admission small 45.1 s, medium 12.2 s, large 0.2 s; \
     at 300 launches a second: 107.5 s; 70.6 / 41.2 / 0.2 s";

/// One class of jobs of a tenant: how many, what each asks for, how long it runs, how often
/// one arrives.
#[derive(Debug, Clone, Copy)]
struct Class {
    name: &'static str,
    count: usize,
    gpus: u32,
    runtime: f64,
    interval: f64,
    priority: i32,
}

#[derive(Debug, Clone)]
struct Workload {
    cohorts: usize,
    tenants_per_cohort: usize,
    nominal: u64,
    borrowing_limit: u64,
    classes: Vec<Class>,
    /// GPUs per node where each cohort has nodes of its own (`Layout::NodesPerCohort`): a
    /// divisor of a cohort's capacity.
    node_gpus: u64,
}

impl Workload {
    /// Kueue's baseline shape at a sixth of its tenants and a fifth of its jobs per tenant.
    fn reduced() -> Workload {
        Workload {
            cohorts: 2,
            tenants_per_cohort: 3,
            nominal: 20,
            borrowing_limit: 100,
            classes: vec![
                Class { name: "small", count: 70, gpus: 1, runtime: 0.2, interval: 0.1, priority: 50 },
                Class { name: "medium", count: 20, gpus: 5, runtime: 0.5, interval: 0.5, priority: 100 },
                Class { name: "large", count: 10, gpus: 20, runtime: 1.0, interval: 1.2, priority: 200 },
            ],
            // A cohort's 60 GPUs on two nodes.
            node_gpus: 30,
        }
    }

    /// Kueue's baseline: 5 cohorts x 6 queues, 350 small / 100 medium / 50 large per queue:
    /// 15,000 jobs (`tests/bench/replay.sh`).
    fn baseline() -> Workload {
        let reduced = Workload::reduced();
        let counts = [350, 100, 50];
        Workload {
            cohorts: 5,
            tenants_per_cohort: 6,
            classes: reduced.classes.iter().zip(counts).map(|(class, count)| Class { count, ..*class }).collect(),
            // A cohort's 120 GPUs on three nodes, as in the simulator.
            node_gpus: 40,
            ..reduced
        }
    }

    /// Kueue's large-scale scenario (`configs/large-scale`, the 10-cohort version): 10 cohorts x
    /// 100 queues, per queue 35 small (1 GPU, 150 ms, one every 60 ms), 11 medium (5 GPUs,
    /// 350 ms, every 300 ms) and 4 large (20 GPUs, 700 ms, every 700 ms): 50,000 jobs, nearly
    /// all submitted in the first 3.3 s.
    fn large_scale() -> Workload {
        Workload {
            cohorts: 10,
            tenants_per_cohort: 100,
            nominal: 20,
            borrowing_limit: 100,
            classes: vec![
                Class { name: "small", count: 35, gpus: 1, runtime: 0.15, interval: 0.06, priority: 50 },
                Class { name: "medium", count: 11, gpus: 5, runtime: 0.35, interval: 0.3, priority: 100 },
                Class { name: "large", count: 4, gpus: 20, runtime: 0.7, interval: 0.7, priority: 200 },
            ],
            node_gpus: 40,
        }
    }

    fn jobs(&self) -> usize {
        self.classes.iter().map(|c| c.count).sum::<usize>() * self.tenants().len()
    }

    fn tenants(&self) -> Vec<(String, String)> {
        (0..self.cohorts)
            .flat_map(|c| (0..self.tenants_per_cohort).map(move |t| (format!("q{c}-{t}"), format!("cohort-{c}"))))
            .collect()
    }

    fn capacity(&self) -> u64 {
        self.nominal * (self.cohorts * self.tenants_per_cohort) as u64
    }
}

/// What the server recorded of one job.
#[derive(Debug, sqlx::FromRow)]
struct Outcome {
    id: uuid::Uuid,
    name: String,
    state: String,
    created_at: DateTime<Utc>,
    /// Its last admission (a preempted job is admitted again), and its first start running after it.
    admitted_at: Option<DateTime<Utc>>,
    running_at: Option<DateTime<Utc>>,
    finished_at: Option<DateTime<Utc>>,
    preemptions: i64,
}

/// The replica command: leaves its marker, sleeps its runtime, notes its end. Once it has slept
/// its runtime it ignores SIGTERM, so a stop that arrives between writing `end` and exiting
/// cannot turn a finished replica into a stopped one: a marker that says `end` belongs to a
/// replica that exited 0, as the control plane saw it.
fn job(markers: &Path, class: &Class) -> Value {
    let script = format!(
        "f='{}/'\"$TRAINYARD_JOB_ID.$TRAINYARD_ATTEMPT.$RANK\"; : > \"$f\"; sleep {}; trap '' TERM; echo end >> \"$f\"",
        markers.display(),
        class.runtime
    );
    json!({
        "name": class.name,
        "command": ["sh", "-c", script],
        "priority": class.priority,
        "resources": {"gpus": class.gpus, "cpu": 0.01, "memory": "16Mi"},
    })
}

/// The servers a client may submit to (one, or two replicas on one database), tried in turn.
struct Servers {
    urls: std::sync::RwLock<Vec<String>>,
}

impl Servers {
    /// Submits with an idempotency key, to each server in turn until one answers: a server
    /// killed mid-request costs a retry, never a second job.
    async fn submit(&self, http: &reqwest::Client, token: &str, mut body: Value, key: String) -> String {
        body["idempotency_key"] = Value::from(key);
        let deadline = Instant::now() + Duration::from_secs(60);
        let mut turn = 0;
        loop {
            let url = {
                let urls = self.urls.read().unwrap();
                urls[turn % urls.len()].clone()
            };
            turn += 1;
            let sent = http.post(format!("{url}/api/v1/jobs")).bearer_auth(token).json(&body).send().await;
            if let Ok(response) = sent
                && matches!(response.status(), StatusCode::CREATED | StatusCode::OK)
            {
                return response.json::<Value>().await.unwrap()["id"].as_str().unwrap().to_string();
            }
            assert!(Instant::now() < deadline, "no server took the submit of {body}");
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }
}

/// Where the replay's GPUs are, as the simulator lays them out or as Kueue's baseline (no topology).
#[derive(Debug, Clone, Copy, PartialEq)]
enum Layout {
    /// One simulated node holding every cohort's capacity, of one GPU type (the local executor).
    OneNode,
    /// Each cohort its own 40-GPU nodes, as many as its tenants' nominal quota fills, with a GPU
    /// type of its own that only its tenants have quota in: the simulator's layout.
    NodesPerCohort,
}

impl Layout {
    /// The GPU type cohort `cohort` ("cohort-<n>") has its quota in.
    fn gpu_type(self, cohort: &str) -> String {
        match self {
            Layout::OneNode => GPU.to_string(),
            Layout::NodesPerCohort => format!("{GPU}-{}", cohort.trim_start_matches("cohort-")),
        }
    }
}

async fn setup(env: &TestEnv, workload: &Workload, layout: Layout) -> BTreeMap<String, String> {
    let mut tokens = BTreeMap::new();
    let admin = &env.admin_token;
    for (tenant, cohort) in workload.tenants() {
        let gpu_type = layout.gpu_type(&cohort);
        let (status, body) = env.post("/api/v1/admin/tenants", admin, &json!({"name": tenant})).await;
        assert_eq!(status, StatusCode::CREATED, "{body}");
        let policy = json!({"cohort": cohort, "preempt_lower_priority": true});
        let path = format!("/api/v1/admin/tenants/{tenant}");
        assert_eq!(env.call(reqwest::Method::PATCH, &path, Some(admin), Some(&policy)).await.0, StatusCode::NO_CONTENT);
        let quota = json!({"nominal": workload.nominal, "borrowing_limit": workload.borrowing_limit});
        let path = format!("/api/v1/admin/tenants/{tenant}/quotas/{gpu_type}");
        let (status, body) = env.call(reqwest::Method::PUT, &path, Some(admin), Some(&quota)).await;
        assert_eq!(status, StatusCode::OK, "{body}");
        tokens.insert(tenant.clone(), env.member(&tenant, &format!("{tenant}-user"), "member").await);
    }
    // The statements counted are the replay's (when they are counted at all, see
    // `print_statements`).
    let _ = sqlx::query("SELECT pg_stat_statements_reset()").execute(&env.db.pool).await;
    tokens
}

/// Submits every job at its arrival time, each tenant's classes from their own client task.
async fn replay(
    workload: &Workload,
    servers: &std::sync::Arc<Servers>,
    tokens: &BTreeMap<String, String>,
    markers: &Path,
) -> Instant {
    let started = Instant::now();
    let mut tasks = Vec::new();
    // At most this many submits in flight over all clients: a thousand tenants' clients would
    // otherwise open thousands of connections at once (the large scenario submits 50,000 jobs
    // in 3.3 s). The baseline's 90 clients never reach it.
    let in_flight = std::sync::Arc::new(tokio::sync::Semaphore::new(128));
    for (tenant, token) in tokens {
        let http = reqwest::Client::new();
        for class in workload.classes.clone() {
            let (servers, token, tenant, markers, http, in_flight) = (
                std::sync::Arc::clone(servers),
                token.clone(),
                tenant.clone(),
                markers.to_path_buf(),
                http.clone(),
                std::sync::Arc::clone(&in_flight),
            );
            tasks.push(tokio::spawn(async move {
                for i in 0..class.count {
                    let at = started + Duration::from_secs_f64(i as f64 * class.interval);
                    tokio::time::sleep_until(at.into()).await;
                    let key = format!("{tenant}-{}-{i}", class.name);
                    let _turn = in_flight.acquire().await.unwrap();
                    servers.submit(&http, &token, job(&markers, &class), key).await;
                }
            }));
        }
    }
    for task in tasks {
        task.await.unwrap();
    }
    started
}

async fn wait_all_ended(env: &TestEnv, jobs: usize, timeout: Duration) {
    let deadline = Instant::now() + timeout;
    loop {
        let (total, ended): (i64, i64) = sqlx::query_as(
            "SELECT count(*), count(*) FILTER (WHERE state IN ('succeeded', 'failed', 'cancelled')) FROM jobs
             WHERE tenant_id IN (SELECT id FROM tenants WHERE name LIKE 'q%')",
        )
        .fetch_one(&env.db.pool)
        .await
        .unwrap();
        if total as usize == jobs && ended == total {
            return;
        }
        assert!(Instant::now() < deadline, "{ended} of {total} jobs ended (of {jobs}) in {timeout:?}");
        // The figures come from the recorded times, not from this wait; each look reads the whole
        // jobs table, CPU the replayed server would otherwise have.
        tokio::time::sleep(Duration::from_secs(1)).await;
    }
}

async fn outcomes(env: &TestEnv) -> Vec<Outcome> {
    sqlx::query_as(
        "SELECT j.id, j.name, j.state, j.created_at, j.finished_at,
                -- The last admission, as Kueue's recorder counts a workload's time to admission
                -- (re-set at each admission after an eviction) and the simulator does.
                (SELECT max(e.at) FROM job_events e WHERE e.job_id = j.id AND e.to_state = 'admitted') AS admitted_at,
                -- Its first start running after that admission (none when its attempt ended
                -- before a pass saw it running: a 200 ms job can).
                (SELECT min(r.at) FROM job_events r WHERE r.job_id = j.id AND r.to_state = 'running'
                    AND r.at >= (SELECT max(e.at) FROM job_events e WHERE e.job_id = j.id AND e.to_state = 'admitted'))
                    AS running_at,
                (SELECT count(*) FROM job_events e WHERE e.job_id = j.id AND e.to_state = 'queued'
                    AND e.from_state IS NOT NULL) AS preemptions
         FROM jobs j JOIN tenants n ON n.id = j.tenant_id WHERE n.name LIKE 'q%'",
    )
    .fetch_all(&env.db.pool)
    .await
    .unwrap()
}

/// Each attempt that started, by (job, attempt): whether it ran to its end.
fn attempts_run(markers: &Path) -> BTreeMap<(String, u32), bool> {
    let mut seen = BTreeMap::new();
    for entry in std::fs::read_dir(markers).unwrap().flatten() {
        let name = entry.file_name().to_string_lossy().into_owned();
        let mut parts = name.split('.');
        let (job, attempt, rank) = (parts.next().unwrap(), parts.next().unwrap(), parts.next().unwrap());
        assert_eq!(rank, "0", "one replica per job: {name}");
        let ended = std::fs::read_to_string(entry.path()).unwrap().contains("end");
        let previous = seen.insert((job.to_string(), attempt.parse().unwrap()), ended);
        assert!(previous.is_none(), "attempt {attempt} of {job} started twice");
    }
    seen
}

/// An attempt's row of the allocation ledger: tenant, GPUs, start, end (none: still running).
type LedgerRange = (String, i32, DateTime<Utc>, Option<DateTime<Utc>>);

/// Every attempt's row of the allocation ledger, of the replay's tenants.
async fn ledger(env: &TestEnv) -> Vec<LedgerRange> {
    sqlx::query_as(
        "SELECT n.name, l.gpus, l.started_at, l.ended_at FROM usage_ledger l JOIN tenants n ON n.id = l.tenant_id
         WHERE n.name LIKE 'q%'",
    )
    .fetch_all(&env.db.pool)
    .await
    .unwrap()
}

/// The most any tenant and any cohort held at once, from the allocation ledger (a sweep over
/// the attempts' starts and ends).
async fn peaks(env: &TestEnv, workload: &Workload) -> (BTreeMap<String, i64>, BTreeMap<String, i64>) {
    let rows = ledger(env).await;
    let cohort_of: BTreeMap<String, String> = workload.tenants().into_iter().collect();
    let mut events: Vec<(DateTime<Utc>, i64, String)> = Vec::new();
    for (tenant, gpus, start, end) in rows {
        events.push((start, i64::from(gpus), tenant.clone()));
        events.push((end.unwrap_or(Utc::now()), -i64::from(gpus), tenant));
    }
    // Ends before starts at the same instant: a handover is not an overlap.
    events.sort_by(|a, b| a.0.cmp(&b.0).then(a.1.cmp(&b.1)));
    let (mut now_t, mut now_c): (BTreeMap<String, i64>, BTreeMap<String, i64>) = Default::default();
    let (mut peak_t, mut peak_c): (BTreeMap<String, i64>, BTreeMap<String, i64>) = Default::default();
    for (_, delta, tenant) in events {
        let cohort = cohort_of[&tenant].clone();
        let t = now_t.entry(tenant.clone()).or_default();
        *t += delta;
        let peak = peak_t.entry(tenant).or_default();
        *peak = (*peak).max(*t);
        let c = now_c.entry(cohort.clone()).or_default();
        *c += delta;
        let peak = peak_c.entry(cohort).or_default();
        *peak = (*peak).max(*c);
    }
    (peak_t, peak_c)
}

fn seconds(from: DateTime<Utc>, to: DateTime<Utc>) -> f64 {
    (to - from).num_microseconds().unwrap_or(0) as f64 / 1e6
}

fn percentile(sorted: &[f64], p: f64) -> f64 {
    if sorted.is_empty() {
        return f64::NAN;
    }
    sorted[((sorted.len() - 1) as f64 * p).round() as usize]
}

/// Prints the figures Kueue publishes (wall time, mean time to admission per class, queue
/// usage) and the end-to-end ones (admission percentiles, admission to running).
fn report(label: &str, workload: &Workload, outcomes: &[Outcome]) -> f64 {
    let first = outcomes.iter().map(|o| o.created_at).min().unwrap();
    let last = outcomes.iter().filter_map(|o| o.finished_at).max().unwrap();
    let wall = seconds(first, last);
    println!("== {label}: {} jobs, {} tenants, wall {wall:.1} s", outcomes.len(), workload.tenants().len());
    for class in &workload.classes {
        let waits: Vec<f64> = outcomes
            .iter()
            .filter(|o| o.name == class.name)
            .filter_map(|o| o.admitted_at.map(|a| seconds(o.created_at, a)))
            .collect();
        let mean = waits.iter().sum::<f64>() / waits.len().max(1) as f64;
        println!("   mean time to admission, {:<6}: {mean:.2} s", class.name);
    }
    let mut admission: Vec<f64> =
        outcomes.iter().filter_map(|o| o.admitted_at.map(|a| seconds(o.created_at, a))).collect();
    admission.sort_by(f64::total_cmp);
    let mut launch: Vec<f64> =
        outcomes.iter().filter_map(|o| o.admitted_at.zip(o.running_at).map(|(a, r)| seconds(a, r))).collect();
    launch.sort_by(f64::total_cmp);
    println!(
        "   admission p50/p95/p99: {:.2} / {:.2} / {:.2} s; admission -> running p50/p95: {:.2} / {:.2} s",
        percentile(&admission, 0.5),
        percentile(&admission, 0.95),
        percentile(&admission, 0.99),
        percentile(&launch, 0.5),
        percentile(&launch, 0.95)
    );
    // An admitted job holds its GPUs, idle, until it runs: per class, how long, and what that
    // costs the cluster (of its last admission; a preempted job's earlier ones are not counted).
    let mut held_idle = 0.0;
    let per_class: Vec<String> = workload
        .classes
        .iter()
        .map(|class| {
            let waits: Vec<f64> = outcomes
                .iter()
                .filter(|o| o.name == class.name)
                .filter_map(|o| o.admitted_at.zip(o.running_at).map(|(a, r)| seconds(a, r)))
                .collect();
            held_idle += f64::from(class.gpus) * waits.iter().sum::<f64>();
            format!("{} {:.2} s", class.name, waits.iter().sum::<f64>() / waits.len().max(1) as f64)
        })
        .collect();
    println!(
        "   admission -> running, mean: {}; GPUs held before running: {:.1}% of capacity x wall",
        per_class.join(", "),
        100.0 * held_idle / (workload.capacity() as f64 * wall)
    );
    let gpu_seconds: f64 = outcomes
        .iter()
        .map(|o| {
            let class = workload.classes.iter().find(|c| c.name == o.name).unwrap();
            f64::from(class.gpus) * class.runtime
        })
        .sum();
    println!(
        "   work over capacity x wall: {:.1}% (GPU-seconds of the jobs' runtimes); preemptions: {}",
        100.0 * gpu_seconds / (workload.capacity() as f64 * wall),
        outcomes.iter().map(|o| o.preemptions).sum::<i64>()
    );
    print_timeline(workload, outcomes, first, wall);
    wall
}

/// The replay in steps of 10 s: jobs admitted and started running in each, and the GPUs held on
/// average by jobs admitted but not running yet, and by jobs running (until their end is
/// recorded); each job's last admission only. A job that ended before a pass saw it running is
/// counted as started when admitted.
fn print_timeline(workload: &Workload, outcomes: &[Outcome], first: DateTime<Utc>, wall: f64) {
    const STEP: f64 = 10.0;
    let steps = (wall / STEP).ceil().max(1.0) as usize;
    let step_of = |t: f64| ((t / STEP) as usize).min(steps - 1);
    let (mut admitted, mut started) = (vec![0usize; steps], vec![0usize; steps]);
    let (mut held, mut running) = (vec![0.0f64; steps], vec![0.0f64; steps]);
    // Spreads `gpus` held from `from` to `to` over the steps, as an average over each step.
    let spread = |into: &mut [f64], from: f64, to: f64, gpus: f64| {
        for (i, slot) in into.iter_mut().enumerate().take(step_of(to) + 1).skip(step_of(from)) {
            let overlap = to.min((i + 1) as f64 * STEP) - from.max(i as f64 * STEP);
            *slot += gpus * overlap.max(0.0) / STEP;
        }
    };
    for o in outcomes {
        let gpus = f64::from(workload.classes.iter().find(|c| c.name == o.name).map_or(0, |c| c.gpus));
        let at = |t: Option<DateTime<Utc>>| t.map(|t| seconds(first, t));
        let (Some(a), Some(f)) = (at(o.admitted_at), at(o.finished_at)) else { continue };
        // A job that ended before a pass saw it running counts as running from its admission.
        let r = at(o.running_at).unwrap_or(a);
        admitted[step_of(a)] += 1;
        started[step_of(r)] += 1;
        spread(&mut held, a, r, gpus);
        spread(&mut running, r, f, gpus);
    }
    println!(
        "   timeline, {} GPUs: seconds, jobs admitted / started, GPUs held before running / running (mean)",
        workload.capacity()
    );
    for i in 0..steps {
        println!(
            "     {:>4.0}-{:<4.0} {:>6} {:>6} {:>7.0} {:>7.0}",
            i as f64 * STEP,
            (i + 1) as f64 * STEP,
            admitted[i],
            started[i],
            held[i],
            running[i]
        );
    }
    // The rate the control plane and this machine launched at when launches were what limited
    // it (the simulator takes it as `--launches-per-s`).
    let busiest = started.iter().max().copied().unwrap_or(0);
    println!("   launches a second in the busiest 10 s: {:.0}", busiest as f64 / STEP);
}

/// Kueue's usage statistic (its scheduler benchmark's recorder and checker): the quota its
/// admitted jobs held, integrated over time (an attempt holds its GPUs from its admission to
/// its end, as a Kueue workload's usage counts from admission to finish, borrowing included),
/// over the nominal quota of all tenants times the time from the first job's creation to the
/// last one's end. Kueue publishes it for the one class of its ClusterQueues: all tenants here.
/// Also the lowest one tenant reaches, measured the same way.
async fn print_kueue_usage(env: &TestEnv, workload: &Workload, outcomes: &[Outcome]) {
    let first = outcomes.iter().map(|o| o.created_at).min().unwrap();
    let last = outcomes.iter().filter_map(|o| o.finished_at).max().unwrap();
    let window = seconds(first, last);
    let rows = ledger(env).await;
    let mut held: BTreeMap<String, f64> = workload.tenants().into_iter().map(|(tenant, _)| (tenant, 0.0)).collect();
    for (tenant, gpus, start, end) in rows {
        *held.entry(tenant).or_default() += f64::from(gpus) * seconds(start, end.unwrap_or(last));
    }
    let nominal = workload.nominal as f64;
    let all = held.values().sum::<f64>() / (nominal * held.len() as f64 * window);
    let lowest = held.values().map(|h| h / (nominal * window)).fold(f64::INFINITY, f64::min);
    println!("   quota usage as Kueue measures it: {:.1}% (lowest tenant {:.1}%)", 100.0 * all, 100.0 * lowest);
}

/// A row of a job's history: from, to, by whom, why, when.
type JobEvent = (Option<String>, String, String, Option<String>, DateTime<Utc>);

/// What both tests assert of a finished replay.
async fn assert_replay(env: &TestEnv, workload: &Workload, markers: &Path, label: &str) {
    let outcomes = outcomes(env).await;
    assert_eq!(outcomes.len(), workload.jobs(), "every job submitted once");
    let failed: Vec<&Outcome> = outcomes.iter().filter(|o| o.state != "succeeded").collect();
    assert!(failed.is_empty(), "every job succeeded: {failed:#?}");
    // Exactly once: one attempt of each job ran to its end (earlier ones were preempted and
    // stopped), and no attempt started twice (checked while reading the markers).
    let runs = attempts_run(markers);
    for outcome in &outcomes {
        let id = outcome.id.to_string();
        let mine: Vec<(u32, bool)> =
            runs.iter().filter(|((job, _), _)| *job == id).map(|((_, attempt), ended)| (*attempt, *ended)).collect();
        let completed = mine.iter().filter(|(_, ended)| *ended).count();
        if completed != 1 {
            // What the control plane recorded of it: the first thing to read when this fails.
            let events: Vec<JobEvent> = sqlx::query_as(
                "SELECT from_state, to_state, actor, reason, at FROM job_events WHERE job_id = $1 ORDER BY seq",
            )
            .bind(outcome.id)
            .fetch_all(&env.db.pool)
            .await
            .unwrap();
            panic!(
                "job {id} ({}) ran to its end {completed} times, not once: {mine:?}; its events: {events:#?}",
                outcome.name
            );
        }
    }
    let (tenant_peaks, cohort_peaks) = peaks(env, workload).await;
    for (tenant, peak) in &tenant_peaks {
        assert!(*peak as u64 <= workload.nominal + workload.borrowing_limit, "{tenant} held {peak} GPUs at once");
    }
    let cohort_capacity = workload.nominal * workload.tenants_per_cohort as u64;
    for (cohort, peak) in &cohort_peaks {
        assert!(*peak as u64 <= cohort_capacity, "{cohort} held {peak} of its {cohort_capacity} GPUs at once");
    }
    let large = outcomes.iter().filter(|o| o.name == "large").count();
    let large_submitted = workload.classes.iter().find(|c| c.name == "large").map_or(0, |c| c.count);
    assert_eq!(large, large_submitted * workload.tenants().len(), "every large job (a whole nominal quota) ran");
    report(label, workload, &outcomes);
    print_kueue_usage(env, workload, &outcomes).await;
    println!("   peak GPUs held per cohort: {cohort_peaks:?}");
}

/// CPU time during a replay as the kernel counts it (`/proc`, in seconds): the whole machine's
/// busy time, the server's own, its reaped children's (the supervisors, and through them the
/// replicas) and this harness's (the clients submitting). What it says per job is the cost the
/// simulator does not have: on two cores it bounds the wall (docs/PERFORMANCE.md).
#[derive(Debug, Clone, Copy)]
struct CpuUse {
    machine_busy: f64,
    server: Option<(f64, f64)>,
    harness: f64,
    at: Instant,
}

/// The kernel's clock tick for `/proc`'s CPU times (`USER_HZ`, 100 on Linux's x86 and arm ABIs).
const USER_HZ: f64 = 100.0;

impl CpuUse {
    fn now(server_pid: Option<u32>) -> CpuUse {
        let stat = std::fs::read_to_string("/proc/stat").unwrap_or_default();
        // cpu user nice system idle iowait irq softirq steal ...: busy is all but idle and iowait.
        let ticks: Vec<f64> =
            stat.lines().next().unwrap_or_default().split_whitespace().skip(1).filter_map(|f| f.parse().ok()).collect();
        let busy: f64 = ticks.iter().enumerate().filter(|(i, _)| *i != 3 && *i != 4).map(|(_, t)| t).sum();
        // utime, stime, cutime, cstime: fields 14 to 17 of /proc/<pid>/stat, after the command.
        let times = |pid: &str| -> Option<[f64; 4]> {
            let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
            let fields: Vec<f64> = stat[stat.rfind(')')? + 2..]
                .split_whitespace()
                .skip(11)
                .take(4)
                .filter_map(|f| f.parse().ok())
                .collect();
            Some([
                fields.first()? / USER_HZ,
                fields.get(1)? / USER_HZ,
                fields.get(2)? / USER_HZ,
                fields.get(3)? / USER_HZ,
            ])
        };
        let harness = times("self").map(|t| t[0] + t[1]).unwrap_or_default();
        let server = server_pid.and_then(|pid| times(&pid.to_string())).map(|t| (t[0] + t[1], t[2] + t[3]));
        CpuUse { machine_busy: busy / USER_HZ, server, harness, at: Instant::now() }
    }

    /// Prints what was spent since `before`, per job.
    fn print_since(&self, before: &CpuUse, jobs: usize) {
        let cores = std::thread::available_parallelism().map_or(1, |n| n.get());
        let wall = self.at.duration_since(before.at).as_secs_f64();
        let busy = self.machine_busy - before.machine_busy;
        let per_job = |seconds: f64| 1000.0 * seconds / jobs.max(1) as f64;
        let harness = self.harness - before.harness;
        let mut parts = Vec::new();
        let mut accounted = harness;
        if let (Some((own, children)), Some((own_before, children_before))) = (self.server, before.server) {
            let (own, children) = (own - own_before, children - children_before);
            accounted += own + children;
            parts.push(format!("the server {:.1}", per_job(own)));
            parts.push(format!("its supervisors and replicas {:.1}", per_job(children)));
        }
        parts.push(format!("this harness {:.1}", per_job(harness)));
        parts.push(format!("the rest (Postgres, the kernel, an API server) {:.1}", per_job(busy - accounted)));
        println!(
            "   CPU while replaying ({cores} cores): busy {busy:.1} of {:.1} CPU-s ({:.0}%), {:.1} ms a job: {} ms",
            wall * cores as f64,
            100.0 * busy / (wall * cores as f64).max(f64::MIN_POSITIVE),
            per_job(busy),
            parts.join(", ")
        );
    }
}

/// The credential the replays' servers take for `/metrics` (written to a file in `dir`), and the
/// arguments that give it to a server.
const METRICS_TOKEN: &str = "the-replay-metrics-token";

fn metrics_args(dir: &Path) -> [String; 2] {
    let file = dir.join("metrics-token");
    std::fs::write(&file, METRICS_TOKEN).unwrap();
    ["--metrics-token-file".into(), file.display().to_string()]
}

/// How the server's control loop spent the replay, from its `/metrics`: how many passes and
/// admission cycles, and their mean time, and the mean time of each phase of a pass. (The
/// lines read are a histogram's sum and count, at most one label: read as they are.)
async fn print_control_loop(url: &str) {
    let response = reqwest::Client::new().get(format!("{url}/metrics")).bearer_auth(METRICS_TOKEN).send().await;
    let text = response.unwrap().text().await.unwrap();
    let value = |name: String| {
        text.lines().find_map(|line| line.strip_prefix(name.as_str())?.strip_prefix(' ')?.trim().parse::<f64>().ok())
    };
    for (what, metric) in [
        ("passes", "trainyard_reconciler_pass_duration_seconds"),
        ("admission cycles", "trainyard_admission_cycle_duration_seconds"),
    ] {
        if let (Some(sum), Some(count)) = (value(format!("{metric}_sum")), value(format!("{metric}_count"))) {
            println!("   control loop: {count} {what}, mean {:.1} ms", 1000.0 * sum / count.max(1.0));
        }
    }
    let phase = |phase: &str, part: &str| {
        value(format!("trainyard_reconciler_pass_phase_duration_seconds_{part}{{phase=\"{phase}\"}}"))
    };
    let phases: Vec<String> = ["read", "observe", "admit", "rest"]
        .iter()
        .filter_map(|p| Some(format!("{p} {:.1} ms", 1000.0 * phase(p, "sum")? / phase(p, "count")?.max(1.0))))
        .collect();
    println!("   a pass's phases (mean): {}", phases.join(", "));
    let launch =
        |phase: &str, part: &str| value(format!("trainyard_launch_phase_duration_seconds_{part}{{phase=\"{phase}\"}}"));
    let phases: Vec<String> = ["wait", "launch", "open", "start", "record"]
        .iter()
        .filter_map(|p| Some(format!("{p} {:.1} ms", 1000.0 * launch(p, "sum")? / launch(p, "count")?.max(1.0))))
        .collect();
    println!("   a launch's phases (mean): {}", phases.join(", "));
}

/// The ten statements that took the database the most time during the replay, with their calls
/// and mean time, when Postgres counts them (`TRAINYARD_BENCH_STATEMENTS=1 tests/bench/replay.sh`
/// loads `pg_stat_statements`); otherwise says how to have them.
/// Who preempted whom, from the jobs' events: per preemptor class and kind, how many preemptors
/// freed more GPUs than they need (preempting again after their room went to others: a stop and
/// a second launch each time, for nothing), and how many jobs were admitted more than once.
async fn print_preemptions(env: &TestEnv) {
    // language=PostgreSQL
    let rows: Vec<(String, bool, bool, i64, i64)> = sqlx::query_as(
        "WITH p AS (SELECT e.job_id AS victim, e.reason LIKE '%borrowed quota%' AS reclaim,
                           substring(e.reason from '[(]job ([0-9a-f-]+)[)]')::uuid AS preemptor
                    FROM job_events e WHERE e.to_state = 'queued' AND e.reason LIKE 'preempted%'),
              gpus AS (SELECT id, coalesce((spec->'resources'->>'gpus')::int, 0) * coalesce((spec->>'replicas')::int, 1) AS n
                       FROM jobs),
              r AS (SELECT p.preemptor, bool_or(p.reclaim) AS reclaim, sum(g.n) AS freed, count(*) AS victims
                    FROM p JOIN gpus g ON g.id = p.victim GROUP BY p.preemptor)
         SELECT j.name, r.reclaim, r.freed > g.n, count(*), sum(r.victims)::bigint
         FROM r JOIN jobs j ON j.id = r.preemptor JOIN gpus g ON g.id = r.preemptor
         GROUP BY 1, 2, 3 ORDER BY 1, 2, 3",
    )
    .fetch_all(&env.db.pool)
    .await
    .expect("the preemptions from the jobs' events");
    for (class, reclaim, over, preemptors, victims) in rows {
        let kind = if reclaim { "reclaiming" } else { "over lower priority" };
        let freed = if over { "more GPUs than they need" } else { "at most what they need" };
        println!("   preemptions: {preemptors} {class} jobs {kind} stopped {victims} jobs, freeing {freed}");
    }
    // language=PostgreSQL
    let again: Vec<(String, i64, i64)> = sqlx::query_as(
        "SELECT j.name, count(*) FILTER (WHERE a.n > 1), count(*)
         FROM (SELECT job_id, count(*) AS n FROM job_events WHERE to_state = 'admitted' GROUP BY job_id) a
         JOIN jobs j ON j.id = a.job_id GROUP BY 1 ORDER BY 1",
    )
    .fetch_all(&env.db.pool)
    .await
    .expect("the admissions from the jobs' events");
    let again: Vec<String> = again.iter().map(|(class, n, all)| format!("{class} {n} of {all}")).collect();
    println!("   admitted more than once: {}", again.join(", "));
}

async fn print_statements(env: &TestEnv) {
    let _ = sqlx::query("CREATE EXTENSION IF NOT EXISTS pg_stat_statements").execute(&env.db.pool).await;
    let top: Result<Vec<(String, i64, f64, i64)>, _> = sqlx::query_as(
        "SELECT regexp_replace(query, '\\s+', ' ', 'g'), calls, total_exec_time, rows FROM pg_stat_statements
         WHERE dbid = (SELECT oid FROM pg_database WHERE datname = current_database())
         ORDER BY total_exec_time DESC LIMIT 10",
    )
    .fetch_all(&env.db.pool)
    .await;
    match top {
        Ok(top) => {
            println!("   the database's time by statement (pg_stat_statements, total / calls / mean / rows):");
            for (query, calls, total_ms, rows) in top {
                let query: String = query.chars().take(110).collect();
                println!(
                    "     {:>8.0} ms {calls:>7} x {:>6.2} ms {rows:>8}  {query}",
                    total_ms,
                    total_ms / calls.max(1) as f64
                );
            }
        }
        Err(_) => println!(
            "   statements: not counted (TRAINYARD_BENCH_STATEMENTS=1 tests/bench/replay.sh loads pg_stat_statements)"
        ),
    }
}

/// The options of the server of a full-size replay: the server's own default pool of database
/// connections (16; the test harness gives its many small servers 8 each), and more from
/// `TRAINYARD_BENCH_SERVER_ARGS` (split at whitespace; e.g. `--launch-concurrency 16`), to
/// measure a setting without a build.
fn bench_server_args() -> Vec<String> {
    let mut args: Vec<String> =
        std::env::var("TRAINYARD_BENCH_SERVER_ARGS").unwrap_or_default().split_whitespace().map(String::from).collect();
    if !args.is_empty() {
        println!("   the server's extra options (TRAINYARD_BENCH_SERVER_ARGS): {}", args.join(" "));
    }
    if !args.iter().any(|arg| arg == "--max-connections") {
        args.extend(["--max-connections".into(), SERVER_DEFAULT_CONNECTIONS.into()]);
    }
    args
}

/// `trainyard serve --max-connections`'s default.
const SERVER_DEFAULT_CONNECTIONS: &str = "16";

fn marker_dir(env: &TestEnv) -> PathBuf {
    let markers = env.dir.path().join("markers");
    std::fs::create_dir_all(&markers).unwrap();
    std::fs::set_permissions(&markers, std::os::unix::fs::PermissionsExt::from_mode(0o1777)).unwrap();
    markers
}

#[tokio::test(flavor = "multi_thread")]
async fn kueues_baseline_reduced_runs_every_job_once_within_quota() {
    let workload = Workload::reduced();
    let gpus = workload.capacity().to_string();
    let scratch = tempfile::tempdir().unwrap();
    let metrics = metrics_args(scratch.path());
    let env =
        TestEnv::start_with(&["--simulate-gpus", &gpus, "--simulate-gpu-type", GPU, &metrics[0], &metrics[1]]).await;
    let markers = marker_dir(&env);
    let tokens = setup(&env, &workload, Layout::OneNode).await;
    let servers = std::sync::Arc::new(Servers { urls: std::sync::RwLock::new(vec![env.server.url.clone()]) });
    let cpu = CpuUse::now(Some(env.server.pid()));
    let started = replay(&workload, &servers, &tokens, &markers).await;
    wait_all_ended(&env, workload.jobs(), Duration::from_secs(90)).await;
    println!("replayed in {:.1} s", started.elapsed().as_secs_f64());
    let cpu_after = CpuUse::now(Some(env.server.pid()));
    assert_replay(&env, &workload, &markers, "reduced baseline, one server").await;
    cpu_after.print_since(&cpu, workload.jobs());
    print_control_loop(&env.server.url).await;
    print_preemptions(&env).await;
    print_statements(&env).await;
}

/// The API server a Kubernetes replay runs against.
enum Cluster {
    /// The executor tests' in-memory API server over HTTP, which plays the Job controller, the
    /// scheduler and the kubelet (each pod runs for the time its command sleeps, then succeeds,
    /// unless its attempt was stopped first) and writes the markers the replicas write on the
    /// local executor.
    InMemory,
    /// A real one (kube-apiserver, etcd, kube-controller-manager and its Job controller), whose
    /// nodes, scheduler and kubelets the kubelet stand-in plays, markers included, with an
    /// admin's kubeconfig; Trainyard runs with its service account's.
    Real { admin: PathBuf, executor: PathBuf },
}

/// Replays `workload` on the Kubernetes executor: the same binary and configuration as on the
/// local executor, pointed at `cluster`. Each cohort has nodes of its own with a GPU type of its
/// own (`Layout::NodesPerCohort`): the simulator's layout. Checked as every replay is.
async fn replay_on_kubernetes(workload: &Workload, cluster: Cluster, timeout: Duration, label: &str) {
    let scratch = tempfile::tempdir().unwrap();
    let markers = scratch.path().join("markers");
    std::fs::create_dir_all(&markers).unwrap();
    let nodes = (workload.capacity() / workload.node_gpus).to_string();
    let node_gpus = workload.node_gpus.to_string();
    let marker_arg = markers.display().to_string();
    let gpu_types: Vec<String> =
        (0..workload.cohorts).map(|c| Layout::NodesPerCohort.gpu_type(&format!("cohort-{c}"))).collect();
    let gpu_types = gpu_types.join(",");
    let machines = [nodes.as_str(), "--gpus", &node_gpus, "--gpu-product", &gpu_types, "--markers", &marker_arg];
    // Tenant namespaces of their own each run: a real cluster keeps those of earlier runs.
    let prefix = format!("replay-{}-", &uuid::Uuid::new_v4().simple().to_string()[..8]);
    let metrics = metrics_args(scratch.path());
    let mut args = vec!["--executor", "kubernetes", "--kube-image", "registry.example/runtime:1"];
    args.extend(["--kube-namespace-prefix", &prefix, &metrics[0], &metrics[1]]);
    let extra = bench_server_args();
    args.extend(extra.iter().map(String::as_str));
    let (_fake, _standin, kubeconfig) = match &cluster {
        Cluster::InMemory => {
            let fake = trainyard_tests::FakeApiServer::start(scratch.path(), &machines);
            let kubeconfig = fake.kubeconfig.clone();
            (Some(fake), None, kubeconfig)
        }
        Cluster::Real { admin, executor } => {
            (None, Some(trainyard_tests::KubeletStandin::start(admin, &machines)), executor.clone())
        }
    };
    let env = TestEnv::start_with_env(&args, &[("KUBECONFIG".to_string(), kubeconfig.display().to_string())]).await;
    let tokens = setup(&env, workload, Layout::NodesPerCohort).await;
    let servers = std::sync::Arc::new(Servers { urls: std::sync::RwLock::new(vec![env.server.url.clone()]) });
    let cpu = CpuUse::now(Some(env.server.pid()));
    let started = replay(workload, &servers, &tokens, &markers).await;
    wait_all_ended(&env, workload.jobs(), timeout).await;
    println!("replayed in {:.1} s", started.elapsed().as_secs_f64());
    let cpu_after = CpuUse::now(Some(env.server.pid()));
    assert_replay(&env, workload, &markers, label).await;
    cpu_after.print_since(&cpu, workload.jobs());
    print_control_loop(&env.server.url).await;
    print_preemptions(&env).await;
    print_statements(&env).await;
}

/// The reduced replay against a real API server, when `TRAINYARD_TEST_KUBECONFIG` names an
/// admin's kubeconfig for one (the kubelet stand-in's) and `TRAINYARD_TEST_KUBECONFIG_EXECUTOR`
/// Trainyard's service account's (as the executor's cluster suite takes them; docs/kubernetes.md
/// says how to have one). CI has no API server: ignored there, run by name.
#[tokio::test(flavor = "multi_thread")]
#[ignore = "needs a real API server: TRAINYARD_TEST_KUBECONFIG and TRAINYARD_TEST_KUBECONFIG_EXECUTOR"]
async fn kueues_baseline_reduced_on_a_real_api_server() {
    let (Ok(admin), Ok(executor)) =
        (std::env::var("TRAINYARD_TEST_KUBECONFIG"), std::env::var("TRAINYARD_TEST_KUBECONFIG_EXECUTOR"))
    else {
        panic!(
            "TRAINYARD_TEST_KUBECONFIG and TRAINYARD_TEST_KUBECONFIG_EXECUTOR are not both set (docs/kubernetes.md)"
        );
    };
    let cluster = Cluster::Real { admin: admin.into(), executor: executor.into() };
    let label = "reduced baseline, one server, Kubernetes executor (real API server)";
    replay_on_kubernetes(&Workload::reduced(), cluster, Duration::from_secs(300), label).await;
}

/// The whole baseline against a real API server, as above: a benchmark (`tests/bench/replay.sh
/// real`, with the two variables set).
#[tokio::test(flavor = "multi_thread")]
#[ignore = "a benchmark: tests/bench/replay.sh real"]
async fn kueues_baseline_full_on_a_real_api_server() {
    let admin =
        std::env::var("TRAINYARD_TEST_KUBECONFIG").expect("TRAINYARD_TEST_KUBECONFIG names an admin's kubeconfig");
    let executor = std::env::var("TRAINYARD_TEST_KUBECONFIG_EXECUTOR")
        .expect("TRAINYARD_TEST_KUBECONFIG_EXECUTOR names Trainyard's service account's kubeconfig");
    let cluster = Cluster::Real { admin: admin.into(), executor: executor.into() };
    let label = "Kueue's baseline, one server, Kubernetes executor (real API server)";
    replay_on_kubernetes(&Workload::baseline(), cluster, Duration::from_secs(3600), label).await;
}

#[tokio::test(flavor = "multi_thread")]
async fn kueues_baseline_reduced_on_kubernetes_runs_every_job_once_within_quota() {
    let label = "reduced baseline, one server, Kubernetes executor (in-memory API server)";
    replay_on_kubernetes(&Workload::reduced(), Cluster::InMemory, Duration::from_secs(90), label).await;
}

/// The whole baseline on the Kubernetes executor: a benchmark (`tests/bench/replay.sh
/// kubernetes`).
#[tokio::test(flavor = "multi_thread")]
#[ignore = "a benchmark: tests/bench/replay.sh kubernetes"]
async fn kueues_baseline_full_on_kubernetes() {
    let label = "Kueue's baseline, one server, Kubernetes executor (in-memory API server)";
    replay_on_kubernetes(&Workload::baseline(), Cluster::InMemory, Duration::from_secs(1800), label).await;
    println!(
        "   Kueue (means of 5 runs): wall 351.1 s; admission small 215.5 s, medium 76.8 s, large 6.7 s; min usage 58.7%"
    );
    println!("   {SIMULATOR_NODES_PER_COHORT}");
}

/// Kueue's large-scale scenario, 50,000 jobs of 1,000 tenants, on the Kubernetes executor: a
/// benchmark (`tests/bench/replay.sh large`).
#[tokio::test(flavor = "multi_thread")]
#[ignore = "a benchmark: tests/bench/replay.sh large"]
async fn kueues_large_scale_on_kubernetes() {
    let label = "Kueue's large scale, one server, Kubernetes executor (in-memory API server)";
    replay_on_kubernetes(&Workload::large_scale(), Cluster::InMemory, Duration::from_secs(3600), label).await;
    println!("   Kueue (10 cohorts x 100 queues): wall 1,179 s; admission small 700 s, medium 256 s, large 105.6 s");
}

/// The whole baseline, 15,000 jobs: a benchmark, run by `tests/bench/replay.sh` (release
/// binaries), not by `tests/run`. Prints its figures beside Kueue's published means and the
/// simulator's on the same layout (docs/PERFORMANCE.md).
#[tokio::test(flavor = "multi_thread")]
#[ignore = "a benchmark: tests/bench/replay.sh"]
async fn kueues_baseline_full() {
    let workload = Workload::baseline();
    let gpus = workload.capacity().to_string();
    let scratch = tempfile::tempdir().unwrap();
    let metrics = metrics_args(scratch.path());
    let mut args = vec!["--simulate-gpus", &gpus, "--simulate-gpu-type", GPU, &metrics[0], &metrics[1]];
    let extra = bench_server_args();
    args.extend(extra.iter().map(String::as_str));
    let env = TestEnv::start_with(&args).await;
    let markers = marker_dir(&env);
    let tokens = setup(&env, &workload, Layout::OneNode).await;
    let servers = std::sync::Arc::new(Servers { urls: std::sync::RwLock::new(vec![env.server.url.clone()]) });
    let cpu = CpuUse::now(Some(env.server.pid()));
    replay(&workload, &servers, &tokens, &markers).await;
    wait_all_ended(&env, workload.jobs(), Duration::from_secs(1800)).await;
    let cpu_after = CpuUse::now(Some(env.server.pid()));
    assert_replay(&env, &workload, &markers, "Kueue's baseline, one server, local executor").await;
    cpu_after.print_since(&cpu, workload.jobs());
    print_control_loop(&env.server.url).await;
    print_preemptions(&env).await;
    print_statements(&env).await;
    println!(
        "   Kueue (means of 5 runs): wall 351.1 s; admission small 215.5 s, medium 76.8 s, large 6.7 s; min usage 58.7%"
    );
    println!("   {SIMULATOR_ONE_NODE}");
}

/// The same replay on two servers sharing the database and data directory, the leader killed
/// (SIGKILL) three times while it runs; each killed server comes back as the standby.
#[tokio::test(flavor = "multi_thread")]
async fn kueues_baseline_reduced_survives_three_leader_kills() {
    let kills = Kills { count: 3, every: Duration::from_secs(3), jitter: Duration::ZERO };
    let label = "reduced baseline, two servers, three leader kills";
    replay_with_leader_kills(&Workload::reduced(), &kills, Duration::from_secs(90), label).await;
}

/// The whole baseline on two servers with five leader kills at random moments: a benchmark
/// (`tests/bench/replay.sh kills`).
#[tokio::test(flavor = "multi_thread")]
#[ignore = "a benchmark: tests/bench/replay.sh kills"]
async fn kueues_baseline_full_survives_five_leader_kills() {
    // All five while jobs are still being admitted: the replay admits its last jobs after about
    // 130 s (session 15), so a kill lands every 15-25 s.
    let kills = Kills { count: 5, every: Duration::from_secs(15), jitter: Duration::from_secs(10) };
    let label = "Kueue's baseline, two servers, five leader kills, local executor";
    replay_with_leader_kills(&Workload::baseline(), &kills, Duration::from_secs(1800), label).await;
    println!(
        "   Kueue (means of 5 runs): wall 351.1 s; admission small 215.5 s, medium 76.8 s, large 6.7 s; min usage 58.7%"
    );
    println!("   {SIMULATOR_ONE_NODE}");
}

/// When the leader is killed during a replay: `count` times, each `every` plus a random part of
/// `jitter` after the previous takeover.
struct Kills {
    count: usize,
    every: Duration,
    jitter: Duration,
}

/// Replays `workload` on two servers sharing the database and data directory (local executor),
/// killing whichever leads as `kills` says; each killed server comes back as the standby.
/// Prints each takeover: the time until the other server reports itself leader, and until its
/// first admission. Checked as every replay is.
async fn replay_with_leader_kills(workload: &Workload, kills: &Kills, timeout: Duration, label: &str) {
    let gpus = workload.capacity().to_string();
    let args = ["--simulate-gpus", gpus.as_str(), "--simulate-gpu-type", GPU];
    let mut env = TestEnv::start_with(&args).await;
    let markers = marker_dir(&env);
    let tokens = setup(&env, workload, Layout::OneNode).await;
    let mut extra: Vec<&str> = args.to_vec();
    extra.extend(["--cluster-grows", "--restart-backoff-seconds", "0.5"]);
    let mut standby = ServerProcess::start_with(&env.db.url, &env.data_dir(), &extra);
    let servers = std::sync::Arc::new(Servers {
        urls: std::sync::RwLock::new(vec![env.server.url.clone(), standby.url.clone()]),
    });
    let replaying = {
        let (workload, servers, tokens, markers) =
            (workload.clone(), std::sync::Arc::clone(&servers), tokens.clone(), markers.clone());
        tokio::spawn(async move { replay(&workload, &servers, &tokens, &markers).await })
    };
    let http = reqwest::Client::new();
    let leads = |url: String| {
        let http = http.clone();
        async move {
            let ready = http.get(format!("{url}/readyz")).send().await.ok()?.json::<Value>().await.ok()?;
            Some(ready["leader"] == true)
        }
    };
    let mut takeovers = Vec::new();
    for kill in 1..=kills.count {
        let jitter = kills.jitter.mul_f64((uuid::Uuid::new_v4().as_u128() % 1000) as f64 / 1000.0);
        tokio::time::sleep(kills.every + jitter).await;
        // Kill whichever leads; the other takes over within its lease.
        let first_leads = leads(env.server.url.clone()).await == Some(true);
        let killed = if first_leads { &mut env.server } else { &mut standby };
        let (killed_at, killed_at_utc) = (Instant::now(), Utc::now());
        killed.kill_hard();
        let survivor = if first_leads { standby.url.clone() } else { env.server.url.clone() };
        while leads(survivor.clone()).await != Some(true) {
            assert!(killed_at.elapsed() < Duration::from_secs(15), "no takeover after kill {kill}");
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        let leading = killed_at.elapsed().as_secs_f64();
        println!("kill {kill}: the other server leads after {leading:.2} s");
        takeovers.push((killed_at_utc, leading));
        // The killed one comes back as the standby, at a new address.
        let back = ServerProcess::start_with(&env.db.url, &env.data_dir(), &extra);
        let url = back.url.clone();
        if first_leads {
            env.server = back;
        } else {
            standby = back;
        }
        let mut urls = servers.urls.write().unwrap();
        *urls = vec![env.server.url.clone(), standby.url.clone()];
        assert!(urls.contains(&url));
    }
    replaying.await.unwrap();
    wait_all_ended(&env, workload.jobs(), timeout).await;
    assert_replay(&env, workload, &markers, label).await;
    for (kill, (killed_at, leading)) in takeovers.iter().enumerate() {
        // Only the new leader admits after the kill: the old one is dead.
        let admitted: Option<DateTime<Utc>> =
            sqlx::query_scalar("SELECT min(at) FROM job_events WHERE to_state = 'admitted' AND at > $1")
                .bind(killed_at)
                .fetch_one(&env.db.pool)
                .await
                .unwrap();
        let first = match admitted {
            Some(at) => format!("first admission after {:.2} s", seconds(*killed_at, at)),
            None => "no admission after it (every job was admitted before the kill)".to_string(),
        };
        println!("   takeover {}: leader after {leading:.2} s, {first}", kill + 1);
    }
}
