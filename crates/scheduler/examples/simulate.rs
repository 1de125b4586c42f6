//! The scheduler simulator: replays a workload on a virtual clock through the real admission
//! cycle. At every instant something happens (a job arrives or ends), one cycle runs; admitted
//! jobs run for their duration; preempted jobs go back to the queue and start over.
//!
//!   cargo run --release -p trainyard-scheduler --example simulate -- kueue-baseline
//!   cargo run --release -p trainyard-scheduler --example simulate -- kueue-baseline-one-node
//!   cargo run --release -p trainyard-scheduler --example simulate -- workload.json
//!
//! `--stop-ms N` (after the workload): a preempted job keeps what it holds for N ms of virtual
//! time before it is gone, as a real one takes time to stop (0, the default: gone at once).
//! `--pass-ms P`: cycles run only every P ms, as a control loop's passes do, and what happened
//! in between (arrivals, ends) is seen at the next one (0, the default: at every instant).
//! `--launch-ms L`: an admitted job holds its quota L ms before it runs (its launch: the pod or
//! process starting; 0, the default).
//! `--launches-per-s R`: at most R launches start a second, one after another (a control plane
//! on a machine that starts processes or pods at that rate); an admitted job holds its quota
//! while it waits for its turn (0, the default: no limit).
//!
//! `--runtimes declared|default|history` (issue 43: how good start estimates are): what the
//! scheduler is told of run times. `declared` (the default): each job's true duration, as if
//! every job declared it exactly; `default`: nothing (the platform's default of one hour, as
//! for a job without a declared run time); `history`: the median of its tenant's last runs of
//! its class (`trainyard_scheduler::history`), else the default.
//! `--estimate-every N`: at every Nth arrival, the start estimates (`estimate_starts`) of every
//! waiting job not estimated before are taken, and at the end compared with when each started:
//! p50 and p90 of |actual - estimated|. `--time-scale K` multiplies every time of the workload
//! by K (the scheduler counts whole seconds: Kueue's sub-second jobs need K = 1000 to be
//! estimated at all); figures are printed back in the workload's own time.
//!
//! `kueue-baseline` is Kueue's published performance scenario (see docs/PERFORMANCE.md), each
//! cohort on three 40-unit nodes of its own; `kueue-baseline-one-node` the same on one node of
//! 600 units that every cohort shares (the layout of the local executor's replay). A
//! workload file is JSON: {"nodes": [{"name", "flavor", "gpus", "rack"?}], "tenants": [{"name",
//! "cohort"?, "quotas": {flavor: [nominal, borrowing_limit?, lending_limit?]}, "preempt_lower_priority"?}],
//! "jobs": [{"tenant", "class", "gpus", "flavor", "priority", "arrival_ms", "duration_ms"}]}.

use std::collections::{BTreeMap, BTreeSet};
use std::time::Instant;

use serde::Deserialize;
use trainyard_scheduler::history::{RuntimeFacts, guess_runtime};
use trainyard_scheduler::{
    Demand, Node, PendingJob, Quota, RunningJob, Settings, Snapshot, TenantPolicy, admission_cycle, estimate_starts,
};
use uuid::Uuid;

#[derive(Debug, Clone, Deserialize)]
struct Workload {
    nodes: Vec<NodeSpec>,
    tenants: Vec<TenantSpec>,
    jobs: Vec<JobSpec>,
}

#[derive(Debug, Clone, Deserialize)]
struct NodeSpec {
    name: String,
    flavor: String,
    gpus: u32,
    #[serde(default)]
    rack: Option<String>,
}

#[derive(Debug, Clone, Deserialize)]
struct TenantSpec {
    name: String,
    #[serde(default)]
    cohort: Option<String>,
    quotas: BTreeMap<String, (u64, Option<u64>, Option<u64>)>,
    #[serde(default)]
    preempt_lower_priority: bool,
}

#[derive(Debug, Clone, Deserialize)]
struct JobSpec {
    tenant: String,
    class: String,
    gpus: u32,
    flavor: String,
    priority: i32,
    arrival_ms: i64,
    duration_ms: i64,
}

