//! The interactive sessions' proxy: `/sessions/{id}/...`, HTTP and WebSocket (any upgrade), to
//! the session's program on 127.0.0.1 at its attempt's port. See docs/sessions.md.
//!
//! The origin model: each session is served only on a host of its own, `s-<id>.<the server's
//! host>` (`s-<id>.localhost` when the server is reached by an IP address or `localhost`), never
//! on the dashboard's host: the browser keeps the notebook's scripts in an origin of their own,
//! which can read neither the dashboard nor another session. The browser authenticates with a
//! cookie of the session's own (host-only, `Path=/sessions/<id>/`, `HttpOnly`,
//! `SameSite=Strict`), which a one-time grant from the dashboard or `yard notebook` is exchanged
//! for at `/sessions/<id>/_trainyard/enter`. Before a request goes upstream the platform's
//! cookies and every `Authorization` header are removed; the session's own upstream secret is
//! sent instead.

use axum::body::Body;
use axum::extract::{Path, Request, State};
use axum::http::{HeaderMap, HeaderName, HeaderValue, StatusCode, Uri, header};
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use axum_extra::extract::cookie::{Cookie, CookieJar, SameSite};
use hyper_util::client::legacy::Client;
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::rt::TokioExecutor;
use trainyard_core::Error;
use trainyard_core::error::ObjectKind;
use uuid::Uuid;

use crate::app::interactive::SessionRoute;
use crate::http::AppState;
use crate::http::error::ApiError;
use crate::http::routes::RouteTable;

/// The session's own cookie, on the session's host and path only.
pub const SESSION_PROXY_COOKIE: &str = "trainyard_notebook";
/// Where a grant is exchanged for the cookie, under the session's path.
const ENTER_PATH: &str = "_trainyard/enter";

/// What the proxy sets on every proxied response (replacing the program's own): no plugins, no
/// framing by other origins, no `<base>` or form posts elsewhere. Scripts stay allowed (JupyterLab
/// is a script); what keeps them from other pages is the session's origin of its own. No
/// `sandbox`: without `allow-same-origin` JupyterLab cannot reach its own API or storage, and
/// with it a sandbox adds nothing.
const PROXIED_CONTENT_SECURITY_POLICY: &str =
    "object-src 'none'; base-uri 'self'; form-action 'self'; frame-ancestors 'self'";

pub fn routes() -> RouteTable {
    RouteTable::new()
        .route("/sessions/{id}/_trainyard/enter", get(session_enter))
        .route("/sessions/{id}/", proxied(session_proxy_root))
        .route("/sessions/{id}/{*path}", proxied(session_proxy))
}

/// The methods the proxy forwards (JupyterLab's; HEAD with GET). Others answer 405, as on
/// every route.
fn proxied<H, T>(handler: H) -> axum::routing::MethodRouter<AppState>
where
    H: axum::handler::Handler<T, AppState> + Clone,
    T: 'static,
{
    get(handler.clone()).post(handler.clone()).put(handler.clone()).patch(handler.clone()).delete(handler)
}

/// The host a session is served on, for a server reached at `host` (with its port, if any).
pub fn session_host(host: &str, id: Uuid) -> String {
    let (name, port) = match host.rsplit_once(':') {
        Some((name, _)) if !name.ends_with(']') && name.contains(':') => (host, None),
        Some((name, port)) if port.chars().all(|c| c.is_ascii_digit()) => (name, Some(port)),
        _ => (host, None),
    };
    let is_ip = name.parse::<std::net::IpAddr>().is_ok() || name.starts_with('[');
    let parent = if is_ip || name.eq_ignore_ascii_case("localhost") { "localhost" } else { name };
    match port {
        Some(port) => format!("s-{}.{parent}:{port}", id.simple()),
        None => format!("s-{}.{parent}", id.simple()),
    }
}

/// The session's origin (`http://s-<id>.<host>`), for a request that reached the server at its
/// `Host`.
pub fn session_origin(headers: &HeaderMap, id: Uuid) -> String {
    let host = headers.get(header::HOST).and_then(|h| h.to_str().ok()).unwrap_or("localhost");
    let scheme = if over_tls(headers) { "https" } else { "http" };
    format!("{scheme}://{}", session_host(host, id))
}

/// The link that opens a session in a browser, carrying a one-time grant.
pub fn session_link(headers: &HeaderMap, id: Uuid, grant: &str) -> String {
    format!("{}/sessions/{id}/{ENTER_PATH}?grant={grant}", session_origin(headers, id))
}

