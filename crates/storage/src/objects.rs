//! The configured object store: a local directory (`file:///path`) or an S3-compatible bucket
//! (`s3://bucket/prefix`, credentials from the environment: `AWS_ACCESS_KEY_ID`,
//! `AWS_SECRET_ACCESS_KEY`, `AWS_SESSION_TOKEN`, `AWS_REGION`). Callers pass keys from
//! [`crate::keys`]; this module adds the store's own prefix and does the I/O.

use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use futures::stream::BoxStream;
use futures::{Stream, StreamExt, TryStreamExt};
use object_store::aws::{AmazonS3, AmazonS3Builder};
use object_store::local::LocalFileSystem;
use object_store::path::Path;
use object_store::signer::Signer;
use object_store::{GetResultPayload, ObjectStore, ObjectStoreExt, PutPayload, WriteMultipart};
use sha2::{Digest, Sha256};
use tokio::io::AsyncReadExt;
use tokio_util::io::ReaderStream;

/// The smallest part S3 accepts (all but the last part of a multipart upload).
pub const MIN_PART_SIZE: usize = 5 * 1024 * 1024;
/// The chunk size of streamed local reads.
const DOWNLOAD_CHUNK: usize = 256 * 1024;
/// Parts uploaded at once in a multipart upload.
const PARTS_IN_FLIGHT: usize = 4;

#[derive(Debug, thiserror::Error)]
pub enum StorageError {
    #[error("object store URL {url:?}: {message}")]
    Config { url: String, message: String },
    #[error("the upload is over the limit of {0} bytes")]
    TooLarge(u64),
    #[error("reading the upload failed: {0}")]
    Body(String),
    /// The bytes are not the ones expected ([`ObjectStorage::upload_expecting`]): what came.
    #[error("{size} bytes with sha256 {sha256} arrived, not the content expected")]
    Mismatch { size: u64, sha256: String },
    #[error("object store: {0}")]
    Backend(#[from] object_store::Error),
    #[error("{0}")]
    Io(#[from] std::io::Error),
}

/// How to reach the store.
#[derive(Clone, Debug)]
pub struct StorageConfig {
    /// `file:///absolute/path` or `s3://bucket[/prefix]`.
    pub url: String,
    /// An S3-compatible endpoint (`http://127.0.0.1:9000`); AWS when absent.
    pub endpoint: Option<String>,
    /// The part size of multipart uploads; bodies up to this size are one plain put.
    pub part_size: usize,
}

/// One object, as listed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ObjectInfo {
    /// The key without the store's own prefix (as built by [`crate::keys`]).
    pub key: Path,
    pub size: u64,
    pub modified: chrono::DateTime<chrono::Utc>,
}

/// What an upload wrote.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Uploaded {
    pub size: u64,
    /// Hex SHA-256 of the content.
    pub sha256: String,
    /// How many parts it took (1 for a plain put).
    pub parts: usize,
}

/// The object store Trainyard writes logs and artefacts to. Cheap to clone.
#[derive(Clone, Debug)]
pub struct ObjectStorage {
    store: Arc<dyn ObjectStore>,
    /// Present for S3: signs download URLs with the store's credentials.
    s3: Option<Arc<AmazonS3>>,
    /// Put in front of every key (the path part of `s3://bucket/prefix`).
    prefix: Path,
    part_size: usize,
    /// The URL as configured, for logs (it holds no credentials).
    url: String,
}

