//! Interactive sessions (notebooks): opened as ordinary jobs of the caller's tenant from the
//! built-in `notebook` template (queued under quota, charged, recorded like any run), marked as
//! sessions, and reached in a browser through the proxy (`http/proxy.rs`) with a cookie that a
//! one-time grant is exchanged for. See docs/sessions.md.

use chrono::{DateTime, Duration, Utc};
use trainyard_core::api::{SESSION_KINDS, Session, SessionCreate, TemplateRun};
use trainyard_core::auth::{Action, Caller, Role};
use trainyard_core::error::Problems;
use trainyard_core::job::JobState;
use trainyard_core::{Error, Result};
use trainyard_store::interactive::{InteractiveSessionRow, SessionUpstream};
use trainyard_store::jobs::Submitted;
use trainyard_store::sessions::random_hex;
use uuid::Uuid;

use super::{App, RunMode, TemplateRunOutcome};
use crate::templates::NOTEBOOK_TEMPLATE;

/// How long a grant (the link the dashboard or `yard notebook` gives) may wait to be followed.
pub const GRANT_LIFETIME_SECONDS: i64 = 60;
/// How long a browser's session cookie lasts at most; the token behind it may end it sooner.
pub const SESSION_COOKIE_HOURS: i64 = 12;

/// A grant just made: the secret (shown once, in the link) and until when it may be used.
pub struct SessionGrant {
    pub grant: String,
    pub expires_at: DateTime<Utc>,
}

/// What the proxy may do with a request whose cookie checked out.
pub enum SessionRoute {
    /// Forward it to `127.0.0.1:port`, sending `secret` as the upstream credential.
    Forward { port: u16, secret: String },
    /// The session is not running (yet, or any more): its state says which.
    NotRunning(JobState),
}

impl App {
    /// Opens a session: a job of the caller's tenant from the kind's built-in template, queued
    /// like any job. Every bad field is named at once.
    pub async fn session_create(&self, caller: &Caller, create: SessionCreate) -> Result<Session> {
        caller.authorize(Action::OpenSessions)?;
        let mut problems = Problems::default();
        if !SESSION_KINDS.contains(&create.kind.as_str()) {
            problems.add(
                "kind",
                format!(
                    "{:?} is not a kind of session this server opens; one of: {}",
                    create.kind,
                    SESSION_KINDS.join(", ")
                ),
            );
        }
        problems.into_result()?;
        let mut params = serde_json::Map::new();
        if let Some(python) = create.python {
            params.insert("python".into(), python.into());
        }
        if let Some(gpus) = create.gpus {
            params.insert("gpus".into(), gpus.into());
        }
        if let Some(gpu_type) = create.gpu_type {
            params.insert("gpu_type".into(), gpu_type.into());
        }
        if let Some(cpu) = create.cpu {
            params.insert("cpu".into(), cpu.into());
        }
        if let Some(memory) = create.memory {
            params.insert("memory".into(), memory.into());
        }
        let run = TemplateRun {
            version: None,
            params,
            // A job's name allows no '@' and at most MAX_NAME_LEN characters; user names may have both.
            name: Some(
                format!("{}-{}", create.kind, caller.user.replace('@', "-"))
                    .chars()
                    .take(trainyard_core::job::MAX_NAME_LEN)
                    .collect(),
            ),
            priority: 0,
            max_restarts: 0,
            idempotency_key: None,
            cache_wait_seconds: None,
            spare: false,
        };
        let job = match self.template_run(caller, NOTEBOOK_TEMPLATE, run, RunMode::Submit).await? {
            TemplateRunOutcome::Submitted(submitted) => match *submitted {
                Submitted::Created(job) | Submitted::Replayed(job) => job,
            },
            _ => return Err(Error::internal("a submit of a session's template did not submit")),
        };
        self.store.interactive_session_insert(caller.tenant_id, job.id, caller.user_id, &create.kind).await?;
        self.session_get(caller, job.id).await
    }

    /// A session of the caller's tenant.
    pub async fn session_get(&self, caller: &Caller, id: Uuid) -> Result<Session> {
        caller.authorize(Action::ReadJobs)?;
        let row = self.store.interactive_session_get(caller.tenant_id, id).await?;
        session_of(row)
    }

    /// A one-time grant to open the session in a browser: for the session's own user, or an
    /// admin of its tenant.
    pub async fn session_grant(&self, caller: &Caller, id: Uuid) -> Result<SessionGrant> {
        // Reading first keeps "no such session" (404) ahead of "not allowed" (403).
        caller.authorize(Action::ReadJobs)?;
        let row = self.store.interactive_session_get(caller.tenant_id, id).await?;
        caller.authorize(Action::OpenSessions)?;
        if row.user_id != caller.user_id && caller.role < Role::Admin {
            return Err(Error::Forbidden(format!(
                "this session is {}'s; only they and the tenant's admins may open it",
                row.user_name
            )));
        }
        let grant =
            SessionGrant { grant: random_hex(), expires_at: Utc::now() + Duration::seconds(GRANT_LIFETIME_SECONDS) };
        self.store
            .interactive_grant_create(caller.tenant_id, id, caller.token_id, &grant.grant, grant.expires_at)
            .await?;
        Ok(grant)
    }

    /// Exchanges a grant for the browser's session cookie (returned, to be set), once.
    pub async fn session_enter(&self, id: Uuid, grant: &str) -> Result<String> {
        let cookie = random_hex();
        let expires = Utc::now() + Duration::hours(SESSION_COOKIE_HOURS);
        if self.store.interactive_grant_redeem(id, grant, &cookie, expires).await? {
            Ok(cookie)
        } else {
            Err(Error::Unauthenticated(
                "this link to a session is not valid any more (links work once, within a minute); ask for a new one"
                    .into(),
            ))
        }
    }

    /// Where a proxied request with this cookie goes, or why it goes nowhere. Counts as the
    /// session's activity only when the cookie is good.
    pub async fn session_route(&self, id: Uuid, cookie: Option<&str>) -> Result<SessionRoute> {
        let refused = || Error::Unauthenticated("open this session from the dashboard or with yard notebook".into());
        let cookie = cookie.ok_or_else(refused)?;
        let SessionUpstream { state, placement, .. } =
            self.store.interactive_cookie_check(id, cookie).await?.ok_or_else(refused)?;
        let state = JobState::parse(&state).ok_or_else(|| Error::internal(format!("job state {state:?}")))?;
        // The local executor's replicas share the server's network: its placement's port is on
        // 127.0.0.1. (Kubernetes placements have none yet: those sessions are not reached.)
        let port = placement
            .as_ref()
            .filter(|p| p.get("executor").and_then(serde_json::Value::as_str) == Some("local"))
            .and_then(|p| p.get("master_port"))
            .and_then(serde_json::Value::as_u64);
        match (state, port) {
            (JobState::Running, Some(port)) => Ok(SessionRoute::Forward {
                port: u16::try_from(port).map_err(Error::internal)?,
                secret: self.storage.session_upstream_secret(id),
            }),
            (state, _) => Ok(SessionRoute::NotRunning(state)),
        }
    }
}

fn session_of(row: InteractiveSessionRow) -> Result<Session> {
    Ok(Session {
        id: row.job_id,
        kind: row.kind,
        state: JobState::parse(&row.state).ok_or_else(|| Error::internal(format!("job state {:?}", row.state)))?,
        user: row.user_name,
        created_at: row.created_at,
        last_activity_at: row.last_activity_at,
    })
}