fn over_tls(headers: &HeaderMap) -> bool {
    headers.get("x-forwarded-proto").and_then(|v| v.to_str().ok()).is_some_and(|v| v.eq_ignore_ascii_case("https"))
}

/// Refuses a request for a session on any host but the session's own (a 404: on the
/// dashboard's host, no session exists).
fn on_session_host(headers: &HeaderMap, id: Uuid) -> Result<(), ApiError> {
    let host = headers.get(header::HOST).and_then(|h| h.to_str().ok()).unwrap_or_default();
    let prefix = format!("s-{}.", id.simple());
    if host.len() > prefix.len() && host[..prefix.len()].eq_ignore_ascii_case(&prefix) {
        Ok(())
    } else {
        Err(Error::NotFound { kind: ObjectKind::Session }.into())
    }
}

fn session_id(text: &str) -> Result<Uuid, ApiError> {
    Uuid::parse_str(text).map_err(|_| Error::NotFound { kind: ObjectKind::Session }.into())
}

#[derive(serde::Deserialize)]
struct EnterQuery {
    /// Missing: refused as an unknown grant is (401), not as bad input.
    #[serde(default)]
    grant: String,
}

/// Exchanges the link's grant for the session's cookie and goes on to the session.
async fn session_enter(
    State(state): State<AppState>,
    Path(id): Path<String>,
    headers: HeaderMap,
    jar: CookieJar,
    crate::http::extract::ApiQuery(query): crate::http::extract::ApiQuery<EnterQuery>,
) -> Result<Response, ApiError> {
    let id = session_id(&id)?;
    on_session_host(&headers, id)?;
    let cookie = state.app.session_enter(id, &query.grant).await?;
    let cookie = Cookie::build((SESSION_PROXY_COOKIE, cookie))
        .path(format!("/sessions/{id}/"))
        .http_only(true)
        .same_site(SameSite::Strict)
        .secure(over_tls(&headers))
        .build();
    // A page of the session's origin moves on, not a redirect: a navigation that began on the
    // dashboard (another site) would not carry a SameSite=Strict cookie, even after a redirect.
    let lab = format!("/sessions/{id}/lab");
    let page = format!(
        "<!doctype html><meta charset=\"utf-8\"><meta http-equiv=\"refresh\" content=\"0;url={lab}\">\
         <title>Opening the notebook</title><p>Opening <a href=\"{lab}\">the notebook</a>…</p>"
    );
    Ok((jar.add(cookie), axum::response::Html(page)).into_response())
}

async fn session_proxy_root(
    state: State<AppState>,
    Path(id): Path<String>,
    request: Request,
) -> Result<Response, ApiError> {
    proxy(state, id, request).await
}

async fn session_proxy(
    state: State<AppState>,
    Path((id, _rest)): Path<(String, String)>,
    request: Request,
) -> Result<Response, ApiError> {
    proxy(state, id, request).await
}

async fn proxy(State(state): State<AppState>, id: String, mut request: Request) -> Result<Response, ApiError> {
    let id = session_id(&id)?;
    on_session_host(request.headers(), id)?;
    let jar = CookieJar::from_headers(request.headers());
    let cookie = jar.get(SESSION_PROXY_COOKIE).map(|c| c.value().to_string());
    let (port, secret) = match state.app.session_route(id, cookie.as_deref()).await? {
        SessionRoute::Forward { port, secret } => (port, secret),
        SessionRoute::NotRunning(job_state) => {
            return Err(Error::Conflict(format!(
                "the session is {job_state}, not running: it answers once it runs (yard wait {id})"
            ))
            .into());
        }
    };
    let upgrade = request.headers().contains_key(header::UPGRADE).then(|| hyper::upgrade::on(&mut request));
    let path_and_query = request.uri().path_and_query().map(|p| p.as_str()).unwrap_or("/").to_string();
    let uri: Uri = format!("http://127.0.0.1:{port}{path_and_query}").parse().map_err(Error::internal)?;
    let (mut parts, body) = request.into_parts();
    parts.uri = uri;
    upstream_headers(&mut parts.headers, &secret, upgrade.is_some());
    let upstream_request = hyper::Request::from_parts(parts, body);
    let mut response = state.sessions.request(upstream_request).await.map_err(|err| {
        tracing::debug!(session = %id, %err, "the session's program did not answer");
        Error::Unavailable("the session's program does not answer (yet); try again in a moment".into())
    })?;
    if response.status() == StatusCode::SWITCHING_PROTOCOLS
        && let Some(client_side) = upgrade
    {
        let upstream_side = hyper::upgrade::on(&mut response);
        tokio::spawn(async move {
            let (Ok(client), Ok(upstream)) = (client_side.await, upstream_side.await) else { return };
            let mut client = hyper_util::rt::TokioIo::new(client);
            let mut upstream = hyper_util::rt::TokioIo::new(upstream);
            let _ = tokio::io::copy_bidirectional(&mut client, &mut upstream).await;
        });
    }
    let (mut parts, body) = response.into_parts();
    downstream_headers(&mut parts.headers, parts.status == StatusCode::SWITCHING_PROTOCOLS);
    Ok(Response::from_parts(parts, Body::new(body)))
}

