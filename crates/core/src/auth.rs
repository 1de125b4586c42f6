//! Roles within a tenant and the actions each allows.

use serde::{Deserialize, Serialize};
use utoipa::ToSchema;

use crate::Error;

/// A member's role in one tenant. Ordered: each role can do what the ones before it can.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize, ToSchema)]
#[serde(rename_all = "lowercase")]
pub enum Role {
    /// Reads the tenant's jobs, events and logs.
    Viewer,
    /// Also submits and cancels jobs.
    Member,
    /// Also manages the tenant's members and tokens.
    Admin,
}

impl Role {
    pub fn as_str(self) -> &'static str {
        match self {
            Role::Viewer => "viewer",
            Role::Member => "member",
            Role::Admin => "admin",
        }
    }

    pub fn parse(s: &str) -> Option<Role> {
        match s {
            "viewer" => Some(Role::Viewer),
            "member" => Some(Role::Member),
            "admin" => Some(Role::Admin),
            _ => None,
        }
    }
}

/// What a caller wants to do, checked against its role before any work happens.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Action {
    ReadJobs,
    WriteJobs,
    ManageOwnTokens,
    ManageTenant,
    /// Read tracked experiments and runs (MLflow's API).
    ReadRuns,
    /// Create experiments and runs and log to them (MLflow's API).
    LogRuns,
    /// Open an interactive session (a notebook) and reach it through the proxy.
    OpenSessions,
    /// Subscribe to notifications of your own jobs, and read or remove your subscriptions.
    Notify,
}

impl Action {
    fn minimum_role(self) -> Role {
        match self {
            Action::ReadJobs => Role::Viewer,
            Action::ManageOwnTokens => Role::Viewer,
            Action::WriteJobs => Role::Member,
            Action::ManageTenant => Role::Admin,
            Action::ReadRuns => Role::Viewer,
            Action::LogRuns => Role::Member,
            Action::OpenSessions => Role::Member,
            Action::Notify => Role::Member,
        }
    }

    fn describe(self) -> &'static str {
        match self {
            Action::ReadJobs => "read jobs",
            Action::WriteJobs => "submit or cancel jobs",
            Action::ManageOwnTokens => "manage your tokens",
            Action::ManageTenant => "manage this tenant",
            Action::ReadRuns => "read tracked runs",
            Action::LogRuns => "create runs or log to them",
            Action::OpenSessions => "open notebooks",
            Action::Notify => "subscribe to notifications",
        }
    }
}

/// Allows the action or says which role it needs.
pub fn authorize(role: Role, action: Action) -> Result<(), Error> {
    let needed = action.minimum_role();
    if role >= needed {
        Ok(())
    } else {
        Err(Error::Forbidden(format!(
            "your role in this tenant is {}; to {} you need the {} role",
            role.as_str(),
            action.describe(),
            needed.as_str()
        )))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn viewer_reads_but_does_not_write() {
        assert!(authorize(Role::Viewer, Action::ReadJobs).is_ok());
        let err = authorize(Role::Viewer, Action::WriteJobs).unwrap_err();
        assert!(err.to_string().contains("member role"), "{err}");
        assert!(authorize(Role::Member, Action::WriteJobs).is_ok());
        assert!(authorize(Role::Member, Action::ManageTenant).is_err());
        assert!(authorize(Role::Admin, Action::ManageTenant).is_ok());
    }
}

/// An authenticated caller: one user acting in one tenant through one token.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Caller {
    pub user_id: uuid::Uuid,
    pub user: String,
    pub tenant_id: uuid::Uuid,
    pub tenant: String,
    pub role: Role,
    pub platform_admin: bool,
    pub token_id: uuid::Uuid,
    /// Signed in to the dashboard (a session on the token), rather than calling with the token.
    pub session: bool,
    /// The client's address, when the server knows it (for the audit log).
    pub source: Option<std::net::IpAddr>,
}

impl Caller {
    pub fn authorize(&self, action: Action) -> Result<(), Error> {
        authorize(self.role, action)
    }

    pub fn require_platform_admin(&self) -> Result<(), Error> {
        if self.platform_admin { Ok(()) } else { Err(Error::Forbidden("only platform admins may do this".into())) }
    }

    /// How this caller appears in job events.
    pub fn actor(&self) -> String {
        format!("user:{}", self.user)
    }

    /// The credential this caller used, as the audit log names it (never its secret).
    pub fn credential(&self) -> String {
        format!("{}:{}", if self.session { "session" } else { "token" }, self.token_id)
    }
}
