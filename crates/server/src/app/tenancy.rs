//! Tenants, members and tokens: who may create what in whose name (see `docs/security.md`).

use trainyard_core::api::{
    MemberAdd, MemberAdded, MemberRemoved, MemberToken, MemberTokenReissue, Tenant, TokenCreated, TokenInfo,
};
use trainyard_core::auth::{Action, Caller};
use trainyard_core::{Error, Result};
use trainyard_store::audit::Audit;
use trainyard_store::metrics::JobCaller;

use uuid::Uuid;

use std::net::IpAddr;

use super::App;

impl App {
    /// The caller an API token stands for (`Authorization: Bearer tyd_...`), presented by
    /// `client`. Failures are throttled (see [`super::throttle`]).
    pub async fn token_authenticate(&self, token: &str, client: Option<IpAddr>) -> Result<Caller> {
        let mut caller = self.throttled(token, client, self.store.token_authenticate(token)).await?;
        caller.source = client;
        Ok(caller)
    }

    /// The job a job token stands for (`tyj_...`, in a replica's `TRAINYARD_TOKEN`).
    pub async fn job_token_authenticate(&self, token: &str, client: Option<IpAddr>) -> Result<JobCaller> {
        self.throttled(token, client, self.store.job_token_authenticate(token)).await
    }

    /// Signs in to the dashboard with an API token: a new session, worth no more than the token.
    pub async fn session_open(
        &self,
        token: &str,
        client: Option<IpAddr>,
    ) -> Result<(trainyard_store::sessions::WebSession, Caller)> {
        self.throttled(token, client, self.store.session_open(token, client)).await
    }

    /// Runs an authentication unless the token (by its prefix) is throttled, and counts its
    /// failure against the token and the client; a client over its allowance gets 429 for its
    /// failures, never for a valid credential (see [`super::throttle`]).
    pub(super) async fn throttled<T>(
        &self,
        token: &str,
        client: Option<IpAddr>,
        authenticate: impl std::future::Future<Output = Result<T>>,
    ) -> Result<T> {
        self.throttle.check(token)?;
        let outcome = authenticate.await;
        if let Err(Error::Unauthenticated(_)) = &outcome {
            self.throttle.failed(client, token);
            self.throttle.check_client(client)?;
        }
        outcome
    }

    /// The caller of a dashboard session and its CSRF value.
    pub async fn session_authenticate(&self, secret: &str, client: Option<IpAddr>) -> Result<(Caller, String)> {
        let (mut caller, csrf) = self.store.session_authenticate(secret).await?;
        caller.source = client;
        Ok((caller, csrf))
    }

    /// Ends a dashboard session (recorded in the audit log with the session's user).
    pub async fn session_close(&self, secret: &str, client: Option<IpAddr>) -> Result<()> {
        self.store.session_close(secret, client).await
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
        let audit = Audit::by(caller, "token.create", "token");
        self.audited(&audit, async {
            caller.authorize(Action::ManageOwnTokens)?;
            let tenant_id = self.token_tenant(caller, tenant).await?;
            let audit = match tenant {
                Some(name) if tenant_id != caller.tenant_id => audit.clone().on_tenant(Some(tenant_id), name),
                _ => audit.clone(),
            };
            self.store.token_create(tenant_id, caller.user_id, name, expires_in_days, &audit).await
        })
        .await
    }

    /// The tenant a new token of the caller's is for: the caller's, or another the user is a
    /// member of.
    async fn token_tenant(&self, caller: &Caller, tenant: Option<&str>) -> Result<Uuid> {
        Ok(match tenant {
            None => caller.tenant_id,
            Some(tenant) if tenant == caller.tenant => caller.tenant_id,
            Some(tenant) => self.store.membership_tenant(caller.user_id, tenant).await.map_err(|err| match err {
                Error::NotFound { .. } => {
                    Error::invalid("tenant", format!("you are not a member of a tenant {tenant:?}"))
                }
                other => other,
            })?,
        })
    }

    pub async fn tokens_list(&self, caller: &Caller) -> Result<Vec<TokenInfo>> {
        caller.authorize(Action::ManageOwnTokens)?;
        self.store.tokens_list(caller).await
    }

    pub async fn token_revoke(&self, caller: &Caller, token_id: Uuid) -> Result<()> {
        let audit = Audit::by(caller, "token.revoke", format!("token:{token_id}"));
        self.audited(&audit, async {
            caller.authorize(Action::ManageOwnTokens)?;
            self.store.token_revoke(caller, token_id, &audit).await
        })
        .await
    }

