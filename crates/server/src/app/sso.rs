//! Single sign-on: a browser leaves for the identity provider and comes back with a code; the
//! verified identity's groups decide its tenants and roles (see [`crate::oidc`] for the protocol
//! and `docs/security.md` for the rules).

use std::net::IpAddr;

use trainyard_core::auth::Caller;
use trainyard_core::{Error, Result};
use trainyard_store::sessions::WebSession;
use trainyard_store::sso::{PendingLogin, SsoSignIn};

use super::App;
use crate::oidc::{Oidc, grants, user_name_for};

impl App {
    /// Turns single sign-on on (the server does, before it serves).
    pub(crate) fn oidc_set(&mut self, oidc: Option<std::sync::Arc<Oidc>>) {
        self.oidc = oidc;
    }

    /// The callback URL for a server listening at `base`, unless the settings named one.
    pub(crate) fn sso_redirect_default(&self, base: &str) {
        if let Some(oidc) = &self.oidc {
            oidc.redirect_url_default(base);
        }
    }

    /// The identity provider's name for the sign-in page, when single sign-on is on.
    pub fn sso_display_name(&self) -> Option<&str> {
        self.oidc.as_deref().map(|oidc| oidc.display_name.as_str())
    }

    fn oidc(&self) -> Result<&Oidc> {
        self.oidc.as_deref().ok_or(Error::NotFound { kind: trainyard_core::error::ObjectKind::Route })
    }

    /// Starts a sign-in (into `tenant`, if named): the URL to send the browser to and the
    /// `state` it must come back with. `sign_in_again` (the browser signed out before) makes
    /// the provider ask who is there instead of signing its last user in again.
    pub async fn sso_begin(&self, tenant: Option<&str>, sign_in_again: bool) -> Result<(String, String)> {
        let oidc = self.oidc()?;
        if let Some(tenant) = tenant {
            trainyard_core::names::TenantName::parse(tenant).map_err(|err| Error::invalid("tenant", err))?;
        }
        let authorization = oidc.authorization(sign_in_again).await?;
        let pending = PendingLogin {
            pkce_verifier: authorization.pkce_verifier,
            nonce: authorization.nonce,
            tenant: tenant.map(str::to_string),
        };
        self.store.sso_login_begin(&authorization.state, &pending).await?;
        Ok((authorization.url, authorization.state))
    }

    /// Finishes a sign-in that came back with `code` and `state`: verifies the identity, keeps
    /// its user and memberships in step with its groups, and opens a dashboard session (with
    /// the ID token, for signing out at the provider). Failures count against the client like
    /// a wrong token.
    pub async fn sso_finish(
        &self,
        code: &str,
        state: &str,
        client: Option<IpAddr>,
    ) -> Result<(WebSession, Caller, String)> {
        let oidc = self.oidc()?;
        self.throttled(state, client, async {
            let pending = self.store.sso_login_take(state).await?;
            let identity = oidc.identity(code, &pending.pkce_verifier, &pending.nonce).await?;
            let grants = grants(&oidc.group_roles, oidc.admin_group.as_deref(), &identity.groups);
            if !grants.any() && !identity.groups_claim_sent {
                tracing::info!(issuer = %identity.issuer, subject = %identity.subject, "single sign-on refused: no groups claim");
                return Err(Error::Forbidden(format!(
                    "the identity provider sent no `{}` claim, in the ID token or at userinfo, so no group gives you \
                     access; an operator may need to ask for the scope that carries it (`--oidc-scopes`, e.g. \
                     `openid profile email groups`)",
                    oidc.groups_claim
                )));
            }
            if !grants.any() {
                tracing::info!(issuer = %identity.issuer, subject = %identity.subject, "single sign-on refused: no mapped group");
                return Err(Error::Forbidden(
                    "your account is in none of the groups that give access to Trainyard; ask an administrator".into(),
                ));
            }
            let user_name = user_name_for(identity.name_hint.as_deref(), &identity.subject);
            let mapped_tenants = oidc.mapped_tenants();
            let roles: Vec<_> = grants.roles.into_iter().collect();
            let (session, caller) = self
                .store
                .sso_sign_in(&SsoSignIn {
                    issuer: &identity.issuer,
                    subject: &identity.subject,
                    user_name: &user_name,
                    provision: oidc.provision_users,
                    platform_admin: grants.platform_admin,
                    mapped_tenants: &mapped_tenants,
                    grants: &roles,
                    source: client,
                    tenant: pending.tenant.as_deref(),
                })
                .await?;
            Ok((session, caller, identity.id_token))
        })
        .await
    }

    /// Where a browser that signs out goes next: the provider's end-session endpoint (with the
    /// session's ID token as the hint) when it has one, else `None` (the sign-in page).
    pub async fn sso_logout_url(&self, id_token_hint: Option<&str>) -> Option<String> {
        self.oidc.as_deref()?.logout_url(id_token_hint).await
    }
}
