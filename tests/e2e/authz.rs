//! Authorization coverage: every route the server serves (`trainyard routes`, the table its
//! router is built from), every method it answers (the `Allow` header of a 405), for every kind
//! of caller, against the outcome written down here (HEAD: as GET's, unless written down). A route or method without an entry fails
//! the test, so a new route cannot ship without someone deciding who may call it (the pattern of
//! omicron's `unauthorized.rs`).
//!
//! The callers: anonymous; a viewer, a member of tenant A; the admin of another tenant (B); a
//! platform admin (also admin of A); and the job token of a running job of tenant B. Ids in paths
//! name tenant A's objects. Outcomes: `ok` (allowed past authorization: 2xx, 3xx other than
//! the sign-in page, or a 4xx about the input such as 409 or 422), `401`, `403`, `404`, `login`
//! (the dashboard sends the caller to sign in). Bodies are empty (`{}` or an empty form with the
//! session's CSRF value), so allowed writes mostly stop at validation; destructive calls
//! (revoke, delete, sign out) get a fresh target or session per caller.
//!
//! `TRAINYARD_AUTHZ_PRINT=1` prints the observed table in the form below.

use std::collections::BTreeMap;
use std::time::Duration;

use reqwest::Method;
use serde_json::json;
use trainyard_tests::web::{WebClient, csrf_of};
use trainyard_tests::{StatusCode, TestEnv, bin};

const CALLERS: [&str; 6] = ["anonymous", "viewer", "member", "other-tenant admin", "platform admin", "job token"];

