//! The application layer: what each API operation does, independent of HTTP. Handlers extract
//! input and call exactly one of these; these check permissions, validate, and call the store.

use std::sync::Arc;

use sha2::{Digest, Sha256};
use tokio::sync::Notify;
use trainyard_core::api::{
    Dataset, DatasetRegister, DryRun, FlavorUsage, Job, JobAttempt, JobEvent, JobMetrics, JobOutput, JobPage,
    MemberAdd, MemberAdded, MetricBatch, QuotaReport, QuotaSet, Schedule, TemplateDetail, TemplateRun, TemplateSummary,
    TemplateUpload, Tenant, TenantPolicyUpdate, TokenCreated, TokenInfo,
};
use trainyard_core::auth::{Action, Caller};
use trainyard_core::error::ObjectKind;
use trainyard_core::job::JobSubmission;
use trainyard_core::{Error, Result};
use trainyard_executor::Executor;
use trainyard_store::Store;
use trainyard_store::jobs::{JobFilter, Submitted};
use trainyard_store::metrics::JobCaller;
use trainyard_store::templates::Published;

use uuid::Uuid;

use crate::templates::Templates;

/// Everything the operations need. Cheap to clone.
#[derive(Clone)]
pub struct App {
    pub store: Store,
    pub executor: Arc<dyn Executor>,
    /// Pokes the reconciler so a submit or a cancel is acted on now, not at the next tick.
    pub reconciler_wake: Arc<Notify>,
    /// Every queued job's reason, positions and estimate, shared by readers (see [`crate::board`]).
    pub schedule: Arc<crate::control::board::ScheduleBoard>,
    pub templates: Arc<Templates>,
    /// The object store and volumes (see [`crate::storage`]).
    pub storage: Arc<crate::storage::Storage>,
    /// How the control loop is doing (see [`crate::control::health`]).
    pub health: Arc<crate::control::health::LoopHealth>,
}

/// What a template run did.
pub enum TemplateRunOutcome {
    DryRun(DryRun),
    WhatIf(Schedule),
    Submitted(Box<Submitted>),
}

/// How far a template run goes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RunMode {
    Submit,
    /// Render and check; return the spec.
    DryRun,
    /// Render and check; say when it would start.
    WhatIf,
}

/// The most points one metrics request may carry.
pub const MAX_METRIC_POINTS: usize = 50_000;

impl App {
    /// After a change the scheduler must see (a submit, a cancel, a quota): wakes the
    /// reconciler, and makes the schedule board recompute for the next reader.
    fn scheduling_changed(&self) {
        self.schedule.changed();
        self.reconciler_wake.notify_one();
    }

    /// Whether this server is ready to serve, and how its control loop is doing.
    pub async fn readiness(&self) -> crate::control::health::Readiness {
        self.health.readiness(self.store.ping().await)
    }

    pub async fn job_submit(&self, caller: &Caller, submission: JobSubmission) -> Result<Submitted> {
        caller.authorize(Action::WriteJobs)?;
        // The request as given, canonically encoded: a replay with the same idempotency key
        // must be the same request.
        let request_hash = Sha256::digest(serde_json::to_vec(&submission).map_err(Error::internal)?).to_vec();
        let valid = submission.validate()?;
        let submitted = self.store.job_submit(caller, valid, None, &request_hash).await?;
        if matches!(submitted, Submitted::Created(_)) {
            self.scheduling_changed();
        }
        Ok(submitted)
    }

