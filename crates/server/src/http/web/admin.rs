//! Quota and usage (everyone), one's own tokens (everyone), and the platform admin's page:
//! tenants, members and roles, quotas, and the GPU inventory.

use std::collections::BTreeMap;

use askama::Template;
use axum::extract::{Path, State};
use axum::http::StatusCode;
use axum::response::{IntoResponse, Redirect, Response};
use trainyard_core::Error;
use trainyard_core::api::{MemberAdd, QuotaSet, TokenCreated};
use trainyard_core::auth::Role;
use trainyard_core::error::ObjectKind;
use trainyard_core::resources::human_memory;

use super::{CsrfForm, Nav, WebAuth, WebResult, render, when_opt};
use crate::http::AppState;
use crate::http::extract::parse_id;

/// One GPU type's bar: the parts as percentages of the bar's length, and the figures.
pub struct QuotaBar {
    pub flavor: String,
    pub nominal: u64,
    pub used: u64,
    pub borrowed: u64,
    pub lent: u64,
    pub borrowing_limit: String,
    /// Widths in percent: used within nominal, borrowed beyond it, lent to others, idle.
    pub own_pct: u64,
    pub borrowed_pct: u64,
    pub lent_pct: u64,
    pub idle_pct: u64,
}

impl QuotaBar {
    fn of(usage: &trainyard_core::api::FlavorUsage) -> QuotaBar {
        let own = usage.used.min(usage.nominal);
        let lent = usage.lent.min(usage.nominal - own);
        let idle = usage.nominal - own - lent;
        let total = (usage.nominal + usage.borrowed).max(1);
        let pct = |part: u64| part * 100 / total;
        QuotaBar {
            flavor: usage.flavor.clone(),
            nominal: usage.nominal,
            used: usage.used,
            borrowed: usage.borrowed,
            lent: usage.lent,
            borrowing_limit: usage.borrowing_limit.map(|l| l.to_string()).unwrap_or_else(|| "none set".into()),
            own_pct: pct(own),
            borrowed_pct: pct(usage.borrowed),
            lent_pct: pct(lent),
            idle_pct: pct(idle),
        }
    }
}

#[derive(Template)]
#[template(path = "quota.html")]
struct QuotaPage {
    nav: Nav,
    tenant: String,
    cohort: String,
    weight: f64,
    bars: Vec<QuotaBar>,
}

pub async fn quota(State(state): State<AppState>, auth: WebAuth) -> WebResult<Response> {
    let report = state.app.quota_report(&auth.caller).await?;
    Ok(render(&QuotaPage {
        nav: Nav::new(&auth, "quota"),
        tenant: report.tenant,
        cohort: report.cohort.unwrap_or_else(|| "none".into()),
        weight: report.weight,
        bars: report.flavors.iter().map(QuotaBar::of).collect(),
    }))
}

pub struct QueueRow {
    pub position: String,
    pub id: String,
    pub name: String,
    pub tenant: String,
    pub priority: i32,
    pub reason: String,
    pub estimate: String,
}

pub struct NodeUsageRow {
    pub name: String,
    pub gpu_type: String,
    pub gpus: String,
    pub cpus: String,
    pub memory: String,
    pub replicas: u32,
    /// Allocated GPUs as a share of the node's (or of its CPU, for a node without GPUs), in %.
    pub used_pct: u64,
}

#[derive(Template)]
#[template(path = "queue.html")]
struct QueuePage {
    nav: Nav,
    queue: Vec<QueueRow>,
    others_waiting: usize,
    nodes: Vec<NodeUsageRow>,
}