/// `METHOD path` -> outcome per caller, in the order of [`CALLERS`].
const EXPECTED: &[(&str, &str)] = &[
    // Health and the document: public.
    ("GET /healthz", "ok ok ok ok ok ok"),
    ("GET /readyz", "ok ok ok ok ok ok"),
    ("GET /api/v1/openapi.json", "ok ok ok ok ok ok"),
    // Prometheus: the metrics token (not given here) or a platform admin.
    ("GET /metrics", "401 403 403 403 ok 401"),
    // REST API.
    ("GET /api/v1/me", "401 ok ok ok ok 401"),
    ("GET /api/v1/jobs", "401 ok ok ok ok 401"),
    ("POST /api/v1/jobs", "401 403 ok ok ok 401"),
    ("PUT /api/v1/code/{digest}", "401 403 ok ok ok 401"),
    ("GET /api/v1/jobs/{id}", "401 ok ok 404 ok 401"),
    ("POST /api/v1/jobs/{id}/cancel", "401 403 ok 404 ok 401"),
    ("POST /api/v1/jobs/{id}/rerun", "401 403 ok 404 ok 401"),
    ("GET /api/v1/jobs/{id}/events", "401 ok ok 404 ok 401"),
    ("GET /api/v1/jobs/{id}/attempts", "401 ok ok 404 ok 401"),
    ("GET /api/v1/jobs/{id}/logs", "401 ok ok 404 ok 401"),
    ("GET /api/v1/jobs/{id}/metrics", "401 ok ok 404 ok 401"),
    ("POST /api/v1/jobs/{id}/metrics", "401 401 401 401 401 ok"),
    ("GET /api/v1/jobs/{id}/outputs", "401 ok ok 404 ok 401"),
    ("POST /api/v1/jobs/{id}/outputs", "401 401 401 401 401 ok"),
    ("GET /api/v1/jobs/{id}/schedule", "401 ok ok 404 ok 401"),
    ("POST /api/v1/jobs/what-if", "401 403 ok ok ok 401"),
    ("GET /api/v1/quota", "401 ok ok ok ok 401"),
    // Operations: the audit log for admins (a tenant admin sees their tenant's), usage for all.
    ("GET /api/v1/audit", "401 403 403 ok ok 401"),
    ("GET /api/v1/usage", "401 ok ok ok ok 401"),
    ("GET /api/v1/queue", "401 ok ok ok ok 401"),
    ("GET /api/v1/nodes", "401 ok ok ok ok 401"),
    ("GET /api/v1/datasets", "401 ok ok ok ok 401"),
    ("POST /api/v1/datasets", "401 403 ok ok ok 401"),
    ("GET /api/v1/datasets/{name}/{version}", "401 ok ok 404 ok 401"),
    // A pushed dataset's files: the tenant's members, and the engine of a job that records
    // reading the version (tenant B's job does not: 404, as for tenant B's admin).
    ("GET /api/v1/datasets/{name}/{version}/files/{file}", "401 ok ok 404 ok 404"),
    // Uploading a push's files: members, into their own tenant's store (the body `{}` is no
    // manifest: refused as input, past authorization).
    ("PUT /api/v1/dataset-content/{hash}/{file}", "401 403 ok ok ok 401"),
    ("PATCH /api/v1/admin/tenants/{tenant}", "401 403 403 403 ok 401"),
    ("DELETE /api/v1/admin/tenants/{tenant}", "401 403 403 403 ok 401"),
    ("PUT /api/v1/admin/tenants/{tenant}/quotas/{flavor}", "401 403 403 403 ok 401"),
    ("GET /api/v1/templates", "401 ok ok ok ok 401"),
    ("POST /api/v1/templates", "401 403 ok ok ok 401"),
    ("GET /api/v1/templates/{name}", "401 ok ok ok ok 401"),
    ("POST /api/v1/templates/{name}/jobs", "401 403 ok ok ok 401"),
    ("GET /api/v1/tokens", "401 ok ok ok ok 401"),
    ("POST /api/v1/tokens", "401 ok ok ok ok 401"),
    ("DELETE /api/v1/tokens/{id}", "401 404 404 404 ok 401"),
    ("GET /api/v1/admin/tenants", "401 403 403 403 ok 401"),
    ("POST /api/v1/admin/tenants", "401 403 403 403 ok 401"),
    ("POST /api/v1/admin/tenants/{tenant}/members", "401 403 403 403 ok 401"),
    ("GET /api/v1/jobs/{id}/checkpoints", "401 ok ok 404 ok 401"),
    // The job here wrote no checkpoint: 404 for all who may read it (tests/e2e/checkpoints.rs
    // downloads one, and shows another tenant's is a 404).
    ("GET /api/v1/jobs/{id}/checkpoints/{step}", "401 404 404 404 404 401"),
    // Removing a member (a fresh one of tenant A per caller) and reissuing a member's token: the
    // tenant's admins and platform admins (tenant B's admin is not one of A's).
    ("DELETE /api/v1/admin/tenants/{tenant}/members/{user}", "401 403 403 403 ok 401"),
    ("POST /api/v1/admin/tenants/{tenant}/members/{user}/tokens", "401 403 403 403 ok 401"),
    // Draining a node is the platform's (a reason too long: refused as input, nothing drained;
    // undraining a node not drained: 409).
    ("PUT /api/v1/admin/nodes/{node}/drain", "401 403 403 403 ok 401"),
    ("DELETE /api/v1/admin/nodes/{node}/drain", "401 403 403 403 ok 401"),
    ("GET /api/v1/jobs/{id}/artifacts", "401 ok ok 404 ok 401"),
    ("GET /api/v1/jobs/{id}/artifacts/{*path}", "401 ok ok 404 ok 401"),
    ("PUT /api/v1/jobs/{id}/artifacts/{*path}", "401 403 ok 404 ok 404"),
    // A signed download link is its own credential (checked by signature, not token).
    ("GET /api/v1/artifacts/download", "ok ok ok ok ok ok"),
    // Experiments: read by viewers, started and steered by members, invisible to other tenants.
    ("GET /api/v1/experiments", "401 ok ok ok ok 401"),
    ("POST /api/v1/experiments", "401 403 ok ok ok 401"),
    ("POST /api/v1/experiments/preview", "401 403 ok ok ok 401"),
    ("GET /api/v1/experiments/{id}", "401 ok ok 404 ok 401"),
    ("POST /api/v1/experiments/{id}/pause", "401 403 ok 404 ok 401"),
    ("POST /api/v1/experiments/{id}/resume", "401 403 ok 404 ok 401"),
    ("POST /api/v1/experiments/{id}/cancel", "401 403 ok 404 ok 401"),
    ("POST /api/v1/experiments/{id}/ask", "401 403 ok 404 ok 401"),
    ("POST /api/v1/experiments/{id}/tell", "401 403 ok 404 ok 401"),
    ("GET /api/v1/volumes", "401 ok ok ok ok 401"),
    ("POST /api/v1/volumes", "401 403 ok ok ok 401"),
    ("DELETE /api/v1/volumes/{name}", "401 403 ok 404 ok 401"),
    ("GET /api/v1/storage", "401 ok ok ok ok 401"),
    ("PUT /api/v1/admin/tenants/{tenant}/storage", "401 403 403 403 ok 401"),
    // Run records: read by the job's tenant; completed by the job's engine with its token only.
    ("GET /api/v1/jobs/{id}/record", "401 ok ok 404 ok 401"),
    ("POST /api/v1/jobs/{id}/record", "401 401 401 401 401 ok"),
    // A job's engine reports what its node's shard cache holds: its own job token only.
    ("POST /api/v1/jobs/{id}/cached-datasets", "401 401 401 401 401 ok"),
    // Comparing runs: tenant A's job with itself, read like a job (the query is filled in).
    ("GET /api/v1/compare", "401 ok ok 404 ok 401"),
    // Lineage: the tenant's own, walked from a job or a dataset version.
    ("GET /api/v1/jobs/{id}/lineage", "401 ok ok 404 ok 401"),
    ("GET /api/v1/datasets/{name}/{version}/lineage", "401 ok ok 404 ok 401"),
    // MLflow's tracking API: the tenant's experiments and runs, read by viewers and written by
    // members. Tenant A's experiment and run are named in the query or body, so tenant B's admin
    // gets MLflow's 404. A job token (tenant B's job) reaches only its own job's run: the calls
    // only users make are 403, another run (tenant A's here) is none to it (404).
    ("GET /api/2.0/mlflow/experiments/get-by-name", "401 ok ok 404 ok 403"),
    ("POST /api/2.0/mlflow/experiments/create", "401 403 ok ok ok 403"),
    ("GET /api/2.0/mlflow/experiments/get", "401 ok ok 404 ok 403"),
    ("GET /api/2.0/mlflow/experiments/search", "401 ok ok ok ok 403"),
    ("POST /api/2.0/mlflow/experiments/search", "401 ok ok ok ok 403"),
    // Deleting tenant A's experiment then restoring it, renaming it to its own name, setting and
    // deleting a tag of it (set again before each delete).
    ("POST /api/2.0/mlflow/experiments/delete", "401 403 ok 404 ok 403"),
    ("POST /api/2.0/mlflow/experiments/restore", "401 403 ok 404 ok 403"),
    ("POST /api/2.0/mlflow/experiments/update", "401 403 ok 404 ok 403"),
    ("POST /api/2.0/mlflow/experiments/set-experiment-tag", "401 403 ok 404 ok 403"),
    ("POST /api/2.0/mlflow/experiments/delete-experiment-tag", "401 403 ok 404 ok 403"),
    ("POST /api/2.0/mlflow/runs/create", "401 403 ok 404 ok 403"),
    ("GET /api/2.0/mlflow/runs/get", "401 ok ok 404 ok 404"),
    ("POST /api/2.0/mlflow/runs/update", "401 403 ok 404 ok 404"),
    ("POST /api/2.0/mlflow/runs/search", "401 ok ok ok ok 403"),
    ("POST /api/2.0/mlflow/runs/log-metric", "401 403 ok 404 ok 404"),
    ("POST /api/2.0/mlflow/runs/log-parameter", "401 403 ok 404 ok 404"),
    ("POST /api/2.0/mlflow/runs/log-batch", "401 403 ok 404 ok 404"),
    ("POST /api/2.0/mlflow/runs/set-tag", "401 403 ok 404 ok 404"),
    ("GET /api/2.0/mlflow/metrics/get-history", "401 ok ok 404 ok 404"),
    ("POST /api/2.0/mlflow/runs/delete", "401 403 ok 404 ok 404"),
    ("POST /api/2.0/mlflow/runs/restore", "401 403 ok 404 ok 404"),
    ("POST /api/2.0/mlflow/runs/delete-tag", "401 403 ok 404 ok 404"),
    ("POST /api/2.0/mlflow/logged-models/search", "401 ok ok ok ok 403"),
    // MLflow's artefacts: a job's run's are the job's artefacts.
    ("GET /api/2.0/mlflow/artifacts/list", "401 ok ok 404 ok 404"),
    ("GET /api/2.0/mlflow-artifacts/artifacts", "401 ok ok 404 ok 404"),
    ("GET /api/2.0/mlflow-artifacts/artifacts/{*path}", "401 ok ok 404 ok 404"),
    ("PUT /api/2.0/mlflow-artifacts/artifacts/{*path}", "401 403 ok 404 ok 404"),
    // Interactive sessions: opened by members, read by the tenant, opened in a browser by the
    // session's user (here the platform admin) and the tenant's admins only.
    // Notifications: members subscribe; a subscription is its maker's (and its tenant admins').
    ("GET /api/v1/notifications/subscriptions", "401 403 ok ok ok 401"),
    ("POST /api/v1/notifications/subscriptions", "401 403 ok ok ok 401"),
    ("DELETE /api/v1/notifications/subscriptions/{id}", "401 403 404 404 ok 401"),
    ("GET /api/v1/notifications/subscriptions/{id}/deliveries", "401 403 404 404 ok 401"),
    ("POST /api/v1/sessions", "401 403 ok ok ok 401"),
    ("GET /api/v1/sessions/{id}", "401 ok ok 404 ok 401"),
    ("POST /api/v1/sessions/{id}/link", "401 403 403 404 ok 401"),
    // The sessions' proxy, on the session's own host: no API token, job token or dashboard
    // session reaches it (each caller sends its token and its signed-in cookie), only the
    // session's own cookie (tests/e2e/sessions.rs).
    ("GET /sessions/{id}/_trainyard/enter", "401 401 401 401 401 401"),
    ("GET /sessions/{id}/", "401 401 401 401 401 401"),
    ("POST /sessions/{id}/", "401 401 401 401 401 401"),
    ("PUT /sessions/{id}/", "401 401 401 401 401 401"),
    ("PATCH /sessions/{id}/", "401 401 401 401 401 401"),
    ("DELETE /sessions/{id}/", "401 401 401 401 401 401"),
    ("GET /sessions/{id}/{*path}", "401 401 401 401 401 401"),
    ("POST /sessions/{id}/{*path}", "401 401 401 401 401 401"),
    ("PUT /sessions/{id}/{*path}", "401 401 401 401 401 401"),
    ("PATCH /sessions/{id}/{*path}", "401 401 401 401 401 401"),
    ("DELETE /sessions/{id}/{*path}", "401 401 401 401 401 401"),
    // Dashboard.
    ("GET /", "ok ok ok ok ok ok"),
    ("GET /login", "ok ok ok ok ok ok"),
    // Without the sign-in form's double-submit cookie, a sign-in is refused for everyone.
    ("POST /login", "403 403 403 403 403 403"),
    // Signing out (or trying to without a session) sends everyone to the sign-in page.
    ("POST /logout", "login login login login login login"),
    // Single sign-on is off in this test's server: its routes are not there (tests/e2e/sso.rs
    // covers them with a provider).
    ("GET /sso/login", "404 404 404 404 404 404"),
    ("GET /sso/callback", "404 404 404 404 404 404"),
    ("GET /jobs", "login ok ok ok ok login"),
    ("GET /jobs/rows", "login ok ok ok ok login"),
    ("GET /jobs/{id}", "login ok ok 404 ok login"),
    ("GET /jobs/{id}/live", "login ok ok 404 ok login"),
    ("GET /jobs/{id}/metrics.json", "login ok ok 404 ok login"),
    ("GET /jobs/{id}/record.json", "login ok ok 404 ok login"),
    ("GET /jobs/{id}/log.txt", "login ok ok 404 ok login"),
    ("GET /jobs/{id}/log/stream", "login ok ok 404 ok login"),
    ("POST /jobs/{id}/cancel", "login 403 ok 404 ok login"),
    ("POST /jobs/{id}/rerun", "login 403 ok 404 ok login"),
    // "Open notebook" (on tenant A's session, the platform admin's): its user and the tenant's admins.
    ("POST /jobs/{id}/notebook", "login 403 403 404 ok login"),
    ("GET /jobs/{id}/artifacts/{*path}", "login ok ok 404 ok login"),
    // No checkpoint in this job (see the API's entry).
    ("GET /jobs/{id}/checkpoints/{step}", "login 404 404 404 404 login"),
    ("GET /compare", "login ok ok 404 ok login"),
    ("GET /jobs/{id}/lineage", "login ok ok 404 ok login"),
    ("GET /datasets/{name}/{version}/lineage", "login ok ok 404 ok login"),
    ("GET /datasets", "login ok ok ok ok login"),
    ("GET /volumes", "login ok ok ok ok login"),
    ("POST /volumes", "login 403 ok ok ok login"),
    ("GET /experiments", "login ok ok ok ok login"),
    ("POST /experiments", "login 403 ok ok ok login"),
    ("GET /experiments/{id}", "login ok ok 404 ok login"),
    ("POST /experiments/{id}/pause", "login 403 ok 404 ok login"),
    ("POST /experiments/{id}/resume", "login 403 ok 404 ok login"),
    ("POST /experiments/{id}/cancel", "login 403 ok 404 ok login"),
    ("POST /volumes/{name}/delete", "login 403 ok 404 ok login"),
    ("GET /submit", "login 403 ok ok ok login"),
    ("GET /submit/{template}", "login 403 ok ok ok login"),
    ("POST /submit/{template}", "login 403 ok ok ok login"),
    ("POST /submit/{template}/preview", "login 403 ok ok ok login"),
    ("GET /templates", "login ok ok ok ok login"),
    ("GET /templates/{name}", "login ok ok ok ok login"),
    ("GET /quota", "login ok ok ok ok login"),
    ("GET /queue", "login ok ok ok ok login"),
    // Usage for everyone signed in (their tenant's, every tenant's for platform admins); the
    // audit log for admins (a tenant admin reads their own tenant's).
    ("GET /usage", "login ok ok ok ok login"),
    ("GET /audit", "login 403 403 ok ok login"),
    ("GET /tokens", "login ok ok ok ok login"),
    ("POST /tokens", "login ok ok ok ok login"),
    ("POST /tokens/{id}/revoke", "login 404 404 404 ok login"),
    ("GET /admin", "login 403 403 403 ok login"),
    ("POST /admin/quota", "login 403 403 403 ok login"),
    ("POST /admin/members", "login 403 403 403 ok login"),
    ("POST /admin/tenants", "login 403 403 403 ok login"),
    ("POST /admin/tenants/remove", "login 403 403 403 ok login"),
    ("GET /static/{*path}", "ok ok ok ok ok ok"),
];