    pub async fn tenant_create(&self, caller: &Caller, name: &str) -> Result<Tenant> {
        let audit = Audit::by(caller, "tenant.create", format!("tenant:{name}")).platform_wide();
        self.audited(&audit, async {
            caller.require_platform_admin()?;
            trainyard_core::names::TenantName::parse(name).map_err(|message| Error::invalid("name", message))?;
            self.store.tenant_create(name, &audit).await
        })
        .await
    }

    /// Asks for a tenant's removal (platform admins): it takes nothing new, its tokens are
    /// revoked and its jobs cancelled now; the reconciler removes its namespace or volumes once
    /// nothing of it runs and marks it removed (see [`trainyard_store::Store::tenant_remove_request`]).
    pub async fn tenant_remove(&self, caller: &Caller, name: &str) -> Result<Tenant> {
        let audit = Audit::by(caller, "tenant.remove", format!("tenant:{name}")).platform_wide();
        let tenant = self
            .audited(&audit, async {
                caller.require_platform_admin()?;
                self.store.tenant_remove_request(name, caller.tenant_id, &audit).await
            })
            .await?;
        self.scheduling_changed();
        Ok(tenant)
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

    /// Platform admins add any user to any tenant; a tenant's admins invite new users to their
    /// own tenant and change its members' roles. Either gets a token only for a user the call
    /// creates (an invitation), never for an existing user.
    pub async fn member_add(&self, caller: &Caller, tenant: &str, member: MemberAdd) -> Result<MemberAdded> {
        let audit = Audit::by(caller, "member.add", format!("tenant:{tenant}/user:{}", member.user));
        self.audited(&audit, async {
            Self::require_members_admin(caller, tenant, "add members")?;
            let may_add_existing_users = caller.platform_admin;
            self.store.member_add(tenant, &member, may_add_existing_users, &audit).await
        })
        .await
    }

    /// Platform admins, and the admins of `tenant` itself, manage its members.
    fn require_members_admin(caller: &Caller, tenant: &str, what: &str) -> Result<()> {
        if caller.platform_admin || (caller.tenant == tenant && caller.authorize(Action::ManageTenant).is_ok()) {
            Ok(())
        } else {
            Err(Error::Forbidden(format!("only platform admins and this tenant's admins may {what}")))
        }
    }

    /// Removes a member from a tenant: their tokens there are revoked at once, their jobs kept
    /// (cancelled too with `cancel_jobs`). The tenant's last admin stays (409); someone not a
    /// member is 404 (see [`trainyard_store::Store::member_remove`]).
    pub async fn member_remove(
        &self,
        caller: &Caller,
        tenant: &str,
        user: &str,
        cancel_jobs: bool,
    ) -> Result<MemberRemoved> {
        let audit = Audit::by(caller, "member.remove", format!("tenant:{tenant}/user:{user}"));
        let removed = self
            .audited(&audit, async {
                Self::require_members_admin(caller, tenant, "remove members")?;
                let may_remove_platform_admins = caller.platform_admin;
                self.store.member_remove(tenant, user, cancel_jobs, may_remove_platform_admins, &audit).await
            })
            .await?;
        if removed.jobs_cancelled > 0 {
            self.scheduling_changed();
        }
        Ok(removed)
    }

    /// A new token for a member who lost theirs, printed once to the admin who hands it over
    /// (the invitation's path: [`trainyard_store::Store::member_token_reissue`]); with
    /// `revoke_others`, their other tokens in the tenant are revoked. A platform admin's token is
    /// reissued by a platform admin only: it carries powers beyond the tenant.
    pub async fn member_token_reissue(
        &self,
        caller: &Caller,
        tenant: &str,
        user: &str,
        request: MemberTokenReissue,
    ) -> Result<MemberToken> {
        let audit = Audit::by(caller, "member.token_reissue", format!("tenant:{tenant}/user:{user}"));
        self.audited(&audit, async {
            Self::require_members_admin(caller, tenant, "reissue members' tokens")?;
            let name = request.name.as_deref().unwrap_or("reissued");
            let may_reissue_platform_admins = caller.platform_admin;
            self.store
                .member_token_reissue(
                    tenant,
                    user,
                    name,
                    request.expires_in_days,
                    request.revoke_others,
                    may_reissue_platform_admins,
                    &audit,
                )
                .await
        })
        .await
    }
}