    /// Submits (or, with `dry_run`, only renders) a job from a template: the parameters are
    /// checked against the template's types and bounds, the manifest is rendered to a spec, and
    /// the job records template name, version and digest, the parameters as given, and the spec.
    pub async fn template_run(
        &self,
        caller: &Caller,
        template: &str,
        run: TemplateRun,
        mode: RunMode,
    ) -> Result<TemplateRunOutcome> {
        caller.authorize(Action::WriteJobs)?;
        let request_hash = {
            let mut hasher = Sha256::new();
            hasher.update(b"template\0");
            hasher.update(template.as_bytes());
            hasher.update(serde_json::to_vec(&run).map_err(Error::internal)?);
            hasher.finalize().to_vec()
        };
        let (template, _) = self.templates.resolve(caller.tenant_id, template, run.version.as_deref()).await?;
        let mut values = template.check_params(&run.params)?;
        // A dataset parameter names a registered version: the job gets its URI and records
        // exactly which version and content it used.
        let mut datasets = Vec::new();
        for (param, spec) in &template.manifest.parameters {
            if spec.kind != trainyard_templates::ParamKind::Dataset {
                continue;
            }
            let Some(reference) = values.get(param).and_then(|v| v.as_str()).map(str::to_string) else { continue };
            let (name, version) = reference.split_once('@').expect("checked as name@version");
            let dataset = self.store.dataset_get(caller.tenant_id, name, version).await.map_err(|err| match err {
                Error::NotFound { .. } => Error::invalid(
                    format!("params.{param}"),
                    format!("no dataset {reference} is registered in your tenant"),
                ),
                other => other,
            })?;
            values.insert(param.clone(), serde_json::Value::String(dataset.uri.clone()));
            datasets.push(trainyard_core::api::DatasetUse {
                param: param.clone(),
                name: dataset.name,
                version: dataset.version,
                uri: dataset.uri,
                content_hash: dataset.content_hash,
            });
        }
        // A volume parameter names one of the tenant's volumes: the job gets its path, and the
        // spec lists it so that a cluster executor mounts it there.
        let mut volumes: Vec<trainyard_core::job::VolumeMount> = Vec::new();
        for (param, spec) in &template.manifest.parameters {
            if spec.kind != trainyard_templates::ParamKind::Volume {
                continue;
            }
            let Some(name) = values.get(param).and_then(|v| v.as_str()).map(str::to_string) else { continue };
            let path = self.volume_path(caller.tenant_id, &name).await.map_err(|err| match err {
                Error::NotFound { .. } => {
                    Error::invalid(format!("params.{param}"), format!("no volume {name} exists in your tenant"))
                }
                other => other,
            })?;
            if !volumes.iter().any(|v| v.name == name) {
                volumes.push(trainyard_core::job::VolumeMount { name, path: path.clone() });
            }
            values.insert(param.clone(), serde_json::Value::String(path));
        }
        let spec = template.render(&values)?;
        // The job-level fields pass the same checks as a direct submit.
        let mut valid = JobSubmission {
            name: Some(run.name.clone().unwrap_or_else(|| template.name().to_string())),
            command: spec.command.clone(),
            args: spec.args.clone(),
            env: spec.env.clone(),
            resources: spec.resources.clone(),
            replicas: spec.replicas,
            priority: run.priority,
            max_restarts: run.max_restarts,
            idempotency_key: run.idempotency_key.clone(),
        }
        .validate()?;
        valid.spec.template = spec.template;
        valid.spec.volumes = volumes;
        valid.datasets = datasets;
        valid.expected_runtime_seconds =
            template.manifest.expected_runtime_seconds().map(|s| s.min(u64::from(u32::MAX)) as u32);
        if mode == RunMode::WhatIf {
            let schedule = self.what_if_of(caller, &valid.spec, valid.priority, valid.expected_runtime_seconds).await?;
            return Ok(TemplateRunOutcome::WhatIf(schedule));
        }
        if mode == RunMode::DryRun {
            let values = serde_json::to_value(&values).map_err(Error::internal)?;
            return Ok(TemplateRunOutcome::DryRun(DryRun { name: valid.name, values, spec: valid.spec }));
        }
        let params = serde_json::Value::Object(run.params);
        let submitted = self.store.job_submit(caller, valid, Some(&params), &request_hash).await?;
        if matches!(submitted, Submitted::Created(_)) {
            self.scheduling_changed();
        }
        Ok(TemplateRunOutcome::Submitted(Box::new(submitted)))
    }

