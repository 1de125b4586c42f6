//! Single sign-on with OpenID Connect against a real, OpenID-Certified provider (npm's
//! oidc-provider, see `tests/oidc/provider.mjs`): the authorization code flow with PKCE and nonce
//! over real HTTP and in Chromium, the group mapping to tenant roles, users made at their first
//! sign-in, claims at userinfo and behind a `groups` scope, Ed25519-signed ID tokens, signing out
//! at the provider, and what must be refused: users outside every mapped group, a tampered ID
//! token, a replayed or foreign callback, unknown identities when provisioning is off. Keys
//! rotated at the provider are followed.

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
    sso_server_with(provider, provision, &[]).await
}

/// [`sso_server`] with more server options, registered at the provider (RS256 ID tokens).
async fn sso_server_with(provider: &OidcProvider, provision: bool, extra: &[&str]) -> TestEnv {
    let mut args =
        vec!["--oidc-issuer", &provider.issuer, "--oidc-client-id", "trainyard", "--oidc-display-name", "Acme SSO"];
    for line in GROUP_ROLES {
        args.extend(["--oidc-group-role", line]);
    }
    args.extend(["--oidc-admin-group", "platform-admins"]);
    if provision {
        args.push("--oidc-provision-users");
    }
    args.extend(extra);
    let env = TestEnv::start_with(&args).await;
    provider.register_client(&env.server.url, "RS256").await;
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

/// The provider's way back to Trainyard at `base` for a browser sent to `to_provider`: its
/// redirects followed (with the browser's cookies at the provider) until one leads to `base`.
async fn provider_callback(web: &WebClient, to_provider: &str, base: &str) -> String {
    let mut next = to_provider.to_string();
    for _ in 0..10 {
        let mut at_provider = web.http().get(&next).send().await.unwrap();
        if at_provider.status() == StatusCode::OK {
            // A page that posts its form as soon as it loads (the provider ending the last
            // person's session before it signs in another): submitted, as a browser would.
            let page = at_provider.text().await.unwrap();
            assert!(page.contains("document.forms[0].submit()"), "provider answered a page: {page}");
            let (action, fields) = auto_submitted_form(&page);
            at_provider = web.http().post(action).form(&fields).send().await.unwrap();
        }
        let status = at_provider.status();
        assert!(status.is_redirection(), "provider answered {status}: {}", at_provider.text().await.unwrap());
        let location = at_provider.headers()["location"].to_str().unwrap().to_string();
        next = at_provider.url().join(&location).unwrap().to_string();
        if next.starts_with(&format!("{base}/")) {
            return next;
        }
    }
    panic!("the provider never sent the browser back to {base}; last at {next}")
}

/// The action and hidden fields of the one form on a provider's page.
fn auto_submitted_form(page: &str) -> (String, Vec<(String, String)>) {
    let attribute = |tag: &str, name: &str| {
        let start = tag.find(&format!("{name}=\"")).map(|at| at + name.len() + 2)?;
        Some(tag[start..].split('"').next()?.to_string())
    };
    let form = page.split("<form").nth(1).expect("a form on the page");
    let action = attribute(form.split('>').next().unwrap(), "action").expect("a form action");
    let fields = form
        .split("<input")
        .skip(1)
        .filter_map(|input| Some((attribute(input, "name")?, attribute(input, "value")?)))
        .collect();
    (action, fields)
}

/// One sign-in as a browser makes it, one redirect at a time: Trainyard's /sso/login, the
/// provider's authorization endpoint (and its sign-in interaction), Trainyard's callback.
async fn sign_in(web: &WebClient, base: &str) -> Outcome {
    let (status, to_provider) = web.redirect_of("/sso/login").await;
    assert_eq!(status, StatusCode::SEE_OTHER, "/sso/login should send the browser to the provider");
    let to_provider = to_provider.unwrap();
    assert!(
        to_provider.contains("code_challenge_method=S256") && to_provider.contains("nonce="),
        "the authorization request must carry a PKCE challenge and a nonce: {to_provider}"
    );
    let callback = provider_callback(web, &to_provider, base).await;
    let response = web.http().get(&callback).send().await.unwrap();
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
    let callback = provider_callback(&attacker, &to_provider.unwrap(), &base).await;
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
    let (status, page) = ada.post_form("/logout", &[("csrf", &csrf)]).await;
    assert_eq!(status, StatusCode::OK, "a page that moves on to the provider's sign-out: {page}");
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

    // Signing out signs grace out at the provider too (its confirmation page), and the browser
    // comes back to the sign-in page; the next person there signs in as themselves.
    c.find(Locator::Css("#sign-out")).await.unwrap().click().await.unwrap();
    let yes = Locator::Css("button[name=logout][value=yes]");
    let deadline = std::time::Instant::now() + Duration::from_secs(15);
    let confirm = loop {
        if let Ok(button) = c.find(yes).await {
            break button;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "the provider's sign-out page never came: {:?}",
            c.current_url().await
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    };
    confirm.click().await.unwrap();
    browser.wait_text("#sso", Duration::from_secs(15), |text| text.contains("Acme SSO")).await;
    assert!(c.current_url().await.unwrap().as_str().starts_with(&format!("{base}/login")));
    provider.next_identity("subject-hal", "hal", &["team-a-devs"]).await;
    c.find(Locator::Css("#sso")).await.unwrap().click().await.unwrap();
    let who = browser.wait_text("#who", Duration::from_secs(15), |text| !text.is_empty()).await;
    assert_eq!(who, "hal · team-a (member)");

    // Outside every group: the browser comes back to the sign-in page with the reason.
    c.delete_all_cookies().await.unwrap();
    provider.next_identity("subject-eve", "eve", &["coffee-club"]).await;
    c.goto(&format!("{base}/login")).await.unwrap();
    c.find(Locator::Css("#sso")).await.unwrap().click().await.unwrap();
    let error = browser.wait_text("[role=alert]", Duration::from_secs(15), |text| !text.is_empty()).await;
    assert!(error.contains("none of the groups"), "{error}");
}

/// The user name single sign-on made for an identity, by its subject.
async fn user_of_subject(env: &TestEnv, subject: &str) -> Option<String> {
    sqlx::query_scalar("SELECT u.name FROM users u JOIN user_identities i ON i.user_id = u.id WHERE i.subject = $1")
        .bind(subject)
        .fetch_optional(&env.db.pool)
        .await
        .unwrap()
}

#[tokio::test(flavor = "multi_thread")]
async fn claims_are_read_from_userinfo_verified_e_mails_only_and_the_admin_group_alone_signs_in() {
    let provider = OidcProvider::start();
    let env = sso_server(&provider, true).await;
    let base = env.server.url.clone();

    // The provider's default (OIDC Core 5.4): the ID token carries `sub` and no name or
    // groups; they are at userinfo, and the user is named and placed from there.
    provider.next_identity("subject-ada", "ada", &["team-a-devs"]).await;
    let outcome = sign_in(&WebClient::new(&base), &base).await;
    assert_eq!(outcome.status, StatusCode::SEE_OTHER, "{}", outcome.page);
    let id_token = provider.last_id_token().await;
    assert!(
        id_token["claims"].get("preferred_username").is_none() && id_token["claims"].get("groups").is_none(),
        "the provider should have kept the claims for userinfo: {id_token}"
    );
    assert_eq!(user_of_subject(&env, "subject-ada").await.as_deref(), Some("ada"));
    assert_eq!(memberships(&env, "ada").await, pairs(&[("team-a", "member")]));

    // An e-mail address the provider has not verified is not taken as a name (it may be
    // anybody's); a verified one is.
    provider
        .next_account(json!({"sub": "subject-carol", "email": "carol@example.org", "email_verified": false,
                             "groups": ["team-a-devs"]}))
        .await;
    let outcome = sign_in(&WebClient::new(&base), &base).await;
    assert_eq!(outcome.status, StatusCode::SEE_OTHER, "{}", outcome.page);
    let carol = user_of_subject(&env, "subject-carol").await.unwrap();
    assert!(carol.starts_with("sso-"), "an unverified e-mail became the name {carol:?}");
    assert!(!user_exists(&env, "carol@example.org").await);
    provider
        .next_account(json!({"sub": "subject-dave", "email": "dave@example.org", "email_verified": true,
                             "groups": ["team-a-devs"]}))
        .await;
    let outcome = sign_in(&WebClient::new(&base), &base).await;
    assert_eq!(outcome.status, StatusCode::SEE_OTHER, "{}", outcome.page);
    assert_eq!(user_of_subject(&env, "subject-dave").await.as_deref(), Some("dave@example.org"));

    // A member of the platform-admin group and of no mapped group signs in, a platform admin.
    provider.next_identity("subject-root", "root", &["platform-admins"]).await;
    let root = WebClient::new(&base);
    let outcome = sign_in(&root, &base).await;
    assert_eq!(outcome.status, StatusCode::SEE_OTHER, "{}", outcome.page);
    assert_eq!(outcome.location.as_deref(), Some("/jobs"));
    let (status, _) = root.get("/jobs").await;
    assert_eq!(status, StatusCode::OK);
    let admin: bool = sqlx::query_scalar("SELECT platform_admin FROM users WHERE name = 'root'")
        .fetch_one(&env.db.pool)
        .await
        .unwrap();
    assert!(admin);
}

#[tokio::test(flavor = "multi_thread")]
async fn groups_behind_a_groups_scope_need_the_scope_and_the_refusal_says_so() {
    let provider = OidcProvider::start();
    // Like Dex and Okta: `groups` only for a `groups` scope, and in the ID token.
    provider.settings(json!({"groups_scope": true, "claims_in_id_token": true})).await;
    provider.next_identity("subject-ada", "ada", &["team-a-devs"]).await;

    // The default scopes do not ask for it: nobody gets in, and the refusal names the claim.
    let env = sso_server(&provider, true).await;
    let base = env.server.url.clone();
    let outcome = sign_in(&WebClient::new(&base), &base).await;
    assert_eq!(outcome.status, StatusCode::FORBIDDEN, "{}", outcome.page);
    assert!(outcome.page.contains("sent no `groups` claim"), "{}", outcome.page);
    drop(env);

    // With the scope configured, the groups come in the ID token and decide the roles.
    let env = sso_server_with(&provider, true, &["--oidc-scopes", "openid profile email groups"]).await;
    let base = env.server.url.clone();
    let outcome = sign_in(&WebClient::new(&base), &base).await;
    assert_eq!(outcome.status, StatusCode::SEE_OTHER, "{}", outcome.page);
    assert_eq!(provider.last_id_token().await["claims"]["groups"], json!(["team-a-devs"]));
    assert_eq!(memberships(&env, "ada").await, pairs(&[("team-a", "member")]));
}

#[tokio::test(flavor = "multi_thread")]
async fn an_id_token_signed_with_ed25519_is_accepted() {
    let provider = OidcProvider::start();
    let env = sso_server(&provider, true).await;
    let base = env.server.url.clone();
    provider.register_client(&base, "EdDSA").await;
    provider.next_identity("subject-ada", "ada", &["team-a-devs"]).await;
    let outcome = sign_in(&WebClient::new(&base), &base).await;
    assert_eq!(outcome.status, StatusCode::SEE_OTHER, "{}", outcome.page);
    assert_eq!(provider.last_id_token().await["alg"], "EdDSA");
    assert_eq!(memberships(&env, "ada").await, pairs(&[("team-a", "member")]));
}

#[tokio::test(flavor = "multi_thread")]
async fn signing_out_ends_the_provider_session_and_the_next_person_is_asked_to_sign_in() {
    let provider = OidcProvider::start();
    let env = sso_server(&provider, true).await;
    let base = env.server.url.clone();
    let shared = WebClient::new(&base);
    provider.next_identity("subject-ada", "ada", &["team-a-devs"]).await;
    let outcome = sign_in(&shared, &base).await;
    assert_eq!(outcome.status, StatusCode::SEE_OTHER, "{}", outcome.page);
    assert_eq!(provider.login_prompts().await, 1);

    // Signing out sends the browser to the provider's end-session endpoint, with the ID token
    // as the hint and this server's sign-in page to come back to.
    let (_, page) = shared.get("/jobs").await;
    let csrf = trainyard_tests::web::csrf_of(&page);
    let (status, page) = shared.post_form("/logout", &[("csrf", &csrf)]).await;
    assert_eq!(status, StatusCode::OK, "{page}");
    let link = page.split("id=\"provider-logout\" href=\"").nth(1).expect("a link to the provider").split('"');
    let to =
        reqwest::Url::parse(&link.into_iter().next().unwrap().replace("&amp;", "&").replace("&#38;", "&")).unwrap();
    assert_eq!(to.as_str().split('?').next(), Some(format!("{}/session/end", provider.issuer).as_str()));
    let query: std::collections::HashMap<_, _> = to.query_pairs().into_owned().collect();
    assert_eq!(query.get("post_logout_redirect_uri"), Some(&format!("{base}/login")));
    assert_eq!(query["id_token_hint"].split('.').count(), 3, "the hint is the session's ID token: {query:?}");
    let (status, _) = shared.get("/jobs").await;
    assert_eq!(status, StatusCode::SEE_OTHER, "signed out, /jobs sends to sign-in");

    // The next person at this browser (the provider's session cookie still in it) is asked to
    // sign in, and is signed in as themselves, not as ada.
    provider.next_identity("subject-bob", "bob", &["team-a-devs"]).await;
    let (_, to_provider) = shared.redirect_of("/sso/login").await;
    assert!(to_provider.as_deref().is_some_and(|url| url.contains("prompt=login")), "{to_provider:?}");
    let outcome = sign_in(&shared, &base).await;
    assert_eq!(outcome.status, StatusCode::SEE_OTHER, "{}", outcome.page);
    assert_eq!(provider.login_prompts().await, 2, "the provider should have asked who is there");
    let (_, jobs) = shared.get("/jobs").await;
    assert!(jobs.contains("bob · team-a (member)"), "{jobs}");
}

#[tokio::test(flavor = "multi_thread")]
async fn userinfo_about_someone_else_and_tokens_from_a_clock_far_ahead_are_refused() {
    let provider = OidcProvider::start();
    let env = sso_server(&provider, true).await;
    let base = env.server.url.clone();

    // Userinfo must speak of the ID token's subject.
    provider
        .next_account(json!({"sub": "subject-ada", "preferred_username": "ada", "groups": ["team-a-devs"],
                             "userinfo_sub": "subject-eve"}))
        .await;
    let outcome = sign_in(&WebClient::new(&base), &base).await;
    assert_eq!(outcome.status, StatusCode::UNAUTHORIZED, "{}", outcome.page);
    assert!(outcome.page.contains("userinfo names another subject than the ID token"), "{}", outcome.page);
    assert!(!user_exists(&env, "ada").await);

    // A provider's clock a little ahead is within the leeway; five minutes ahead is not, and
    // the refusal says why.
    provider.next_identity("subject-ada", "ada", &["team-a-devs"]).await;
    provider.settings(json!({"clock_skew_s": 30})).await;
    let outcome = sign_in(&WebClient::new(&base), &base).await;
    assert_eq!(outcome.status, StatusCode::SEE_OTHER, "{}", outcome.page);
    provider.settings(json!({"clock_skew_s": 300})).await;
    let outcome = sign_in(&WebClient::new(&base), &base).await;
    assert_eq!(outcome.status, StatusCode::UNAUTHORIZED, "{}", outcome.page);
    assert!(outcome.page.contains("in the future"), "{}", outcome.page);
}