struct World {
    env: TestEnv,
    /// Makes names unique across calls (volumes, tokens, tenants, dataset versions).
    counter: std::sync::atomic::AtomicUsize,
    /// API tokens by caller index (none for anonymous; the job token for the last).
    tokens: Vec<Option<String>>,
    job: String,
    /// The content hash (hex) of tenant A's pushed dataset `pushed@1`.
    pushed: String,
    /// Tenant A's MLflow experiment `authz` (its id) and a run in it.
    mlflow_experiment: String,
    mlflow_run: String,
    experiment: String,
    /// Tenant A's notebook session (the platform admin's; queued: it asks for 64 GPUs).
    session: String,
}

fn classify(status: StatusCode, location: Option<&str>) -> String {
    match status.as_u16() {
        401 => "401".into(),
        403 => "403".into(),
        404 => "404".into(),
        300..=399 if location.is_some_and(|l| l.starts_with("/login")) => "login".into(),
        429 | 500..=599 | 405 => format!("unexpected {status}"),
        _ => "ok".into(),
    }
}

impl World {
    async fn new() -> World {
        let env = TestEnv::start().await;
        let admin = env.admin_token.clone();
        let viewer = env.member("default", "vera", "viewer").await;
        let member = env.member("default", "mia", "member").await;
        let (status, _) = env.post("/api/v1/admin/tenants", &admin, &json!({"name": "team-b"})).await;
        assert_eq!(status, StatusCode::CREATED);
        let other = env.member("team-b", "bob", "admin").await;
        // A running job of tenant B that hands its job token to the test.
        let token_file = env.dir.path().join("job-token");
        let script = format!("echo \"$TRAINYARD_TOKEN\" > '{}'; sleep 300", token_file.display());
        let (status, body) = env.post("/api/v1/jobs", &other, &json!({"command": ["sh", "-c", script]})).await;
        assert_eq!(status, StatusCode::CREATED, "{body}");
        let deadline = std::time::Instant::now() + Duration::from_secs(30);
        let job_token = loop {
            if let Ok(text) = std::fs::read_to_string(&token_file)
                && text.trim().starts_with("tyj_")
            {
                break text.trim().to_string();
            }
            assert!(std::time::Instant::now() < deadline, "the job never wrote its token");
            tokio::time::sleep(Duration::from_millis(100)).await;
        };
        // Tenant A's objects the paths name.
        let job = env.submit(json!({"command": ["true"]})).await;
        env.wait_state(&job, "succeeded", Duration::from_secs(30)).await;
        env.artifact_put(&job, "model.bin", &admin, "weights").await;
        let (status, body) =
            env.post("/api/v1/datasets", &admin, &json!({"name": "ds", "version": "1", "uri": "/data/ds", "content_hash": format!("sha256:{}", "ab".repeat(32))})).await;
        assert_eq!(status, StatusCode::CREATED, "{body}");
        let pushed = crate::store_datasets::push_tiny(&env, &admin, "pushed", "1").await;
        let (status, body) = env.post("/api/2.0/mlflow/experiments/create", &admin, &json!({"name": "authz"})).await;
        assert_eq!(status, StatusCode::OK, "{body}");
        let mlflow_experiment = body["experiment_id"].as_str().unwrap().to_string();
        let (status, body) = env
            .post("/api/2.0/mlflow/runs/create", &admin, &json!({"experiment_id": mlflow_experiment, "start_time": 1}))
            .await;
        assert_eq!(status, StatusCode::OK, "{body}");
        let mlflow_run = body["run"]["info"]["run_id"].as_str().unwrap().to_string();
        // An experiment of tenant A (its one trial fails at once: no such data; it stays to be read).
        let (status, body) =
            env.post("/api/v1/experiments", &admin, &crate::experiments::failing_search("authz")).await;
        assert_eq!(status, StatusCode::CREATED, "{body}");
        let experiment = body["id"].as_str().unwrap().to_string();
        let (status, body) = env.post("/api/v1/sessions", &admin, &json!({"gpus": 64})).await;
        assert_eq!(status, StatusCode::CREATED, "{body}");
        let session = body["id"].as_str().unwrap().to_string();
        let tokens = vec![None, Some(viewer), Some(member), Some(other), Some(admin), Some(job_token)];
        World {
            env,
            counter: Default::default(),
            tokens,
            job,
            pushed,
            mlflow_experiment,
            mlflow_run,
            experiment,
            session,
        }
    }