/// The waiting jobs the caller may see, in the scheduler's order, and the nodes with what is in use.
pub async fn queue(State(state): State<AppState>, auth: WebAuth) -> WebResult<Response> {
    let waiting = state.app.queue(&auth.caller).await?;
    let nodes = state.app.nodes_usage(&auth.caller).await?;
    let queue = waiting
        .items
        .into_iter()
        .map(|entry| {
            let s = entry.schedule;
            QueueRow {
                position: if s.admitted_now {
                    "next".into()
                } else {
                    s.cluster_position.map(|p| p.to_string()).unwrap_or_default()
                },
                id: entry.id.to_string(),
                name: entry.name,
                tenant: entry.tenant,
                priority: entry.priority,
                reason: s.reason.unwrap_or_else(|| "starts at the next admission".into()),
                estimate: match (s.estimated_start, s.admitted_now) {
                    (Some(at), _) => super::when(&at),
                    (None, true) => "now".into(),
                    (None, false) => "—".into(),
                },
            }
        })
        .collect();
    let cores = |millis: u64| format!("{:.1}", millis as f64 / 1000.0);
    let nodes = nodes
        .items
        .into_iter()
        .map(|n| NodeUsageRow {
            gpu_type: n.gpu_type.unwrap_or_else(|| "—".into()),
            gpus: format!("{} of {}", n.gpus_allocated, n.gpus),
            cpus: format!("{} of {}", cores(n.cpu_millis_allocated), cores(n.cpu_millis)),
            memory: format!("{} of {}", human_memory(n.memory_bytes_allocated), human_memory(n.memory_bytes)),
            replicas: n.replicas,
            used_pct: if n.gpus > 0 {
                u64::from(n.gpus_allocated) * 100 / u64::from(n.gpus)
            } else {
                (n.cpu_millis_allocated * 100).checked_div(n.cpu_millis).unwrap_or(0)
            }
            .min(100),
            name: n.name,
        })
        .collect();
    Ok(render(&QueuePage { nav: Nav::new(&auth, "queue"), queue, others_waiting: waiting.others_waiting, nodes }))
}

pub struct TokenRow {
    pub id: String,
    pub name: String,
    pub created: String,
    pub expires: String,
    pub last_used: String,
    pub revoked: bool,
    /// The token this session was opened with.
    pub current: bool,
}

#[derive(Template)]
#[template(path = "tokens.html")]
struct TokensPage {
    nav: Nav,
    tokens: Vec<TokenRow>,
    created: Option<TokenCreated>,
    error: Option<String>,
}

async fn tokens_page(
    state: &AppState,
    auth: &WebAuth,
    created: Option<TokenCreated>,
    error: Option<String>,
) -> WebResult<TokensPage> {
    let tokens = state
        .app
        .tokens_list(&auth.caller)
        .await?
        .into_iter()
        .map(|t| TokenRow {
            id: t.id.to_string(),
            name: t.name,
            created: super::when(&t.created_at),
            expires: when_opt(t.expires_at.as_ref()),
            last_used: when_opt(t.last_used_at.as_ref()),
            revoked: t.revoked_at.is_some(),
            current: t.id == auth.caller.token_id,
        })
        .collect();
    Ok(TokensPage { nav: Nav::new(auth, "tokens"), tokens, created, error })
}

pub async fn tokens(State(state): State<AppState>, auth: WebAuth) -> WebResult<Response> {
    Ok(render(&tokens_page(&state, &auth, None, None).await?))
}

pub async fn token_create(
    State(state): State<AppState>,
    auth: WebAuth,
    CsrfForm(form): CsrfForm,
) -> WebResult<Response> {
    let name = form.get("name").map(|n| n.trim()).unwrap_or_default();
    let days = form.get("expires_in_days").map(|d| d.trim()).filter(|d| !d.is_empty());
    let result = match (name.is_empty(), days.map(str::parse::<u32>).transpose()) {
        (true, _) => Err(Error::invalid("name", "give the token a name, e.g. laptop")),
        (_, Err(_)) => Err(Error::invalid("expires_in_days", "must be a whole number of days")),
        (false, Ok(days)) => state.app.token_create(&auth.caller, name, days, None).await,
    };
    match result {
        // The secret is shown once, on this response, never again.
        Ok(created) => Ok(render(&tokens_page(&state, &auth, Some(created), None).await?)),
        Err(err @ (Error::InvalidInput { .. } | Error::InvalidFields(_))) => {
            let mut response = render(&tokens_page(&state, &auth, None, Some(err.to_string())).await?);
            *response.status_mut() = StatusCode::UNPROCESSABLE_ENTITY;
            Ok(response)
        }
        Err(err) => Err(err.into()),
    }
}

