//! The API's surface: health checks and the OpenAPI document.

use trainyard_tests::{StatusCode, TestEnv, bin};

#[tokio::test(flavor = "multi_thread")]
async fn health_and_readiness_answer_without_a_token() {
    let env = TestEnv::start().await;
    assert_eq!(env.call(reqwest::Method::GET, "/healthz", None, None).await.0, StatusCode::OK);
    assert_eq!(env.call(reqwest::Method::GET, "/readyz", None, None).await.0, StatusCode::OK);
    let (status, page) = env.call(reqwest::Method::GET, "/", None, None).await;
    assert_eq!(status, StatusCode::OK);
    assert!(page.as_str().unwrap().contains("Trainyard"));
    let (status, body) = env.call(reqwest::Method::GET, "/api/v1/nothing-here", None, None).await;
    assert_eq!(status, StatusCode::NOT_FOUND);
    assert_eq!(body["error"]["code"], "not_found");
}

#[tokio::test(flavor = "multi_thread")]
async fn the_committed_openapi_document_is_current_and_served() {
    let generated = std::process::Command::new(bin("trainyard")).arg("openapi").output().unwrap();
    assert!(generated.status.success());
    let committed_path = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../docs/openapi.json");
    let committed = std::fs::read_to_string(&committed_path).unwrap_or_default();
    assert!(
        committed == String::from_utf8(generated.stdout.clone()).unwrap(),
        "docs/openapi.json is stale: regenerate it with `cargo run -q --bin trainyard -- openapi > docs/openapi.json`"
    );
    let env = TestEnv::start().await;
    let (status, served) = env.call(reqwest::Method::GET, "/api/v1/openapi.json", None, None).await;
    assert_eq!(status, StatusCode::OK);
    let generated: serde_json::Value = serde_json::from_slice(&generated.stdout).unwrap();
    assert_eq!(served, generated);
    for path in ["/api/v1/jobs", "/api/v1/jobs/{id}/logs", "/api/v1/jobs/{id}/cancel", "/api/v1/tokens"] {
        assert!(served["paths"][path].is_object(), "{path} is documented");
    }
}

/// Every response carries the security headers: the dashboard runs only its own scripts, loads
/// nothing from elsewhere and cannot be framed; nothing is sniffed into another type.
#[tokio::test(flavor = "multi_thread")]
async fn responses_carry_the_security_headers() {
    let env = TestEnv::start().await;
    for path in ["/login", "/api/v1/jobs", "/static/app.css"] {
        let response = reqwest::get(format!("{}{path}", env.server.url)).await.unwrap();
        let headers = response.headers();
        let csp = headers.get("content-security-policy").map(|v| v.to_str().unwrap().to_string()).unwrap_or_default();
        assert!(csp.contains("frame-ancestors 'none'") && csp.contains("script-src 'self'"), "{path}: {csp:?}");
        assert_eq!(headers.get("x-content-type-options").map(|v| v.to_str().unwrap()), Some("nosniff"), "{path}");
    }
}

/// The CLI documents where its server and token come from and prints shell completions that
/// know its commands and flags.
#[test]
fn the_cli_says_where_its_settings_come_from_and_completes_in_shells() {
    let yard = |args: &[&str]| std::process::Command::new(bin("yard")).args(args).output().unwrap();
    let help = yard(&["--help"]);
    let help = String::from_utf8_lossy(&help.stdout);
    assert!(help.contains("TRAINYARD_URL") && help.contains("TRAINYARD_TOKEN"), "{help}");
    let login = yard(&["login", "--help"]);
    assert!(String::from_utf8_lossy(&login.stdout).contains("Your API token"), "every flag has help");
    for shell in ["bash", "zsh", "fish"] {
        let script = yard(&["completions", shell]);
        assert!(script.status.success(), "{shell}");
        let script = String::from_utf8_lossy(&script.stdout);
        assert!(
            script.contains("submit") && script.contains("what-if"),
            "{shell}: {}",
            &script[..200.min(script.len())]
        );
    }
    let unknown = yard(&["completions", "cmd.exe"]);
    assert!(!unknown.status.success());
}
