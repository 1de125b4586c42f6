//! The node cache agent (`trainyard cache-agent`): the shard cache of one Kubernetes node,
//! shared by every job on it (issue 23).
//!
//! On the local executor every replica reaches the machine's cache folder itself. A pod cannot:
//! tenant namespaces run under Pod Security "restricted", which forbids a hostPath. So the
//! platform runs this agent on each node (a DaemonSet in a namespace of its own, with the node's
//! cache folder as a hostPath), and pods read their dataset files from it instead of from the
//! server (`TRAINYARD_DATASET_URL`, the agent's node-local Service). It speaks the server's
//! protocol for those files, so the engine reads the same way from either.
//!
//! For every request, whatever the cache holds, the agent first asks the server, with the job's
//! own token, whether the job may read the file (`HEAD` of the same path): the server answers
//! as it would for the file itself (404 for another tenant's dataset, a version the job does not
//! read, a token no longer live), and names the copy: the version's tenant and content hash, a
//! shard's SHA-256 and size. Copies are kept per tenant (`<tenant id>/...`), so a tenant reads
//! only copies its own jobs fetched, and only of files the server lets it read. The agent holds
//! no credential of its own.
//!
//! The cache's layout and eviction are the engine's (`templates/pytorch-ddp/engine/cache.py`):
//! shards at `<tenant>/<sha[:2]>/<sha>`, indexes at `<tenant>/indexes/<content hash>/<name>`,
//! recency the access time; over its budget the least recently used copies no request is
//! reading go first ([`trainyard_executor::local::cache_sweep`]: a copy being served holds a
//! shared `flock`). A fill streams to a temporary file in the same folder and to the request
//! that asked for it, checks a shard's size and SHA-256 against the manifest's (the request gets
//! the last piece only then), syncs and renames: a crash never leaves a partial copy under a
//! copy's name. Every shard served is hashed again on its way out; a copy damaged
//! on disk ends its response early (the engine tries again) and is dropped, so the next request
//! fetches it anew. Manifests are passed through, never cached (a few kilobytes).

use std::collections::hash_map::DefaultHasher;
use std::hash::{Hash, Hasher};
use std::os::unix::fs::{DirBuilderExt, MetadataExt};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};

use axum::Router;
use axum::body::Body;
use axum::body::Bytes;
use axum::extract::{Path as UrlPath, State};
use axum::http::{HeaderMap, HeaderValue, StatusCode, header};
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use futures::{Stream, StreamExt};
use nix::fcntl::{Flock, FlockArg};
use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::registry::Registry;
use sha2::{Digest, Sha256};
use tokio::io::AsyncWriteExt;
use trainyard_core::api::dataset_headers::{CONTENT_HEADER, KIND_HEADER, SHA256_HEADER, TENANT_HEADER};
use trainyard_core::api::{ErrorBody, ErrorDetail};
use trainyard_core::job::is_sha256_hex;
use uuid::Uuid;

/// Fills that may run at once for different files; two requests for one file share its fill.
const FILL_STRIPES: usize = 256;
/// Read and send a copy in pieces of this size.
const CHUNK: usize = 1 << 20;
/// The response header saying whether the copy was in the cache (`hit`) or fetched (`miss`).
pub const CACHE_HEADER: &str = "x-trainyard-cache";

/// What the agent needs to run.
#[derive(Debug, Clone)]
pub struct AgentConfig {
    /// The node's cache folder (the DaemonSet's hostPath).
    pub dir: PathBuf,
    /// The server's URL as the agent reaches it.
    pub server: String,
    /// The most bytes the cache keeps of copies no request is reading.
    pub budget_bytes: u64,
    /// The most one tenant's copies may take of it (its own least recently used go first), so
    /// that no tenant's data evicts everyone else's. None: no share of its own.
    pub tenant_budget_bytes: Option<u64>,
}

