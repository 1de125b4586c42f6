//! The REST API under `/api/v1`: routes, handlers and the OpenAPI document generated from them.
//! Handlers are thin: extract, call one [`App`](crate::app::App) operation, shape the response.

mod accounting;
mod admin;
mod checkpoints;
mod compare;
mod datasets;
mod experiments;
mod health;
mod interactive;
pub mod jobs;
mod lineage;
mod logs;
mod metrics;
mod notifications;
mod records;
mod scheduling;
mod storage;
mod templates;
mod tokens;

use crate::http::routes::RouteTable;
use axum::extract::DefaultBodyLimit;
use axum::routing::{delete, get, patch, post, put};
use utoipa::openapi::security::{HttpAuthScheme, HttpBuilder, SecurityScheme};
use utoipa::{Modify, OpenApi};

pub fn routes() -> RouteTable {
    RouteTable::new()
        .route("/healthz", get(health::healthz))
        .route("/readyz", get(health::readyz))
        .route("/api/v1/openapi.json", get(health::openapi_json))
        .route("/metrics", get(accounting::metrics))
        .route("/api/v1/audit", get(accounting::audit_get))
        .route("/api/v1/usage", get(accounting::usage_get))
        .route("/api/v1/me", get(tokens::me))
        .route("/api/v1/jobs", post(jobs::job_submit).get(jobs::jobs_list))
        .route("/api/v1/jobs/{id}", get(jobs::job_get))
        .route(
            "/api/v1/code/{digest}",
            // The handler reads the body up to the archive limit itself.
            put(jobs::code_upload).layer(DefaultBodyLimit::disable()),
        )
        .route("/api/v1/jobs/{id}/cancel", post(jobs::job_cancel))
        .route("/api/v1/jobs/{id}/rerun", post(jobs::job_rerun))
        .route("/api/v1/jobs/{id}/events", get(jobs::job_events))
        .route("/api/v1/jobs/{id}/attempts", get(jobs::job_attempts))
        .route("/api/v1/jobs/{id}/logs", get(logs::job_logs))
        .route("/api/v1/jobs/{id}/metrics", get(metrics::metrics_get).post(metrics::metrics_post))
        .route("/api/v1/jobs/{id}/outputs", get(metrics::outputs_get).post(metrics::output_post))
        .route("/api/v1/jobs/{id}/record", get(records::record_get).post(records::record_post))
        .route("/api/v1/jobs/{id}/cached-datasets", post(datasets::node_cache_report))
        .route("/api/v1/compare", get(compare::compare_get))
        .route("/api/v1/jobs/{id}/lineage", get(lineage::job_lineage))
        .route("/api/v1/datasets/{name}/{version}/lineage", get(lineage::dataset_lineage))
        .route("/api/v1/jobs/{id}/schedule", get(scheduling::job_schedule))
        .route("/api/v1/jobs/what-if", post(scheduling::job_what_if))
        .route("/api/v1/quota", get(scheduling::quota_get))
        .route("/api/v1/queue", get(scheduling::queue_get))
        .route("/api/v1/nodes", get(scheduling::nodes_get))
        .route("/api/v1/datasets", get(datasets::datasets_list).post(datasets::dataset_register))
        .route("/api/v1/datasets/{name}/{version}", get(datasets::dataset_get))
        .route(
            "/api/v1/datasets/{name}/{version}/files/{file}",
            get(datasets::dataset_file_get).head(datasets::dataset_file_head),
        )
        .route(
            "/api/v1/dataset-content/{hash}/{file}",
            // Shards stream to the store: no body limit here (each is held to the size its
            // manifest gives while it streams; the manifest itself to its own limit).
            put(datasets::dataset_file_upload).layer(DefaultBodyLimit::disable()),
        )
        .route("/api/v1/admin/tenants/{tenant}", patch(scheduling::tenant_patch).delete(admin::tenant_remove))
        .route("/api/v1/admin/tenants/{tenant}/quotas/{flavor}", put(scheduling::quota_put))
        .route("/api/v1/templates", get(templates::templates_list).post(templates::template_publish))
        .route("/api/v1/templates/{name}", get(templates::template_show))
        .route("/api/v1/templates/{name}/jobs", post(templates::template_run))
        .route("/api/v1/tokens", get(tokens::tokens_list).post(tokens::token_create))
        .route("/api/v1/tokens/{id}", delete(tokens::token_revoke))
        .route("/api/v1/admin/tenants", get(admin::tenants_list).post(admin::tenant_create))
        .route("/api/v1/admin/tenants/{tenant}/members", post(admin::member_add))
        .route("/api/v1/admin/tenants/{tenant}/members/{user}", delete(admin::member_remove))
        .route("/api/v1/admin/tenants/{tenant}/members/{user}/tokens", post(admin::member_token_reissue))
        .route("/api/v1/admin/nodes/{node}/drain", put(admin::node_drain).delete(admin::node_undrain))
        .route("/api/v1/sessions", post(interactive::session_create))
        .route("/api/v1/sessions/{id}", get(interactive::session_get))
        .route("/api/v1/sessions/{id}/link", post(interactive::session_link_create))
        .merge(storage_routes())
}

