//! What the checks at the edge cost a submit, side by side in one run: the same submit-sized
//! request through a bare router, and through the server's edge checks (NUL refusal with the
//! body buffered and scanned, the body limit, the security headers) plus the failed-
//! authentication throttle's check that every authenticated request makes. The handler parses
//! the JSON body, as the real submit does; the database work of a real submit is not here (see
//! `tests/bench/submit_passes.sh` for the whole submit, and docs/PERFORMANCE.md).
//!
//! Run: `cargo bench -p trainyard-server --bench edge`

use std::hint::black_box;
use std::sync::Arc;

use axum::Router;
use axum::body::Body;
use axum::http::{Request, StatusCode};
use axum::routing::post;
use criterion::{Criterion, criterion_group, criterion_main};
use tower::ServiceExt;
use trainyard_server::app::throttle::AuthThrottle;

const SUBMIT: &str = r#"{"name":"resnet-sweep-17","command":["python","-m","train","--lr","0.1","--epochs","90"],
"replicas":2,"resources":{"gpus":8,"cpus":32,"memory":"256Gi"},"env":{"WANDB_MODE":"offline","NCCL_DEBUG":"WARN"},
"priority":0,"max_restarts":3,"labels":{"team":"vision","sweep":"17"}}"#;

const TOKEN: &str = "tyd_0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef";

async fn submit(axum::Json(body): axum::Json<serde_json::Value>) -> StatusCode {
    black_box(body);
    StatusCode::CREATED
}

fn request() -> Request<Body> {
    Request::post("/api/v1/jobs")
        .header("content-type", "application/json")
        .header("content-length", SUBMIT.len())
        .header("authorization", format!("Bearer {TOKEN}"))
        .body(Body::from(SUBMIT))
        .unwrap_or_else(|err| panic!("{err}"))
}

fn edge(c: &mut Criterion) {
    let runtime = tokio::runtime::Builder::new_current_thread().build().unwrap_or_else(|err| panic!("{err}"));
    let bare: Router = Router::new().route("/api/v1/jobs", post(submit));
    let throttle = Arc::new(AuthThrottle::default());
    let guarded: Router = trainyard_server::http::edge_limits_and_headers(trainyard_server::http::edge_input_checks(
        Router::new().route(
            "/api/v1/jobs",
            post(move |body: axum::Json<serde_json::Value>| {
                let throttle = Arc::clone(&throttle);
                async move {
                    if throttle.check(TOKEN).is_err() {
                        return StatusCode::TOO_MANY_REQUESTS;
                    }
                    submit(body).await
                }
            }),
        ),
    ));
    let mut group = c.benchmark_group("submit request at the edge");
    for (name, router) in [("bare router", bare), ("with edge checks and throttle", guarded)] {
        group.bench_function(name, |b| {
            b.iter(|| {
                let response = runtime.block_on(router.clone().oneshot(request())).unwrap_or_else(|err| match err {});
                assert_eq!(response.status(), StatusCode::CREATED);
            })
        });
    }
    group.finish();
}

criterion_group!(benches, edge);
criterion_main!(benches);