    pub async fn templates_list(&self, caller: &Caller) -> Result<Vec<TemplateSummary>> {
        caller.authorize(Action::ReadJobs)?;
        self.templates.list(caller.tenant_id).await
    }

    pub async fn template_show(&self, caller: &Caller, name: &str, version: Option<&str>) -> Result<TemplateDetail> {
        caller.authorize(Action::ReadJobs)?;
        Ok(self.templates.resolve(caller.tenant_id, name, version).await?.1)
    }

    pub async fn template_publish(
        &self,
        caller: &Caller,
        upload: TemplateUpload,
    ) -> Result<(TemplateDetail, Published)> {
        caller.authorize(Action::WriteJobs)?;
        self.templates.publish(caller, upload).await
    }

    /// Stores a batch of metric points from a job's engine. The token must belong to the job.
    pub async fn metrics_post(&self, caller: &JobCaller, job_id: Uuid, batch: MetricBatch) -> Result<u64> {
        if caller.job_id != job_id {
            return Err(Error::not_found(ObjectKind::Job));
        }
        if batch.points.is_empty() || batch.points.len() > MAX_METRIC_POINTS {
            return Err(Error::invalid("points", format!("send 1 to {MAX_METRIC_POINTS} points per request")));
        }
        for (i, point) in batch.points.iter().enumerate() {
            let name_ok = !point.name.is_empty()
                && point.name.len() <= 128
                && point.name.chars().all(|c| c.is_ascii_alphanumeric() || "_./-".contains(c));
            if !name_ok {
                return Err(Error::invalid(
                    format!("points[{i}].name"),
                    "1 to 128 letters, digits, '_', '.', '/' or '-'",
                ));
            }
            if point.step < 0 {
                return Err(Error::invalid(format!("points[{i}].step"), "must be 0 or more"));
            }
            if !point.value.is_finite() {
                return Err(Error::invalid(format!("points[{i}].value"), "must be a finite number"));
            }
        }
        self.store.metrics_insert(caller, &batch.points).await
    }

    pub async fn job_output_set(&self, caller: &JobCaller, job_id: Uuid, output: JobOutput) -> Result<()> {
        if caller.job_id != job_id {
            return Err(Error::not_found(ObjectKind::Job));
        }
        if serde_json::to_vec(&output.value).map_err(Error::internal)?.len() > 64 * 1024 {
            return Err(Error::invalid(
                "value",
                "an output is at most 64 KiB of JSON; store large results as artefacts",
            ));
        }
        self.store.job_output_set(caller, &output.name, &output.value).await
    }

    pub async fn job_outputs(
        &self,
        caller: &Caller,
        job_id: Uuid,
    ) -> Result<std::collections::BTreeMap<String, serde_json::Value>> {
        caller.authorize(Action::ReadJobs)?;
        self.store.job_outputs(caller.tenant_id, job_id).await
    }