fn storage_routes() -> RouteTable {
    RouteTable::new()
        .route("/api/v1/jobs/{id}/checkpoints", get(checkpoints::checkpoints_list))
        .route("/api/v1/jobs/{id}/checkpoints/{step}", get(checkpoints::checkpoint_download))
        .route("/api/v1/jobs/{id}/artifacts", get(storage::artifacts_list))
        .route(
            "/api/v1/jobs/{id}/artifacts/{*path}",
            // Uploads stream to the store in parts: no body limit here (the server's own
            // per-artefact limit applies while streaming).
            get(storage::artifact_link).put(storage::artifact_upload).layer(DefaultBodyLimit::disable()),
        )
        .route("/api/v1/artifacts/download", get(storage::artifact_download))
        .route("/api/v1/volumes", get(storage::volumes_list).post(storage::volume_create))
        .route("/api/v1/volumes/{name}", delete(storage::volume_delete))
        .route("/api/v1/storage", get(storage::storage_get))
        .route("/api/v1/experiments", get(experiments::experiments_list).post(experiments::experiment_create))
        .route("/api/v1/experiments/preview", post(experiments::experiment_preview))
        .route("/api/v1/experiments/{id}", get(experiments::experiment_get))
        .route("/api/v1/experiments/{id}/pause", post(experiments::experiment_pause))
        .route("/api/v1/experiments/{id}/resume", post(experiments::experiment_resume))
        .route("/api/v1/experiments/{id}/cancel", post(experiments::experiment_cancel))
        .route("/api/v1/experiments/{id}/ask", post(experiments::experiment_ask))
        .route("/api/v1/experiments/{id}/tell", post(experiments::experiment_tell))
        .route("/api/v1/admin/tenants/{tenant}/storage", put(storage::storage_policy_put))
        .route(
            "/api/v1/notifications/subscriptions",
            get(notifications::subscriptions_list).post(notifications::subscription_create),
        )
        .route("/api/v1/notifications/subscriptions/{id}", delete(notifications::subscription_delete))
        .route("/api/v1/notifications/subscriptions/{id}/deliveries", get(notifications::subscription_deliveries))
}

#[derive(OpenApi)]
#[openapi(
    info(
        title = "Trainyard API",
        description = "Submit and watch deep-learning jobs on a shared cluster. Every call but \
            the health checks needs `Authorization: Bearer <token>`. Errors are \
            `{\"error\": {\"code\", \"message\", \"field\"?}}`."
    ),
    paths(
        health::healthz,
        health::readyz,
        accounting::metrics,
        accounting::audit_get,
        accounting::usage_get,
        tokens::me,
        jobs::job_submit,
        jobs::jobs_list,
        jobs::job_get,
        jobs::job_cancel,
        jobs::job_rerun,
        jobs::job_events,
        jobs::code_upload,
        jobs::job_attempts,
        logs::job_logs,
        metrics::metrics_post,
        metrics::metrics_get,
        metrics::output_post,
        records::record_post,
        records::record_get,
        compare::compare_get,
        lineage::job_lineage,
        lineage::dataset_lineage,
        scheduling::quota_get,
        scheduling::queue_get,
        scheduling::nodes_get,
        datasets::dataset_register,
        datasets::datasets_list,
        datasets::dataset_get,
        datasets::dataset_file_upload,
        datasets::dataset_file_get,
        datasets::dataset_file_head,
        datasets::node_cache_report,
        scheduling::quota_put,
        scheduling::tenant_patch,
        scheduling::job_schedule,
        scheduling::job_what_if,
        metrics::outputs_get,
        templates::templates_list,
        templates::template_show,
        templates::template_publish,
        templates::template_run,
        tokens::tokens_list,
        tokens::token_create,
        tokens::token_revoke,
        notifications::subscription_create,
        notifications::subscriptions_list,
        notifications::subscription_delete,
        notifications::subscription_deliveries,
        admin::tenants_list,
        admin::tenant_create,
        admin::tenant_remove,
        admin::member_add,
        checkpoints::checkpoints_list,
        checkpoints::checkpoint_download,
        admin::member_remove,
        admin::member_token_reissue,
        admin::node_drain,
        admin::node_undrain,
        storage::artifacts_list,
        storage::artifact_upload,
        storage::artifact_link,
        storage::artifact_download,
        storage::volumes_list,
        storage::volume_create,
        storage::volume_delete,
        storage::storage_get,
        storage::storage_policy_put,
        experiments::experiment_create,
        experiments::experiment_preview,
        experiments::experiments_list,
        experiments::experiment_get,
        experiments::experiment_pause,
        experiments::experiment_resume,
        experiments::experiment_cancel,
        experiments::experiment_ask,
        experiments::experiment_tell,
        interactive::session_create,
        interactive::session_get,
        interactive::session_link_create,
    ),
    modifiers(&BearerAuth, &EdgeResponses),
    tags(
        (name = "jobs", description = "Submit, list, watch and cancel jobs"),
        (name = "templates", description = "Task templates: list, show, publish, run"),
        (name = "metrics", description = "Metrics reported by jobs' engines"),
        (name = "datasets", description = "The dataset registry: named, immutable versions; datasets pushed to the object store and their files"),
        (name = "storage", description = "Artefacts with signed downloads, volumes, the storage policy"),
        (name = "scheduling", description = "Quotas, the queue, nodes, queue positions, start estimates, what-if"),
        (name = "experiments", description = "Hyperparameter searches whose trials are jobs: grid, random, successive halving"),
        (name = "tokens", description = "Your identity and API tokens"),
        (name = "notifications", description = "Webhooks when jobs end, fail, are preempted or wait too long"),
        (name = "admin", description = "Tenants, members and their tokens, node drains"),
        (name = "health", description = "Liveness and readiness"),
        (name = "sessions", description = "Interactive sessions (notebooks): opened as jobs, reached through the proxy at /sessions/{id}/"),
    )
)]
pub struct ApiDoc;