impl ObjectStorage {
    /// Opens the store `config.url` names. A local directory is created when missing.
    pub fn open(config: &StorageConfig) -> Result<ObjectStorage, StorageError> {
        let bad = |message: String| StorageError::Config { url: config.url.clone(), message };
        let url = url::Url::parse(&config.url).map_err(|e| bad(e.to_string()))?;
        if config.part_size < MIN_PART_SIZE {
            return Err(bad(format!("the part size must be at least {MIN_PART_SIZE} bytes (S3's minimum)")));
        }
        let (store, s3, prefix): (Arc<dyn ObjectStore>, _, _) = match url.scheme() {
            "file" => {
                let root = url.to_file_path().map_err(|()| bad("a file URL needs an absolute path".into()))?;
                std::fs::create_dir_all(&root).map_err(|e| bad(format!("cannot create the directory: {e}")))?;
                let local = LocalFileSystem::new_with_prefix(&root).map_err(|e| bad(e.to_string()))?;
                (Arc::new(local), None, Path::default())
            }
            "s3" => {
                // The S3 client's TLS uses rustls with ring; install it unless something did.
                let _ = rustls::crypto::ring::default_provider().install_default();
                let bucket = url.host_str().filter(|b| !b.is_empty()).ok_or_else(|| bad("no bucket".into()))?;
                // A few quick retries, then the error: a request fails within seconds when the
                // store is away (object_store's default keeps one retrying for three minutes),
                // and what must not be lost (archived logs) is retried by Trainyard with backoff.
                let retry = object_store::RetryConfig {
                    backoff: Default::default(),
                    max_retries: 3,
                    retry_timeout: std::time::Duration::from_secs(15),
                };
                let mut builder = AmazonS3Builder::from_env().with_bucket_name(bucket).with_retry(retry);
                if let Some(endpoint) = &config.endpoint {
                    builder = builder.with_endpoint(endpoint).with_allow_http(endpoint.starts_with("http://"));
                }
                let s3 = Arc::new(builder.build().map_err(|e| bad(e.to_string()))?);
                let prefix = Path::parse(url.path().trim_matches('/')).map_err(|e| bad(e.to_string()))?;
                (s3.clone() as Arc<dyn ObjectStore>, Some(s3), prefix)
            }
            other => return Err(bad(format!("unsupported scheme {other:?}; use file:// or s3://"))),
        };
        Ok(ObjectStorage { store, s3, prefix, part_size: config.part_size, url: config.url.clone() })
    }

    /// The URL the store was opened from.
    pub fn url(&self) -> &str {
        &self.url
    }

    /// True for the local directory store, whose downloads the server streams itself.
    pub fn is_local(&self) -> bool {
        self.s3.is_none()
    }

    pub fn part_size(&self) -> usize {
        self.part_size
    }

    fn location(&self, key: &Path) -> Path {
        self.prefix.parts().chain(key.parts()).collect()
    }

    fn key_of(&self, location: &Path) -> Path {
        match location.prefix_match(&self.prefix) {
            Some(parts) => parts.collect(),
            None => location.clone(),
        }
    }

    /// Streams `body` to `key`: one put when it fits in a part, a multipart upload of
    /// `part_size` parts otherwise. Refuses more than `max_bytes`. On any failure the upload is
    /// aborted, so nothing is left at `key` (an earlier object there stays as it was).
    pub async fn upload<S, E>(&self, key: &Path, body: S, max_bytes: u64) -> Result<Uploaded, StorageError>
    where
        S: Stream<Item = Result<Bytes, E>> + Send + Unpin,
        E: std::fmt::Display,
    {
        self.upload_checked(key, body, max_bytes, None).await
    }

    /// [`ObjectStorage::upload`] of content known in advance: exactly `size` bytes with the hex
    /// SHA-256 `sha256`. Other bytes are [`StorageError::Mismatch`] and are never visible at
    /// `key`: a body longer than `size` is refused as soon as it passes it, and the hash is
    /// checked before the put (or the multipart upload's completion) that makes the object.
    pub async fn upload_expecting<S, E>(
        &self,
        key: &Path,
        body: S,
        size: u64,
        sha256: &str,
    ) -> Result<Uploaded, StorageError>
    where
        S: Stream<Item = Result<Bytes, E>> + Send + Unpin,
        E: std::fmt::Display,
    {
        self.upload_checked(key, body, size, Some(sha256)).await
    }