    /// Registers a dataset version, described in full or taken from a data-pack job's output.
    pub async fn dataset_register(&self, caller: &Caller, request: DatasetRegister) -> Result<(Dataset, bool)> {
        caller.authorize(Action::WriteJobs)?;
        let mut dataset = Dataset {
            name: request.name.clone(),
            version: request.version.clone(),
            uri: request.uri.clone().unwrap_or_default(),
            format: request.format.clone().unwrap_or_else(|| "files".into()),
            size_bytes: request.size_bytes,
            samples: request.samples,
            content_hash: request.content_hash.clone().unwrap_or_default(),
            source_job: None,
            created_by: caller.user.clone(),
            created_at: chrono::Utc::now(),
        };
        if let Some(job_id) = request.from_job {
            let outputs = self.store.job_outputs(caller.tenant_id, job_id).await?;
            let job = self.store.job_get(caller.tenant_id, job_id).await?;
            if job.state != trainyard_core::job::JobState::Succeeded {
                return Err(Error::invalid(
                    "from_job",
                    format!("the job {}; only a succeeded job's output is registered", job.state),
                ));
            }
            let out = outputs.get("dataset").ok_or_else(|| {
                Error::invalid("from_job", "the job recorded no `dataset` output (data-pack jobs do)")
            })?;
            let text = |k: &str| out[k].as_str().map(str::to_string);
            dataset.uri = text("path").unwrap_or_default();
            dataset.format = text("format").unwrap_or_else(|| "trainyard-shards-v1".into());
            dataset.content_hash = text("content_hash").unwrap_or_default();
            dataset.size_bytes = out["bytes"].as_i64();
            dataset.samples = out["samples"].as_i64();
            dataset.source_job = Some(job_id);
        }
        if dataset.uri.is_empty() {
            return Err(Error::invalid("uri", "say where the dataset is, or give from_job"));
        }
        if dataset.content_hash.is_empty() {
            return Err(Error::invalid(
                "content_hash",
                "a dataset version needs its content hash (data-pack records one)",
            ));
        }
        let published = self.store.dataset_register(caller, &dataset).await?;
        let stored = self.store.dataset_get(caller.tenant_id, &dataset.name, &dataset.version).await?;
        Ok((stored, published == Published::Created))
    }

    pub async fn datasets_list(&self, caller: &Caller) -> Result<Vec<Dataset>> {
        caller.authorize(Action::ReadJobs)?;
        self.store.datasets_list(caller.tenant_id).await
    }

    pub async fn dataset_get(&self, caller: &Caller, name: &str, version: &str) -> Result<Dataset> {
        caller.authorize(Action::ReadJobs)?;
        self.store.dataset_get(caller.tenant_id, name, version).await
    }

    pub async fn metrics_get(&self, caller: &Caller, job_id: Uuid, name: Option<&str>) -> Result<JobMetrics> {
        caller.authorize(Action::ReadJobs)?;
        Ok(JobMetrics { series: self.store.metrics_read(caller.tenant_id, job_id, name).await? })
    }

    pub async fn jobs_list(&self, caller: &Caller, filter: &JobFilter) -> Result<JobPage> {
        caller.authorize(Action::ReadJobs)?;
        self.store.jobs_list(caller.tenant_id, filter).await
    }

    pub async fn job_get(&self, caller: &Caller, job_id: Uuid) -> Result<Job> {
        caller.authorize(Action::ReadJobs)?;
        self.store.job_get(caller.tenant_id, job_id).await
    }

    pub async fn job_cancel(&self, caller: &Caller, job_id: Uuid) -> Result<Job> {
        // Reading first keeps "no such job" (404) ahead of "not allowed" (403) for viewers, so
        // a viewer learns nothing new either way.
        caller.authorize(Action::ReadJobs)?;
        self.store.job_get(caller.tenant_id, job_id).await?;
        caller.authorize(Action::WriteJobs)?;
        let job = self.store.job_cancel(caller, job_id).await?;
        self.scheduling_changed();
        Ok(job)
    }

    pub async fn job_events(&self, caller: &Caller, job_id: Uuid) -> Result<Vec<JobEvent>> {
        caller.authorize(Action::ReadJobs)?;
        self.store.job_events(caller.tenant_id, job_id).await
    }

    pub async fn job_attempts(&self, caller: &Caller, job_id: Uuid) -> Result<Vec<JobAttempt>> {
        caller.authorize(Action::ReadJobs)?;
        self.store.job_attempts(caller.tenant_id, job_id).await
    }

