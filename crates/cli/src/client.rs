//! A small typed client of the REST API. Non-2xx answers become [`ApiFailure`] carrying the
//! server's message, which `yard` prints as it is.

use std::time::Duration;

use anyhow::Context;

use reqwest::{Method, RequestBuilder, Response, StatusCode};
use serde::Serialize;
use serde::de::DeserializeOwned;
use trainyard_core::api::ErrorBody;

use crate::config::Config;

#[derive(Debug, thiserror::Error)]
#[error("{message}")]
pub struct ApiFailure {
    pub status: StatusCode,
    pub code: String,
    pub message: String,
    pub field: Option<String>,
    /// Every input the server refused, with why (`invalid_input`): printed one a line.
    pub problems: Vec<trainyard_core::error::FieldProblem>,
}

/// How many more times a request the server answered 503 (its database away, or too busy) is
/// sent, and the longest wait before one: about 15 s in all, the length of a database failover.
const RETRIES: u32 = 4;
const RETRY_WAIT_MAX: Duration = Duration::from_secs(8);

pub struct Client {
    http: reqwest::Client,
    config: Config,
}

impl Client {
    pub fn new(config: Config) -> anyhow::Result<Client> {
        let http = reqwest::Client::builder()
            .user_agent(concat!("yard/", env!("CARGO_PKG_VERSION")))
            .connect_timeout(std::time::Duration::from_secs(10))
            .build()?;
        Ok(Client { http, config })
    }

    fn request(&self, method: Method, path: &str) -> RequestBuilder {
        self.http.request(method, format!("{}{path}", self.config.url)).bearer_auth(&self.config.token)
    }

    pub async fn get<T: DeserializeOwned>(&self, path: &str) -> anyhow::Result<T> {
        decode(self.send(self.request(Method::GET, path)).await?).await
    }

    /// GET of a body to stream (a checkpoint's file): the answer itself, its status a success.
    pub async fn get_streamed(&self, path: &str) -> anyhow::Result<Response> {
        self.send(self.request(Method::GET, path)).await
    }

    pub async fn post<B: Serialize, T: DeserializeOwned>(&self, path: &str, body: &B) -> anyhow::Result<T> {
        decode(self.send(self.request(Method::POST, path).json(body)).await?).await
    }

    /// POST of a body that carries an idempotency key (a submit): sending it again returns what
    /// the first did, so a 503 is retried as an idempotent method's is.
    pub async fn post_idempotent<B: Serialize, T: DeserializeOwned>(&self, path: &str, body: &B) -> anyhow::Result<T> {
        decode(self.send_retrying(self.request(Method::POST, path).json(body), true).await?).await
    }

    /// The job a full id or a short one (its first hex digits, at least 6) names, among the
    /// caller's tenant's jobs: `yard logs 01a20b11` as well as the whole id. An ambiguous or
    /// unknown prefix is an error that says which.
    pub async fn job_id(&self, text: &str) -> anyhow::Result<uuid::Uuid> {
        if let Ok(id) = uuid::Uuid::parse_str(text) {
            return Ok(id);
        }
        let query = serde_urlencoded::to_string([("id_prefix", text), ("limit", "3")])?;
        let page: trainyard_core::api::JobPage = self.get(&format!("/api/v1/jobs?{query}")).await?;
        match page.items.as_slice() {
            [job] => Ok(job.id),
            [] => anyhow::bail!("no job of your tenant has an id starting with {text}"),
            several => {
                let ids: Vec<String> = several.iter().map(|j| j.id.to_string()).collect();
                anyhow::bail!("{text} is ambiguous: it starts {} ...; give more of the id", ids.join(", "))
            }
        }
    }

    /// PUT with a JSON body; the JSON answer decoded.
    pub async fn put_json<B: Serialize, T: DeserializeOwned>(&self, path: &str, body: &B) -> anyhow::Result<T> {
        decode(self.send(self.request(Method::PUT, path).json(body)).await?).await
    }

    /// PUT or PATCH with a JSON body; the answer's body (if any) is not needed.
    pub async fn put<B: Serialize>(&self, path: &str, body: &B) -> anyhow::Result<()> {
        self.send(self.request(Method::PUT, path).json(body)).await?;
        Ok(())
    }

    pub async fn patch<B: Serialize>(&self, path: &str, body: &B) -> anyhow::Result<()> {
        self.send(self.request(Method::PATCH, path).json(body)).await?;
        Ok(())
    }

    /// DELETE; the JSON answer decoded.
    pub async fn delete_json<T: DeserializeOwned>(&self, path: &str) -> anyhow::Result<T> {
        decode(self.send(self.request(Method::DELETE, path)).await?).await
    }

    pub async fn delete(&self, path: &str) -> anyhow::Result<()> {
        self.send(self.request(Method::DELETE, path)).await?;
        Ok(())
    }

    /// PUT of a streamed body (an artefact); the JSON answer decoded.
    pub async fn put_body<T: DeserializeOwned>(&self, path: &str, body: reqwest::Body, len: u64) -> anyhow::Result<T> {
        let request = self
            .request(Method::PUT, path)
            .header(reqwest::header::CONTENT_TYPE, "application/octet-stream")
            .header(reqwest::header::CONTENT_LENGTH, len)
            .body(body);
        decode(self.send(request).await?).await
    }