    /// The upload: with `expected` (a hex SHA-256), `max_bytes` is the exact size expected and
    /// the content is checked before the object is made.
    async fn upload_checked<S, E>(
        &self,
        key: &Path,
        body: S,
        max_bytes: u64,
        expected: Option<&str>,
    ) -> Result<Uploaded, StorageError>
    where
        S: Stream<Item = Result<Bytes, E>> + Send + Unpin,
        E: std::fmt::Display,
    {
        // Over the size expected: what arrived so far is not the content, whatever follows.
        let too_large = |size: u64, hasher: &Sha256| match expected {
            Some(_) => StorageError::Mismatch { size, sha256: hex::encode(hasher.clone().finalize()) },
            None => StorageError::TooLarge(max_bytes),
        };
        let check = |size: u64, sha256: &str| match expected {
            Some(want) if size != max_bytes || !sha256.eq_ignore_ascii_case(want) => {
                Err(StorageError::Mismatch { size, sha256: sha256.to_string() })
            }
            _ => Ok(()),
        };
        let location = self.location(key);
        let mut body = body.map_err(|e| StorageError::Body(e.to_string()));
        let mut hasher = Sha256::new();
        let mut size = 0u64;
        // The first part is buffered: a small body never starts a multipart upload.
        let mut first = Vec::new();
        let mut rest = None;
        while let Some(chunk) = body.next().await {
            let chunk = chunk?;
            size += chunk.len() as u64;
            hasher.update(&chunk);
            if size > max_bytes {
                return Err(too_large(size, &hasher));
            }
            if first.len() + chunk.len() > self.part_size {
                rest = Some(chunk);
                break;
            }
            first.extend_from_slice(&chunk);
        }
        let Some(overflow) = rest else {
            let sha256 = hex::encode(hasher.finalize());
            check(size, &sha256)?;
            self.store.put(&location, PutPayload::from(first)).await?;
            return Ok(Uploaded { size, sha256, parts: 1 });
        };
        let upload = self.store.put_multipart(&location).await?;
        let mut writer =
            AbortUnlessFinished::new(WriteMultipart::new_with_chunk_size(upload, self.part_size), &location);
        let streamed = async {
            writer.write(&first);
            writer.write(&overflow);
            while let Some(chunk) = body.next().await {
                let chunk = chunk?;
                size += chunk.len() as u64;
                hasher.update(&chunk);
                if size > max_bytes {
                    return Err(too_large(size, &hasher));
                }
                writer.wait_for_capacity(PARTS_IN_FLIGHT).await?;
                writer.write(&chunk);
            }
            let sha256 = hex::encode(hasher.clone().finalize());
            check(size, &sha256)?;
            Ok(sha256)
        }
        .await;
        let sha256 = match streamed {
            Ok(sha256) => sha256,
            Err(err) => {
                writer.abort().await;
                return Err(err);
            }
        };
        writer.finish().await?;
        let parts = size.div_ceil(self.part_size as u64) as usize;
        Ok(Uploaded { size, sha256, parts })
    }

    /// Copies a local file to `key`, in parts when it is large.
    pub async fn upload_file(&self, key: &Path, file: &std::path::Path) -> Result<Uploaded, StorageError> {
        let file = tokio::fs::File::open(file).await?;
        let chunks = futures::stream::try_unfold(file, |mut file| async move {
            let mut buffer = vec![0u8; 1024 * 1024];
            let n = file.read(&mut buffer).await?;
            buffer.truncate(n);
            Ok::<_, std::io::Error>(if n == 0 { None } else { Some((Bytes::from(buffer), file)) })
        });
        self.upload(key, Box::pin(chunks), u64::MAX).await
    }

    /// The object's size and content as a stream, or `None` when there is no such object.
    pub async fn download(
        &self,
        key: &Path,
    ) -> Result<Option<(u64, BoxStream<'static, Result<Bytes, StorageError>>)>, StorageError> {
        match self.store.get(&self.location(key)).await {
            Ok(result) => {
                let size = result.meta.size;
                let stream = match result.payload {
                    // A local file: read it in large chunks (object_store's own stream uses 8 KiB).
                    GetResultPayload::File(mut file, _) => {
                        use std::io::Seek;
                        file.seek(std::io::SeekFrom::Start(result.range.start))?;
                        let reader = tokio::fs::File::from_std(file).take(result.range.end - result.range.start);
                        ReaderStream::with_capacity(reader, DOWNLOAD_CHUNK).map_err(StorageError::from).boxed()
                    }
                    GetResultPayload::Stream(stream) => stream.map_err(StorageError::from).boxed(),
                };
                Ok(Some((size, stream)))
            }
            Err(err) if is_absent(&err) => Ok(None),
            Err(err) => Err(err.into()),
        }
    }

    /// The object's size, or `None` when there is no such object.
    pub async fn size_of(&self, key: &Path) -> Result<Option<u64>, StorageError> {
        match self.store.head(&self.location(key)).await {
            Ok(meta) => Ok(Some(meta.size)),
            Err(err) if is_absent(&err) => Ok(None),
            Err(err) => Err(err.into()),
        }
    }

