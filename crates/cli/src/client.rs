//! A small typed client of the REST API. Non-2xx answers become [`ApiFailure`] carrying the
//! server's message, which `yard` prints as it is.

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
}

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

    pub async fn post<B: Serialize, T: DeserializeOwned>(&self, path: &str, body: &B) -> anyhow::Result<T> {
        decode(self.send(self.request(Method::POST, path).json(body)).await?).await
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

    /// A URL the server gave: absolute as it is, relative against the server's URL.
    pub fn resolve(&self, url: &str) -> anyhow::Result<reqwest::Url> {
        let base = reqwest::Url::parse(&self.config.url)?;
        Ok(base.join(url)?)
    }

    /// A streaming GET (logs): the response, checked for errors, body not yet read.
    pub async fn get_stream(&self, path: &str) -> anyhow::Result<Response> {
        self.send(self.request(Method::GET, path)).await
    }

    async fn send(&self, request: RequestBuilder) -> anyhow::Result<Response> {
        let response = request
            .send()
            .await
            .map_err(|err| anyhow::anyhow!("cannot reach Trainyard at {}: {}", self.config.url, root_cause(&err)))?;
        if response.status().is_success() {
            return Ok(response);
        }
        let status = response.status();
        let text = response.text().await.unwrap_or_default();
        let failure = match serde_json::from_str::<ErrorBody>(&text) {
            Ok(body) => {
                ApiFailure { status, code: body.error.code, message: body.error.message, field: body.error.field }
            }
            Err(_) => {
                ApiFailure { status, code: "http".into(), message: format!("{status}: {}", text.trim()), field: None }
            }
        };
        Err(failure.into())
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
