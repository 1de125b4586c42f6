//! Run records: the engine's part posted with its job token, and a job's records read by the
//! members of its tenant (see [`trainyard_core::record`]; the server's part is written by the
//! reconciler when an attempt begins).

use trainyard_core::auth::{Action, Caller};
use trainyard_core::error::ObjectKind;
use trainyard_core::record::{AttemptRunRecord, EngineRecord, JobRunRecords};
use trainyard_core::{Error, Result};
use trainyard_store::metrics::JobCaller;
use uuid::Uuid;

use super::App;

impl App {
    /// Completes the record of the token's attempt with the engine's part, once.
    pub async fn run_record_post(&self, caller: &JobCaller, job_id: Uuid, engine: EngineRecord) -> Result<()> {
        if caller.job_id != job_id {
            return Err(Error::not_found(ObjectKind::Job));
        }
        engine.validate()?;
        self.store.run_record_complete(caller, &engine).await
    }

    /// Every attempt's record of a job of the caller's tenant.
    pub async fn run_records(&self, caller: &Caller, job_id: Uuid) -> Result<JobRunRecords> {
        caller.authorize(Action::ReadJobs)?;
        Ok(JobRunRecords { job_id, attempts: self.store.run_records(caller.tenant_id, job_id).await? })
    }

    /// The latest attempt's record of a job of the caller's tenant (none yet: no attempt began).
    pub async fn run_record_latest(&self, caller: &Caller, job_id: Uuid) -> Result<Option<AttemptRunRecord>> {
        caller.authorize(Action::ReadJobs)?;
        self.store.run_record_latest(caller.tenant_id, job_id).await
    }
}
