//! Single sign-on with OpenID Connect against a real provider (npm's oauth2-mock-server, see
//! `tests/oidc/provider.mjs`): the authorization code flow with PKCE and nonce over real HTTP and
//! in Chromium, the group mapping to tenant roles, users made at their first sign-in, and what
//! must be refused: users outside every mapped group, a tampered ID token, a replayed or foreign
//! callback, unknown identities when provisioning is off. Keys rotated at the provider are
//! followed.

use std::time::Duration;

use fantoccini::Locator;
use serde_json::json;
use trainyard_tests::oidc::OidcProvider;
use trainyard_tests::web::{WebClient, browser_or_skip};
use trainyard_tests::{StatusCode, TestEnv};

/// The mapping every test here runs with.
const GROUP_ROLES: [&str; 3] =
    ["team-a-devs=team-a:member", "team-a-admins=team-a:admin", "team-b-readers=team-b:viewer"];

/// A server with single sign-on at `provider`, and the tenants the mapping names.
async fn sso_server(provider: &OidcProvider, provision: bool) -> TestEnv {
    let mut args =
        vec!["--oidc-issuer", &provider.issuer, "--oidc-client-id", "trainyard", "--oidc-display-name", "Acme SSO"];
    for line in GROUP_ROLES {
        args.extend(["--oidc-group-role", line]);
    }
    args.extend(["--oidc-admin-group", "platform-admins"]);
    if provision {
        args.push("--oidc-provision-users");
    }
    let env = TestEnv::start_with(&args).await;
    for tenant in ["team-a", "team-b"] {
        let (status, body) = env.post("/api/v1/admin/tenants", &env.admin_token, &json!({ "name": tenant })).await;
        assert_eq!(status, StatusCode::CREATED, "{body}");
    }
    env
}

/// What came back at the end of a sign-in: the callback's status and page, and where it sent
/// the browser.
struct Outcome {
    status: StatusCode,
    page: String,
    location: Option<String>,
    /// The callback URL the provider sent the browser to (for replays).
    callback: String,
}

/// One sign-in as a browser makes it, one redirect at a time: Trainyard's /sso/login, the
/// provider's authorization endpoint, Trainyard's callback.
async fn sign_in(web: &WebClient, base: &str) -> Outcome {
    let (status, to_provider) = web.redirect_of("/sso/login").await;
    assert_eq!(status, StatusCode::SEE_OTHER, "/sso/login should send the browser to the provider");
    let to_provider = to_provider.unwrap();
    assert!(
        to_provider.contains("code_challenge_method=S256") && to_provider.contains("nonce="),
        "the authorization request must carry a PKCE challenge and a nonce: {to_provider}"
    );
    let at_provider = web.http().get(&to_provider).send().await.unwrap();
    assert!(at_provider.status().is_redirection(), "provider answered {}", at_provider.status());
    let callback = at_provider.headers()["location"].to_str().unwrap().to_string();
    let path = callback.strip_prefix(base).unwrap_or_else(|| panic!("the provider sent the browser to {callback}"));
    let response = web.http().get(format!("{base}{path}")).send().await.unwrap();
    let status = response.status();
    let location = response.headers().get("location").and_then(|v| v.to_str().ok()).map(str::to_string);
    Outcome { status, page: response.text().await.unwrap(), location, callback }
}

/// The user's memberships as the database has them: (tenant, role), by tenant.
async fn memberships(env: &TestEnv, user: &str) -> Vec<(String, String)> {
    sqlx::query_as(
        "SELECT n.name, m.role FROM memberships m JOIN users u ON u.id = m.user_id
         JOIN tenants n ON n.id = m.tenant_id WHERE u.name = $1 ORDER BY n.name",
    )
    .bind(user)
    .fetch_all(&env.db.pool)
    .await
    .unwrap()
}

async fn user_exists(env: &TestEnv, user: &str) -> bool {
    sqlx::query_scalar("SELECT EXISTS (SELECT 1 FROM users WHERE name = $1)")
        .bind(user)
        .fetch_one(&env.db.pool)
        .await
        .unwrap()
}

fn pairs(list: &[(&str, &str)]) -> Vec<(String, String)> {
    list.iter().map(|(a, b)| (a.to_string(), b.to_string())).collect()
}

