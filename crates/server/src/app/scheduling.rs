//! Scheduling seen from the API: why a job waits and when it should start, what-if, the quota
//! report, quotas and tenant policies, the executor's nodes.

use trainyard_core::api::{CacheLocality, FlavorUsage, QuotaReport, QuotaSet, Schedule, TenantPolicyUpdate};
use trainyard_core::auth::{Action, Caller};
use trainyard_core::error::ObjectKind;
use trainyard_core::job::{JobSubmission, ValidSubmission};
use trainyard_core::{Error, Result};
use trainyard_store::audit::Audit;
use trainyard_store::reconcile::{QUEUE_WINDOW_PER_TENANT, QUEUED_AHEAD_COUNTED, QueuedAhead, UnfinishedJob};

use rustc_hash::FxHashMap;
use std::sync::Arc;
use uuid::Uuid;

use super::App;
use crate::scheduling::board::{BoardInput, schedule_of};

impl App {
    /// What the executor offers in all (the machine's GPUs for the local executor).
    pub fn inventory(&self) -> trainyard_executor::Inventory {
        self.executor.inventory()
    }

    /// What the executor offers, as the scheduler's nodes (platform admins).
    pub fn nodes(&self, caller: &Caller) -> Result<Vec<trainyard_scheduler::Node>> {
        caller.require_platform_admin()?;
        Ok(crate::scheduling::snapshot::nodes_for(self.executor.as_ref()))
    }

    /// The scheduler's view right now (what the next admission cycle would see).
    pub(crate) async fn scheduling_snapshot(&self) -> Result<trainyard_scheduler::Snapshot> {
        let jobs = self.store.jobs_unfinished().await?.jobs;
        crate::scheduling::snapshot::snapshot_now(&self.store, self.executor.as_ref(), &jobs, &Default::default()).await
    }

