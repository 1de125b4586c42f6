//! Browser sessions. A person signs in with an API token; the server opens a session (see
//! `trainyard_store::sessions`) and sets its secret as an `HttpOnly`, `SameSite=Lax` cookie,
//! `Secure` when the request came over TLS (`X-Forwarded-Proto: https` from the proxy in front).
//!
//! CSRF: every form a session posts carries the session's synchronizer token in a hidden `csrf`
//! field, compared in constant time. The sign-in form, which has no session yet, uses a
//! double-submit cookie instead.

use std::collections::BTreeMap;

use askama::Template;
use axum::extract::{Form, FromRequest, FromRequestParts, Request, State};
use axum::http::request::Parts;
use axum::http::{HeaderMap, StatusCode};
use axum::response::{IntoResponse, Redirect, Response};
use axum_extra::extract::cookie::{Cookie, CookieJar, SameSite};
use subtle::ConstantTimeEq;
use trainyard_core::Error;
use trainyard_core::auth::Caller;
use trainyard_store::sessions::random_hex;

use super::{WebError, render};
use crate::http::AppState;

const SESSION_COOKIE: &str = "trainyard_session";
const LOGIN_COOKIE: &str = "trainyard_login";
/// Binds a single sign-on to the browser that started it: the `state` it left with.
const SSO_COOKIE: &str = "trainyard_sso";
/// The ID token of a single sign-on session, the hint of the RP-initiated logout; sent only
/// with the sign-out form.
const SSO_ID_TOKEN_COOKIE: &str = "trainyard_sso_id";
/// Left by a sign-out: the next single sign-on asks the provider for `prompt=login`, so the
/// next person at a shared browser is asked who they are.
const SIGNED_OUT_COOKIE: &str = "trainyard_signed_out";

/// The caller of a signed-in browser, with the CSRF value its forms must carry.
pub struct WebAuth {
    pub caller: Caller,
    pub csrf: String,
}

impl FromRequestParts<AppState> for WebAuth {
    type Rejection = WebError;

    async fn from_request_parts(parts: &mut Parts, state: &AppState) -> Result<Self, WebError> {
        let jar = CookieJar::from_headers(&parts.headers);
        let secret = jar
            .get(SESSION_COOKIE)
            .map(|c| c.value().to_string())
            .ok_or_else(|| Error::Unauthenticated("sign in first".into()))?;
        let (caller, csrf) = state.app.session_authenticate(&secret, crate::http::extract::client_ip(parts)).await?;
        // For the form extractor that follows: the value this session's forms must carry.
        parts.extensions.insert(SessionCsrf(csrf.clone()));
        Ok(WebAuth { caller, csrf })
    }
}

/// The CSRF value of the request's session, left by [`WebAuth`] for [`CsrfForm`].
#[derive(Clone)]
struct SessionCsrf(String);

/// A dashboard form post, accepted only when it carries its session's CSRF value: the one
/// place that check is made. [`WebAuth`] must come before it among a handler's arguments (a
/// form without a signed-in session is refused).
pub struct CsrfForm(pub BTreeMap<String, String>);

impl FromRequest<AppState> for CsrfForm {
    type Rejection = WebError;

    async fn from_request(request: Request, state: &AppState) -> Result<Self, WebError> {
        let expected = request.extensions().get::<SessionCsrf>().map(|c| c.0.clone()).unwrap_or_default();
        let Form(form) = Form::<BTreeMap<String, String>>::from_request(request, state)
            .await
            .map_err(|rejection| WebError(Error::invalid("form", rejection.body_text())))?;
        let given = form.get("csrf").map(String::as_str).unwrap_or_default();
        if expected.is_empty() || given.is_empty() || !bool::from(given.as_bytes().ct_eq(expected.as_bytes())) {
            return Err(WebError(Error::Forbidden(
                "the form did not carry this session's CSRF token; reload the page and try again".into(),
            )));
        }
        Ok(CsrfForm(form))
    }
}

/// Whether the browser reached us over TLS, as the proxy in front tells.
fn over_tls(headers: &HeaderMap) -> bool {
    headers.get("x-forwarded-proto").and_then(|v| v.to_str().ok()).is_some_and(|v| v.eq_ignore_ascii_case("https"))
}

fn cookie(name: &'static str, value: String, path: &'static str, tls: bool) -> Cookie<'static> {
    Cookie::build((name, value)).path(path).http_only(true).same_site(SameSite::Lax).secure(tls).build()
}

#[derive(Template)]
#[template(path = "login.html")]
struct LoginPage {
    csrf: String,
    error: Option<String>,
    /// The identity provider's name, when single sign-on is on.
    sso: Option<String>,
}