pub async fn token_revoke(
    State(state): State<AppState>,
    auth: WebAuth,
    Path(id): Path<String>,
    CsrfForm(_form): CsrfForm,
) -> WebResult<Response> {
    let token_id = parse_id(&id, ObjectKind::Token)?;
    state.app.token_revoke(&auth.caller, token_id).await?;
    Ok(Redirect::to("/tokens").into_response())
}

pub struct TenantRow {
    pub name: String,
    pub cohort: String,
    pub weight: f64,
    pub quotas: Vec<(String, String)>,
    pub members: Vec<(String, &'static str)>,
    /// "being removed since ..." while its jobs stop; empty for a tenant in use.
    pub removal: String,
}

pub struct NodeRow {
    pub name: String,
    pub gpu_type: String,
    pub gpus: u32,
    pub cpus: String,
    pub memory: String,
}

#[derive(Template)]
#[template(path = "admin.html")]
struct AdminPage {
    nav: Nav,
    tenants: Vec<TenantRow>,
    nodes: Vec<NodeRow>,
    roles: Vec<&'static str>,
    message: Option<String>,
    error: Option<String>,
}

async fn admin_page(
    state: &AppState,
    auth: &WebAuth,
    message: Option<String>,
    error: Option<String>,
) -> WebResult<AdminPage> {
    let policies = state.app.tenant_policies(&auth.caller).await?;
    let members = state.app.members_list(&auth.caller).await?;
    let being_removed: BTreeMap<String, String> = state
        .app
        .tenants_list(&auth.caller)
        .await?
        .into_iter()
        .filter_map(|t| Some((t.name, t.removal_requested_at?.format("%Y-%m-%d %H:%M UTC").to_string())))
        .collect();
    let tenants = policies
        .into_iter()
        .map(|p| TenantRow {
            quotas: p
                .quotas
                .iter()
                .map(|q| {
                    let limit = q.borrowing_limit.map(|l| format!(", may borrow {l}")).unwrap_or_default();
                    (q.flavor.clone(), format!("{} nominal{limit}", q.nominal))
                })
                .collect(),
            members: members.iter().filter(|(t, _, _)| *t == p.name).map(|(_, u, r)| (u.clone(), r.as_str())).collect(),
            removal: being_removed.get(&p.name).map(|at| format!("being removed since {at}")).unwrap_or_default(),
            name: p.name,
            cohort: p.cohort.unwrap_or_default(),
            weight: p.weight,
        })
        .collect();
    let nodes = state
        .app
        .nodes(&auth.caller)?
        .into_iter()
        .map(|n| NodeRow {
            name: n.name,
            gpu_type: n.gpu_type.unwrap_or_else(|| "—".into()),
            gpus: n.gpus,
            cpus: format!("{:.1}", n.cpu_millis as f64 / 1000.0),
            memory: human_memory(n.memory_bytes),
        })
        .collect();
    let roles = [Role::Viewer, Role::Member, Role::Admin].iter().map(|r| r.as_str()).collect();
    Ok(AdminPage { nav: Nav::new(auth, "admin"), tenants, nodes, roles, message, error })
}

pub async fn admin(State(state): State<AppState>, auth: WebAuth) -> WebResult<Response> {
    Ok(render(&admin_page(&state, &auth, None, None).await?))
}

/// The admin page again after a form: with the outcome, or the error next to the forms.
async fn after(state: &AppState, auth: &WebAuth, outcome: trainyard_core::Result<String>) -> WebResult<Response> {
    match outcome {
        Ok(message) => Ok(render(&admin_page(state, auth, Some(message), None).await?)),
        Err(
            err @ (Error::InvalidInput { .. } | Error::InvalidFields(_) | Error::NotFound { .. } | Error::Conflict(_)),
        ) => {
            let status = crate::http::error::ApiError::Domain(err.clone()).status();
            let mut response = render(&admin_page(state, auth, None, Some(err.to_string())).await?);
            *response.status_mut() = status;
            Ok(response)
        }
        Err(err) => Err(err.into()),
    }
}

fn field<'a>(form: &'a BTreeMap<String, String>, name: &str) -> &'a str {
    form.get(name).map(|v| v.trim()).unwrap_or_default()
}