    /// A new token for the caller's own user, in the caller's tenant or (with `tenant`) in
    /// another tenant the user is a member of. Nobody creates a token in another user's name.
    pub async fn token_create(
        &self,
        caller: &Caller,
        name: &str,
        expires_in_days: Option<u32>,
        tenant: Option<&str>,
    ) -> Result<TokenCreated> {
        caller.authorize(Action::ManageOwnTokens)?;
        let tenant_id = match tenant {
            None => caller.tenant_id,
            Some(tenant) if tenant == caller.tenant => caller.tenant_id,
            Some(tenant) => self.store.membership_tenant(caller.user_id, tenant).await.map_err(|err| match err {
                Error::NotFound { .. } => {
                    Error::invalid("tenant", format!("you are not a member of a tenant {tenant:?}"))
                }
                other => other,
            })?,
        };
        self.store.token_create(tenant_id, caller.user_id, name, expires_in_days).await
    }

    pub async fn tokens_list(&self, caller: &Caller) -> Result<Vec<TokenInfo>> {
        caller.authorize(Action::ManageOwnTokens)?;
        self.store.tokens_list(caller).await
    }

    pub async fn token_revoke(&self, caller: &Caller, token_id: Uuid) -> Result<()> {
        caller.authorize(Action::ManageOwnTokens)?;
        self.store.token_revoke(caller, token_id).await
    }

    pub async fn tenant_create(&self, caller: &Caller, name: &str) -> Result<Tenant> {
        caller.require_platform_admin()?;
        self.store.tenant_create(name).await
    }

    pub async fn tenants_list(&self, caller: &Caller) -> Result<Vec<Tenant>> {
        caller.require_platform_admin()?;
        self.store.tenants_list().await
    }

    /// Every tenant's scheduling policy and quotas (platform admins).
    pub async fn tenant_policies(&self, caller: &Caller) -> Result<Vec<trainyard_store::reconcile::TenantPolicyRow>> {
        caller.require_platform_admin()?;
        self.store.tenant_policies().await
    }

    /// Every membership of every tenant (platform admins).
    pub async fn members_list(&self, caller: &Caller) -> Result<Vec<(String, String, trainyard_core::auth::Role)>> {
        caller.require_platform_admin()?;
        self.store.members_list().await
    }

    /// What the executor offers, as the scheduler's nodes (platform admins).
    pub fn nodes(&self, caller: &Caller) -> Result<Vec<trainyard_scheduler::Node>> {
        caller.require_platform_admin()?;
        Ok(crate::scheduling::nodes_for(self.executor.as_ref()))
    }

    /// Platform admins add any user to any tenant; a tenant's admins invite new users to their
    /// own tenant and change its members' roles. Either gets a token only for a user the call
    /// creates (an invitation), never for an existing user.
    pub async fn member_add(&self, caller: &Caller, tenant: &str, member: MemberAdd) -> Result<MemberAdded> {
        if !(caller.platform_admin || (caller.tenant == tenant && caller.authorize(Action::ManageTenant).is_ok())) {
            return Err(Error::Forbidden("only platform admins and this tenant's admins may add members".into()));
        }
        let may_add_existing_users = caller.platform_admin;
        self.store
            .member_add(
                tenant,
                &member.user,
                member.role,
                may_add_existing_users,
                &member.token_name,
                member.expires_in_days,
            )
            .await
    }
}

/// Scheduling: quotas, positions, estimates, what-if.
impl App {
    /// The scheduler's view right now (what the next admission cycle would see).
    async fn scheduling_snapshot(&self) -> Result<trainyard_scheduler::Snapshot> {
        let jobs = self.store.jobs_unfinished().await?.jobs;
        let tenants = crate::scheduling::policies(&self.store.tenant_policies().await?);
        let nodes = crate::scheduling::nodes_for(self.executor.as_ref());
        Ok(crate::scheduling::snapshot(chrono::Utc::now(), nodes, tenants, &jobs, &Default::default()))
    }

