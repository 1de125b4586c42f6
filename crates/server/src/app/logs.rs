//! Reading a replica's log, once or following it until the job ends. When the executor no
//! longer has the file (the pod or the data directory is gone), the copy archived in the object
//! store when the attempt ended is read instead; once retention removed a job's logs, there is
//! no log to read. Tokens a job printed are masked on the way out ([`super::log_mask`]).

use std::time::Duration;

use axum::body::Bytes;
use futures::Stream;
use tokio::io::{AsyncRead, AsyncReadExt};
use tokio::sync::mpsc;
use tokio_stream::wrappers::ReceiverStream;
use tokio_util::io::StreamReader;
use tokio_util::sync::CancellationToken;
use trainyard_core::auth::{Action, Caller};
use trainyard_core::error::ObjectKind;
use trainyard_core::{Error, Result};
use uuid::Uuid;

use super::App;
use super::log_mask::LogMask;

/// How often a follower looks for new output and for the job's end.
const FOLLOW_POLL: Duration = Duration::from_millis(200);

#[derive(Debug, Clone)]
pub struct LogRequest {
    pub job_id: Uuid,
    pub replica: u32,
    pub attempt: Option<i32>,
    pub follow: bool,
}

type Chunk = std::result::Result<Bytes, std::io::Error>;

/// The log as a stream of chunks. Checks access and the replica and attempt numbers first, so
/// that errors are proper responses rather than a broken stream.
pub async fn job_logs(
    app: &App,
    caller: &Caller,
    request: LogRequest,
    shutdown: CancellationToken,
) -> Result<impl Stream<Item = Chunk> + use<>> {
    caller.authorize(Action::ReadJobs)?;
    let job = app.store.job_get(caller.tenant_id, request.job_id).await?;
    if request.replica >= job.spec.replicas {
        return Err(Error::invalid("replica", format!("the job has {} replicas, numbered from 0", job.spec.replicas)));
    }
    if app.store.job_storage_expiry(caller.tenant_id, request.job_id).await?.logs.is_some() {
        return Err(Error::not_found(ObjectKind::Log));
    }
    let attempts = app.store.job_attempts(caller.tenant_id, request.job_id).await?;
    if let Some(wanted) = request.attempt
        && !attempts.iter().any(|a| a.attempt == wanted)
    {
        return Err(Error::invalid("attempt", format!("the job has {} attempts so far", attempts.len())));
    }
    let (sender, receiver) = mpsc::channel::<Chunk>(16);
    let follower =
        Follower { app: app.clone(), tenant_id: caller.tenant_id, request, sender, shutdown, mask: Default::default() };
    // The first attempt's log is opened here, so that a log that cannot be read (its node is
    // unreachable) is an error response, not a stream that ends with nothing in it.
    let first = match follower.request.attempt {
        Some(n) => Some(n),
        None => follower.latest_attempt().await?,
    };
    let opened = match first {
        Some(attempt) => Some((attempt, follower.open(attempt).await?)),
        None => None,
    };
    tokio::spawn(follower.run(opened));
    Ok(ReceiverStream::new(receiver))
}

/// Why a follower stopped early.
enum Stop {
    /// The client went away or the server is shutting down: the stream just ends.
    Gone,
    /// Reading failed: the stream ends with an error.
    Failed(Error),
}

impl From<Error> for Stop {
    fn from(err: Error) -> Stop {
        Stop::Failed(err)
    }
}

type Reader = Box<dyn AsyncRead + Send + Unpin>;

/// One open log stream on `trainyard_log_streams`, counted down however its task ends.
struct OpenStream(prometheus_client::metrics::gauge::Gauge);

impl OpenStream {
    fn counted(gauge: &prometheus_client::metrics::gauge::Gauge) -> OpenStream {
        gauge.inc();
        OpenStream(gauge.clone())
    }
}

impl Drop for OpenStream {
    fn drop(&mut self) {
        self.0.dec();
    }
}

struct Follower {
    app: App,
    tenant_id: Uuid,
    request: LogRequest,
    sender: mpsc::Sender<Chunk>,
    shutdown: CancellationToken,
    /// Masks tokens; holds back what may be the start of one.
    mask: std::sync::Mutex<LogMask>,
}

enum Next {
    /// Keep reading the current attempt.
    Wait,
    /// A newer attempt started: read that one.
    Switch(i32),
    /// The job ended: read what is left, then stop.
    Finish,
}

impl Follower {
    /// Follows the log from `opened` (the attempt read first and its reader, if any attempt exists).
    async fn run(self, opened: Option<(i32, Option<Reader>)>) {
        let _open = OpenStream::counted(&self.app.monitoring.log_streams);
        match self.follow(opened).await {
            Ok(()) => {
                let rest = self.masked(|mask| mask.finish());
                let _ = self.send(rest).await;
            }
            Err(Stop::Gone) => {}
            Err(Stop::Failed(err)) => {
                tracing::warn!(job = %self.request.job_id, %err, "log stream failed");
                let _ = self.sender.send(Err(std::io::Error::other(err.to_string()))).await;
            }
        }
    }

