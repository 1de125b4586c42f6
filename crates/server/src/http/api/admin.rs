use axum::Json;
use axum::extract::{Path, State};
use axum::http::StatusCode;
use trainyard_core::api::{ErrorBody, MemberAdd, MemberAdded, Tenant, TenantCreate};

use crate::http::AppState;
use crate::http::error::ApiResult;
use crate::http::extract::{ApiJson, Auth};

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