struct BearerAuth;

impl Modify for BearerAuth {
    fn modify(&self, openapi: &mut utoipa::openapi::OpenApi) {
        let components = openapi.components.get_or_insert_with(Default::default);
        components.add_security_scheme(
            "bearer",
            SecurityScheme::Http(HttpBuilder::new().scheme(HttpAuthScheme::Bearer).build()),
        );
    }
}

/// The answers the edge gives any operation of a kind, listed on every operation that does not
/// list them itself, so that generated clients and fuzzers know every status code the server
/// may send: 401, 429 and 503 for operations that need a token (no valid token; too many failed
/// authentications, with `Retry-After`; the database away), 403 for the writes (a role that does
/// not allow it), 400, 413 and 415 for operations with a body, 404 for paths with ids or names,
/// and 422 for every operation (a rule broken by a value in the path, the query or the body;
/// text Postgres cannot store is refused on every route).
struct EdgeResponses;

impl Modify for EdgeResponses {
    fn modify(&self, openapi: &mut utoipa::openapi::OpenApi) {
        use utoipa::openapi::{ContentBuilder, Ref, RefOr, ResponseBuilder};
        let error = |description: &str| {
            let content = ContentBuilder::new().schema(Some(Ref::from_schema_name("ErrorBody"))).build();
            RefOr::T(ResponseBuilder::new().description(description).content("application/json", content).build())
        };
        for (path, item) in openapi.paths.paths.iter_mut() {
            let operations = [
                (false, item.get.as_mut()),
                (true, item.post.as_mut()),
                (true, item.put.as_mut()),
                (true, item.patch.as_mut()),
                (true, item.delete.as_mut()),
            ];
            for (writes, operation) in operations {
                let Some(operation) = operation else { continue };
                let secured = operation.security.as_ref().is_some_and(|s| !s.is_empty());
                let mut codes: Vec<(&str, &str)> = Vec::new();
                if secured {
                    codes.push(("401", "No valid token"));
                    codes.push(("429", "Too many failed authentications; wait for Retry-After"));
                    codes.push(("503", "The database is not answering; try again shortly"));
                }
                if secured && writes {
                    codes.push(("403", "Your role does not allow this"));
                }
                if operation.request_body.is_some() {
                    codes.push(("400", "The body is not valid JSON"));
                    codes.push(("413", "The body is over the size limit"));
                    codes.push(("415", "The body is not sent as JSON"));
                    codes.push(("422", "A value breaks a rule; the error names the field"));
                }
                if path.contains('{') {
                    codes.push(("404", "No such object for this caller"));
                }
                // Every operation: a query parameter or path segment that breaks a rule (text
                // Postgres cannot store is refused on every route, whatever it takes).
                codes.push(("422", "A value breaks a rule; the error names the field"));
                for (code, description) in codes {
                    operation.responses.responses.entry(code.to_string()).or_insert_with(|| error(description));
                }
            }
        }
    }
}

/// The OpenAPI document as committed under `docs/openapi.json`.
pub fn openapi_document() -> String {
    let mut text = ApiDoc::openapi().to_pretty_json().expect("the OpenAPI document serialises");
    text.push('\n');
    text
}