/// An optional whole number from a form field, naming the field when it is not one.
fn optional_number(form: &BTreeMap<String, String>, name: &str) -> trainyard_core::Result<Option<u64>> {
    let text = field(form, name);
    if text.is_empty() {
        return Ok(None);
    }
    text.parse().map(Some).map_err(|_| Error::invalid(name, "must be a whole number"))
}

pub async fn quota_set(State(state): State<AppState>, auth: WebAuth, CsrfForm(form): CsrfForm) -> WebResult<Response> {
    auth.caller.require_platform_admin()?;
    let (tenant, flavor) = (field(&form, "tenant"), field(&form, "flavor"));
    let outcome = async {
        let nominal = optional_number(&form, "nominal")?.ok_or_else(|| Error::invalid("nominal", "is required"))?;
        let quota = QuotaSet {
            nominal,
            borrowing_limit: optional_number(&form, "borrowing_limit")?,
            lending_limit: optional_number(&form, "lending_limit")?,
            allow_unknown: field(&form, "allow_unknown") == "on",
        };
        let set = state.app.quota_set(&auth.caller, tenant, flavor, quota).await?;
        let mut message = format!("quota of {tenant} for {flavor} set to {nominal} GPUs");
        for warning in set.warnings {
            message.push_str(&format!(" (warning: {warning})"));
        }
        Ok(message)
    }
    .await;
    after(&state, &auth, outcome).await
}

pub async fn member_add(State(state): State<AppState>, auth: WebAuth, CsrfForm(form): CsrfForm) -> WebResult<Response> {
    auth.caller.require_platform_admin()?;
    let tenant = field(&form, "tenant");
    let outcome = async {
        let role =
            Role::parse(field(&form, "role")).ok_or_else(|| Error::invalid("role", "viewer, member or admin"))?;
        let member =
            MemberAdd { user: field(&form, "user").to_string(), role, token_name: "web".into(), expires_in_days: None };
        let added = state.app.member_add(&auth.caller, tenant, member).await?;
        Ok(match added.token {
            Some(token) => format!(
                "{} is now {} in {}. Their first token, shown once: {}",
                added.user,
                added.role.as_str(),
                added.tenant,
                token.token
            ),
            None => format!(
                "{} is now {} in {}. They already had an account: they create their own token for {} on the Tokens page.",
                added.user,
                added.role.as_str(),
                added.tenant,
                added.tenant
            ),
        })
    }
    .await;
    after(&state, &auth, outcome).await
}

/// Removes a tenant, once its name is typed again to confirm (see [`crate::app::App::tenant_remove`]).
pub async fn tenant_remove(
    State(state): State<AppState>,
    auth: WebAuth,
    CsrfForm(form): CsrfForm,
) -> WebResult<Response> {
    auth.caller.require_platform_admin()?;
    let tenant = field(&form, "tenant");
    let outcome = async {
        if tenant.is_empty() {
            return Err(Error::invalid("tenant", "choose the tenant to remove"));
        }
        if field(&form, "confirm") != tenant {
            return Err(Error::invalid("confirm", "type the tenant's name to confirm its removal"));
        }
        let tenant = state.app.tenant_remove(&auth.caller, tenant).await?;
        Ok(format!(
            "tenant {} is being removed: its tokens are revoked and its jobs cancelled; its namespace and volumes go once they have stopped",
            tenant.name
        ))
    }
    .await;
    after(&state, &auth, outcome).await
}

pub async fn tenant_create(
    State(state): State<AppState>,
    auth: WebAuth,
    CsrfForm(form): CsrfForm,
) -> WebResult<Response> {
    let outcome = async {
        let tenant = state.app.tenant_create(&auth.caller, field(&form, "name")).await?;
        Ok(format!("tenant {} created", tenant.name))
    }
    .await;
    after(&state, &auth, outcome).await
}