/// The sign-in page with a fresh double-submit value (and `error`, if any), with `status`.
fn login_again(state: &AppState, jar: CookieJar, tls: bool, status: StatusCode, error: Option<String>) -> Response {
    let csrf = random_hex();
    let jar = jar.add(cookie(LOGIN_COOKIE, csrf.clone(), "/login", tls));
    let sso = state.app.sso_display_name().map(str::to_string);
    (status, jar, render(&LoginPage { csrf, error, sso })).into_response()
}

pub async fn login_page(State(state): State<AppState>, headers: HeaderMap, jar: CookieJar) -> Response {
    login_again(&state, jar, over_tls(&headers), StatusCode::OK, None)
}

pub async fn login(
    State(state): State<AppState>,
    crate::http::extract::ClientIp(client): crate::http::extract::ClientIp,
    headers: HeaderMap,
    jar: CookieJar,
    Form(form): Form<BTreeMap<String, String>>,
) -> Response {
    let tls = over_tls(&headers);
    let expected = jar.get(LOGIN_COOKIE).map(|c| c.value().to_string()).unwrap_or_default();
    let given = form.get("csrf").cloned().unwrap_or_default();
    let again = |jar: CookieJar, status: StatusCode, error: String| login_again(&state, jar, tls, status, Some(error));
    if expected.is_empty() || !bool::from(expected.as_bytes().ct_eq(given.as_bytes())) {
        let message = "the sign-in form expired; try again".to_string();
        return again(jar, StatusCode::FORBIDDEN, message);
    }
    let token = form.get("token").map(|t| t.trim()).unwrap_or_default();
    if token.is_empty() {
        return again(jar, StatusCode::UNPROCESSABLE_ENTITY, "paste your API token (it starts with tyd_)".into());
    }
    match state.app.session_open(token, client).await {
        Ok((session, caller)) => {
            tracing::info!(user = %caller.user, tenant = %caller.tenant, "dashboard sign-in");
            let jar = jar.remove(Cookie::build(LOGIN_COOKIE).path("/login"));
            signed_in(jar, session, tls)
        }
        Err(err) => match sign_in_refusal(err) {
            Ok((status, message)) => again(jar, status, message),
            Err(err) => WebError(err).into_response(),
        },
    }
}

/// Sets the session cookie and sends the browser to its jobs.
fn signed_in(jar: CookieJar, session: trainyard_store::sessions::WebSession, tls: bool) -> Response {
    let max_age = (session.expires_at - chrono::Utc::now()).num_seconds().max(0);
    let mut session_cookie = cookie(SESSION_COOKIE, session.secret, "/", tls);
    session_cookie.set_max_age(Some(cookie::time::Duration::seconds(max_age)));
    (jar.add(session_cookie), Redirect::to("/jobs")).into_response()
}

/// A refused sign-in as the sign-in page shows it (status and message), or the error page's.
fn sign_in_refusal(err: Error) -> Result<(StatusCode, String), Error> {
    match err {
        Error::Unauthenticated(message) => Ok((StatusCode::UNAUTHORIZED, message)),
        Error::Forbidden(message) => Ok((StatusCode::FORBIDDEN, message)),
        Error::TooManyRequests { message, .. } => Ok((StatusCode::TOO_MANY_REQUESTS, message)),
        Error::Unavailable(message) => Ok((StatusCode::SERVICE_UNAVAILABLE, message)),
        other => Err(other),
    }
}

#[derive(serde::Deserialize)]
pub struct SsoStart {
    tenant: Option<String>,
}

/// Single sign-on, step one: off to the identity provider, with the `state` kept in a cookie
/// so that only this browser can finish the sign-in (no login CSRF).
pub async fn sso_start(
    State(state): State<AppState>,
    headers: HeaderMap,
    jar: CookieJar,
    axum::extract::Query(start): axum::extract::Query<SsoStart>,
) -> Response {
    let tls = over_tls(&headers);
    let sign_in_again = jar.get(SIGNED_OUT_COOKIE).is_some();
    match state.app.sso_begin(start.tenant.as_deref().filter(|t| !t.is_empty()), sign_in_again).await {
        Ok((url, sso_state)) => {
            let jar = jar.add(cookie(SSO_COOKIE, sso_state, "/sso", tls));
            (jar, Redirect::to(&url)).into_response()
        }
        Err(err) => match sign_in_refusal(err) {
            Ok((status, message)) => login_again(&state, jar, tls, status, Some(message)),
            Err(err) => WebError(err).into_response(),
        },
    }
}