/// The agent's state, shared by its requests.
pub struct Agent {
    config: AgentConfig,
    server: reqwest::Url,
    client: reqwest::Client,
    fills: Vec<tokio::sync::Mutex<()>>,
    sweeping: AtomicBool,
    metrics: AgentMetrics,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct Outcome {
    outcome: &'static str,
}

/// The agent's `/metrics`.
struct AgentMetrics {
    registry: Registry,
    requests: Family<Outcome, Counter>,
    origin_bytes: Counter,
    served_bytes: Counter,
    damaged: Counter,
    cache_bytes: Gauge,
}

impl AgentMetrics {
    fn new() -> AgentMetrics {
        let mut registry = Registry::with_prefix("trainyard_cache_agent");
        let metrics = AgentMetrics {
            requests: Family::default(),
            origin_bytes: Counter::default(),
            served_bytes: Counter::default(),
            damaged: Counter::default(),
            cache_bytes: Gauge::default(),
            registry: Registry::default(),
        };
        registry.register(
            "requests",
            "Requests for dataset files, by outcome: hit, miss (fetched from the server), manifest (passed through), refused (by the server), failed",
            metrics.requests.clone(),
        );
        registry.register(
            "origin_bytes",
            "Bytes of shards and indexes fetched from the server",
            metrics.origin_bytes.clone(),
        );
        registry.register(
            "served_bytes",
            "Bytes of cached shards and indexes sent to jobs",
            metrics.served_bytes.clone(),
        );
        registry.register("damaged", "Cached copies found damaged on disk and dropped", metrics.damaged.clone());
        registry.register("cache_bytes", "Bytes the cache held after its last sweep", metrics.cache_bytes.clone());
        AgentMetrics { registry, ..metrics }
    }

    fn count(&self, outcome: &'static str) {
        self.requests.get_or_create(&Outcome { outcome }).inc();
    }
}

/// What the server said of a file a job asked for.
#[derive(Debug, Clone, PartialEq, Eq)]
struct Facts {
    tenant: Uuid,
    content_hex: String,
    kind: Kind,
}

#[derive(Debug, Clone, PartialEq, Eq)]
enum Kind {
    Manifest,
    Shard { sha256: String, size: u64 },
    Index,
}

/// How a fill begins, for the request that started it.
enum Begin {
    /// Another request filled it meanwhile: the copy, opened and held.
    Copy(Copy),
    /// The bytes follow as they come from the server (its size, when known).
    Streaming(Option<u64>),
    /// The server refused, or could not be reached: the answer to pass on.
    Refused(Response),
}

impl Agent {
    /// The agent for `config`, its cache folder made and cleared of fills a crash left.
    pub fn new(config: AgentConfig) -> anyhow::Result<Arc<Agent>> {
        std::fs::DirBuilder::new().recursive(true).mode(0o700).create(&config.dir)?;
        remove_abandoned_fills(&config.dir);
        let server = reqwest::Url::parse(&config.server)
            .ok()
            .filter(|url| !url.cannot_be_a_base() && matches!(url.scheme(), "http" | "https"))
            .ok_or_else(|| anyhow::anyhow!("--server {:?} is not an http(s) URL", config.server))?;
        let client = reqwest::Client::builder()
            .connect_timeout(std::time::Duration::from_secs(10))
            // A token goes only where it was sent.
            .redirect(reqwest::redirect::Policy::none())
            .build()?;
        Ok(Arc::new(Agent {
            config,
            server,
            client,
            fills: (0..FILL_STRIPES).map(|_| tokio::sync::Mutex::new(())).collect(),
            sweeping: AtomicBool::new(false),
            metrics: AgentMetrics::new(),
        }))
    }

    /// The agent's routes: the server's dataset-file path, `/healthz` and `/metrics`.
    pub fn router(self: &Arc<Agent>) -> Router {
        Router::new()
            .route("/api/v1/datasets/{name}/{version}/files/{file}", get(dataset_file))
            .route("/healthz", get(|| async { "ok" }))
            .route("/metrics", get(metrics))
            .with_state(self.clone())
    }

    /// The server's URL of the file, each part escaped as a path segment.
    fn file_url(&self, name: &str, version: &str, file: &str) -> String {
        let mut url = self.server.clone();
        if let Ok(mut segments) = url.path_segments_mut() {
            segments.pop_if_empty().extend(["api", "v1", "datasets", name, version, "files", file]);
        }
        url.to_string()
    }

