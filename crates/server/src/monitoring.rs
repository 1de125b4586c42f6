//! The server's own metrics, for Prometheus (`GET /metrics`, text exposition format), on the
//! `prometheus-client` crate (the Prometheus project's official Rust client: typed label sets,
//! no global registry, OpenMetrics-compatible encoding).
//!
//! Names follow Kueue's where the concept is the same (`admission_wait_time_seconds`,
//! `admission_attempts_total`, `pending_jobs`), prefixed `trainyard_`. No label carries a job id
//! or anything else without bound: tenants, GPU types, states, reason classes, routes as
//! declared (`/api/v1/jobs/{id}`), status codes. `docs/operations.md` lists every metric.
//!
//! Who feeds what: the HTTP middleware ([`track_requests`]) the request metrics; the reconciler
//! the job, admission, launch, quota and executor metrics (each pass, from what it read anyway);
//! the archiving loop its backlog; engines' `input_stall_share` points the stall histogram;
//! the dataset file route the bytes it sends.

use std::collections::BTreeMap;

use rustc_hash::FxHashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Instant;

use axum::extract::{MatchedPath, Request, State};
use axum::middleware::Next;
use axum::response::Response;
use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::{Histogram, exponential_buckets};
use prometheus_client::registry::Registry;

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct RequestLabels {
    pub method: String,
    pub route: String,
    pub status: u16,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct RouteLabels {
    pub method: String,
    pub route: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, PartialOrd, Ord, EncodeLabelSet)]
pub struct TenantState {
    pub tenant: String,
    pub state: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, PartialOrd, Ord, EncodeLabelSet)]
pub struct TenantReason {
    pub tenant: String,
    pub reason: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, PartialOrd, Ord, EncodeLabelSet)]
