//! Object storage for Trainyard: one configured store (a local directory in `trainyard dev`, an
//! S3-compatible bucket in production) holding every tenant's archived logs and artefacts under
//! a prefix of its own.
//!
//! - [`paths`]: the one check for relative paths given by users; nothing it accepts can leave
//!   the prefix it is joined to.
//! - [`keys`]: where each object lives (`tenants/<tenant>/jobs/<job>/...`).
//! - [`objects`]: the store itself: streaming and multipart uploads, downloads, listing,
//!   deletion by prefix, S3 pre-signed URLs.
//! - [`signing`]: HMAC-signed, short-lived download URLs for the local store.
//!
//! See `docs/storage.md`.

pub mod keys;
pub mod objects;
pub mod paths;
pub mod signing;

pub use object_store::path::Path as Key;
pub use objects::{ObjectInfo, ObjectStorage, StorageConfig, StorageError, Uploaded};
pub use paths::{PathRefused, RelPath, relative_path};
pub use signing::{SignatureError, UrlSigner};