    /// PUT of a file's bytes streamed from disk (a dataset's shard, an artefact); the JSON answer
    /// decoded. `bar` counts the bytes sent. A 503 is retried as [`Client::send`] retries, the
    /// file read again from its start (a streamed body cannot be sent twice) and the failed
    /// try's bytes taken back from `bar`.
    pub async fn put_file<T: DeserializeOwned>(
        &self,
        path: &str,
        file: &std::path::Path,
        len: u64,
        bar: &indicatif::ProgressBar,
    ) -> anyhow::Result<T> {
        use futures::StreamExt;
        use std::sync::Arc;
        use std::sync::atomic::{AtomicU64, Ordering};
        let mut tries = 0;
        loop {
            let handle = tokio::fs::File::open(file).await.with_context(|| format!("opening {}", file.display()))?;
            let sent = Arc::new(AtomicU64::new(0));
            let (counted, counter) = (bar.clone(), Arc::clone(&sent));
            let stream = tokio_util::io::ReaderStream::new(handle).inspect(move |chunk| {
                if let Ok(bytes) = chunk {
                    counted.inc(bytes.len() as u64);
                    counter.fetch_add(bytes.len() as u64, Ordering::Relaxed);
                }
            });
            match self.put_body(path, reqwest::Body::wrap_stream(stream), len).await {
                Err(err)
                    if tries < RETRIES
                        && err
                            .downcast_ref::<ApiFailure>()
                            .is_some_and(|f| f.status == StatusCode::SERVICE_UNAVAILABLE) =>
                {
                    tries += 1;
                    bar.dec(sent.load(Ordering::Relaxed));
                    let wait = backoff(Duration::from_secs(1), tries);
                    bar.suspend(|| {
                        eprintln!(
                            "yard: {} ({err}); trying again in {} ({tries} of {RETRIES})",
                            file.display(),
                            humantime::format_duration(wait)
                        );
                    });
                    tokio::time::sleep(wait).await;
                }
                outcome => return outcome,
            }
        }
    }

    /// A URL the server gave: absolute as it is, relative against the server's URL.
    pub fn resolve(&self, url: &str) -> anyhow::Result<reqwest::Url> {
        let base = reqwest::Url::parse(&self.config.url)?;
        Ok(base.join(url)?)
    }

    /// A streaming GET (logs): the response, checked for errors, body not yet read.
    pub async fn get_stream(&self, path: &str) -> anyhow::Result<Response> {
        self.send(self.request(Method::GET, path)).await
    }

    /// Sends the request; a 503 answer to a request that may be sent again (GET, PUT, DELETE,
    /// with a body that is not a stream) is retried after the server's `Retry-After`, doubling,
    /// saying so on standard error. Any other failure is an [`ApiFailure`].
    async fn send(&self, request: RequestBuilder) -> anyhow::Result<Response> {
        self.send_retrying(request, false).await
    }

    /// [`Client::send`], retrying a POST too when `keyed` (its body has an idempotency key).
    async fn send_retrying(&self, request: RequestBuilder, keyed: bool) -> anyhow::Result<Response> {
        let request = request.build()?;
        let mut tries = 0;
        let mut next = request.try_clone().filter(|_| keyed || is_idempotent(request.method()));
        let mut response = self.execute(request).await?;
        while response.status() == StatusCode::SERVICE_UNAVAILABLE
            && tries < RETRIES
            && let Some(again) = next.take()
        {
            tries += 1;
            let wait = retry_wait(&response, tries);
            let failure = failure_of(response).await;
            eprintln!("yard: {failure}; trying again in {} ({tries} of {RETRIES})", humantime::format_duration(wait));
            tokio::time::sleep(wait).await;
            next = again.try_clone();
            response = self.execute(again).await?;
        }
        if response.status().is_success() {
            return Ok(response);
        }
        Err(failure_of(response).await.into())
    }

    async fn execute(&self, request: reqwest::Request) -> anyhow::Result<Response> {
        self.http
            .execute(request)
            .await
            .map_err(|err| anyhow::anyhow!("cannot reach Trainyard at {}: {}", self.config.url, root_cause(&err)))
    }
}

/// Whether sending the request twice does what sending it once does.
fn is_idempotent(method: &Method) -> bool {
    matches!(*method, Method::GET | Method::HEAD | Method::PUT | Method::DELETE)
}

/// How long to wait before try `tries` (1-based): the server's `Retry-After` (seconds) or half a
/// second, doubled for each try before, at most [`RETRY_WAIT_MAX`].
fn retry_wait(response: &Response, tries: u32) -> Duration {
    let asked = response
        .headers()
        .get(reqwest::header::RETRY_AFTER)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.trim().parse::<u64>().ok())
        .map_or(Duration::from_millis(500), Duration::from_secs);
    backoff(asked, tries)
}

/// `first`, doubled for each try before try `tries` (1-based), at most [`RETRY_WAIT_MAX`].
fn backoff(first: Duration, tries: u32) -> Duration {
    (first * 2u32.saturating_pow(tries.saturating_sub(1))).min(RETRY_WAIT_MAX)
}

/// The server's error answer as an [`ApiFailure`].
async fn failure_of(response: Response) -> ApiFailure {
    let status = response.status();
    let text = response.text().await.unwrap_or_default();
    match serde_json::from_str::<ErrorBody>(&text) {
        Ok(body) => ApiFailure {
            status,
            code: body.error.code,
            message: body.error.message,
            field: body.error.field,
            problems: body.error.errors,
        },
        Err(_) => ApiFailure {
            status,
            code: "http".into(),
            message: format!("{status}: {}", text.trim()),
            field: None,
            problems: Vec::new(),
        },
    }
}

async fn decode<T: DeserializeOwned>(response: Response) -> anyhow::Result<T> {
    let bytes = response.bytes().await?;
    serde_json::from_slice(&bytes).map_err(|err| anyhow::anyhow!("unexpected answer from the server: {err}"))
}

fn root_cause(err: &(dyn std::error::Error + 'static)) -> String {
    let mut cause = err;
    while let Some(source) = cause.source() {
        cause = source;
    }
    cause.to_string()
}