#[tokio::test(flavor = "multi_thread")]
async fn groups_decide_tenants_and_roles_and_everyone_else_is_refused() {
    let provider = OidcProvider::start();
    let env = sso_server(&provider, true).await;
    let base = env.server.url.clone();

    // The sign-in page offers single sign-on by the provider's name.
    let (_, page) = WebClient::new(&base).get("/login").await;
    assert!(page.contains("Sign in with Acme SSO"), "{page}");

    // A user in two mapped groups (and one that maps to nothing) lands in the first tenant by
    // name with the mapped role, and is made a member of the other with its role.
    provider.next_identity("subject-ada", "ada", &["team-a-devs", "team-b-readers", "coffee-club"]).await;
    let ada = WebClient::new(&base);
    let outcome = sign_in(&ada, &base).await;
    assert_eq!(outcome.status, StatusCode::SEE_OTHER, "{}", outcome.page);
    assert_eq!(outcome.location.as_deref(), Some("/jobs"));
    let (status, jobs) = ada.get("/jobs").await;
    assert_eq!(status, StatusCode::OK);
    assert!(jobs.contains("ada · team-a (member)"), "the page should show who and where: {jobs}");
    assert_eq!(memberships(&env, "ada").await, pairs(&[("team-a", "member"), ("team-b", "viewer")]));

    // The same callback again, even with the state cookie it left with, is refused: a sign-in
    // is used once.
    let state = outcome.callback.split("state=").nth(1).unwrap().split('&').next().unwrap().to_string();
    let replay = reqwest::Client::builder()
        .redirect(reqwest::redirect::Policy::none())
        .build()
        .unwrap()
        .get(&outcome.callback)
        .header("cookie", format!("trainyard_sso={state}"))
        .send()
        .await
        .unwrap();
    assert_eq!(replay.status(), StatusCode::UNAUTHORIZED, "a replayed callback must not sign in again");
    assert!(replay.text().await.unwrap().contains("used already"));

    // Groups change at the provider: at the next sign-in the memberships follow (team-b's,
    // granted by a group ada left, ends; team-a's role rises).
    provider.next_identity("subject-ada", "ada", &["team-a-admins"]).await;
    let outcome = sign_in(&WebClient::new(&base), &base).await;
    assert_eq!(outcome.status, StatusCode::SEE_OTHER, "{}", outcome.page);
    assert_eq!(memberships(&env, "ada").await, pairs(&[("team-a", "admin")]));

    // Somebody in none of the mapped groups is refused, and no user is made for them.
    provider.next_identity("subject-eve", "eve", &["coffee-club"]).await;
    let outcome = sign_in(&WebClient::new(&base), &base).await;
    assert_eq!(outcome.status, StatusCode::FORBIDDEN, "{}", outcome.page);
    assert!(outcome.page.contains("none of the groups"), "{}", outcome.page);
    assert!(!user_exists(&env, "eve").await);

    // An ID token altered after the provider signed it (more groups, another subject) does not
    // verify: refused, nobody made, nobody promoted.
    provider.next_identity("subject-mallory", "mallory", &["team-b-readers"]).await;
    provider.tamper_next().await;
    let outcome = sign_in(&WebClient::new(&base), &base).await;
    assert_eq!(outcome.status, StatusCode::UNAUTHORIZED, "{}", outcome.page);
    assert!(outcome.page.contains("did not verify"), "{}", outcome.page);
    assert!(!user_exists(&env, "mallory").await);
    let admins: i64 =
        sqlx::query_scalar("SELECT count(*) FROM users WHERE platform_admin").fetch_one(&env.db.pool).await.unwrap();
    assert_eq!(admins, 1, "only the bootstrap admin is a platform admin");

    // A callback this browser did not start (login CSRF: a link with someone else's code and
    // state) is refused before the code is used.
    provider.next_identity("subject-ada", "ada", &["team-a-devs"]).await;
    let attacker = WebClient::new(&base);
    let (_, to_provider) = attacker.redirect_of("/sso/login").await;
    let at_provider = attacker.http().get(to_provider.unwrap()).send().await.unwrap();
    let callback = at_provider.headers()["location"].to_str().unwrap().to_string();
    let victim = WebClient::new(&base);
    let foreign = victim.http().get(&callback).send().await.unwrap();
    assert_eq!(foreign.status(), StatusCode::FORBIDDEN);

    // The provider rotates its signing keys: the next ID token is signed with a key the server
    // has not seen, and the sign-in still works (the server fetches the keys again).
    let new_kid = provider.rotate_keys().await;
    provider.next_identity("subject-ada", "ada", &["team-a-devs", "platform-admins"]).await;
    let outcome = sign_in(&WebClient::new(&base), &base).await;
    assert_eq!(outcome.status, StatusCode::SEE_OTHER, "{}", outcome.page);
    assert_eq!(provider.last_kid().await, new_kid, "the ID token should have been signed with the new key");
    // ... and the platform-admin group made ada a platform admin.
    let ada_admin: bool = sqlx::query_scalar("SELECT platform_admin FROM users WHERE name = 'ada'")
        .fetch_one(&env.db.pool)
        .await
        .unwrap();
    assert!(ada_admin);

    // Signing out ends the session and the token behind it.
    let (_, page) = ada.get("/jobs").await;
    let csrf = trainyard_tests::web::csrf_of(&page);
    let (status, _) = ada.post_form("/logout", &[("csrf", &csrf)]).await;
    assert_eq!(status, StatusCode::SEE_OTHER);
    let (status, _) = ada.get("/jobs").await;
    assert_eq!(status, StatusCode::SEE_OTHER, "signed out, /jobs sends to sign-in");
    let live: i64 = sqlx::query_scalar(
        "SELECT count(*) FROM api_tokens t JOIN users u ON u.id = t.user_id
         JOIN web_sessions s ON s.token_id = t.id WHERE u.name = 'ada' AND t.revoked_at IS NULL",
    )
    .fetch_one(&env.db.pool)
    .await
    .unwrap();
    assert!(live >= 1, "the other sign-ins' sessions are still open");
    let revoked: i64 = sqlx::query_scalar(
        "SELECT count(*) FROM api_tokens t JOIN users u ON u.id = t.user_id
         WHERE u.name = 'ada' AND t.session_only AND t.revoked_at IS NOT NULL",
    )
    .fetch_one(&env.db.pool)
    .await
    .unwrap();
    assert_eq!(revoked, 1, "signing out revokes that session's token");
}

