use axum::Json;
use axum::extract::{Path, State};
use axum::http::StatusCode;
use serde::Deserialize;
use trainyard_core::api::{
    ErrorBody, MemberAdd, MemberAdded, MemberRemoved, MemberToken, MemberTokenReissue, NodeDrain, NodeDrainRequest,
    Tenant, TenantCreate,
};
use utoipa::IntoParams;

use crate::http::AppState;
use crate::http::error::ApiResult;
use crate::http::extract::{ApiJson, ApiQuery, Auth};

/// Every tenant (platform admins).
#[utoipa::path(get, path = "/api/v1/admin/tenants", tag = "admin", security(("bearer" = [])),
    responses((status = 200, body = Vec<Tenant>), (status = 403, body = ErrorBody)))]
pub async fn tenants_list(State(state): State<AppState>, Auth(caller): Auth) -> ApiResult<Json<Vec<Tenant>>> {
    Ok(Json(state.app.tenants_list(&caller).await?))
}

/// Create a tenant (platform admins).
#[utoipa::path(post, path = "/api/v1/admin/tenants", tag = "admin", request_body = TenantCreate, security(("bearer" = [])),
    responses(
        (status = 201, body = Tenant),
        (status = 403, body = ErrorBody),
        (status = 409, description = "The name is taken", body = ErrorBody),
        (status = 422, body = ErrorBody),
    ))]
pub async fn tenant_create(
    State(state): State<AppState>,
    Auth(caller): Auth,
    ApiJson(body): ApiJson<TenantCreate>,
) -> ApiResult<(StatusCode, Json<Tenant>)> {
    Ok((StatusCode::CREATED, Json(state.app.tenant_create(&caller, &body.name).await?)))
}

/// Remove a tenant (platform admins). Accepted at once: from then on the tenant takes nothing
/// new, its tokens are revoked and its unfinished jobs cancelled; once the last has stopped,
/// what the executor held for it (its Kubernetes namespace, its volumes) is removed and
/// `removed_at` is set. Its jobs, usage and audit entries stay. Asking again changes nothing.
#[utoipa::path(delete, path = "/api/v1/admin/tenants/{tenant}", tag = "admin",
    params(("tenant" = String, Path, description = "Tenant name")), security(("bearer" = [])),
    responses(
        (status = 202, description = "Removal under way (or done)", body = Tenant),
        (status = 403, body = ErrorBody),
        (status = 404, body = ErrorBody),
        (status = 409, description = "The caller's own credential belongs to the tenant", body = ErrorBody),
    ))]
pub async fn tenant_remove(
    State(state): State<AppState>,
    Auth(caller): Auth,
    Path(tenant): Path<String>,
) -> ApiResult<(StatusCode, Json<Tenant>)> {
    Ok((StatusCode::ACCEPTED, Json(state.app.tenant_remove(&caller, &tenant).await?)))
}

/// Add a member to a tenant, or change a member's role. A user this call creates (an invitation)
/// gets a first token, returned here for the inviter to hand over; an existing user gets none.
/// Platform admins may add existing users; a tenant's admins invite new users and change the
/// roles of their tenant's members (403 for an existing user who is not yet a member).
#[utoipa::path(post, path = "/api/v1/admin/tenants/{tenant}/members", tag = "admin", request_body = MemberAdd,
    params(("tenant" = String, Path, description = "Tenant name")), security(("bearer" = [])),
    responses(
        (status = 201, body = MemberAdded),
        (status = 403, body = ErrorBody),
        (status = 404, body = ErrorBody),
        (status = 422, body = ErrorBody),
    ))]
pub async fn member_add(
    State(state): State<AppState>,
    Auth(caller): Auth,
    Path(tenant): Path<String>,
    ApiJson(body): ApiJson<MemberAdd>,
) -> ApiResult<(StatusCode, Json<MemberAdded>)> {
    Ok((StatusCode::CREATED, Json(state.app.member_add(&caller, &tenant, body).await?)))
}

#[derive(Debug, Default, Clone, Deserialize, IntoParams)]
#[serde(deny_unknown_fields)]
#[into_params(parameter_in = Query)]
pub struct MemberRemoveParams {
    /// Also cancel the member's unfinished jobs in this tenant (default: they are kept, running).
    pub cancel_jobs: Option<bool>,
}