pub struct TenantGpu {
    pub tenant: String,
    pub gpu_type: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct TenantLabel {
    pub tenant: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct TenantKind {
    pub tenant: String,
    pub kind: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct ResultLabel {
    pub result: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct OperationLabel {
    pub operation: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct PhaseLabel {
    pub phase: &'static str,
}

type HistogramFamily<L> = Family<L, Histogram, fn() -> Histogram>;
type FloatGauge = Gauge<f64, AtomicU64>;
type FloatCounter = Counter<f64, AtomicU64>;

fn latency_histogram() -> Histogram {
    // 1 ms to about 16 s.
    Histogram::new(exponential_buckets(0.001, 2.0, 15))
}

fn wait_histogram() -> Histogram {
    // 0.1 s to about 27 hours.
    Histogram::new(exponential_buckets(0.1, 3.0, 14))
}

fn share_histogram() -> Histogram {
    Histogram::new([0.01, 0.02, 0.05, 0.1, 0.2, 0.3, 0.5, 0.75, 1.0])
}

/// Every metric the server exports, registered once.
pub struct Monitoring {
    registry: Registry,
    pub http_requests: Family<RequestLabels, Counter>,
    pub http_request_duration: HistogramFamily<RouteLabels>,
    pub jobs: Family<TenantState, Gauge>,
    pub jobs_finished: Family<TenantState, Counter>,
    pub pending_jobs: Family<TenantReason, Gauge>,
    pub admission_wait: HistogramFamily<TenantGpu>,
    pub launch_time: HistogramFamily<TenantGpu>,
    pub admission_cycle_duration: Histogram,
    pub admission_attempts: Family<ResultLabel, Counter>,
    pub preempted_jobs: Family<TenantReason, Counter>,
    pub reconciler_pass_duration: Histogram,
    pub reconciler_pass_phase: HistogramFamily<PhaseLabel>,
    pub launch_phase: HistogramFamily<PhaseLabel>,
    pub reconciler_last_success: FloatGauge,
    pub leader: Gauge,
    pub quota_nominal: Family<TenantGpu, Gauge>,
    pub quota_used: Family<TenantGpu, Gauge>,
    pub quota_borrowed: Family<TenantGpu, Gauge>,
    pub quota_lent: Family<TenantGpu, Gauge>,
    pub executor_errors: Family<OperationLabel, Counter>,
    pub log_archive_backlog: Gauge,
    pub log_streams: Gauge,
    pub input_stall_share: HistogramFamily<TenantLabel>,
    pub gpu_hours: Family<TenantGpu, FloatCounter>,
    pub dataset_bytes_served: Family<TenantKind, Counter>,
}

impl Default for Monitoring {
    fn default() -> Self {
        Monitoring::new()
    }
}

impl Monitoring {
    pub fn new() -> Monitoring {
        let mut registry = Registry::with_prefix("trainyard");
        let m = Monitoring {
            http_requests: Family::default(),
            http_request_duration: Family::new_with_constructor(latency_histogram),
            jobs: Family::default(),
            jobs_finished: Family::default(),
            pending_jobs: Family::default(),
            admission_wait: Family::new_with_constructor(wait_histogram),
            launch_time: Family::new_with_constructor(wait_histogram),
            admission_cycle_duration: latency_histogram(),
            admission_attempts: Family::default(),
            preempted_jobs: Family::default(),
            reconciler_pass_duration: latency_histogram(),
            reconciler_pass_phase: Family::new_with_constructor(latency_histogram),
            launch_phase: Family::new_with_constructor(latency_histogram),
            reconciler_last_success: FloatGauge::default(),
            leader: Gauge::default(),
            quota_nominal: Family::default(),
            quota_used: Family::default(),
            quota_borrowed: Family::default(),
            quota_lent: Family::default(),
            executor_errors: Family::default(),
            log_archive_backlog: Gauge::default(),
            log_streams: Gauge::default(),
            input_stall_share: Family::new_with_constructor(share_histogram),
            gpu_hours: Family::default(),
            dataset_bytes_served: Family::default(),
            registry: Registry::default(),
        };
        // Counters get `_total` appended by the encoder.
        let r = &mut registry;
        r.register("http_requests", "HTTP requests answered, by route and status", m.http_requests.clone());
        r.register(
            "http_request_duration_seconds",
            "Time to answer an HTTP request (until the response head; streams not included)",
            m.http_request_duration.clone(),
        );
        r.register("jobs", "Unfinished jobs by tenant and state", m.jobs.clone());
        r.register("jobs_finished", "Jobs that ended, by tenant and final state", m.jobs_finished.clone());
        r.register("pending_jobs", "Queued jobs by tenant and why they wait (reason class)", m.pending_jobs.clone());
        r.register(
            "admission_wait_time_seconds",
            "From submit to admission, per admitted job",
            m.admission_wait.clone(),
        );
        r.register("launch_time_seconds", "From admission to every replica running", m.launch_time.clone());
        r.register(
            "admission_cycle_duration_seconds",
            "Time one admission cycle takes (the scheduler's decision)",
            m.admission_cycle_duration.clone(),
        );
        r.register(
            "admission_attempts",
            "Jobs considered by admission cycles, by result (success, inadmissible)",
            m.admission_attempts.clone(),
        );
        r.register("preempted_jobs", "Jobs preempted, by tenant and reason", m.preempted_jobs.clone());
        r.register(
            "reconciler_pass_duration_seconds",
            "Time one reconciler pass takes (observe, admit, launch)",
            m.reconciler_pass_duration.clone(),
        );
        r.register(
            "reconciler_pass_phase_duration_seconds",
            "Time a reconciler pass spends in each phase: read (the unfinished jobs), observe (every \
             running attempt, and the ends and starts it records), admit (snapshot, cycle, admissions, \
             preemptions, reasons), rest (launch hand-over, sweeps)",
            m.reconciler_pass_phase.clone(),
        );
        r.register(
            "launch_phase_duration_seconds",
            "Time a launch spends in each phase: wait (handed over by a pass, waiting for one of the \
             --launch-concurrency slots), launch (in its slot: the attempt opened, the executor's \
             launch, its placement stored); within launch, for a fresh launch: open (its inputs read, its \
             attempt opened), start (the executor's launch), record (its placement stored)",
            m.launch_phase.clone(),
        );
        r.register(
            "reconciler_last_success_timestamp_seconds",
            "Unix time of the last pass that completed",
            m.reconciler_last_success.clone(),
        );
        r.register("leader", "1 while this server leads the control loops", m.leader.clone());
        r.register("quota_nominal_gpus", "Nominal quota per tenant and GPU type", m.quota_nominal.clone());
        r.register("quota_used_gpus", "GPUs held per tenant and GPU type", m.quota_used.clone());
        r.register(
            "quota_borrowed_gpus",
            "GPUs held beyond nominal (borrowed from the cohort)",
            m.quota_borrowed.clone(),
        );
        r.register("quota_lent_gpus", "Idle nominal GPUs used by others in the cohort", m.quota_lent.clone());
        r.register("executor_errors", "Executor operations that failed, by operation", m.executor_errors.clone());
        r.register(
            "log_archive_backlog",
            "Ended attempts whose logs are not archived yet (at most the archiver's batch)",
            m.log_archive_backlog.clone(),
        );
        r.register(
            "log_streams",
            "Job log streams open now (clients reading or following a log)",
            m.log_streams.clone(),
        );
        r.register(
            "input_stall_share",
            "Share of training time spent waiting for data, as engines report it",
            m.input_stall_share.clone(),
        );
        r.register("gpu_hours", "GPU-hours allocated to attempts, by tenant and GPU type", m.gpu_hours.clone());
        r.register(
            "dataset_bytes_served",
            "Bytes of pushed datasets' files sent to jobs and members, by tenant and kind (shard, index, manifest)",
            m.dataset_bytes_served.clone(),
        );
        Monitoring { registry, ..m }
    }

    /// The exposition, in Prometheus' text format.
    pub fn encode(&self) -> String {
        let mut text = String::new();
        prometheus_client::encoding::text::encode(&mut text, &self.registry).expect("writing to a String never fails");
        text
    }

    /// Counts `took` to `phase` of the current pass.
    pub fn pass_phase(&self, phase: &'static str, took: std::time::Duration) {
        self.reconciler_pass_phase.get_or_create(&PhaseLabel { phase }).observe(took.as_secs_f64());
    }

    /// Counts `took` to `phase` of a launch.
    pub fn launch_phase_observe(&self, phase: &'static str, took: std::time::Duration) {
        self.launch_phase.get_or_create(&PhaseLabel { phase }).observe(took.as_secs_f64());
    }

    pub fn pass_completed(&self, took: std::time::Duration) {
        self.reconciler_pass_duration.observe(took.as_secs_f64());
        let now = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap_or_default();
        self.reconciler_last_success.set(now.as_secs_f64());
    }

    pub fn job_finished(&self, tenant: &str, state: &str) {
        self.jobs_finished.get_or_create(&TenantState { tenant: tenant.into(), state: state.into() }).inc();
    }

    /// The counter of a pushed dataset's bytes sent, for one tenant and kind of file.
    pub fn dataset_bytes_counter(&self, tenant: &str, kind: &str) -> Counter {
        self.dataset_bytes_served.get_or_create(&TenantKind { tenant: tenant.into(), kind: kind.into() }).clone()
    }

    pub fn executor_error(&self, operation: &str) {
        self.executor_errors.get_or_create(&OperationLabel { operation: operation.into() }).inc();
    }

    /// Replaces a gauge family's values with `values` (a label set absent now disappears).
    pub fn gauges_set<L>(family: &Family<L, Gauge>, values: BTreeMap<L, i64>)
    where
        L: Clone + std::hash::Hash + Eq + EncodeLabelSet + std::fmt::Debug + Send + Sync + 'static,
    {
        family.clear();
        for (labels, value) in values {
            family.get_or_create(&labels).set(value);
        }
    }
}

/// The middleware that counts and times every request by its declared route (never by the
/// path as sent: a path carries ids).
pub async fn track_requests(
    State(monitoring): State<std::sync::Arc<Monitoring>>,
    request: Request,
    next: Next,
) -> Response {
    let started = Instant::now();
    let method = request.method().as_str().to_string();
    let route =
        request.extensions().get::<MatchedPath>().map_or_else(|| "unmatched".to_string(), |p| p.as_str().to_string());
    let response = next.run(request).await;
    let status = response.status().as_u16();
    monitoring
        .http_requests
        .get_or_create(&RequestLabels { method: method.clone(), route: route.clone(), status })
        .inc();
    monitoring
        .http_request_duration
        .get_or_create(&RouteLabels { method, route })
        .observe(started.elapsed().as_secs_f64());
    response
}

/// The reason class a pending reason is counted in (`trainyard_pending_jobs{reason}`).
pub fn reason_class(reason: &trainyard_scheduler::PendingReason) -> &'static str {
    use trainyard_scheduler::PendingReason as R;
    match reason {
        R::NoQuota { .. } | R::QuotaExceeded { .. } | R::CohortExhausted { .. } => "quota",
        R::NoRoom { .. } | R::NeverFits { .. } => "capacity",
        R::Reserved { .. } => "fair_share",
        R::WaitingForPreemption { .. } => "preemption",
        R::WaitingForCache { .. } => "data_locality",
        R::NoSpareRoom { .. } => "spare_room",
        R::Drained { .. } => "drained",
    }
}

/// The gauges describing unfinished jobs, computed from the reconciler's list and the tenants'
/// quotas: pure, so that the arithmetic is tested alone.
#[derive(Debug, Default, PartialEq)]
pub struct JobGauges {
    pub by_state: BTreeMap<TenantState, i64>,
    pub nominal: BTreeMap<TenantGpu, i64>,
    pub used: BTreeMap<TenantGpu, i64>,
    pub borrowed: BTreeMap<TenantGpu, i64>,
    pub lent: BTreeMap<TenantGpu, i64>,
    /// GPUs of attempts that run (starting or running), for the GPU-hours counter.
    pub running_gpus: BTreeMap<TenantGpu, u64>,
}

pub fn job_gauges(
    jobs: &[std::sync::Arc<trainyard_store::reconcile::UnfinishedJob>],
    policies: &[trainyard_store::reconcile::TenantPolicyRow],
) -> JobGauges {
    use trainyard_core::job::JobState;
    let mut g = JobGauges::default();
    // Counted by borrowed names (a pass brings thousands of jobs of a few tenants), labelled after.
    let mut by_state: FxHashMap<(&str, &'static str), i64> = FxHashMap::default();
    let mut used_by: FxHashMap<(&str, &str), u64> = FxHashMap::default();
    let mut running_by: FxHashMap<(&str, &str), u64> = FxHashMap::default();
    for job in jobs {
        *by_state.entry((job.tenant.as_str(), job.state.as_str())).or_default() += 1;
        let gpus = u64::from(job.spec.resources.gpus) * u64::from(job.spec.replicas);
        let holding =
            matches!(job.state, JobState::Admitted | JobState::Starting | JobState::Running | JobState::Restarting);
        if let (true, Some(flavor), true) = (holding, &job.flavor, gpus > 0) {
            *used_by.entry((job.tenant.as_str(), flavor.as_str())).or_default() += gpus;
            if matches!(job.state, JobState::Starting | JobState::Running) {
                *running_by.entry((job.tenant.as_str(), flavor.as_str())).or_default() += gpus;
            }
        }
    }
    for ((tenant, state), count) in by_state {
        g.by_state.insert(TenantState { tenant: tenant.into(), state: state.into() }, count);
    }
    for ((tenant, gpu_type), gpus) in running_by {
        g.running_gpus.insert(TenantGpu { tenant: tenant.into(), gpu_type: gpu_type.into() }, gpus);
    }
    let used: BTreeMap<(String, String), u64> =
        used_by.into_iter().map(|((tenant, flavor), gpus)| ((tenant.into(), flavor.into()), gpus)).collect();
    let as_gauge = |v: u64| i64::try_from(v).unwrap_or(i64::MAX);
    let quota = |p: &trainyard_store::reconcile::TenantPolicyRow, flavor: &str| {
        p.quotas.iter().find(|q| q.flavor == flavor).map(|q| trainyard_scheduler::Quota {
            nominal: q.nominal.max(0) as u64,
            borrowing_limit: q.borrowing_limit.map(|v| v.max(0) as u64),
            lending_limit: q.lending_limit.map(|v| v.max(0) as u64),
        })
    };
    let mut sorted: Vec<&trainyard_store::reconcile::TenantPolicyRow> = policies.iter().collect();
    sorted.sort_by(|a, b| a.name.cmp(&b.name));
    for tenant in &sorted {
        for q in &tenant.quotas {
            let labels = TenantGpu { tenant: tenant.name.clone(), gpu_type: q.flavor.clone() };
            let mine = used.get(&(tenant.name.clone(), q.flavor.clone())).copied().unwrap_or(0);
            let nominal = q.nominal.max(0) as u64;
            g.nominal.insert(labels.clone(), as_gauge(nominal));
            g.used.insert(labels.clone(), as_gauge(mine));
            g.borrowed.insert(labels.clone(), as_gauge(mine.saturating_sub(nominal)));
            // What the cohort borrows is attributed to its lenders in name order, by the
            // scheduler's own rule (`Quota::lent_by`), as the quota report does.
            let lent = match &tenant.cohort {
                None => 0,
                Some(cohort) => {
                    let members: Vec<&&trainyard_store::reconcile::TenantPolicyRow> =
                        sorted.iter().filter(|t| t.cohort.as_ref() == Some(cohort)).collect();
                    let uses: Vec<(Option<trainyard_scheduler::Quota>, u64)> = members
                        .iter()
                        .map(|t| {
                            (quota(t, &q.flavor), used.get(&(t.name.clone(), q.flavor.clone())).copied().unwrap_or(0))
                        })
                        .collect();
                    let shares = trainyard_scheduler::Quota::lent_by(&uses);
                    members.iter().zip(shares).find(|(t, _)| t.name == tenant.name).map_or(0, |(_, s)| s)
                }
            };
            g.lent.insert(labels, as_gauge(lent));
        }
    }
    // Use without a quota (a tenant borrowing everything) is shown as used and borrowed.
    for ((tenant, flavor), gpus) in used {
        let labels = TenantGpu { tenant, gpu_type: flavor };
        if !g.used.contains_key(&labels) {
            g.used.insert(labels.clone(), as_gauge(gpus));
            g.borrowed.insert(labels, as_gauge(gpus));
        }
    }
    g
}

/// Adds GPU-hours to a counter without losing fractions: the counter is a float.
pub fn add_hours(counter: &FloatCounter, hours: f64) {
    if hours > 0.0 && hours.is_finite() {
        counter.inc_by(hours);
    }
}

/// A counter of seconds since an instant, for rate-based pass accounting.
#[derive(Debug, Default)]
pub struct Stamp(AtomicU64);

impl Stamp {
    /// Seconds since the last call (zero on the first), measured on a monotonic clock from
    /// `origin`.
    pub fn lap(&self, origin: Instant) -> f64 {
        let now = origin.elapsed().as_micros() as u64;
        let last = self.0.swap(now, Ordering::Relaxed);
        if last == 0 { 0.0 } else { (now.saturating_sub(last)) as f64 / 1e6 }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_exposition_names_every_metric_with_its_prefix() {
        let m = Monitoring::new();
        m.job_finished("a", "succeeded");
        m.admission_wait.get_or_create(&TenantGpu { tenant: "a".into(), gpu_type: "h100".into() }).observe(2.0);
        let text = m.encode();
        assert!(text.contains("trainyard_jobs_finished_total{tenant=\"a\",state=\"succeeded\"} 1"), "{text}");
        assert!(
            text.contains("trainyard_admission_wait_time_seconds_count{tenant=\"a\",gpu_type=\"h100\"} 1"),
            "{text}"
        );
        assert!(text.contains("# TYPE trainyard_reconciler_last_success_timestamp_seconds gauge"), "{text}");
    }

    fn job(
        tenant: &str,
        state: trainyard_core::job::JobState,
        gpus: u32,
    ) -> std::sync::Arc<trainyard_store::reconcile::UnfinishedJob> {
        std::sync::Arc::new(crate::scheduling::snapshot::job_for_tests(tenant, state, gpus))
    }

    fn tenant(name: &str, nominal: i64) -> trainyard_store::reconcile::TenantPolicyRow {
        trainyard_store::reconcile::TenantPolicyRow {
            id: uuid::Uuid::now_v7(),
            name: name.into(),
            cohort: Some("c".into()),
            weight: 1.0,
            preempt_lower_priority: false,
            quotas: vec![trainyard_store::reconcile::QuotaRow {
                flavor: "h100".into(),
                nominal,
                borrowing_limit: None,
                lending_limit: None,
            }],
        }
    }

    #[test]
    fn quota_gauges_show_borrowing_and_who_lent_it() {
        use trainyard_core::job::JobState::*;
        // a (nominal 4) runs 6: borrows 2, which b (nominal 4, idle) lends.
        let jobs = [job("a", Running, 4), job("a", Starting, 2), job("b", Queued, 1)];
        let g = job_gauges(&jobs, &[tenant("a", 4), tenant("b", 4)]);
        let at = |t: &str| TenantGpu { tenant: t.into(), gpu_type: "h100".into() };
        assert_eq!((g.used[&at("a")], g.borrowed[&at("a")], g.lent[&at("a")]), (6, 2, 0));
        assert_eq!((g.used[&at("b")], g.borrowed[&at("b")], g.lent[&at("b")]), (0, 0, 2));
        assert_eq!(g.nominal[&at("b")], 4);
        assert_eq!(g.running_gpus[&at("a")], 6);
        assert_eq!(g.by_state[&TenantState { tenant: "b".into(), state: "queued".into() }], 1);
    }

    #[test]
    fn gauges_set_drops_label_sets_that_are_gone() {
        let m = Monitoring::new();
        let key = |t: &str| TenantState { tenant: t.into(), state: "queued".into() };
        Monitoring::gauges_set(&m.jobs, BTreeMap::from([(key("a"), 3), (key("b"), 1)]));
        Monitoring::gauges_set(&m.jobs, BTreeMap::from([(key("b"), 2)]));
        let text = m.encode();
        assert!(!text.contains("tenant=\"a\""), "{text}");
        assert!(text.contains("trainyard_jobs{tenant=\"b\",state=\"queued\"} 2"), "{text}");
    }
}