    /// Asks the server whether the token's job may read the file, and what the file is.
    async fn describe(&self, url: &str, authorization: &HeaderValue) -> Result<Facts, Response> {
        let answer = self
            .client
            .head(url)
            .header(header::AUTHORIZATION, authorization.clone())
            .send()
            .await
            .map_err(|err| unavailable(format!("the Trainyard server did not answer: {err}")))?;
        let status = answer.status();
        if !status.is_success() {
            self.metrics.count("refused");
            return Err(refused(status));
        }
        facts_of(answer.headers()).map_err(|why| unavailable(format!("the Trainyard server's answer: {why}")))
    }

    /// Passes a file through from the server, as it comes.
    async fn pass_through(&self, url: &str, authorization: &HeaderValue) -> Response {
        let answer = match self.client.get(url).header(header::AUTHORIZATION, authorization.clone()).send().await {
            Ok(answer) if answer.status().is_success() => answer,
            Ok(answer) => return refused(answer.status()),
            Err(err) => return unavailable(format!("the Trainyard server did not answer: {err}")),
        };
        self.metrics.count("manifest");
        let mut response = Body::from_stream(answer.bytes_stream()).into_response();
        response.headers_mut().insert(header::CONTENT_TYPE, HeaderValue::from_static("application/octet-stream"));
        response
    }

    /// Where the copy of a file lives in the cache.
    fn copy_path(&self, facts: &Facts, file: &str) -> PathBuf {
        let tenant = self.config.dir.join(facts.tenant.to_string());
        match &facts.kind {
            Kind::Shard { sha256, .. } => tenant.join(&sha256[..2]).join(sha256),
            Kind::Index | Kind::Manifest => tenant.join("indexes").join(&facts.content_hex).join(file),
        }
    }

    /// The cached copy of a shard or index; when the cache lacks it, the file as it is fetched
    /// from the server, written to the cache on the way.
    async fn cached(self: &Arc<Agent>, facts: Facts, file: &str, url: String, authorization: HeaderValue) -> Response {
        let path = self.copy_path(&facts, file);
        let (expected_size, check) = match &facts.kind {
            Kind::Shard { size, sha256 } => (Some(*size), Some(sha256.clone())),
            _ => (None, None),
        };
        if let Some(copy) = open_whole(path.clone(), expected_size).await {
            self.metrics.count("hit");
            return self.serve(copy, check, "hit");
        }
        // The fill is a task of its own: a job that goes away mid-fill leaves a whole copy for
        // the next. It says how it begins, then sends the bytes as they come.
        let (begin, begun) = tokio::sync::oneshot::channel();
        let (chunks, chunks_out) = tokio::sync::mpsc::channel(4);
        let agent = self.clone();
        tokio::spawn(async move { agent.fill_once(path, facts, url, authorization, begin, chunks).await });
        match begun.await {
            // Filled by another request while this one waited for its turn.
            Ok(Begin::Copy(copy)) => {
                self.metrics.count("hit");
                self.serve(copy, check, "hit")
            }
            Ok(Begin::Streaming(size)) => {
                self.metrics.count("miss");
                let body = futures::stream::unfold(chunks_out, |mut chunks| async move {
                    chunks.recv().await.map(|chunk| (chunk, chunks))
                });
                let mut response = Body::from_stream(body).into_response();
                let headers = response.headers_mut();
                headers.insert(header::CONTENT_TYPE, HeaderValue::from_static("application/octet-stream"));
                if let Some(size) = size {
                    headers.insert(header::CONTENT_LENGTH, HeaderValue::from(size));
                }
                headers.insert(header::CACHE_CONTROL, HeaderValue::from_static("private, no-store"));
                headers.insert(CACHE_HEADER, HeaderValue::from_static("miss"));
                response
            }
            Ok(Begin::Refused(response)) => response,
            Err(_) => unavailable("the fill stopped before it began".into()),
        }
    }