    /// The concrete path for a caller: tenant A's objects, and a fresh target for destructive
    /// calls (made by the platform admin, so that no caller's call changes another's answer).
    async fn path_for(&self, route: &str, caller: usize) -> String {
        let admin = self.tokens[4].clone().unwrap();
        let id =
            if route.contains("sessions/{id}") || route == "/jobs/{id}/notebook" { &self.session } else { &self.job };
        let mut path = route
            .replace("{id}", id)
            .replace("{tenant}", "default")
            .replace("{flavor}", "simulated-gpu")
            .replace("{template}", "shell")
            .replace("{step}", "20");
        if route.ends_with("/files/{file}") {
            path = path.replace("{name}", "pushed").replace("{version}", "1").replace("{file}", "dataset.json");
        }
        if route.starts_with("/api/v1/datasets/") || route.starts_with("/datasets/") {
            path = path.replace("{name}", "ds").replace("{version}", "1");
        }
        path = path.replace("{hash}", &self.pushed).replace("{file}", "dataset.json");
        if route.contains("/templates/") {
            path = path.replace("{name}", "shell");
        }
        if route.starts_with("/static/") {
            path = path.replace("{*path}", "app.css");
        }
        path = path.replace("{*path}", "model.bin");
        if route == "/api/v1/compare" || route == "/compare" {
            // Tenant A's job compared with itself: the other tenant must not see it.
            path = format!("{path}?jobs={0},{0}", self.job);
        }
        // MLflow's GET calls name tenant A's objects in the query.
        match route {
            "/api/2.0/mlflow/experiments/get-by-name" => path.push_str("?experiment_name=authz"),
            "/api/2.0/mlflow/experiments/get" => path = format!("{path}?experiment_id={}", self.mlflow_experiment),
            "/api/2.0/mlflow/runs/get" => path = format!("{path}?run_id={}", self.mlflow_run),
            "/api/2.0/mlflow/metrics/get-history" => {
                path = format!("{path}?run_id={}&metric_key=loss", self.mlflow_run)
            }
            // Tenant A's job's run (its id the job's) and the job's artefact `model.bin`.
            "/api/2.0/mlflow/artifacts/list" => path = format!("{path}?run_id={}", self.job_run()),
            "/api/2.0/mlflow-artifacts/artifacts" => path = format!("{path}?path={}", self.job_run()),
            "/api/2.0/mlflow-artifacts/artifacts/{*path}" => {
                path = format!("/api/2.0/mlflow-artifacts/artifacts/{}/model.bin", self.job_run())
            }
            _ => {}
        }
        if route.starts_with("/api/v1/experiments/{id}") || route.starts_with("/experiments/{id}") {
            path = route.replace("{id}", &self.experiment);
        }
        if route == "/api/v1/admin/tenants/{tenant}" {
            // Its own tenant each time: removing one is destructive.
            let name = format!("t{caller}-{}", self.next());
            let (status, body) = self.env.post("/api/v1/admin/tenants", &admin, &json!({"name": name})).await;
            assert_eq!(status, StatusCode::CREATED, "{body}");
            path = route.replace("{tenant}", &name);
        }
        path = path.replace("{node}", "local");
        if route == "/api/v1/admin/tenants/{tenant}/members/{user}" {
            // A fresh member for each caller: removing one is destructive.
            let user = format!("rm{caller}-{}", self.next());
            let invite = json!({"user": user, "role": "viewer"});
            let (status, body) = self.env.post("/api/v1/admin/tenants/default/members", &admin, &invite).await;
            assert_eq!(status, StatusCode::CREATED, "{body}");
            path = path.replace("{user}", &user);
        }
        path = path.replace("{user}", "vera");
        if route.contains("/volumes/{name}") {
            let name = format!("v{caller}-{}", self.next());
            let (status, body) = self.env.post("/api/v1/volumes", &admin, &json!({"name": name, "size": "1Mi"})).await;
            assert_eq!(status, StatusCode::CREATED, "{body}");
            path = path.replace("{name}", &name);
        }
        if route.contains("/tokens/{id}") || route == "/api/v1/tokens/{id}" {
            let (status, body) = self.env.post("/api/v1/tokens", &admin, &json!({"name": "spare"})).await;
            assert_eq!(status, StatusCode::CREATED, "{body}");
            // `{id}` was already replaced by the job's id above: swap it for the token's.
            path = route.replace("{id}", body["id"].as_str().unwrap());
        }
        if route == "/api/2.0/mlflow/experiments/delete-experiment-tag" {
            let tag = json!({"experiment_id": self.mlflow_experiment, "key": "doomed", "value": "v"});
            let (status, body) = self.env.post("/api/2.0/mlflow/experiments/set-experiment-tag", &admin, &tag).await;
            assert_eq!(status, StatusCode::OK, "{body}");
        }
        if route.starts_with("/api/v1/notifications/subscriptions/{id}") {
            // Made by tenant A's admin for each caller: removing one is destructive.
            let hook = json!({"url": "https://hooks.example.com/authz", "events": ["failed"]});
            let (status, body) = self.env.post("/api/v1/notifications/subscriptions", &admin, &hook).await;
            assert_eq!(status, StatusCode::CREATED, "{body}");
            path = route.replace("{id}", body["id"].as_str().unwrap());
        }
        if route == "/api/2.0/mlflow/runs/delete-tag" {
            // The tag each caller tries to delete, set again before each (deleting is destructive).
            let tag = json!({"run_id": self.mlflow_run, "key": "doomed", "value": "v"});
            let (status, body) = self.env.post("/api/2.0/mlflow/runs/set-tag", &admin, &tag).await;
            assert_eq!(status, StatusCode::OK, "{body}");
        }
        path
    }