#[tokio::test(flavor = "multi_thread")]
async fn without_provisioning_unknown_identities_are_refused_and_names_are_never_taken_over() {
    let provider = OidcProvider::start();
    let env = sso_server(&provider, false).await;
    let base = env.server.url.clone();
    provider.next_identity("subject-bob", "bob", &["team-a-devs"]).await;
    let outcome = sign_in(&WebClient::new(&base), &base).await;
    assert_eq!(outcome.status, StatusCode::FORBIDDEN, "{}", outcome.page);
    assert!(outcome.page.contains("does not create users"), "{}", outcome.page);
    assert!(!user_exists(&env, "bob").await);

    // With provisioning, an identity whose name is an existing user's ("admin", the platform
    // admin) gets no access to that user.
    drop(env);
    let env = sso_server(&provider, true).await;
    let base = env.server.url.clone();
    provider.next_identity("subject-impostor", "admin", &["team-a-devs", "platform-admins"]).await;
    let outcome = sign_in(&WebClient::new(&base), &base).await;
    assert_eq!(outcome.status, StatusCode::FORBIDDEN, "{}", outcome.page);
    assert!(outcome.page.contains("exists already"), "{}", outcome.page);
    let identities: i64 =
        sqlx::query_scalar("SELECT count(*) FROM user_identities").fetch_one(&env.db.pool).await.unwrap();
    assert_eq!(identities, 0);
}

#[tokio::test(flavor = "multi_thread")]
async fn a_person_signs_in_with_single_sign_on_in_a_browser() {
    let Some(browser) = browser_or_skip("single sign-on browser test").await else { return };
    let provider = OidcProvider::start();
    let env = sso_server(&provider, true).await;
    let base = &env.server.url;
    let c = &browser.client;

    provider.next_identity("subject-grace", "grace", &["team-b-readers"]).await;
    c.goto(&format!("{base}/login")).await.unwrap();
    c.find(Locator::Css("#sso")).await.unwrap().click().await.unwrap();
    let who = browser.wait_text("#who", Duration::from_secs(15), |text| !text.is_empty()).await;
    assert_eq!(who, "grace · team-b (viewer)");
    assert!(c.current_url().await.unwrap().path().ends_with("/jobs"));
    browser.screenshot("sso-signed-in", 1280).await;

    // Outside every group: the browser comes back to the sign-in page with the reason.
    c.delete_all_cookies().await.unwrap();
    provider.next_identity("subject-eve", "eve", &["coffee-club"]).await;
    c.goto(&format!("{base}/login")).await.unwrap();
    c.find(Locator::Css("#sso")).await.unwrap().click().await.unwrap();
    let error = browser.wait_text("[role=alert]", Duration::from_secs(15), |text| !text.is_empty()).await;
    assert!(error.contains("none of the groups"), "{error}");
}