    /// Fetches a file into the cache unless another request did while this one waited for its
    /// turn (then the copy, opened and held, is what `begin` gets).
    async fn fill_once(
        self: Arc<Agent>,
        path: PathBuf,
        facts: Facts,
        url: String,
        authorization: HeaderValue,
        begin: tokio::sync::oneshot::Sender<Begin>,
        chunks: tokio::sync::mpsc::Sender<std::io::Result<Bytes>>,
    ) {
        let expected_size = match &facts.kind {
            Kind::Shard { size, .. } => Some(*size),
            _ => None,
        };
        let _turn = self.fills[stripe(&path)].lock().await;
        if let Some(copy) = open_whole(path.clone(), expected_size).await {
            let _ = begin.send(Begin::Copy(copy));
            return;
        }
        if self.fill(&path, &facts, &url, &authorization, begin, chunks).await {
            self.sweep_soon(facts.tenant);
        }
    }

    /// Streams a file from the server into a temporary file beside its copy's name, and to the
    /// request that asked for it as long as it listens; checks it, syncs it and gives it the
    /// name. A shard's last piece reaches the request only once its size and SHA-256 are the
    /// manifest's: one that is not never arrives whole. True when the copy was kept.
    async fn fill(
        &self,
        path: &Path,
        facts: &Facts,
        url: &str,
        authorization: &HeaderValue,
        begin: tokio::sync::oneshot::Sender<Begin>,
        chunks: tokio::sync::mpsc::Sender<std::io::Result<Bytes>>,
    ) -> bool {
        let answer = match self.client.get(url).header(header::AUTHORIZATION, authorization.clone()).send().await {
            Ok(answer) if answer.status().is_success() => answer,
            Ok(answer) => {
                let _ = begin.send(Begin::Refused(refused(answer.status())));
                return false;
            }
            Err(err) => {
                let _ = begin.send(Begin::Refused(unavailable(format!("the Trainyard server did not answer: {err}"))));
                return false;
            }
        };
        let folder = path.parent().expect("a copy's path has a folder");
        let temporary = folder.join(format!(".fill-{}", Uuid::new_v4()));
        let out = match std::fs::DirBuilder::new().recursive(true).mode(0o700).create(folder) {
            Ok(()) => tokio::fs::File::create(&temporary).await,
            Err(err) => Err(err),
        };
        let mut out = match out {
            Ok(out) => out,
            Err(err) => {
                let _ = begin.send(Begin::Refused(unavailable(format!("making room in the node's cache: {err}"))));
                return false;
            }
        };
        let expected = match &facts.kind {
            Kind::Shard { sha256, size } => Some((sha256.as_str(), *size)),
            _ => None,
        };
        let mut listening =
            begin.send(Begin::Streaming(expected.map(|(_, size)| size).or(answer.content_length()))).is_ok();
        let forward = async |chunk: std::io::Result<Bytes>, listening: &mut bool| {
            if *listening {
                if let Ok(bytes) = &chunk {
                    self.metrics.served_bytes.inc_by(bytes.len() as u64);
                }
                *listening = chunks.send(chunk).await.is_ok();
            }
        };
        let mut hasher = Sha256::new();
        let mut size = 0u64;
        let mut held: Option<Bytes> = None;
        let mut body = answer.bytes_stream();
        let written = loop {
            let chunk = match body.next().await {
                None => break out.sync_all().await,
                Some(Err(err)) => break Err(std::io::Error::other(err)),
                Some(Ok(chunk)) => chunk,
            };
            hasher.update(&chunk);
            size += chunk.len() as u64;
            self.metrics.origin_bytes.inc_by(chunk.len() as u64);
            if let Err(err) = out.write_all(&chunk).await {
                break Err(err);
            }
            // A shard's latest piece waits for the next (or for the check at the end).
            let ready = if expected.is_some() { held.replace(chunk) } else { Some(chunk) };
            if let Some(ready) = ready {
                forward(Ok(ready), &mut listening).await;
            }
        };
        let sha256 = hex::encode(hasher.finalize());
        let failure = match (written, expected) {
            (Err(err), _) => Some(format!("fetching the file into the node's cache: {err}")),
            (Ok(()), Some((want, want_size))) if want != sha256 || want_size != size => Some(format!(
                "the server sent {size} bytes of SHA-256 {sha256} for a shard its manifest gives as {want_size} bytes of {want}"
            )),
            (Ok(()), _) => None,
        };
        if let Some(why) = failure {
            tracing::warn!("{why}");
            let _ = std::fs::remove_file(&temporary);
            forward(Err(std::io::Error::other(why)), &mut listening).await;
            return false;
        }
        if let Some(last) = held {
            forward(Ok(last), &mut listening).await;
        }
        let (temporary, path) = (temporary.clone(), path.to_path_buf());
        let named = tokio::task::spawn_blocking(move || -> std::io::Result<()> {
            std::fs::rename(&temporary, &path)?;
            if let Some(folder) = path.parent() {
                std::fs::File::open(folder)?.sync_all()?;
            }
            Ok(())
        })
        .await;
        match named {
            Ok(Ok(())) => true,
            Ok(Err(err)) => {
                tracing::warn!(%err, "keeping a file in the node's cache");
                false
            }
            Err(err) => {
                tracing::warn!(%err, "keeping a file in the node's cache");
                false
            }
        }
    }