    /// Why a queued job waits, where it stands, and when it should start.
    pub async fn job_schedule(&self, caller: &Caller, job_id: Uuid) -> Result<Option<Schedule>> {
        caller.authorize(Action::ReadJobs)?;
        let job = self.store.job_get(caller.tenant_id, job_id).await?;
        if job.state != trainyard_core::job::JobState::Queued {
            return Ok(None);
        }
        let mut board = self.schedule.get(self.scheduling_snapshot()).await?;
        if board.standing(job_id).is_none() {
            let (ahead, higher) = self.store.queued_ahead(caller.tenant_id, job_id).await?;
            if ahead >= trainyard_store::reconcile::QUEUE_WINDOW_PER_TENANT {
                // Deeper in its tenant's queue than an admission cycle looks: honest about
                // where it stands, with no reason or estimate the scheduler did not compute.
                return Ok(Some(Schedule {
                    admitted_now: false,
                    reason: Some(format!(
                        "waits behind {ahead} earlier queued jobs of its tenant; each admission cycle considers \
                         the first {} of a tenant's queue",
                        trainyard_store::reconcile::QUEUE_WINDOW_PER_TENANT
                    )),
                    tenant_position: Some(ahead as usize + 1),
                    cluster_position: None,
                    behind_higher_priority: higher as usize,
                    estimated_start: None,
                }));
            }
            // Submitted after the board was computed (through another server): compute anew.
            self.schedule.changed();
            board = self.schedule.get(self.scheduling_snapshot()).await?;
        }
        let standing = board.standing(job_id);
        Ok(Some(schedule_of(
            standing.is_some_and(|s| s.admitted_now),
            standing.and_then(|s| s.pending.as_ref()),
            standing.and_then(|s| s.estimated_start),
        )))
    }

    /// What would happen to a job submitted now. Checks it like a submit; queues nothing.
    pub async fn job_what_if(&self, caller: &Caller, submission: JobSubmission) -> Result<Schedule> {
        caller.authorize(Action::WriteJobs)?;
        let valid = submission.validate()?;
        self.what_if_of(caller, &valid.spec, valid.priority, valid.expected_runtime_seconds).await
    }

    pub(crate) async fn what_if_of(
        &self,
        caller: &Caller,
        spec: &trainyard_core::job::JobSpec,
        priority: i32,
        expected_runtime: Option<u32>,
    ) -> Result<Schedule> {
        let snapshot = self.scheduling_snapshot().await?;
        let now = snapshot.now;
        let probe = trainyard_scheduler::PendingJob {
            id: Uuid::now_v7(),
            tenant: caller.tenant_id,
            priority,
            seq: u64::MAX,
            submitted_at: now,
            demand: trainyard_scheduler::Demand {
                replicas: spec.replicas,
                gpus: spec.resources.gpus,
                gpu_type: spec.resources.gpu_type.clone(),
                cpu_millis: spec.resources.cpu.millis(),
                memory_bytes: spec.resources.memory.bytes(),
            },
            expected_runtime: expected_runtime.map(i64::from),
        };
        let answer = tokio::task::spawn_blocking(move || trainyard_scheduler::what_if(&snapshot, probe))
            .await
            .map_err(|err| Error::internal(format!("answering what-if: {err}")))?;
        Ok(schedule_of(answer.admitted_now, answer.pending.as_ref(), answer.estimated_start))
    }