    /// The MLflow run of tenant A's job: the job's id, as MLflow spells run ids.
    fn job_run(&self) -> String {
        uuid::Uuid::parse_str(&self.job).unwrap().simple().to_string()
    }

    fn next(&self) -> usize {
        self.counter.fetch_add(1, std::sync::atomic::Ordering::SeqCst)
    }

    /// A body that passes validation, so that the answer shows the authorization decision
    /// (an empty one would be refused as input first). Unique names, so that no caller's call
    /// conflicts with another's.
    fn body_for(&self, method: &Method, route: &str) -> serde_json::Value {
        let n = self.next();
        let job = json!({"command": ["true"], "resources": {"gpus": 64}});
        match (method.as_str(), route) {
            ("POST", "/api/v1/jobs" | "/api/v1/jobs/what-if") => job,
            // Queued (64 GPUs), so that no notebook starts.
            ("POST", "/api/v1/sessions") => json!({"gpus": 64}),
            ("POST", "/api/v1/datasets") => json!({"name": "ds", "version": format!("v{n}"), "uri": "/data/ds",
                "content_hash": format!("sha256:{}", "cd".repeat(32))}),
            ("PATCH", "/api/v1/admin/tenants/{tenant}") => json!({"weight": 1.0}),
            ("PUT", "/api/v1/admin/tenants/{tenant}/quotas/{flavor}") => json!({"nominal": 4}),
            ("POST", "/api/v1/templates/{name}/jobs") => json!({"params": {"command": ["true"]}}),
            ("POST", "/api/v1/tokens") => json!({"name": format!("t{n}")}),
            ("POST", "/api/v1/templates") => json!({"manifest": "name: not-a-template", "files": {}}),
            ("POST", "/api/v1/admin/tenants") => json!({"name": format!("tenant-{n}")}),
            ("POST", "/api/v1/admin/tenants/{tenant}/members") => {
                json!({"user": format!("user-{n}"), "role": "viewer"})
            }
            ("POST", "/api/v1/volumes") => json!({"name": format!("nv{n}"), "size": "1Mi"}),
            ("POST", "/api/v1/experiments/{id}/tell") => json!({"finished": false}),
            // A search that parses but breaks a rule (its name): refused after authorization.
            ("POST", "/api/v1/experiments" | "/api/v1/experiments/preview") => {
                let mut search = crate::experiments::failing_search("x");
                search["name"] = json!("not a name!");
                search
            }
            ("PUT", "/api/v1/admin/tenants/{tenant}/storage") => json!({"log_retention_days": 30}),
            ("PUT", "/api/v1/admin/nodes/{node}/drain") => json!({"reason": "x".repeat(501)}),
            ("POST", "/api/v1/admin/tenants/{tenant}/members/{user}/tokens") => json!({"name": format!("r{n}")}),
            // MLflow's writes name tenant A's experiment or run (a param's value is the same each
            // time: params are written once).
            ("POST", "/api/2.0/mlflow/experiments/create") => json!({"name": format!("authz-{n}")}),
            ("POST", "/api/2.0/mlflow/runs/create") => json!({"experiment_id": self.mlflow_experiment}),
            ("POST", "/api/2.0/mlflow/runs/search") => json!({"experiment_ids": [self.mlflow_experiment]}),
            ("POST", "/api/2.0/mlflow/runs/update") => json!({"run_id": self.mlflow_run, "status": "RUNNING"}),
            ("POST", "/api/2.0/mlflow/runs/log-metric") => {
                json!({"run_id": self.mlflow_run, "key": "loss", "value": 0.5, "timestamp": 1, "step": n})
            }
            ("POST", "/api/2.0/mlflow/runs/log-parameter") => {
                json!({"run_id": self.mlflow_run, "key": "lr", "value": "0.1"})
            }
            ("POST", "/api/2.0/mlflow/runs/log-batch") => {
                json!({"run_id": self.mlflow_run, "tags": [{"key": "k", "value": "v"}]})
            }
            ("POST", "/api/2.0/mlflow/runs/set-tag") => {
                json!({"run_id": self.mlflow_run, "key": "k", "value": format!("v{n}")})
            }
            // Deleting tenant A's run (then restoring it) leaves the other calls' outcomes as
            // they are: logging to a deleted run is refused as input, past authorization.
            ("POST", "/api/2.0/mlflow/runs/delete" | "/api/2.0/mlflow/runs/restore") => {
                json!({"run_id": self.mlflow_run})
            }
            ("POST", "/api/2.0/mlflow/runs/delete-tag") => json!({"run_id": self.mlflow_run, "key": "doomed"}),
            ("POST", "/api/2.0/mlflow/experiments/delete" | "/api/2.0/mlflow/experiments/restore") => {
                json!({"experiment_id": self.mlflow_experiment})
            }
            ("POST", "/api/2.0/mlflow/experiments/update") => {
                json!({"experiment_id": self.mlflow_experiment, "new_name": "authz"})
            }
            ("POST", "/api/2.0/mlflow/experiments/set-experiment-tag") => {
                json!({"experiment_id": self.mlflow_experiment, "key": "k", "value": format!("v{n}")})
            }
            ("POST", "/api/2.0/mlflow/experiments/delete-experiment-tag") => {
                json!({"experiment_id": self.mlflow_experiment, "key": "doomed"})
            }
            _ => json!({}),
        }
    }