/// Headers that belong to one connection, not to the request (RFC 9110, 7.6.1).
const HOP_BY_HOP: [&str; 8] = [
    "connection",
    "keep-alive",
    "proxy-authenticate",
    "proxy-authorization",
    "proxy-connection",
    "te",
    "trailer",
    "transfer-encoding",
];

/// The request as the session's program gets it: no platform cookie (nor the session's own), no
/// `Authorization` but the upstream secret, no hop-by-hop headers (an upgrade's kept).
fn upstream_headers(headers: &mut HeaderMap, secret: &str, upgrade: bool) {
    strip_hop_by_hop(headers, upgrade);
    headers.remove(header::AUTHORIZATION);
    let kept: Vec<String> = headers
        .get_all(header::COOKIE)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .flat_map(|v| v.split(';'))
        .map(str::trim)
        .filter(|pair| !pair.is_empty() && !pair.to_ascii_lowercase().starts_with("trainyard_"))
        .map(str::to_string)
        .collect();
    headers.remove(header::COOKIE);
    if !kept.is_empty()
        && let Ok(value) = HeaderValue::from_str(&kept.join("; "))
    {
        headers.insert(header::COOKIE, value);
    }
    if let Ok(value) = HeaderValue::from_str(&format!("token {secret}")) {
        headers.insert(header::AUTHORIZATION, value);
    }
}

fn downstream_headers(headers: &mut HeaderMap, upgrade: bool) {
    strip_hop_by_hop(headers, upgrade);
    headers.insert(header::CONTENT_SECURITY_POLICY, HeaderValue::from_static(PROXIED_CONTENT_SECURITY_POLICY));
}

fn strip_hop_by_hop(headers: &mut HeaderMap, upgrade: bool) {
    // Names the Connection header lists are this connection's too.
    let listed: Vec<HeaderName> = headers
        .get_all(header::CONNECTION)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .flat_map(|v| v.split(','))
        .filter_map(|name| HeaderName::from_bytes(name.trim().as_bytes()).ok())
        .filter(|name| !(upgrade && name == header::UPGRADE))
        .collect();
    for name in listed {
        headers.remove(name);
    }
    for name in HOP_BY_HOP {
        headers.remove(name);
    }
    if upgrade {
        headers.insert(header::CONNECTION, HeaderValue::from_static("upgrade"));
    } else {
        headers.remove(header::UPGRADE);
    }
}

/// The client the proxy forwards with: HTTP/1.1 to 127.0.0.1, connections kept for reuse.
pub type SessionClient = Client<HttpConnector, Body>;

pub fn session_client() -> SessionClient {
    Client::builder(TokioExecutor::new()).build_http()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sessions_get_a_host_of_their_own_beside_the_servers() {
        let id = Uuid::nil();
        let s = "s-00000000000000000000000000000000";
        assert_eq!(session_host("127.0.0.1:8080", id), format!("{s}.localhost:8080"));
        assert_eq!(session_host("localhost:8080", id), format!("{s}.localhost:8080"));
        assert_eq!(session_host("[::1]:8080", id), format!("{s}.localhost:8080"));
        assert_eq!(session_host("yard.example.org", id), format!("{s}.yard.example.org"));
    }

    #[test]
    fn user_code_gets_neither_platform_cookies_nor_tokens() {
        let mut headers = HeaderMap::new();
        headers.insert(header::AUTHORIZATION, HeaderValue::from_static("Bearer tyd_secret"));
        headers.insert(header::COOKIE, HeaderValue::from_static("trainyard_session=a; _xsrf=b; trainyard_notebook=c"));
        headers.insert(header::CONNECTION, HeaderValue::from_static("keep-alive, x-private"));
        headers.insert("x-private", HeaderValue::from_static("1"));
        upstream_headers(&mut headers, "up", false);
        assert_eq!(headers.get(header::AUTHORIZATION).unwrap(), "token up");
        assert_eq!(headers.get(header::COOKIE).unwrap(), "_xsrf=b");
        assert!(headers.get("x-private").is_none() && headers.get(header::CONNECTION).is_none());
    }
}
