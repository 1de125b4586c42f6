//! A real OpenID Connect provider for the single sign-on tests: `tests/oidc/provider.mjs` on
//! npm's oidc-provider (OpenID-Certified), installed by `tests/ensure-oidc` (which `tests/run`
//! sources).

use std::io::{BufRead, BufReader};
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use serde_json::{Value, json};

/// How long the provider may take to say it is ready (it takes about a second), and how many
/// times it is started before a test gives up.
const START_TIMEOUT: Duration = Duration::from_secs(20);
const START_ATTEMPTS: u32 = 3;

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
                       which installs npm's oidc-provider and sets TRAINYARD_TEST_OIDC_ENTRY and \
                       TRAINYARD_TEST_OIDC_PROVIDER)";
        let entry = std::env::var("TRAINYARD_TEST_OIDC_ENTRY").expect(missing);
        let script = std::env::var("TRAINYARD_TEST_OIDC_PROVIDER").expect(missing);
        // Node has been seen to hang at start-up (every thread waiting on a futex, nothing
        // listening) once in hundreds of starts: a start that says nothing in time is killed
        // and tried again, so that the hang is neither a test failure nor a run that never ends.
        let (mut child, line) = (1..=START_ATTEMPTS)
            .find_map(|attempt| {
                let mut child = Command::new("node")
                    .arg(&script)
                    .env("OIDC_PROVIDER_ENTRY", &entry)
                    .stdout(Stdio::piped())
                    .stderr(Stdio::inherit())
                    .spawn()
                    .unwrap_or_else(|err| panic!("starting node {script}: {err}"));
                let stdout = child.stdout.take().unwrap();
                let (tx, rx) = std::sync::mpsc::channel();
                std::thread::spawn(move || {
                    let mut line = String::new();
                    let _ = BufReader::new(stdout).read_line(&mut line);
                    let _ = tx.send(line);
                });
                match rx.recv_timeout(START_TIMEOUT) {
                    Ok(line) => Some((child, line)),
                    Err(_) => {
                        eprintln!("the OpenID provider said nothing in {START_TIMEOUT:?} (attempt {attempt}): starting another");
                        let _ = child.kill();
                        let _ = child.wait();
                        None
                    }
                }
            })
            .unwrap_or_else(|| panic!("the OpenID provider did not start in {START_ATTEMPTS} attempts"));
        let ready: Value = serde_json::from_str(&line).unwrap_or_else(|err| {
            let _ = child.kill();
            panic!("the provider said {line:?} when starting: {err}")
        });
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

    /// Registers Trainyard at `base` as the provider's client, its ID tokens signed with
    /// `id_token_alg` ("RS256" or "EdDSA").
    pub async fn register_client(&self, base: &str, id_token_alg: &str) {
        let client = json!({
            "redirect_uri": format!("{base}/sso/callback"),
            "post_logout_redirect_uri": format!("{base}/login"),
            "id_token_alg": id_token_alg,
        });
        self.control(reqwest::Method::POST, "/client", client).await;
    }

    /// What the provider releases: `groups_scope` (groups only for a `groups` scope) and
    /// `claims_in_id_token` (else scope claims only at userinfo, the provider's default).
    pub async fn settings(&self, settings: Value) {
        self.control(reqwest::Method::POST, "/settings", settings).await;
    }

    /// Who the next sign-ins are: subject, user name, a verified e-mail and groups.
    pub async fn next_identity(&self, subject: &str, username: &str, groups: &[&str]) {
        let identity = json!({
            "sub": subject,
            "preferred_username": username,
            "email": format!("{username}@example.org"),
            "email_verified": true,
            "groups": groups,
        });
        self.next_account(identity).await;
    }

    /// Who the next sign-ins are: `sub` and the claims the provider keeps for it, as given.
    pub async fn next_account(&self, claims: Value) {
        self.control(reqwest::Method::POST, "/next", claims).await;
    }

    /// The last ID token the provider issued: {"kid", "alg", "claims"}.
    pub async fn last_id_token(&self) -> Value {
        self.control(reqwest::Method::GET, "/last", Value::Null).await
    }

    /// How many times the provider asked somebody to sign in (what a person sees as a prompt).
    pub async fn login_prompts(&self) -> u64 {
        self.control(reqwest::Method::GET, "/prompts", Value::Null).await["login"].as_u64().unwrap()
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
