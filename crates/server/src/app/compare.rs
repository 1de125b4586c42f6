//! Comparing runs: the facts of each job read from the store (the job, its attempts, outputs,
//! latest run record, each metric series in brief, the params it logged through MLflow), compared by the pure
//! [`trainyard_core::compare`].

use trainyard_core::api::JobMetrics;
use trainyard_core::auth::{Action, Caller};
use trainyard_core::compare::{Comparison, MAX_COMPARED_RUNS, RunFacts, compare};
use trainyard_core::{Error, Result};
use uuid::Uuid;

use super::App;

impl App {
    /// Two to [`MAX_COMPARED_RUNS`] jobs of the caller's tenant compared field by field: only the
    /// fields that differ unless `all`. Another tenant's job is a 404, like one that does not
    /// exist. Metrics are read in brief (count and last value per series, one statement for all
    /// the jobs), never point by point.
    pub async fn runs_compare(&self, caller: &Caller, job_ids: &[Uuid], all: bool) -> Result<Comparison> {
        caller.authorize(Action::ReadJobs)?;
        if !(2..=MAX_COMPARED_RUNS).contains(&job_ids.len()) {
            return Err(Error::invalid("jobs", format!("compare 2 to {MAX_COMPARED_RUNS} jobs")));
        }
        let tenant = caller.tenant_id;
        let facts = job_ids.iter().map(|&id| async move {
            let (job, attempts, outputs, latest) = tokio::try_join!(
                self.store.job_get(tenant, id),
                self.store.job_attempts(tenant, id),
                self.store.job_outputs(tenant, id),
                self.store.run_record_latest(tenant, id),
            )?;
            Ok::<_, Error>(RunFacts {
                job,
                attempts,
                outputs,
                metrics: Vec::new(),
                record_hash: latest.as_ref().map(|r| r.record_hash.clone()),
                record: latest.map(|r| r.record),
                logged_params: Default::default(),
            })
        });
        let (mut runs, summaries, logged) = tokio::try_join!(
            futures::future::try_join_all(facts),
            self.store.metrics_summaries(tenant, job_ids),
            self.store.mlflow_job_params(tenant, job_ids),
        )?;
        for run in &mut runs {
            run.metrics =
                summaries.iter().filter(|(job, _)| *job == run.job.id).map(|(_, summary)| summary.clone()).collect();
            run.logged_params = logged
                .iter()
                .filter(|(job, ..)| *job == run.job.id)
                .map(|(_, key, value)| (key.clone(), value.clone()))
                .collect();
        }
        Ok(compare(&runs, all))
    }

    /// One metric of each of these jobs by wall time, for the compare page's chart aligned by
    /// time: (seconds since the series' first point, value) per job, in the order given.
    pub async fn runs_metric_timeline(
        &self,
        caller: &Caller,
        job_ids: &[Uuid],
        name: &str,
    ) -> Result<Vec<Vec<(f64, f64)>>> {
        caller.authorize(Action::ReadJobs)?;
        let reads = job_ids.iter().map(|&id| self.store.metric_timeline(caller.tenant_id, id, name));
        futures::future::try_join_all(reads).await
    }

    /// One metric of each of these jobs, for the compare page's chart (in the order given).
    pub async fn runs_metric(&self, caller: &Caller, job_ids: &[Uuid], name: &str) -> Result<Vec<JobMetrics>> {
        let reads = job_ids.iter().map(|&id| self.metrics_get(caller, id, Some(name)));
        futures::future::try_join_all(reads).await
    }
}

/// The job ids of a comparison's `jobs=` text: comma-separated (spaces too, as a form's text
/// field gives them). A text that is no id names no job: 404, like an unknown id.
pub fn compared_ids(text: &str) -> Result<Vec<Uuid>> {
    let ids = text.split([',', ' ']).map(str::trim).filter(|t| !t.is_empty());
    ids.map(|t| Uuid::parse_str(t).map_err(|_| Error::not_found(trainyard_core::error::ObjectKind::Job))).collect()
}