    /// The caller's tenant: quotas and usage per GPU type.
    pub async fn quota_report(&self, caller: &Caller) -> Result<QuotaReport> {
        caller.authorize(Action::ReadJobs)?;
        let policies = self.store.tenant_policies().await?;
        let snapshot = self.scheduling_snapshot().await?;
        let mine =
            policies.iter().find(|t| t.id == caller.tenant_id).ok_or_else(|| Error::not_found(ObjectKind::Tenant))?;
        let used = |tenant: Uuid, flavor: &str| -> u64 {
            snapshot
                .running
                .iter()
                .filter(|r| r.tenant == tenant && r.flavor.as_deref() == Some(flavor))
                .map(|r| r.demand.total_gpus())
                .sum()
        };
        let flavors = mine
            .quotas
            .iter()
            .map(|q| {
                let nominal = q.nominal.max(0) as u64;
                let mine_used = used(mine.id, &q.flavor);
                // What the cohort borrows is attributed to its lenders in name order.
                let mut lent = 0;
                if mine.cohort.is_some() {
                    let members: Vec<&trainyard_store::reconcile::TenantPolicyRow> =
                        policies.iter().filter(|t| t.cohort == mine.cohort).collect();
                    let quota_of = |t: &trainyard_store::reconcile::TenantPolicyRow| {
                        t.quotas.iter().find(|x| x.flavor == q.flavor).cloned()
                    };
                    let mut borrowed: u64 = members
                        .iter()
                        .map(|t| {
                            used(t.id, &q.flavor).saturating_sub(quota_of(t).map_or(0, |x| x.nominal.max(0) as u64))
                        })
                        .sum();
                    for member in members {
                        let Some(quota) = quota_of(member) else { continue };
                        let idle = (quota.nominal.max(0) as u64).saturating_sub(used(member.id, &q.flavor));
                        let lendable = quota.lending_limit.map_or(idle, |l| idle.min(l.max(0) as u64));
                        let share = lendable.min(borrowed);
                        borrowed -= share;
                        if member.id == mine.id {
                            lent = share;
                        }
                    }
                }
                FlavorUsage {
                    flavor: q.flavor.clone(),
                    nominal,
                    borrowing_limit: q.borrowing_limit.map(|v| v.max(0) as u64),
                    lending_limit: q.lending_limit.map(|v| v.max(0) as u64),
                    used: mine_used,
                    borrowed: mine_used.saturating_sub(nominal),
                    lent,
                }
            })
            .collect();
        Ok(QuotaReport { tenant: mine.name.clone(), cohort: mine.cohort.clone(), weight: mine.weight, flavors })
    }

    pub async fn quota_set(&self, caller: &Caller, tenant: &str, flavor: &str, quota: QuotaSet) -> Result<()> {
        caller.require_platform_admin()?;
        self.store.quota_set(tenant, flavor, quota.nominal, quota.borrowing_limit, quota.lending_limit).await?;
        self.scheduling_changed();
        self.ceiling_push(tenant).await;
        Ok(())
    }

    /// Mirrors a tenant's quota ceiling into the executor now. A failure is logged, not
    /// returned: the quota is set, the scheduler enforces it, and the reconciler retries.
    async fn ceiling_push(&self, tenant: &str) {
        let policies = match self.store.tenant_policies().await {
            Ok(policies) => policies,
            Err(err) => return tracing::warn!(%err, "cannot read quotas to mirror them"),
        };
        if let Some(policy) = policies.iter().find(|p| p.name == tenant) {
            let ceiling = crate::scheduling::ceiling_of(policy);
            if let Err(err) = self.executor.tenant_ceiling_set(policy.id, &ceiling).await {
                tracing::warn!(tenant, %err, "cannot mirror the quota ceiling");
            }
        }
    }

    pub async fn tenant_policy_set(&self, caller: &Caller, tenant: &str, update: TenantPolicyUpdate) -> Result<()> {
        caller.require_platform_admin()?;
        if update.weight.is_some_and(|w| !w.is_finite()) {
            return Err(Error::invalid("weight", "must be a number"));
        }
        self.store
            .tenant_policy_set(tenant, update.cohort.as_deref(), update.weight, update.preempt_lower_priority)
            .await?;
        self.scheduling_changed();
        self.ceiling_push(tenant).await;
        Ok(())
    }
}

fn schedule_of(admitted_now: bool, pending: Option<&trainyard_scheduler::Pending>, estimate: Option<i64>) -> Schedule {
    Schedule {
        admitted_now,
        reason: pending.map(|p| p.reason.to_string()),
        tenant_position: pending.map(|p| p.tenant_position),
        cluster_position: pending.map(|p| p.cluster_position),
        behind_higher_priority: pending.map_or(0, |p| p.behind_higher_priority),
        estimated_start: estimate.and_then(|s| chrono::DateTime::from_timestamp(s, 0)),
    }
}
