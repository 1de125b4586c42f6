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
use crate::AppState;

const SESSION_COOKIE: &str = "trainyard_session";
const LOGIN_COOKIE: &str = "trainyard_login";

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
        let (caller, csrf) = state.app.session_authenticate(&secret).await?;
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
}

pub async fn login_page(headers: HeaderMap, jar: CookieJar) -> Response {
    let csrf = random_hex();
    let jar = jar.add(cookie(LOGIN_COOKIE, csrf.clone(), "/login", over_tls(&headers)));
    (jar, render(&LoginPage { csrf, error: None })).into_response()
}

pub async fn login(
    State(state): State<AppState>,
    crate::extract::ClientIp(client): crate::extract::ClientIp,
    headers: HeaderMap,
    jar: CookieJar,
    Form(form): Form<BTreeMap<String, String>>,
) -> Response {
    let tls = over_tls(&headers);
    let expected = jar.get(LOGIN_COOKIE).map(|c| c.value().to_string()).unwrap_or_default();
    let given = form.get("csrf").cloned().unwrap_or_default();
    let again = |jar: CookieJar, status: StatusCode, error: String| {
        let csrf = random_hex();
        let jar = jar.add(cookie(LOGIN_COOKIE, csrf.clone(), "/login", tls));
        (status, jar, render(&LoginPage { csrf, error: Some(error) })).into_response()
    };
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
            let max_age = (session.expires_at - chrono::Utc::now()).num_seconds().max(0);
            let mut session_cookie = cookie(SESSION_COOKIE, session.secret, "/", tls);
            session_cookie.set_max_age(Some(cookie::time::Duration::seconds(max_age)));
            let jar = jar.remove(Cookie::build(LOGIN_COOKIE).path("/login")).add(session_cookie);
            (jar, Redirect::to("/jobs")).into_response()
        }
        Err(Error::Unauthenticated(message)) => again(jar, StatusCode::UNAUTHORIZED, message),
        Err(Error::TooManyRequests { message, .. }) => again(jar, StatusCode::TOO_MANY_REQUESTS, message),
        Err(err) => WebError(err).into_response(),
    }
}

pub async fn logout(
    State(state): State<AppState>,
    _auth: WebAuth,
    jar: CookieJar,
    CsrfForm(_form): CsrfForm,
) -> Result<Response, WebError> {
    if let Some(secret) = jar.get(SESSION_COOKIE).map(|c| c.value().to_string()) {
        state.app.session_close(&secret).await?;
    }
    let jar = jar.remove(Cookie::build(SESSION_COOKIE).path("/"));
    Ok((jar, Redirect::to("/login")).into_response())
}