#[derive(serde::Deserialize)]
pub struct SsoReturn {
    code: Option<String>,
    state: Option<String>,
    error: Option<String>,
    error_description: Option<String>,
}

/// Single sign-on, step two: the identity provider sent the browser back.
pub async fn sso_callback(
    State(state): State<AppState>,
    crate::http::extract::ClientIp(client): crate::http::extract::ClientIp,
    headers: HeaderMap,
    jar: CookieJar,
    axum::extract::Query(back): axum::extract::Query<SsoReturn>,
) -> Response {
    if state.app.sso_display_name().is_none() {
        return WebError(Error::NotFound { kind: trainyard_core::error::ObjectKind::Route }).into_response();
    }
    let tls = over_tls(&headers);
    let expected = jar.get(SSO_COOKIE).map(|c| c.value().to_string()).unwrap_or_default();
    let jar = jar.remove(Cookie::build(SSO_COOKIE).path("/sso"));
    let refuse = |jar, status, message: String| login_again(&state, jar, tls, status, Some(message));
    if let Some(error) = back.error {
        let detail = back.error_description.map(|d| format!(": {d}")).unwrap_or_default();
        return refuse(
            jar,
            StatusCode::UNAUTHORIZED,
            format!("the identity provider refused the sign-in ({error}{detail})"),
        );
    }
    let (Some(code), Some(sso_state)) = (back.code, back.state) else {
        return refuse(jar, StatusCode::BAD_REQUEST, "the identity provider sent no code or state back".into());
    };
    if expected.is_empty() || !bool::from(expected.as_bytes().ct_eq(sso_state.as_bytes())) {
        return refuse(jar, StatusCode::FORBIDDEN, "this sign-in was not started by this browser; start again".into());
    }
    match state.app.sso_finish(&code, &sso_state, client).await {
        Ok((session, caller, id_token)) => {
            tracing::info!(user = %caller.user, tenant = %caller.tenant, "dashboard sign-in by single sign-on");
            let jar = jar.remove(Cookie::build(SIGNED_OUT_COOKIE).path("/sso")).add(cookie(
                SSO_ID_TOKEN_COOKIE,
                id_token,
                "/logout",
                tls,
            ));
            signed_in(jar, session, tls)
        }
        Err(err) => match sign_in_refusal(err) {
            Ok((status, message)) => refuse(jar, status, message),
            Err(err) => WebError(err).into_response(),
        },
    }
}

pub async fn logout(
    State(state): State<AppState>,
    headers: HeaderMap,
    auth: WebAuth,
    jar: CookieJar,
    CsrfForm(_form): CsrfForm,
) -> Result<Response, WebError> {
    if let Some(secret) = jar.get(SESSION_COOKIE).map(|c| c.value().to_string()) {
        state.app.session_close(&secret, auth.caller.source).await?;
    }
    let tls = over_tls(&headers);
    let id_token = jar.get(SSO_ID_TOKEN_COOKIE).map(|c| c.value().to_string());
    let jar = jar.remove(Cookie::build(SESSION_COOKIE).path("/"));
    if state.app.sso_display_name().is_none() {
        return Ok((jar, Redirect::to("/login")).into_response());
    }
    // Signed out here; at the provider too when it offers RP-initiated logout, and in any case
    // the next single sign-on from this browser asks who is there.
    let mut signed_out = cookie(SIGNED_OUT_COOKIE, "1".into(), "/sso", tls);
    signed_out.set_max_age(Some(cookie::time::Duration::days(30)));
    let jar = jar.remove(Cookie::build(SSO_ID_TOKEN_COOKIE).path("/logout")).add(signed_out);
    // Only a session single sign-on opened (its ID token kept) is ended at the provider.
    let provider_logout = match &id_token {
        Some(id_token) => state.app.sso_logout_url(Some(id_token)).await,
        None => None,
    };
    match provider_logout {
        // A page that moves on by itself rather than a redirect: the dashboard's CSP
        // (`form-action 'self'`) stops a form post redirected to another origin.
        Some(provider_logout) => {
            let provider = state.app.sso_display_name().unwrap_or_default().to_string();
            Ok((jar, render(&SignedOutPage { provider, provider_logout })).into_response())
        }
        None => Ok((jar, Redirect::to("/login")).into_response()),
    }
}

#[derive(Template)]
#[template(path = "signed_out.html")]
struct SignedOutPage {
    /// The identity provider's name.
    provider: String,
    /// Its end-session URL, with this session's ID token as the hint.
    provider_logout: String,
}
