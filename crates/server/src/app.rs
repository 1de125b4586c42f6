//! The application layer: what each API operation does, independent of HTTP. Handlers extract
//! input and call exactly one of these; these check permissions, validate, and call the store.

use std::sync::Arc;

use sha2::{Digest, Sha256};
use tokio::sync::Notify;
use trainyard_core::api::{
    Job, JobAttempt, JobEvent, JobPage, MemberAdd, MemberAdded, Tenant, TokenCreated, TokenInfo,
};
use trainyard_core::auth::{Action, Caller};
use trainyard_core::job::JobSubmission;
use trainyard_core::{Error, Result};
use trainyard_executor::Executor;
use trainyard_store::Store;
use trainyard_store::jobs::{JobFilter, Submitted};
use uuid::Uuid;

/// Everything the operations need. Cheap to clone.
#[derive(Clone)]
pub struct App {
    pub store: Store,
    pub executor: Arc<dyn Executor>,
    /// Pokes the reconciler so a submit or a cancel is acted on now, not at the next tick.
    pub reconciler_wake: Arc<Notify>,
}

impl App {
    pub async fn job_submit(
        &self,
        caller: &Caller,
        submission: JobSubmission,
    ) -> Result<Submitted> {
        caller.authorize(Action::WriteJobs)?;
        // The request as given, canonically encoded: a replay with the same idempotency key
        // must be the same request.
        let request_hash =
            Sha256::digest(serde_json::to_vec(&submission).map_err(Error::internal)?).to_vec();
        let valid = submission.validate()?;
        let submitted = self.store.job_submit(caller, valid, &request_hash).await?;
        if matches!(submitted, Submitted::Created(_)) {
            self.reconciler_wake.notify_one();
        }
        Ok(submitted)
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
        self.reconciler_wake.notify_one();
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

    pub async fn token_create(
        &self,
        caller: &Caller,
        name: &str,
        expires_in_days: Option<u32>,
    ) -> Result<TokenCreated> {
        caller.authorize(Action::ManageOwnTokens)?;
        self.store
            .token_create(caller.tenant_id, caller.user_id, name, expires_in_days)
            .await
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

    /// Platform admins add members to any tenant; a tenant's admins to their own.
    pub async fn member_add(
        &self,
        caller: &Caller,
        tenant: &str,
        member: MemberAdd,
    ) -> Result<MemberAdded> {
        if !(caller.platform_admin
            || (caller.tenant == tenant && caller.authorize(Action::ManageTenant).is_ok()))
        {
            return Err(Error::Forbidden(
                "only platform admins and this tenant's admins may add members".into(),
            ));
        }
        let token = self
            .store
            .member_add(
                tenant,
                &member.user,
                member.role,
                false,
                &member.token_name,
                member.expires_in_days,
            )
            .await?;
        Ok(MemberAdded {
            user: member.user,
            tenant: tenant.to_string(),
            role: member.role,
            token,
        })
    }
}