    async fn follow(&self, opened: Option<(i32, Option<Reader>)>) -> std::result::Result<(), Stop> {
        let mut attempt = opened.as_ref().map(|(n, _)| *n);
        let mut first = opened.map(|(_, reader)| reader);
        loop {
            let Some(current) = attempt else {
                // Not launched yet: a follower waits for the first attempt, a reader is done.
                if !self.request.follow {
                    return Ok(());
                }
                match self.next_step(None).await? {
                    Next::Switch(n) => attempt = Some(n),
                    Next::Finish => return Ok(()),
                    Next::Wait => self.pause().await?,
                }
                continue;
            };
            let mut reader = match first.take() {
                Some(reader) => reader,
                None => self.open(current).await?,
            };
            loop {
                if let Some(reader) = reader.as_mut()
                    && self.forward(reader).await?
                {
                    continue;
                }
                if !self.request.follow {
                    return Ok(());
                }
                match self.next_step(Some(current)).await? {
                    Next::Wait => {
                        self.pause().await?;
                        if reader.is_none() {
                            reader = self.open(current).await?;
                        }
                    }
                    Next::Switch(n) => {
                        if let Some(reader) = reader.as_mut() {
                            while self.forward(reader).await? {}
                        }
                        attempt = Some(n);
                        break;
                    }
                    Next::Finish => {
                        if let Some(reader) = reader.as_mut() {
                            while self.forward(reader).await? {}
                        }
                        return Ok(());
                    }
                }
            }
        }
    }

    async fn open(&self, attempt: i32) -> Result<Option<Reader>> {
        let (job_id, replica) = (self.request.job_id, self.request.replica);
        let live =
            self.app.executor.log_reader(job_id, attempt, replica, self.request.follow).await.map_err(|err| {
                Error::Unavailable(format!("cannot read the log of replica {replica} of attempt {attempt}: {err}"))
            })?;
        if let Some(reader) = live {
            return Ok(Some(reader));
        }
        let archived = self.app.log_archived(self.tenant_id, job_id, attempt, replica).await?;
        Ok(archived.map(|stream| Box::new(StreamReader::new(stream)) as Box<dyn AsyncRead + Send + Unpin>))
    }

    /// Sends what the reader has now. True when it sent something.
    async fn forward(&self, reader: &mut (dyn AsyncRead + Send + Unpin)) -> std::result::Result<bool, Stop> {
        let mut buffer = vec![0u8; 64 * 1024];
        // A quiet replica's read waits until it writes: a client that went away meanwhile ends
        // the follow now, not at the replica's next line (its task and, on a cluster, its
        // stream from the API server would be held until then).
        let n = tokio::select! {
            read = reader.read(&mut buffer) => read.map_err(Error::internal)?,
            () = self.sender.closed() => return Err(Stop::Gone),
        };
        if n == 0 {
            return Ok(false);
        }
        let shown = self.masked(|mask| mask.push(&buffer[..n]));
        self.send(shown).await?;
        Ok(true)
    }

    fn masked(&self, step: impl FnOnce(&mut LogMask) -> Vec<u8>) -> Vec<u8> {
        step(&mut self.mask.lock().unwrap_or_else(std::sync::PoisonError::into_inner))
    }

    /// Sends a chunk (nothing when it is empty).
    async fn send(&self, chunk: Vec<u8>) -> std::result::Result<(), Stop> {
        if !chunk.is_empty() && self.sender.send(Ok(Bytes::from(chunk))).await.is_err() {
            return Err(Stop::Gone); // the client went away
        }
        Ok(())
    }

    async fn next_step(&self, current: Option<i32>) -> Result<Next> {
        let job = self.app.store.job_get(self.tenant_id, self.request.job_id).await?;
        if self.request.attempt.is_none()
            && let Some(latest) = self.latest_attempt().await?
            && Some(latest) != current
        {
            return Ok(Next::Switch(latest));
        }
        Ok(if job.state.is_terminal() { Next::Finish } else { Next::Wait })
    }

    async fn latest_attempt(&self) -> Result<Option<i32>> {
        let attempts = self.app.store.job_attempts(self.tenant_id, self.request.job_id).await?;
        Ok(attempts.last().map(|a| a.attempt))
    }

    async fn pause(&self) -> std::result::Result<(), Stop> {
        let idle = self.masked(LogMask::flush_idle);
        self.send(idle).await?;
        tokio::select! {
            _ = tokio::time::sleep(FOLLOW_POLL) => Ok(()),
            _ = self.shutdown.cancelled() => Err(Stop::Gone),
            _ = self.sender.closed() => Err(Stop::Gone),
        }
    }
}