    /// Brings the tenant that just filled a copy within its share, then the cache within its
    /// budget, off the request path, one sweep at a time.
    fn sweep_soon(self: &Arc<Agent>, tenant: Uuid) {
        use trainyard_executor::local::cache_sweep;
        if let Some(share) = self.config.tenant_budget_bytes {
            let dir = self.config.dir.clone();
            tokio::task::spawn_blocking(move || cache_sweep::sweep_namespace(&dir, &tenant.to_string(), share));
        }
        if self.sweeping.swap(true, Ordering::AcqRel) {
            return;
        }
        let agent = self.clone();
        tokio::task::spawn_blocking(move || {
            let swept = cache_sweep::sweep(&agent.config.dir, agent.config.budget_bytes);
            agent.metrics.cache_bytes.set(i64::try_from(swept.bytes_left).unwrap_or(i64::MAX));
            if swept.evicted > 0 {
                tracing::info!(evicted = swept.evicted, bytes_left = swept.bytes_left, "cache swept to its budget");
            }
            agent.sweeping.store(false, Ordering::Release);
        });
    }

    /// A copy's bytes, hashed again on the way out when it is a shard.
    fn serve(self: &Arc<Agent>, copy: Copy, sha256: Option<String>, outcome: &'static str) -> Response {
        let reader = match copy.file.try_clone() {
            Ok(file) => tokio::fs::File::from_std(file),
            Err(err) => return unavailable(format!("reading the node's cached copy: {err}")),
        };
        let size = copy.size;
        let serving = Serving {
            reader: tokio_util::io::ReaderStream::with_capacity(reader, CHUNK),
            check: sha256.map(|sha| (Sha256::new(), sha)),
            copy,
            agent: self.clone(),
        };
        let mut response = Body::from_stream(serving.into_stream()).into_response();
        let headers = response.headers_mut();
        headers.insert(header::CONTENT_TYPE, HeaderValue::from_static("application/octet-stream"));
        headers.insert(header::CONTENT_LENGTH, HeaderValue::from(size));
        headers.insert(header::CACHE_CONTROL, HeaderValue::from_static("private, no-store"));
        headers.insert(CACHE_HEADER, HeaderValue::from_static(outcome));
        response
    }
}

/// `GET /api/v1/datasets/{name}/{version}/files/{file}`: the server's file, from the node's
/// cache.
async fn dataset_file(
    State(agent): State<Arc<Agent>>,
    UrlPath((name, version, file)): UrlPath<(String, String, String)>,
    headers: HeaderMap,
) -> Response {
    let Some(authorization) = headers.get(header::AUTHORIZATION).cloned() else {
        return error(StatusCode::UNAUTHORIZED, "unauthenticated", "send the job's token (Authorization: Bearer ...)");
    };
    let url = agent.file_url(&name, &version, &file);
    let facts = match agent.describe(&url, &authorization).await {
        Ok(facts) => facts,
        Err(response) => return response,
    };
    match facts.kind {
        Kind::Manifest => agent.pass_through(&url, &authorization).await,
        // The server named it from the manifest; a name that could leave its folder is refused
        // all the same.
        Kind::Index if !is_plain_file_name(&file) => {
            error(StatusCode::NOT_FOUND, "not_found", "no such file in the dataset")
        }
        Kind::Shard { .. } | Kind::Index => agent.cached(facts, &file, url, authorization).await,
    }
}

async fn metrics(State(agent): State<Arc<Agent>>) -> Response {
    let mut text = String::new();
    if prometheus_client::encoding::text::encode(&mut text, &agent.metrics.registry).is_err() {
        return StatusCode::INTERNAL_SERVER_ERROR.into_response();
    }
    ([(header::CONTENT_TYPE, "text/plain; version=0.0.4")], text).into_response()
}

/// A cached copy, open with a shared `flock` so that no sweep evicts it while it is read.
struct Copy {
    path: PathBuf,
    file: Flock<std::fs::File>,
    size: u64,
}

impl Copy {
    fn open(path: &Path) -> std::io::Result<Copy> {
        let file = std::fs::File::open(path)?;
        let file = Flock::lock(file, FlockArg::LockShared).map_err(|(_, errno)| std::io::Error::from(errno))?;
        let size = file.metadata()?.len();
        Ok(Copy { path: path.to_path_buf(), file, size })
    }
}

/// The copy at `path` when the cache holds it whole (a shard of the size its manifest gives),
/// marked as just used. A shard of another size is damaged: dropped, so that it is fetched.
async fn open_whole(path: PathBuf, expected_size: Option<u64>) -> Option<Copy> {
    tokio::task::spawn_blocking(move || {
        let copy = Copy::open(&path).ok()?;
        if expected_size.is_some_and(|size| size != copy.size) {
            drop_if_same(&copy);
            return None;
        }
        // The sweep's recency.
        let _ = copy.file.set_times(std::fs::FileTimes::new().set_accessed(std::time::SystemTime::now()));
        Some(copy)
    })
    .await
    .ok()
    .flatten()
}

/// Removes the copy's name, unless it names another file by now (a fresh fill).
fn drop_if_same(copy: &Copy) {
    let same = match (copy.file.metadata(), std::fs::metadata(&copy.path)) {
        (Ok(opened), Ok(named)) => (opened.dev(), opened.ino()) == (named.dev(), named.ino()),
        _ => false,
    };
    if same {
        let _ = std::fs::remove_file(&copy.path);
    }
}

/// A copy on its way to a job.
struct Serving {
    reader: tokio_util::io::ReaderStream<tokio::fs::File>,
    /// A shard's hash so far, and the manifest's.
    check: Option<(Sha256, String)>,
    /// Held to the end: its lock keeps the sweep away.
    copy: Copy,
    agent: Arc<Agent>,
}

impl Serving {
    /// The copy's bytes. A shard's last piece is held back until the whole has been hashed: a
    /// copy damaged on disk since its fill never arrives whole (the response breaks off before
    /// its end, so the job tries again), and the copy is dropped, so that it is fetched again.
    fn into_stream(self) -> impl Stream<Item = std::io::Result<Bytes>> + Send {
        futures::stream::unfold((Some(self), None::<Bytes>), |(serving, mut held)| async move {
            let mut serving = serving?;
            loop {
                match serving.reader.next().await {
                    Some(Ok(chunk)) => {
                        if let Some((hasher, _)) = &mut serving.check {
                            hasher.update(&chunk);
                        }
                        serving.agent.metrics.served_bytes.inc_by(chunk.len() as u64);
                        if serving.check.is_none() {
                            return Some((Ok(chunk), (Some(serving), None)));
                        }
                        match held.replace(chunk) {
                            Some(previous) => return Some((Ok(previous), (Some(serving), held))),
                            None => continue, // the first piece: held until the next one comes
                        }
                    }
                    Some(Err(err)) => return Some((Err(err), (None, None))),
                    None => {
                        let (hasher, expected) = serving.check.take()?;
                        if hex::encode(hasher.finalize()) == expected {
                            return held.map(|last| (Ok(last), (None, None)));
                        }
                        serving.agent.metrics.damaged.inc();
                        drop_if_same(&serving.copy);
                        tracing::warn!(path = %serving.copy.path.display(), "a cached shard was damaged on disk; dropped");
                        let err = std::io::Error::other("the node's cached copy of the shard is damaged");
                        return Some((Err(err), (None, None)));
                    }
                }
            }
        })
    }
}

/// What the server's `HEAD` answer says of a file.
fn facts_of(headers: &reqwest::header::HeaderMap) -> Result<Facts, String> {
    let text =
        |name: &str| headers.get(name).and_then(|value| value.to_str().ok()).ok_or_else(|| format!("no {name} header"));
    let tenant = Uuid::parse_str(text(TENANT_HEADER)?).map_err(|_| format!("{TENANT_HEADER} is not a UUID"))?;
    let content_hex = text(CONTENT_HEADER)?.to_string();
    if !is_sha256_hex(&content_hex) {
        return Err(format!("{CONTENT_HEADER} is not 64 hex digits"));
    }
    let kind = match text(KIND_HEADER)? {
        "manifest" => Kind::Manifest,
        "index" => Kind::Index,
        "shard" => {
            let sha256 = text(SHA256_HEADER)?.to_string();
            if !is_sha256_hex(&sha256) {
                return Err(format!("{SHA256_HEADER} is not 64 hex digits"));
            }
            let size = text(header::CONTENT_LENGTH.as_str())?
                .parse()
                .map_err(|_| "a shard's Content-Length is not a size".to_string())?;
            Kind::Shard { sha256, size }
        }
        other => return Err(format!("{KIND_HEADER} {other:?} is no kind of file")),
    };
    Ok(Facts { tenant, content_hex, kind })
}

/// A name that stays in its folder: no separator, not `.` or `..`, no leading dot.
fn is_plain_file_name(name: &str) -> bool {
    !name.is_empty() && name.len() <= 255 && !name.starts_with('.') && !name.contains(['/', '\0'])
}

fn stripe(path: &Path) -> usize {
    let mut hasher = DefaultHasher::new();
    path.hash(&mut hasher);
    (hasher.finish() % FILL_STRIPES as u64) as usize
}

/// Removes the temporary files of fills a crash cut short (cache_sweep never counts them).
fn remove_abandoned_fills(dir: &Path) {
    let folders = |folder: &Path| -> Vec<PathBuf> {
        std::fs::read_dir(folder).into_iter().flatten().flatten().map(|e| e.path()).filter(|p| p.is_dir()).collect()
    };
    for tenant in folders(dir) {
        let mut leaves = Vec::new();
        for sub in folders(&tenant) {
            if sub.file_name().is_some_and(|n| n == "indexes") {
                leaves.extend(folders(&sub));
            } else {
                leaves.push(sub);
            }
        }
        for leaf in leaves {
            for entry in std::fs::read_dir(&leaf).into_iter().flatten().flatten() {
                if entry.file_name().to_string_lossy().starts_with(".fill-") {
                    let _ = std::fs::remove_file(entry.path());
                }
            }
        }
    }
}

/// The server's refusal, passed on: the job's engine fails at once on a 4xx and tries again on
/// a 5xx, as it does with the server.
fn refused(status: reqwest::StatusCode) -> Response {
    let status = StatusCode::from_u16(status.as_u16()).unwrap_or(StatusCode::BAD_GATEWAY);
    match status.as_u16() {
        401 => error(status, "unauthenticated", "the Trainyard server refused the job's token"),
        403 => error(status, "forbidden", "the Trainyard server refused the job this file"),
        404 => error(status, "not_found", "no such dataset file, or not this job's to read"),
        code if code >= 500 => unavailable(format!("the Trainyard server answered {status}")),
        _ => error(status, "refused", &format!("the Trainyard server answered {status}")),
    }
}

fn unavailable(message: String) -> Response {
    tracing::warn!("{message}");
    error(StatusCode::BAD_GATEWAY, "unavailable", &message)
}

fn error(status: StatusCode, code: &str, message: &str) -> Response {
    let body = ErrorBody {
        error: ErrorDetail { code: code.into(), message: message.into(), field: None, errors: Vec::new() },
    };
    (status, axum::Json(body)).into_response()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn headers(pairs: &[(&str, &str)]) -> reqwest::header::HeaderMap {
        let mut map = reqwest::header::HeaderMap::new();
        for (name, value) in pairs {
            map.insert(reqwest::header::HeaderName::from_bytes(name.as_bytes()).unwrap(), value.parse().unwrap());
        }
        map
    }

    #[test]
    fn the_servers_answer_names_the_copy_and_nothing_else_passes() {
        let tenant = "7d1c1f4e-8a43-4d4c-9a57-0f7a3f0e2b11";
        let content = "ab".repeat(32);
        let sha = "cd".repeat(32);
        let shard = headers(&[
            (TENANT_HEADER, tenant),
            (CONTENT_HEADER, &content),
            (KIND_HEADER, "shard"),
            (SHA256_HEADER, &sha),
            ("content-length", "1234"),
        ]);
        let facts = facts_of(&shard).unwrap();
        assert_eq!(facts.kind, Kind::Shard { sha256: sha.clone(), size: 1234 });
        assert_eq!(facts.tenant.to_string(), tenant);

        let index = headers(&[(TENANT_HEADER, tenant), (CONTENT_HEADER, &content), (KIND_HEADER, "index")]);
        assert_eq!(facts_of(&index).unwrap().kind, Kind::Index);

        // A tenant that is no UUID could name a folder anywhere; a shard without its hash could
        // not be checked.
        let escaping = headers(&[(TENANT_HEADER, "../../etc"), (CONTENT_HEADER, &content), (KIND_HEADER, "index")]);
        assert!(facts_of(&escaping).unwrap_err().contains(TENANT_HEADER));
        let unhashed = headers(&[(TENANT_HEADER, tenant), (CONTENT_HEADER, &content), (KIND_HEADER, "shard")]);
        assert!(facts_of(&unhashed).unwrap_err().contains(SHA256_HEADER));
        let odd = headers(&[(TENANT_HEADER, tenant), (CONTENT_HEADER, "../x"), (KIND_HEADER, "index")]);
        assert!(facts_of(&odd).is_err());
    }

    #[test]
    fn copies_live_where_the_engines_cache_and_its_sweep_look() {
        let agent = Agent::new(AgentConfig {
            dir: tempfile::tempdir().unwrap().keep(),
            server: "http://server".into(),
            budget_bytes: 0,
            tenant_budget_bytes: None,
        })
        .unwrap();
        let tenant = Uuid::parse_str("7d1c1f4e-8a43-4d4c-9a57-0f7a3f0e2b11").unwrap();
        let sha = "cd".repeat(32);
        let content = "ab".repeat(32);
        let shard = Facts { tenant, content_hex: content.clone(), kind: Kind::Shard { sha256: sha.clone(), size: 1 } };
        let index = Facts { tenant, content_hex: content.clone(), kind: Kind::Index };
        let root = &agent.config.dir;
        assert_eq!(agent.copy_path(&shard, "x.tar"), root.join(tenant.to_string()).join("cd").join(&sha));
        assert_eq!(
            agent.copy_path(&index, "x.idx.json"),
            root.join(tenant.to_string()).join("indexes").join(&content).join("x.idx.json")
        );
        assert!(!is_plain_file_name("../x") && !is_plain_file_name(".fill-1") && !is_plain_file_name("a/b"));
        assert!(is_plain_file_name("train-000001.idx.json"));
        assert_eq!(agent.file_url("mnist", "v1", "a b"), "http://server/api/v1/datasets/mnist/v1/files/a%20b",);
    }
}