    /// A dashboard client signed in as the caller, or none (anonymous and the job token).
    async fn web_client(&self, caller: usize) -> Option<WebClient> {
        match (caller, &self.tokens[caller]) {
            (1..=4, Some(token)) => Some(WebClient::signed_in(&self.env.server.url, token).await),
            _ => None,
        }
    }

    async fn call(&self, method: &Method, route: &str, caller: usize) -> String {
        let path = self.path_for(route, caller).await;
        let url = format!("{}{path}", self.env.server.url);
        let client = reqwest::Client::builder().redirect(reqwest::redirect::Policy::none()).build().unwrap();
        let response = if route.starts_with("/api/") || ["/healthz", "/readyz", "/metrics"].contains(&route) {
            let mut request = client.request(method.clone(), &url);
            if let Some(token) = &self.tokens[caller] {
                request = request.bearer_auth(token);
            }
            if matches!(*method, Method::POST | Method::PUT | Method::PATCH) {
                request = if route.contains("/artifacts/") {
                    request.header("content-type", "application/octet-stream").body("x")
                } else {
                    request.json(&self.body_for(method, route))
                };
            }
            request.send().await.unwrap()
        } else if route.starts_with("/sessions/") {
            // On the session's own host, with every credential the caller has: its token and
            // its dashboard session's cookie.
            let web = self.web_client(caller).await;
            let http = web.as_ref().map(WebClient::http).unwrap_or(&client);
            let port = self.env.server.url.rsplit(':').next().unwrap().trim_end_matches('/');
            let host = format!("s-{}.localhost:{port}", self.session.replace('-', ""));
            let mut request = http.request(method.clone(), &url).header("host", host);
            if let Some(token) = &self.tokens[caller] {
                request = request.bearer_auth(token);
            }
            request.send().await.unwrap()
        } else {
            let web = self.web_client(caller).await;
            let http = web.as_ref().map(WebClient::http).unwrap_or(&client);
            let mut request = http.request(method.clone(), &url);
            if *method == Method::POST {
                let mut form = vec![];
                if route == "/volumes" {
                    // A valid form, so that the answer shows the authorization decision.
                    let name = format!("wv{}", self.next());
                    form.extend([("name".to_string(), name), ("size".into(), "1Mi".into())]);
                    form.push(("access_mode".into(), "ReadWriteOnce".into()));
                }
                if let Some(web) = &web {
                    let (_, page) = web.get("/tokens").await;
                    form.push(("csrf".to_string(), csrf_of(&page)));
                }
                request = request.form(&form);
            }
            request.send().await.unwrap()
        };
        let location = response.headers().get("location").and_then(|l| l.to_str().ok()).map(str::to_string);
        classify(response.status(), location.as_deref())
    }
}