/// Kueue's baseline: 5 cohorts x 6 ClusterQueues, nominal 20 units, borrowing limit 100, reclaim
/// within the cohort and lower-priority preemption within a queue; per queue 350 small (1 unit,
/// 200 ms, one every 100 ms), 100 medium (5 units, 500 ms, every 500 ms), 50 large (20 units,
/// 1 s, every 1.2 s). Each cohort's capacity (its queues' nominal, 120 units) is three nodes of
/// 40 units with a flavor of their own, or (`one_node`) all five cohorts' 600 units are one node
/// of one flavor. Priorities: large 3, medium 2, small 1.
fn kueue_baseline(one_node: bool) -> Workload {
    let mut nodes = Vec::new();
    let mut tenants = Vec::new();
    let mut jobs = Vec::new();
    if one_node {
        nodes.push(NodeSpec { name: "n0".into(), flavor: "unit".into(), gpus: 600, rack: None });
    }
    for cohort in 0..5 {
        let flavor = if one_node { "unit".to_string() } else { format!("unit-c{cohort}") };
        for n in 0..if one_node { 0 } else { 3 } {
            nodes.push(NodeSpec { name: format!("c{cohort}-n{n}"), flavor: flavor.clone(), gpus: 40, rack: None });
        }
        for queue in 0..6 {
            let name = format!("c{cohort}-q{queue}");
            tenants.push(TenantSpec {
                name: name.clone(),
                cohort: Some(format!("cohort-{cohort}")),
                quotas: [(flavor.clone(), (20, Some(100), None))].into_iter().collect(),
                preempt_lower_priority: true,
            });
            for (class, count, gpus, duration, every, priority) in
                [("small", 350, 1, 200, 100, 1), ("medium", 100, 5, 500, 500, 2), ("large", 50, 20, 1000, 1200, 3)]
            {
                for k in 0..count {
                    jobs.push(JobSpec {
                        tenant: name.clone(),
                        class: class.into(),
                        gpus,
                        flavor: flavor.clone(),
                        priority,
                        arrival_ms: k * every,
                        duration_ms: duration,
                    });
                }
            }
        }
    }
    Workload { nodes, tenants, jobs }
}

struct Running {
    job: usize,
    end: i64,
    /// When a preempted job is gone (it holds what it held until then).
    stopping_until: Option<i64>,
    /// The job a preemption stops it for (the first that did).
    stopping_for: Option<Uuid>,
    flavor: Option<String>,
    nodes: Vec<String>,
    started: i64,
}