    /// Whether any object has `prefix` as its folder (`prefix/...`).
    pub async fn has_objects_under(&self, prefix: &Path) -> Result<bool, StorageError> {
        let location = self.location(prefix);
        let mut listing = self.store.list(Some(&location));
        while let Some(entry) = listing.next().await {
            match entry {
                // Some stores list an object named exactly the prefix: that is no folder.
                Ok(meta) if meta.location == location => continue,
                Ok(_) => return Ok(true),
                Err(err) if is_absent(&err) => return Ok(false),
                Err(err) => return Err(err.into()),
            }
        }
        Ok(false)
    }

    /// Every object under `prefix`, sorted by key.
    pub async fn list(&self, prefix: &Path) -> Result<Vec<ObjectInfo>, StorageError> {
        let mut objects: Vec<ObjectInfo> = self
            .store
            .list(Some(&self.location(prefix)))
            .map_ok(|meta| ObjectInfo {
                key: self.key_of(&meta.location),
                size: meta.size,
                modified: meta.last_modified,
            })
            .try_collect()
            .await?;
        objects.sort_by(|a, b| a.key.cmp(&b.key));
        Ok(objects)
    }

    /// Copies the object at `from` to `to` (within the store: S3 copies it server-side),
    /// replacing what is there.
    pub async fn copy(&self, from: &Path, to: &Path) -> Result<(), StorageError> {
        Ok(self.store.copy(&self.location(from), &self.location(to)).await?)
    }

    /// Deletes the object at `key`; none there is no error.
    pub async fn delete(&self, key: &Path) -> Result<(), StorageError> {
        match self.store.delete(&self.location(key)).await {
            Err(err) if !is_absent(&err) => Err(err.into()),
            _ => Ok(()),
        }
    }

    /// Deletes every object under `prefix`; returns how many there were. Repeating it is
    /// harmless.
    pub async fn delete_prefix(&self, prefix: &Path) -> Result<u64, StorageError> {
        let locations = self.store.list(Some(&self.location(prefix))).map_ok(|meta| meta.location).boxed();
        let deleted = self.store.delete_stream(locations).try_collect::<Vec<_>>().await?;
        Ok(deleted.len() as u64)
    }

    /// A pre-signed GET URL from the store itself (S3), valid for `expires_in`. `None` for the
    /// local store, whose downloads the server signs and serves ([`crate::signing`]).
    pub async fn presigned_get(&self, key: &Path, expires_in: Duration) -> Result<Option<String>, StorageError> {
        let Some(s3) = &self.s3 else {
            return Ok(None);
        };
        let url = s3.signed_url(http::Method::GET, &self.location(key), expires_in).await?;
        Ok(Some(url.to_string()))
    }
}