/// Remove a member from a tenant (platform admins, and the tenant's own admins): their tokens
/// for the tenant are revoked at once (a request with one is 401 from then on), their jobs are
/// kept (still listed, still running) unless `cancel_jobs`. The tenant's last admin is not
/// removed (409).
#[utoipa::path(delete, path = "/api/v1/admin/tenants/{tenant}/members/{user}", tag = "admin",
    params(("tenant" = String, Path, description = "Tenant name"), ("user" = String, Path, description = "User name"),
        MemberRemoveParams),
    security(("bearer" = [])),
    responses(
        (status = 200, body = MemberRemoved),
        (status = 403, body = ErrorBody),
        (status = 404, description = "No such tenant, or the user is not its member", body = ErrorBody),
        (status = 409, description = "The tenant's last admin", body = ErrorBody),
    ))]
pub async fn member_remove(
    State(state): State<AppState>,
    Auth(caller): Auth,
    Path((tenant, user)): Path<(String, String)>,
    ApiQuery(params): ApiQuery<MemberRemoveParams>,
) -> ApiResult<Json<MemberRemoved>> {
    let cancel_jobs = params.cancel_jobs.unwrap_or(false);
    Ok(Json(state.app.member_remove(&caller, &tenant, &user, cancel_jobs).await?))
}

/// A new token for a member who lost theirs (platform admins, and the tenant's own admins; a
/// platform admin's token only by a platform admin). The secret is in this answer only, for the
/// admin to hand over; `revoke_others` revokes the member's other tokens in the tenant.
#[utoipa::path(post, path = "/api/v1/admin/tenants/{tenant}/members/{user}/tokens", tag = "admin",
    request_body = MemberTokenReissue,
    params(("tenant" = String, Path, description = "Tenant name"), ("user" = String, Path, description = "User name")),
    security(("bearer" = [])),
    responses(
        (status = 201, body = MemberToken),
        (status = 403, body = ErrorBody),
        (status = 404, description = "No such tenant, or the user is not its member", body = ErrorBody),
        (status = 422, body = ErrorBody),
    ))]
pub async fn member_token_reissue(
    State(state): State<AppState>,
    Auth(caller): Auth,
    Path((tenant, user)): Path<(String, String)>,
    ApiJson(body): ApiJson<MemberTokenReissue>,
) -> ApiResult<(StatusCode, Json<MemberToken>)> {
    Ok((StatusCode::CREATED, Json(state.app.member_token_reissue(&caller, &tenant, &user, body).await?)))
}

/// Drain a node (platform admins): it takes no new placements, on whichever executor reports it,
/// until undrained; its running jobs stay unless `preempt` (then they go back to the queue, no
/// restart counted). Draining again replaces the reason.
#[utoipa::path(put, path = "/api/v1/admin/nodes/{node}/drain", tag = "admin", request_body = NodeDrainRequest,
    params(("node" = String, Path, description = "Node name, as `GET /api/v1/nodes` lists it")),
    security(("bearer" = [])),
    responses(
        (status = 200, body = NodeDrain),
        (status = 403, body = ErrorBody),
        (status = 404, description = "The executor reports no such node", body = ErrorBody),
        (status = 422, body = ErrorBody),
    ))]
pub async fn node_drain(
    State(state): State<AppState>,
    Auth(caller): Auth,
    Path(node): Path<String>,
    ApiJson(body): ApiJson<NodeDrainRequest>,
) -> ApiResult<Json<NodeDrain>> {
    Ok(Json(state.app.node_drain(&caller, &node, body).await?))
}

/// Undrain a node (platform admins): it takes placements again.
#[utoipa::path(delete, path = "/api/v1/admin/nodes/{node}/drain", tag = "admin",
    params(("node" = String, Path, description = "Node name")),
    security(("bearer" = [])),
    responses(
        (status = 200, description = "The drain that was lifted", body = NodeDrain),
        (status = 403, body = ErrorBody),
        (status = 409, description = "The node is not drained", body = ErrorBody),
    ))]
pub async fn node_undrain(
    State(state): State<AppState>,
    Auth(caller): Auth,
    Path(node): Path<String>,
) -> ApiResult<Json<NodeDrain>> {
    Ok(Json(state.app.node_undrain(&caller, &node).await?))
}