fn main() {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let arg = args.first().cloned().unwrap_or_else(|| "kueue-baseline".into());
    let option = |name: &str| -> i64 {
        args.iter()
            .position(|a| a == name)
            .and_then(|i| args.get(i + 1))
            .map_or(0, |v| v.parse().unwrap_or_else(|_| panic!("{name} takes a whole number")))
    };
    let (stop_ms, pass_ms, launch_ms) = (option("--stop-ms"), option("--pass-ms"), option("--launch-ms"));
    // One launch every this many microseconds at most (0: as many at once as are admitted).
    let launch_every_us = match option("--launches-per-s") {
        0 => 0,
        rate => 1_000_000 / rate,
    };
    let mut workload = if arg == "kueue-baseline" || arg == "kueue-baseline-one-node" {
        kueue_baseline(arg == "kueue-baseline-one-node")
    } else {
        let text = std::fs::read_to_string(&arg).unwrap_or_else(|e| panic!("{arg}: {e}"));
        serde_json::from_str(&text).unwrap_or_else(|e| panic!("{arg}: not a workload: {e}"))
    };
    let scale = option("--time-scale").max(1);
    for job in &mut workload.jobs {
        job.arrival_ms *= scale;
        job.duration_ms *= scale;
    }
    let (stop_ms, pass_ms, launch_ms) = (stop_ms * scale, pass_ms * scale, launch_ms * scale);
    let launch_every_us = launch_every_us * scale;
    let estimate_every = option("--estimate-every").max(0) as usize;
    let runtimes = args
        .iter()
        .position(|a| a == "--runtimes")
        .and_then(|i| args.get(i + 1))
        .map_or("declared", String::as_str)
        .to_string();
    assert!(
        ["declared", "default", "history"].contains(&runtimes.as_str()),
        "--runtimes takes declared, default or history"
    );
    let tenant_id: BTreeMap<&str, Uuid> =
        workload.tenants.iter().enumerate().map(|(i, t)| (t.name.as_str(), Uuid::from_u128(i as u128 + 1))).collect();
    let base = Snapshot {
        now: 0,
        nodes: workload
            .nodes
            .iter()
            .map(|n| Node {
                name: n.name.clone(),
                rack: n.rack.clone(),
                gpu_type: Some(n.flavor.clone()),
                gpus: n.gpus,
                cpu_millis: 1 << 40,
                memory_bytes: 1 << 50,
                drained: None,
            })
            .collect(),
        tenants: workload
            .tenants
            .iter()
            .map(|t| TenantPolicy {
                id: tenant_id[t.name.as_str()],
                name: t.name.clone(),
                cohort: t.cohort.clone(),
                weight: 1.0,
                quotas: t
                    .quotas
                    .iter()
                    .map(|(f, (n, b, l))| (f.clone(), Quota { nominal: *n, borrowing_limit: *b, lending_limit: *l }))
                    .collect(),
                preempt_lower_priority: t.preempt_lower_priority,
            })
            .collect(),
        running: Vec::new(),
        pending: Vec::new(),
        settings: Settings { starvation_after_secs: i64::MAX / 4, ..Settings::default() },
        nominated: Vec::new(),
        held: Vec::new(),
        arrays: Vec::new(),
    };
    let jobs = &workload.jobs;
    let demand = |j: &JobSpec| Demand {
        replicas: 1,
        gpus: j.gpus,
        gpu_type: Some(j.flavor.clone()),
        cpu_millis: 1,
        memory_bytes: 1,
    };
    let mut arrivals: Vec<usize> = (0..jobs.len()).collect();
    arrivals.sort_by_key(|&i| (jobs[i].arrival_ms, i));
    let mut next_arrival = 0;
    let mut pending: BTreeSet<usize> = BTreeSet::new();
    let mut running: Vec<Running> = Vec::new();
    let mut admitted_at: Vec<Option<i64>> = vec![None; jobs.len()];
    // The preemptors whose victims ended since the last cycle, as the server's pass finds them.
    let mut nominated: Vec<Uuid> = Vec::new();
    let mut preemptions = 0usize;
    let mut cycles = 0usize;
    // Usage over time per tenant: integral of used units over virtual ms.
    let mut usage_integral: BTreeMap<&str, f64> = BTreeMap::new();
    let mut now = 0i64;
    // When the launcher can start its next launch (`--launches-per-s`), in microseconds.
    let mut launcher_free_us = 0i64;
    // Each class's finished durations per tenant, oldest first (for `--runtimes history`).
    let mut finished: BTreeMap<(&str, &str), Vec<i64>> = BTreeMap::new();
    // The start estimate of each job, in ms (`--estimate-every`).
    let mut estimated: Vec<Option<i64>> = vec![None; jobs.len()];
    let mut arrivals_since_estimate = 0usize;
    let started = Instant::now();

    loop {
        let next_end = running.iter().map(|r| r.stopping_until.map_or(r.end, |s| s.min(r.end))).min();
        let next_in = arrivals.get(next_arrival).map(|&i| jobs[i].arrival_ms);
        let Some(mut next) = [next_end, next_in].into_iter().flatten().min() else { break };
        if pass_ms > 0 {
            // The next pass at or after it.
            next = (next + pass_ms - 1) / pass_ms * pass_ms;
        }
        for r in &running {
            *usage_integral.entry(jobs[r.job].tenant.as_str()).or_default() +=
                (next - now) as f64 * f64::from(jobs[r.job].gpus);
        }
        now = next;
        // A job that ran to its end ended, stopping or not; a stopped one goes back to the queue.
        let mut stopped = Vec::new();
        running.retain(|r| {
            let gone = r.end > now && r.stopping_until.is_some_and(|s| s <= now);
            if gone {
                stopped.push(r.job);
            }
            // Stopped, or ended on its own while being stopped: its preemptor's room.
            if (gone || r.end <= now) && r.stopping_until.is_some() {
                nominated.extend(r.stopping_for);
            }
            if r.end <= now && !gone {
                let job = &jobs[r.job];
                finished.entry((job.tenant.as_str(), job.class.as_str())).or_default().push(job.duration_ms / 1000);
            }
            r.end > now && !gone
        });
        pending.extend(stopped);
        while next_arrival < arrivals.len() && jobs[arrivals[next_arrival]].arrival_ms <= now {
            pending.insert(arrivals[next_arrival]);
            next_arrival += 1;
            arrivals_since_estimate += 1;
        }
        // What the scheduler is told of a job's run time, in seconds.
        let expected = |i: usize| -> Option<i64> {
            let job = &jobs[i];
            match runtimes.as_str() {
                "declared" => Some(job.duration_ms / 1000),
                "default" => None,
                _ => {
                    let mut runs: Vec<i64> = finished
                        .get(&(job.tenant.as_str(), job.class.as_str()))
                        .map(|runs| runs.iter().rev().copied().collect())
                        .unwrap_or_default();
                    runs.truncate(trainyard_scheduler::history::RECENT_RUNS);
                    let facts = RuntimeFacts { class: &job.class, tenant_runs: &runs, ..Default::default() };
                    let guess = guess_runtime(&facts, base.settings.default_runtime_secs);
                    Some(guess.seconds)
                }
            }
        };
        if pending.is_empty() {
            continue;
        }
        let mut snap = base.clone();
        snap.now = now / 1000;
        snap.running = running
            .iter()
            .map(|r| RunningJob {
                id: Uuid::from_u128(r.job as u128),
                tenant: tenant_id[jobs[r.job].tenant.as_str()],
                priority: jobs[r.job].priority,
                demand: demand(&jobs[r.job]),
                flavor: r.flavor.clone(),
                nodes: r.nodes.clone(),
                started_at: r.started,
                expected_runtime: expected(r.job),
                stopping: r.stopping_until.is_some(),
                stopping_for: r.stopping_for,
                spare: false,
                saved_at: None,
            })
            .collect();
        snap.pending = pending
            .iter()
            .map(|&i| PendingJob {
                id: Uuid::from_u128(i as u128),
                tenant: tenant_id[jobs[i].tenant.as_str()],
                priority: jobs[i].priority,
                seq: i as u64,
                submitted_at: jobs[i].arrival_ms / 1000,
                demand: demand(&jobs[i]),
                expected_runtime: expected(i),
                warm_nodes: Vec::new(),
                cache_wait_secs: 0,
                spare: false,
            })
            .collect();
        snap.nominated = std::mem::take(&mut nominated);
        if estimate_every > 0 && arrivals_since_estimate >= estimate_every {
            arrivals_since_estimate = 0;
            for (id, start) in estimate_starts(&snap) {
                let job = id.as_u128() as usize;
                if estimated[job].is_none() {
                    // Beyond the horizon: counted as never (as far off as the horizon allows).
                    estimated[job] = Some(start.map_or(i64::MAX / 4, |at| at * 1000));
                }
            }
        }
        let result = admission_cycle(&snap);
        cycles += 1;
        for p in &result.preemptions {
            let victim = p.victim.as_u128() as usize;
            if stop_ms == 0 {
                running.retain(|r| r.job != victim);
                pending.insert(victim);
                nominated.push(p.for_job);
            } else if let Some(r) = running.iter_mut().find(|r| r.job == victim) {
                r.stopping_until.get_or_insert(now + stop_ms);
                r.stopping_for.get_or_insert(p.for_job);
            }
            preemptions += 1;
        }
        for a in &result.admissions {
            let job = a.job.as_u128() as usize;
            pending.remove(&job);
            admitted_at[job] = Some(now);
            // Launched after `launch_ms`, and no sooner than the launcher's rate allows: jobs
            // admitted together start one after another, holding their GPUs meanwhile.
            let mut start = now + launch_ms;
            if launch_every_us > 0 {
                let at_us = launcher_free_us.max(start * 1000);
                launcher_free_us = at_us + launch_every_us;
                start = (at_us + 999) / 1000;
            }
            running.push(Running {
                job,
                end: start + jobs[job].duration_ms,
                stopping_until: None,
                stopping_for: None,
                flavor: a.flavor.clone(),
                nodes: a.nodes.clone(),
                started: now / 1000,
            });
        }
    }
    let compute = started.elapsed();

    // Times are printed in the workload's own time (`--time-scale`).
    let in_s = |ms: i64| ms as f64 / 1000.0 / scale as f64;
    println!("workload: {} jobs, {} tenants, {} nodes", jobs.len(), workload.tenants.len(), workload.nodes.len());
    println!("virtual wall time until the last job ended: {:.1} s", in_s(now));
    if estimate_every > 0 {
        // |actual - estimated| in the workload's own time, and how many started later than said:
        // over all jobs, then per class.
        let mut classes: Vec<&str> = jobs.iter().map(|j| j.class.as_str()).collect();
        classes.sort_unstable();
        classes.dedup();
        for class in std::iter::once("all").chain(classes) {
            let mut errors: Vec<(i64, bool)> = jobs
                .iter()
                .enumerate()
                .filter(|(_, j)| class == "all" || j.class == class)
                .filter_map(|(i, _)| {
                    let (at, est) = (admitted_at[i]?, estimated[i]?);
                    Some(((at - est).abs(), at > est))
                })
                .collect();
            errors.sort_unstable();
            let pick = |q: f64| errors.get(((errors.len() as f64 - 1.0) * q).round() as usize).map_or(0, |e| e.0);
            let late = errors.iter().filter(|e| e.1).count();
            println!(
                "start estimates (--runtimes {runtimes}), {class}: {} jobs; |actual - estimated| p50 {:.2} s, p90 {:.2} s; {late} started later than estimated",
                errors.len(),
                in_s(pick(0.5)),
                in_s(pick(0.9)),
            );
        }
    }
    for class in ["small", "medium", "large"] {
        let waits: Vec<f64> = jobs
            .iter()
            .enumerate()
            .filter(|(_, j)| j.class == class)
            .filter_map(|(i, j)| admitted_at[i].map(|a| in_s(a - j.arrival_ms)))
            .collect();
        if !waits.is_empty() {
            println!(
                "mean time to admission, {class}: {:.1} s ({} jobs)",
                waits.iter().sum::<f64>() / waits.len() as f64,
                waits.len()
            );
        }
    }
    let usage: Vec<(f64, &str)> = workload
        .tenants
        .iter()
        .map(|t| {
            let nominal: u64 = t.quotas.values().map(|q| q.0).sum();
            (
                usage_integral.get(t.name.as_str()).copied().unwrap_or(0.0)
                    / (now.max(1) as f64 * nominal.max(1) as f64),
                t.name.as_str(),
            )
        })
        .collect();
    let min = usage.iter().cloned().fold((f64::INFINITY, ""), |a, b| if b.0 < a.0 { b } else { a });
    let max = usage.iter().cloned().fold((0.0, ""), |a, b| if b.0 > a.0 { b } else { a });
    println!(
        "queue usage (time-averaged use over nominal): min {:.1}% ({}), max {:.1}% ({})",
        min.0 * 100.0,
        min.1,
        max.0 * 100.0,
        max.1
    );
    println!(
        "preemptions: {preemptions}; admission cycles: {cycles}; simulation took {:.2} s of real time",
        compute.as_secs_f64()
    );
}
