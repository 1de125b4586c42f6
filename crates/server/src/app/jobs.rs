//! Jobs: submit, list, show, cancel, their events and attempts, and what their engines report
//! (metrics, outputs) with their job tokens.

use sha2::{Digest, Sha256};
use trainyard_core::api::{Job, JobAttempt, JobEvent, JobMetrics, JobOutput, JobPage, MetricBatch};
use trainyard_core::auth::{Action, Caller};
use trainyard_core::error::ObjectKind;
use trainyard_core::job::JobSubmission;
use trainyard_core::{Error, Result};
use trainyard_store::audit::Audit;
use trainyard_store::jobs::{JobFilter, Submitted};
use trainyard_store::metrics::JobCaller;

use uuid::Uuid;

use super::App;

/// The most points one metrics request may carry.
pub const MAX_METRIC_POINTS: usize = 50_000;

impl App {
    pub async fn job_submit(&self, caller: &Caller, submission: JobSubmission) -> Result<Submitted> {
        self.job_submit_linked(caller, submission, None).await
    }

    /// A submit that may be a rerun: `rerun` links the new job to its original, in the insert.
    pub(super) async fn job_submit_linked(
        &self,
        caller: &Caller,
        submission: JobSubmission,
        rerun: Option<trainyard_core::rerun::RerunLink>,
    ) -> Result<Submitted> {
        let audit =
            Audit::by(caller, "job.submit", format!("job:{}", submission.name.as_deref().unwrap_or("(unnamed)")));
        self.audited(&audit, async {
            caller.authorize(Action::WriteJobs)?;
            // The request as given, canonically encoded: a replay with the same idempotency key
            // must be the same request.
            let request_hash = Sha256::digest(serde_json::to_vec(&submission).map_err(Error::internal)?).to_vec();
            let mut valid = submission.validate()?;
            // A rerun on a cluster runs its original's image by digest.
            valid.spec.image = rerun.as_ref().and_then(|link| link.image.clone());
            valid.rerun = rerun;
            if let Some(code) = valid.spec.code.as_mut() {
                code.size_bytes = self.code_size(caller.tenant_id, &code.digest).await?;
            }
            self.fits_cluster(&valid.spec)?;
            self.dependencies_check(caller, &valid.after).await?;
            let submitted = self.store.job_submit(caller, valid, None, &request_hash, &audit).await?;
            if matches!(submitted, Submitted::Created(_)) {
                self.scheduling_changed();
            }
            Ok(submitted)
        })
        .await
    }

    /// Every dependency of a chained job is a job of the caller's tenant; each that is not is
    /// named, with its field, at once.
    async fn dependencies_check(
        &self,
        caller: &Caller,
        after: &[(Uuid, trainyard_core::job::AfterKind)],
    ) -> Result<()> {
        if after.is_empty() {
            return Ok(());
        }
        let ids: Vec<Uuid> = after.iter().map(|(id, _)| *id).collect();
        let found: std::collections::HashSet<Uuid> =
            self.store.jobs_get_many(caller.tenant_id, &ids).await?.into_iter().map(|j| j.id).collect();
        let mut problems = trainyard_core::error::Problems::default();
        for (id, kind) in after.iter().filter(|(id, _)| !found.contains(id)) {
            problems.add(format!("after_{}", kind.as_str()), format!("no job {id} in your tenant"));
        }
        problems.into_result()
    }

    pub async fn jobs_list(&self, caller: &Caller, filter: &JobFilter) -> Result<JobPage> {
        caller.authorize(Action::ReadJobs)?;
        self.store.jobs_list(caller.tenant_id, filter).await
    }

    /// Every tenant's jobs, or one tenant's by name (platform admins only: 403 for anyone else,
    /// whatever their role), paged like [`App::jobs_list`].
    pub async fn jobs_list_every_tenant(
        &self,
        caller: &Caller,
        tenant: Option<&str>,
        filter: &JobFilter,
    ) -> Result<JobPage> {
        caller.require_platform_admin()?;
        self.store.jobs_list_every_tenant(tenant, filter).await
    }

    pub async fn job_get(&self, caller: &Caller, job_id: Uuid) -> Result<Job> {
        caller.authorize(Action::ReadJobs)?;
        self.store.job_get(caller.tenant_id, job_id).await
    }

    pub async fn job_cancel(&self, caller: &Caller, job_id: Uuid) -> Result<Job> {
        // Reading first keeps "no such job" (404) ahead of "not allowed" (403) for viewers, so
        // a viewer learns nothing new either way.
        let audit = Audit::by(caller, "job.cancel", format!("job:{job_id}"));
        self.audited(&audit, async {
            caller.authorize(Action::ReadJobs)?;
            let before = self.store.job_get(caller.tenant_id, job_id).await?;
            caller.authorize(Action::WriteJobs)?;
            let job = self.store.job_cancel(caller, job_id, &audit).await?;
            // A job that never launched ends here; a launched one when the reconciler stops it.
            if before.state != job.state && job.state.is_terminal() {
                self.monitoring.job_finished(&caller.tenant, job.state.as_str());
            }
            self.scheduling_changed();
            Ok(job)
        })
        .await
    }

    pub async fn job_events(&self, caller: &Caller, job_id: Uuid) -> Result<Vec<JobEvent>> {
        caller.authorize(Action::ReadJobs)?;
        self.store.job_events(caller.tenant_id, job_id).await
    }

    pub async fn job_attempts(&self, caller: &Caller, job_id: Uuid) -> Result<Vec<JobAttempt>> {
        caller.authorize(Action::ReadJobs)?;
        self.store.job_attempts(caller.tenant_id, job_id).await
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
        let stored = self.store.metrics_insert(caller, &batch.points).await?;
        // The input-stall share engines report feeds the operators' histogram too.
        let labels = crate::monitoring::TenantLabel { tenant: caller.tenant.clone() };
        for point in batch.points.iter().filter(|p| p.name == "input_stall_share") {
            self.monitoring.input_stall_share.get_or_create(&labels).observe(point.value.clamp(0.0, 1.0));
        }
        Ok(stored)
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

    pub async fn metrics_get(&self, caller: &Caller, job_id: Uuid, name: Option<&str>) -> Result<JobMetrics> {
        caller.authorize(Action::ReadJobs)?;
        Ok(JobMetrics { series: self.store.metrics_read(caller.tenant_id, job_id, name).await? })
    }
}
