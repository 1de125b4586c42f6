//! A real OpenID Connect provider for the single sign-on tests: `tests/oidc/provider.mjs` on
//! npm's oauth2-mock-server, installed by `tests/ensure-oidc` (which `tests/run` sources).

use std::io::{BufRead, BufReader};
use std::process::{Child, Command, Stdio};

use serde_json::{Value, json};

/// The provider process and its control endpoint. Killed on drop.
pub struct OidcProvider {
    pub issuer: String,
    control: String,
    child: Child,
    http: reqwest::Client,
}

impl OidcProvider {
    /// Starts a provider of its own for one test. Panics with what to do when it is not
    /// installed: the single sign-on tests never skip.
    pub fn start() -> OidcProvider {
        let missing = "the OpenID Connect provider is not installed: run tests/run (it sources tests/ensure-oidc, \
                       which installs npm's oauth2-mock-server and sets TRAINYARD_TEST_OIDC_ENTRY and \
                       TRAINYARD_TEST_OIDC_PROVIDER)";
        let entry = std::env::var("TRAINYARD_TEST_OIDC_ENTRY").expect(missing);
        let script = std::env::var("TRAINYARD_TEST_OIDC_PROVIDER").expect(missing);
        let mut child = Command::new("node")
            .arg(&script)
            .env("OAUTH2_MOCK_SERVER_ENTRY", &entry)
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit())
            .spawn()
            .unwrap_or_else(|err| panic!("starting node {script}: {err}"));
        let mut line = String::new();
        BufReader::new(child.stdout.take().unwrap()).read_line(&mut line).unwrap();
        let ready: Value =
            serde_json::from_str(&line).unwrap_or_else(|err| panic!("the provider said {line:?} when starting: {err}"));
        OidcProvider {
            issuer: ready["issuer"].as_str().unwrap().to_string(),
            control: ready["control"].as_str().unwrap().to_string(),
            child,
            http: reqwest::Client::new(),
        }
    }

    async fn control(&self, method: reqwest::Method, path: &str, body: Value) -> Value {
        let response = self.http.request(method, format!("{}{path}", self.control)).json(&body).send().await.unwrap();
        assert!(response.status().is_success(), "provider control {path}: {}", response.status());
        response.json().await.unwrap()
    }

    /// Who the next sign-ins are: subject, user name and groups.
    pub async fn next_identity(&self, subject: &str, username: &str, groups: &[&str]) {
        let identity = json!({
            "sub": subject,
            "preferred_username": username,
            "email": format!("{username}@example.org"),
            "groups": groups,
        });
        self.control(reqwest::Method::POST, "/next", identity).await;
    }

    /// The next ID token leaves the provider signed and then altered.
    pub async fn tamper_next(&self) {
        self.control(reqwest::Method::POST, "/tamper", json!({})).await;
    }

    /// A new signing key for every ID token from now on; its key id.
    pub async fn rotate_keys(&self) -> String {
        self.control(reqwest::Method::POST, "/rotate", json!({})).await["kid"].as_str().unwrap().to_string()
    }

    /// The key id that signed the last ID token.
    pub async fn last_kid(&self) -> String {
        self.control(reqwest::Method::GET, "/last", Value::Null).await["kid"].as_str().unwrap_or_default().to_string()
    }
}

impl Drop for OidcProvider {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}