    /// What the schedule board is computed from, read now; owns what it reads with, so that a
    /// board can be computed behind the request that asked.
    fn board_input(&self) -> impl Future<Output = Result<BoardInput>> + Send + 'static {
        let (store, executor, history) =
            (self.store.clone(), Arc::clone(&self.executor), Arc::clone(&self.run_history));
        async move {
            let jobs = store.jobs_unfinished().await?.jobs;
            let (mut snapshot, held) = snapshot_with_holds(&store, executor.as_ref(), &jobs).await?;
            let guesses = history.guesses(&store, &jobs).await?;
            crate::scheduling::history::apply(&mut snapshot, &guesses);
            Ok(BoardInput { snapshot, jobs, guesses, held })
        }
    }

    /// The waiting jobs the caller may see (its tenant's; every tenant's for platform admins), in
    /// the order the scheduler considers them, each with its reason, positions and estimate, from
    /// the same shared board as a job's own schedule, as of the board's time. Jobs deeper in
    /// their tenant's queue than a cycle looks are not listed.
    pub async fn queue(&self, caller: &Caller) -> Result<trainyard_core::api::Queue> {
        caller.authorize(Action::ReadJobs)?;
        let board = self.schedule.get(|| self.board_input()).await?;
        Ok(board.queue_for(caller.tenant_id, caller.platform_admin))
    }

    /// Every node the scheduler places on, with what unfinished jobs hold of it (any member may
    /// see the cluster's use, as `sinfo` shows it; jobs are counted, not named).
    pub async fn nodes_usage(&self, caller: &Caller) -> Result<trainyard_core::api::Nodes> {
        caller.authorize(Action::ReadJobs)?;
        let jobs = self.store.jobs_unfinished().await?.jobs;
        let nodes = crate::scheduling::snapshot::nodes_for(self.executor.as_ref());
        let mut items = crate::scheduling::snapshot::node_usage(&nodes, &jobs);
        // What each node's cache holds of the caller's tenant's datasets.
        let mut cached: std::collections::HashMap<String, Vec<String>> = Default::default();
        for (node, version) in self.store.node_cached_datasets(caller.tenant_id).await? {
            cached.entry(node).or_default().push(version);
        }
        let drains = self.store.node_drains().await?;
        for node in &mut items {
            node.cached_datasets = cached.remove(&node.name).unwrap_or_default();
            node.drained = drains.iter().find(|d| d.node == node.name).cloned();
        }
        Ok(trainyard_core::api::Nodes { items })
    }

    /// Drains a node (platform admins): no new placements there from the next pass; with
    /// `preempt`, its jobs go back to the queue as preempted. The node must be one the executor
    /// reports (404 otherwise: a typo would drain nothing).
    pub async fn node_drain(
        &self,
        caller: &Caller,
        node: &str,
        request: trainyard_core::api::NodeDrainRequest,
    ) -> Result<trainyard_core::api::NodeDrain> {
        let audit = Audit::by(caller, "node.drain", format!("node:{node}")).platform_wide();
        let drain = self
            .audited(&audit, async {
                caller.require_platform_admin()?;
                let reason = request.reason.as_deref().unwrap_or("").trim();
                if reason.chars().count() > 500 {
                    return Err(Error::invalid("reason", "at most 500 characters"));
                }
                if !crate::scheduling::snapshot::node_names(self.executor.as_ref()).iter().any(|n| n == node) {
                    return Err(Error::not_found(ObjectKind::Node));
                }
                self.store.node_drain(node, reason, request.preempt, &audit).await
            })
            .await?;
        self.scheduling_changed();
        Ok(drain)
    }

    /// Undrains a node (platform admins): it takes placements again. 409 when not drained.
    pub async fn node_undrain(&self, caller: &Caller, node: &str) -> Result<trainyard_core::api::NodeDrain> {
        let audit = Audit::by(caller, "node.undrain", format!("node:{node}")).platform_wide();
        let drain = self
            .audited(&audit, async {
                caller.require_platform_admin()?;
                self.store.node_undrain(node, &audit).await
            })
            .await?;
        self.scheduling_changed();
        Ok(drain)
    }

    /// Why a queued job waits, where it stands, and when it should start.
    pub async fn job_schedule(&self, caller: &Caller, job_id: Uuid) -> Result<Option<Schedule>> {
        caller.authorize(Action::ReadJobs)?;
        let job = self.store.job_get(caller.tenant_id, job_id).await?;
        if job.state != trainyard_core::job::JobState::Queued {
            return Ok(None);
        }
        if let Some(held) = self.store.job_hold_reason(caller.tenant_id, job_id).await? {
            // Estimated as the board runs down its chain (or its array's window), with the
            // reason as of now.
            let mut board = self.schedule.get(|| self.board_input()).await?;
            if board.standing(job_id).is_none() {
                self.schedule.changed();
                board = self.schedule.get(|| self.board_input()).await?;
            }
            let mut schedule = board.schedule(job_id).unwrap_or_default();
            schedule.admitted_now = false;
            schedule.reason = Some(held);
            return Ok(Some(schedule));
        }
        let mut board = self.schedule.get(|| self.board_input()).await?;
        if board.standing(job_id).is_none() {
            let QueuedAhead { ahead, higher, more_than_counted } =
                self.store.queued_ahead(caller.tenant_id, job_id).await?;
            if ahead >= QUEUE_WINDOW_PER_TENANT {
                // Deeper in its tenant's queue than an admission cycle looks: honest about
                // where it stands, with no reason or estimate the scheduler did not compute.
                let behind =
                    if more_than_counted { format!("more than {QUEUED_AHEAD_COUNTED}") } else { ahead.to_string() };
                return Ok(Some(Schedule {
                    admitted_now: false,
                    reason: Some(format!(
                        "waits behind {behind} earlier queued jobs of its tenant; each admission cycle considers \
                         the first {QUEUE_WINDOW_PER_TENANT} of a tenant's queue"
                    )),
                    tenant_position: (!more_than_counted).then_some(ahead as usize + 1),
                    cluster_position: None,
                    behind_higher_priority: higher as usize,
                    cached_on: self.cache_locality(caller.tenant_id, &job.datasets).await?.map(|(l, _)| l),
                    ..Schedule::default()
                }));
            }
            // Submitted after the board was computed (through another server): compute anew.
            self.schedule.changed();
            board = self.schedule.get(|| self.board_input()).await?;
        }
        let mut schedule = board.schedule(job_id).unwrap_or_else(|| schedule_of(false, None, None));
        schedule.cached_on = self.cache_locality(caller.tenant_id, &job.datasets).await?.map(|(l, _)| l);
        Ok(Some(schedule))
    }

    /// For a job reading `datasets`: how many of the cluster's nodes hold its data in their
    /// shard cache, and their names; `None` for a job reading no registered dataset.
    pub(crate) async fn cache_locality(
        &self,
        tenant_id: Uuid,
        datasets: &[trainyard_core::api::DatasetUse],
    ) -> Result<Option<(CacheLocality, Vec<String>)>> {
        if datasets.is_empty() {
            return Ok(None);
        }
        let hashes: Vec<String> = datasets.iter().map(|d| d.content_hash.clone()).collect();
        let caching = self.store.nodes_caching(tenant_id, &hashes).await?;
        let nodes = crate::scheduling::snapshot::nodes_for(self.executor.as_ref());
        let warm: Vec<String> = nodes.iter().filter(|n| caching.contains(&n.name)).map(|n| n.name.clone()).collect();
        Ok(Some((CacheLocality { nodes: warm.len(), of: nodes.len() }, warm)))
    }

    /// What would happen to a job submitted now. Checks it like a submit; queues nothing.
    pub async fn job_what_if(&self, caller: &Caller, submission: JobSubmission) -> Result<Schedule> {
        caller.authorize(Action::WriteJobs)?;
        let valid = submission.validate()?;
        self.what_if_of(caller, &valid).await
    }

    /// Whether jobs larger than today's cluster are queued (it grows) rather than refused.
    pub(crate) fn cluster_grows_set(&mut self, grows: bool) {
        self.cluster_grows = grows;
    }

    /// Refuses a job that can never run on the cluster as it is (a replica larger than every
    /// node, a GPU type no node has, a gang larger than the cluster) with a 422 naming the field
    /// and the capacity, unless the operator said the cluster grows (`--cluster-grows`).
    pub(crate) fn fits_cluster(&self, spec: &trainyard_core::job::JobSpec) -> Result<()> {
        if let (Some(code), Some(max)) = (&spec.code, self.executor.code_bytes_max())
            && code.size_bytes > max
        {
            return Err(Error::invalid(
                "code",
                format!(
                    "the code archive takes {}, more than this cluster delivers with a job ({}): ship larger files in the image or a volume",
                    trainyard_core::resources::human_memory(code.size_bytes),
                    trainyard_core::resources::human_memory(max)
                ),
            ));
        }
        if self.cluster_grows {
            return Ok(());
        }
        let nodes = crate::scheduling::snapshot::nodes_for(self.executor.as_ref());
        match trainyard_scheduler::never_fits(&nodes, &crate::scheduling::snapshot::demand_of_spec(spec)) {
            Some(unfit) => {
                Err(Error::invalid(unfit.field, format!("can never run on this cluster: {}", unfit.message)))
            }
            None => Ok(()),
        }
    }

    /// What would happen to `valid` submitted now by `caller`: admitted at once, waiting (why,
    /// until when, assuming what), or preempting (starting once its victims have stopped).
    pub(crate) async fn what_if_of(&self, caller: &Caller, valid: &ValidSubmission) -> Result<Schedule> {
        let spec = &valid.spec;
        self.fits_cluster(spec)?;
        let locality = self.cache_locality(caller.tenant_id, &valid.datasets).await?;
        // One read of the unfinished jobs for the snapshot and for naming what it would wait for.
        let jobs = self.store.jobs_unfinished().await?.jobs;
        let (mut snapshot, _) = snapshot_with_holds(&self.store, self.executor.as_ref(), &jobs).await?;
        let guesses = self.run_history.guesses(&self.store, &jobs).await?;
        crate::scheduling::history::apply(&mut snapshot, &guesses);
        let guess = self
            .run_history
            .guess_for(&self.store, caller.tenant_id, caller.user_id, &valid.name, spec, valid.expected_runtime_seconds)
            .await?;
        let now = snapshot.now;
        snapshot.settings.stop_grace_secs = self.stop_grace.as_secs() as i64;
        let probe = trainyard_scheduler::PendingJob {
            id: Uuid::now_v7(),
            tenant: caller.tenant_id,
            priority: valid.priority,
            seq: u64::MAX,
            submitted_at: now,
            demand: crate::scheduling::snapshot::demand_of_spec(spec),
            expected_runtime: Some(guess.seconds),
            warm_nodes: locality.as_ref().map(|(_, warm)| warm.clone()).unwrap_or_default(),
            cache_wait_secs: spec.cache_wait_seconds.unwrap_or(0),
            spare: spec.spare,
        };
        // A chained submission waits for its dependencies that have not ended.
        let unfinished: std::collections::HashSet<Uuid> = jobs.iter().map(|j| j.id).collect();
        let after: Vec<Uuid> = valid.after.iter().map(|(id, _)| *id).filter(|id| unfinished.contains(id)).collect();
        let chained = (!after.is_empty()).then(|| {
            let ids: Vec<String> = after.iter().map(|id| id.to_string()[..8].to_string()).collect();
            format!("would wait for {}", ids.join(", "))
        });
        let answer = tokio::task::spawn_blocking(move || trainyard_scheduler::what_if_after(&snapshot, probe, after))
            .await
            .map_err(|err| Error::internal(format!("answering what-if: {err}")))?;
        let mut schedule = schedule_of(answer.admitted_now, answer.pending.as_ref(), answer.estimated_start);
        if chained.is_some() {
            schedule.reason = chained;
        }
        schedule.cached_on = locality.map(|(l, _)| l);
        schedule.runtime_assumed = Some(guess.to_string());
        schedule.would_preempt = answer.preempts.len();
        let jobs: std::collections::HashMap<Uuid, &Arc<UnfinishedJob>> = jobs.iter().map(|j| (j.id, j)).collect();
        schedule.waits_for = answer
            .waits_for
            .iter()
            .take(Schedule::WAITS_FOR_SHOWN)
            .filter_map(|id| {
                let job = jobs.get(id)?;
                Some(crate::scheduling::board::blocker(job, caller.tenant_id, guesses.get(id)))
            })
            .collect();
        schedule.waits_for_more = answer.waits_for.len().saturating_sub(schedule.waits_for.len());
        Ok(schedule)
    }

    /// Between SIGTERM and SIGKILL when jobs are stopped (what a preemptor's what-if assumes).
    pub(crate) fn stop_grace_set(&mut self, grace: std::time::Duration) {
        self.stop_grace = grace;
    }

    /// The caller's tenant: quotas and usage per GPU type.
    pub async fn quota_report(&self, caller: &Caller) -> Result<QuotaReport> {
        caller.authorize(Action::ReadJobs)?;
        let policies = self.store.tenant_policies().await?;
        // In name order: the order lenders are attributed in.
        let mut tenants = crate::scheduling::snapshot::policies(&policies);
        tenants.sort_by(|a, b| a.name.cmp(&b.name));
        let snapshot = self.scheduling_snapshot().await?;
        let mine =
            policies.iter().find(|t| t.id == caller.tenant_id).ok_or_else(|| Error::not_found(ObjectKind::Tenant))?;
        let used = |tenant: Uuid, flavor: &str| -> u64 {
            snapshot
                .running
                .iter()
                .filter(|r| r.tenant == tenant && !r.spare && r.flavor.as_deref() == Some(flavor))
                .map(|r| r.demand.total_gpus())
                .sum()
        };
        // Held on spare room: outside every quota.
        let spare = |flavor: &str| -> u64 {
            snapshot
                .running
                .iter()
                .filter(|r| r.tenant == mine.id && r.spare && r.flavor.as_deref() == Some(flavor))
                .map(|r| r.demand.total_gpus())
                .sum()
        };
        let flavors = mine
            .quotas
            .iter()
            .map(|q| {
                let nominal = q.nominal.max(0) as u64;
                let mine_used = used(mine.id, &q.flavor);
                // What the cohort borrows is attributed to its lenders in name order, by the
                // scheduler's own rule (`Quota::lent_by`).
                let mut lent = 0;
                if mine.cohort.is_some() {
                    let members: Vec<&trainyard_scheduler::TenantPolicy> =
                        tenants.iter().filter(|t| t.cohort == mine.cohort).collect();
                    let uses: Vec<(Option<trainyard_scheduler::Quota>, u64)> =
                        members.iter().map(|t| (t.quotas.get(&q.flavor).copied(), used(t.id, &q.flavor))).collect();
                    let shares = trainyard_scheduler::Quota::lent_by(&uses);
                    lent = members.iter().zip(shares).find(|(t, _)| t.id == mine.id).map_or(0, |(_, share)| share);
                }
                FlavorUsage {
                    flavor: q.flavor.clone(),
                    nominal,
                    borrowing_limit: q.borrowing_limit.map(|v| v.max(0) as u64),
                    lending_limit: q.lending_limit.map(|v| v.max(0) as u64),
                    used: mine_used,
                    borrowed: mine_used.saturating_sub(nominal),
                    lent,
                    spare: spare(&q.flavor),
                }
            })
            .collect();
        Ok(QuotaReport { tenant: mine.name.clone(), cohort: mine.cohort.clone(), weight: mine.weight, flavors })
    }

    pub async fn quota_set(
        &self,
        caller: &Caller,
        tenant: &str,
        flavor: &str,
        quota: QuotaSet,
    ) -> Result<trainyard_core::api::QuotaSetResult> {
        let audit = Audit::by(caller, "quota.set", format!("tenant:{tenant}/quota:{flavor}"));
        let nodes = crate::scheduling::snapshot::nodes_for(self.executor.as_ref());
        let missing = trainyard_scheduler::fit::missing_gpu_type(&nodes, flavor);
        self.audited(&audit, async {
            caller.require_platform_admin()?;
            if let Some(missing) = &missing
                && !quota.allow_unknown
                && !self.cluster_grows
            {
                return Err(Error::invalid(
                    "flavor",
                    format!(
                        "{missing}; to set it before such nodes join, allow unknown GPU types (yard: --allow-unknown)"
                    ),
                ));
            }
            self.store
                .quota_set(tenant, flavor, quota.nominal, quota.borrowing_limit, quota.lending_limit, &audit)
                .await
        })
        .await?;
        self.scheduling_changed();
        self.ceiling_push(tenant).await;
        let warnings = missing
            .map(|missing| format!("{missing}: no job can use this quota until such nodes join"))
            .into_iter()
            .collect();
        Ok(trainyard_core::api::QuotaSetResult { warnings })
    }

    /// Mirrors a tenant's quota ceiling into the executor now. A failure is logged, not
    /// returned: the quota is set, the scheduler enforces it, and the reconciler retries.
    async fn ceiling_push(&self, tenant: &str) {
        let policies = match self.store.tenant_policies().await {
            Ok(policies) => policies,
            Err(err) => return tracing::warn!(%err, "cannot read quotas to mirror them"),
        };
        if let Some(policy) = policies.iter().find(|p| p.name == tenant) {
            let ceiling = crate::scheduling::snapshot::ceiling_of(policy);
            if let Err(err) = self.executor.tenant_ceiling_set(policy.id, &ceiling).await {
                tracing::warn!(tenant, %err, "cannot mirror the quota ceiling");
            }
        }
    }

    pub async fn tenant_policy_set(&self, caller: &Caller, tenant: &str, update: TenantPolicyUpdate) -> Result<()> {
        let audit = Audit::by(caller, "tenant.policy", format!("tenant:{tenant}"));
        self.audited(&audit, async {
            caller.require_platform_admin()?;
            let mut problems = trainyard_core::error::Problems::default();
            if update.weight.is_some_and(|w| !w.is_finite()) {
                problems.add("weight", "must be a number");
            }
            // Checked here as well as by the column's constraint: a value beyond the column's
            // integer type would fail before the constraint is asked.
            if update.session_idle_timeout_seconds.is_some_and(|s| s != 0 && !(10..=2_592_000).contains(&s)) {
                problems.add("session_idle_timeout_seconds", "10 seconds to 30 days (2592000), or 0 for never");
            }
            problems.into_result()?;
            self.store
                .tenant_policy_set(
                    tenant,
                    update.cohort.as_deref(),
                    update.weight,
                    update.preempt_lower_priority,
                    update.session_idle_timeout_seconds,
                    &audit,
                )
                .await
        })
        .await?;
        self.scheduling_changed();
        self.ceiling_push(tenant).await;
        Ok(())
    }
}

/// The scheduler's snapshot of `jobs` as the board and the what-if see it: the jobs the leader
/// holds out of the cycle (chains, arrays' limits: `Store::jobs_held`) held out of it here too,
/// for estimates to release when what they wait for ends; with why each is held.
async fn snapshot_with_holds(
    store: &trainyard_store::Store,
    executor: &dyn trainyard_executor::Executor,
    jobs: &[Arc<UnfinishedJob>],
) -> Result<(trainyard_scheduler::Snapshot, FxHashMap<Uuid, String>)> {
    let held: FxHashMap<Uuid, String> = store.jobs_held().await?.into_iter().collect();
    let (held_jobs, cycled): (Vec<_>, Vec<_>) = jobs.iter().cloned().partition(|j| held.contains_key(&j.id));
    let mut snapshot = crate::scheduling::snapshot::snapshot_now(store, executor, &cycled, &Default::default()).await?;
    if !held_jobs.is_empty() {
        let chains = store.chains_now().await?;
        crate::scheduling::snapshot::held_add(&mut snapshot, &held_jobs, &chains);
    }
    Ok((snapshot, held))
}