/// Whether a store error means "no such object": not found, or (local store) a path that goes
/// beneath a file, which no object can be at.
fn is_absent(err: &object_store::Error) -> bool {
    if matches!(err, object_store::Error::NotFound { .. }) {
        return true;
    }
    let mut source: Option<&(dyn std::error::Error + 'static)> = std::error::Error::source(err);
    while let Some(cause) = source {
        if let Some(io) = cause.downcast_ref::<std::io::Error>()
            && io.kind() == std::io::ErrorKind::NotADirectory
        {
            return true;
        }
        source = cause.source();
    }
    false
}

/// A multipart upload that is aborted unless it is finished: on an error, and also when the
/// future uploading it is dropped (a client gone mid-upload, a request cancelled), which would
/// otherwise leave its parts on the object store, unseen and billed, until a lifecycle rule
/// (`AbortIncompleteMultipartUpload`) removes them. The abort on drop runs as its own task.
struct AbortUnlessFinished {
    writer: Option<WriteMultipart>,
    location: object_store::path::Path,
}

impl AbortUnlessFinished {
    fn new(writer: WriteMultipart, location: &object_store::path::Path) -> AbortUnlessFinished {
        AbortUnlessFinished { writer: Some(writer), location: location.clone() }
    }

    fn writer(&mut self) -> &mut WriteMultipart {
        self.writer.as_mut().expect("the writer is taken only by finish and abort, which consume the guard")
    }

    fn write(&mut self, bytes: &[u8]) {
        self.writer().write(bytes);
    }

    async fn wait_for_capacity(&mut self, parts: usize) -> object_store::Result<()> {
        self.writer().wait_for_capacity(parts).await
    }

    async fn finish(mut self) -> object_store::Result<object_store::PutResult> {
        let writer = self.writer.take().expect("a guard is finished once");
        writer.finish().await
    }

    async fn abort(mut self) {
        if let Some(writer) = self.writer.take()
            && let Err(abort) = writer.abort().await
        {
            tracing::warn!(%abort, key = %self.location, "aborting a failed multipart upload");
        }
    }
}

impl Drop for AbortUnlessFinished {
    fn drop(&mut self) {
        let Some(writer) = self.writer.take() else { return };
        let location = self.location.clone();
        match tokio::runtime::Handle::try_current() {
            Ok(runtime) => {
                runtime.spawn(async move {
                    match writer.abort().await {
                        Ok(()) => tracing::info!(key = %location, "aborted a multipart upload left unfinished"),
                        Err(abort) => {
                            tracing::warn!(%abort, key = %location, "aborting an unfinished multipart upload")
                        }
                    }
                });
            }
            Err(_) => {
                tracing::warn!(key = %location, "a multipart upload left unfinished outside a runtime: not aborted")
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn local(dir: &std::path::Path) -> ObjectStorage {
        let url = url::Url::from_directory_path(dir).unwrap().to_string();
        ObjectStorage::open(&StorageConfig { url, endpoint: None, part_size: MIN_PART_SIZE }).unwrap()
    }

    fn chunks(data: &[u8], size: usize) -> impl Stream<Item = Result<Bytes, std::io::Error>> + Unpin + Send {
        let parts: Vec<_> = data.chunks(size).map(|c| Ok(Bytes::copy_from_slice(c))).collect();
        futures::stream::iter(parts)
    }

    /// A multipart upload that records what was done to it.
    #[derive(Debug, Default)]
    struct Recorded {
        parts: std::sync::atomic::AtomicUsize,
        completed: std::sync::atomic::AtomicBool,
        aborted: std::sync::atomic::AtomicBool,
    }

    #[derive(Debug)]
    struct RecordingUpload(std::sync::Arc<Recorded>);

    #[async_trait::async_trait]
    impl object_store::MultipartUpload for RecordingUpload {
        fn put_part(&mut self, _data: PutPayload) -> object_store::UploadPart {
            self.0.parts.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
            Box::pin(async { Ok(()) })
        }
        async fn complete(&mut self) -> object_store::Result<object_store::PutResult> {
            self.0.completed.store(true, std::sync::atomic::Ordering::SeqCst);
            Ok(object_store::PutResult { e_tag: None, version: None, extensions: Default::default() })
        }
        async fn abort(&mut self) -> object_store::Result<()> {
            self.0.aborted.store(true, std::sync::atomic::Ordering::SeqCst);
            Ok(())
        }
    }

    fn guarded(recorded: &std::sync::Arc<Recorded>) -> AbortUnlessFinished {
        let writer = WriteMultipart::new_with_chunk_size(Box::new(RecordingUpload(recorded.clone())), 4);
        AbortUnlessFinished::new(writer, &object_store::path::Path::from("a/b"))
    }

    #[tokio::test]
    async fn a_multipart_upload_dropped_unfinished_is_aborted_and_a_finished_one_is_not() {
        use std::sync::atomic::Ordering::SeqCst;
        // Dropped midway (its future cancelled: a server shutting down mid-upload).
        let dropped = std::sync::Arc::new(Recorded::default());
        let mut upload = guarded(&dropped);
        upload.write(b"12345678");
        upload.wait_for_capacity(0).await.unwrap();
        drop(upload);
        for _ in 0..100 {
            if dropped.aborted.load(SeqCst) {
                break;
            }
            tokio::task::yield_now().await;
        }
        assert!(dropped.aborted.load(SeqCst), "aborted by the guard's task");
        assert!(!dropped.completed.load(SeqCst));

        let finished = std::sync::Arc::new(Recorded::default());
        let mut upload = guarded(&finished);
        upload.write(b"123456789");
        upload.finish().await.unwrap();
        tokio::task::yield_now().await;
        assert!(finished.completed.load(SeqCst) && !finished.aborted.load(SeqCst));
        assert_eq!(finished.parts.load(SeqCst), 3);

        let failed = std::sync::Arc::new(Recorded::default());
        guarded(&failed).abort().await;
        assert!(failed.aborted.load(SeqCst) && !failed.completed.load(SeqCst));
    }

    #[tokio::test]
    async fn multipart_round_trip_keeps_content() {
        let dir = tempfile::tempdir().unwrap();
        let storage = local(dir.path());
        let data: Vec<u8> = (0..(MIN_PART_SIZE * 2 + 12345)).map(|i| (i * 7 % 251) as u8).collect();
        let key = Path::from("tenants/t/jobs/j/artifacts/big.bin");
        let uploaded = storage.upload(&key, chunks(&data, 100_000), u64::MAX).await.unwrap();
        assert_eq!(uploaded.parts, 3);
        assert_eq!(uploaded.sha256, hex::encode(Sha256::digest(&data)));
        let (size, stream) = storage.download(&key).await.unwrap().unwrap();
        assert_eq!(size, data.len() as u64);
        let back: Vec<Bytes> = stream.try_collect().await.unwrap();
        assert_eq!(back.concat(), data);
        assert_eq!(storage.list(&Path::from("tenants/t")).await.unwrap()[0].key, key);
    }

    #[tokio::test]
    async fn an_upload_over_the_limit_leaves_nothing() {
        let dir = tempfile::tempdir().unwrap();
        let storage = local(dir.path());
        let key = Path::from("a/b");
        let data = vec![1u8; MIN_PART_SIZE + 10];
        let err = storage.upload(&key, chunks(&data, 65536), MIN_PART_SIZE as u64 + 5).await.unwrap_err();
        assert!(matches!(err, StorageError::TooLarge(_)), "{err}");
        assert!(storage.download(&key).await.unwrap().is_none());
        assert!(storage.list(&Path::default()).await.unwrap().is_empty());
    }

    #[tokio::test]
    async fn an_upload_of_other_content_than_expected_leaves_nothing() {
        let dir = tempfile::tempdir().unwrap();
        let storage = local(dir.path());
        let data: Vec<u8> = (0..(MIN_PART_SIZE + 4321)).map(|i| (i % 253) as u8).collect();
        let sha256 = hex::encode(Sha256::digest(&data));
        let key = Path::from("t/shard.tar");
        // One byte changed, in a plain put and in a multipart upload; one byte short; one over.
        for (body, size) in [(&data[..1000], 1000u64), (&data[..], data.len() as u64)] {
            let mut changed = body.to_vec();
            changed[7] ^= 0xff;
            let want = hex::encode(Sha256::digest(body));
            let err = storage.upload_expecting(&key, chunks(&changed, 65536), size, &want).await.unwrap_err();
            assert!(matches!(err, StorageError::Mismatch { size: s, .. } if s == size), "{err}");
        }
        let short = storage.upload_expecting(&key, chunks(&data[1..], 65536), data.len() as u64, &sha256).await;
        assert!(matches!(short, Err(StorageError::Mismatch { .. })), "{short:?}");
        let mut long = data.clone();
        long.push(0);
        let long = storage.upload_expecting(&key, chunks(&long, 65536), data.len() as u64, &sha256).await;
        assert!(matches!(long, Err(StorageError::Mismatch { .. })), "{long:?}");
        assert!(storage.download(&key).await.unwrap().is_none(), "nothing was made at the key");
        assert!(storage.list(&Path::default()).await.unwrap().is_empty());
        // The content itself is stored.
        let uploaded = storage.upload_expecting(&key, chunks(&data, 65536), data.len() as u64, &sha256).await.unwrap();
        assert_eq!((uploaded.size, uploaded.sha256, uploaded.parts), (data.len() as u64, sha256, 2));
    }

    #[tokio::test]
    async fn delete_prefix_removes_only_that_prefix() {
        let dir = tempfile::tempdir().unwrap();
        let storage = local(dir.path());
        for key in ["t/1/logs/a", "t/1/logs/b", "t/2/logs/a"] {
            storage.upload(&Path::from(key), chunks(b"x", 1), 10).await.unwrap();
        }
        assert_eq!(storage.delete_prefix(&Path::from("t/1")).await.unwrap(), 2);
        let left: Vec<String> =
            storage.list(&Path::default()).await.unwrap().into_iter().map(|o| o.key.to_string()).collect();
        assert_eq!(left, ["t/2/logs/a"]);
    }
}