/// The methods a path answers, from the `Allow` header of a method it does not.
async fn methods_of(env: &TestEnv, path: &str) -> Vec<Method> {
    let response = reqwest::Client::new()
        .request(Method::from_bytes(b"PROPFIND").unwrap(), format!("{}{path}", env.server.url))
        .send()
        .await
        .unwrap();
    assert_eq!(response.status(), StatusCode::METHOD_NOT_ALLOWED, "{path}");
    let allow = response.headers().get("allow").map(|v| v.to_str().unwrap().to_string()).unwrap_or_default();
    allow
        .split(',')
        .map(str::trim)
        .filter(|m| !m.is_empty())
        .map(|m| Method::from_bytes(m.as_bytes()).unwrap())
        .collect()
}

#[tokio::test(flavor = "multi_thread")]
async fn every_route_and_method_answers_every_caller_as_written_down() {
    let world = World::new().await;
    let routes = std::process::Command::new(bin("trainyard")).arg("routes").output().unwrap();
    let routes: Vec<String> = String::from_utf8(routes.stdout).unwrap().lines().map(str::to_string).collect();
    assert!(routes.len() > 50, "the route table: {routes:?}");
    let expected: BTreeMap<&str, &str> = EXPECTED.iter().copied().collect();
    let print = std::env::var("TRAINYARD_AUTHZ_PRINT").is_ok();
    let mut failures = Vec::new();
    let mut covered = 0;
    for route in &routes {
        let probe = world.path_for(route, 0).await;
        for method in methods_of(&world.env, &probe).await {
            let key = format!("{method} {route}");
            let mut observed = Vec::new();
            for caller in 0..CALLERS.len() {
                observed.push(world.call(&method, route, caller).await);
            }
            let observed = observed.join(" ");
            if print {
                println!("    (\"{key}\", \"{observed}\"),");
            }
            // HEAD answers as GET does (axum's for every GET route, and the dataset files' own)
            // unless written down otherwise.
            let explicit = expected.get(key.as_str()).copied();
            let want = explicit.or_else(|| {
                (method == Method::HEAD).then(|| expected.get(format!("GET {route}").as_str()).copied()).flatten()
            });
            match want {
                None => failures.push(format!("{key}: no entry in EXPECTED (observed: {observed})")),
                Some(want) if want != observed => {
                    failures.push(format!("{key}: expected {want:?}, observed {observed:?} ({CALLERS:?})"))
                }
                Some(_) => covered += usize::from(explicit.is_some()),
            }
        }
    }
    assert!(
        failures.is_empty(),
        "{} of {} route methods differ:\n{}",
        failures.len(),
        covered + failures.len(),
        failures.join("\n")
    );
    assert_eq!(covered, EXPECTED.len(), "every entry names a route the server serves");
}
