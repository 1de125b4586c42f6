//! Short-lived download URLs for the local store, served by the server itself: HMAC-SHA256 over
//! the method, the object key and the expiry time, with a key every server replica shares (kept
//! in Postgres). S3 stores sign with their own credentials instead (`Signer::signed_url`).

use hmac::{Hmac, Mac};
use sha2::Sha256;

/// Where the server serves signed downloads of the local store.
pub const DOWNLOAD_PATH: &str = "/api/v1/artifacts/download";

/// Why a signed URL was refused. Both answer 403; the words help whoever holds the URL.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum SignatureError {
    #[error("this download link has expired; ask for a new one")]
    Expired,
    #[error("this download link is not valid (it was changed or not made by this server)")]
    Invalid,
}

/// Signs and checks download URLs. The key never leaves the process (`Debug` redacts it).
#[derive(Clone)]
pub struct UrlSigner {
    key: Vec<u8>,
}

impl std::fmt::Debug for UrlSigner {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("UrlSigner(<redacted>)")
    }
}

impl UrlSigner {
    pub fn new(key: Vec<u8>) -> UrlSigner {
        UrlSigner { key }
    }

    fn mac(&self, object_key: &str, expires: i64) -> Hmac<Sha256> {
        let mut mac = Hmac::<Sha256>::new_from_slice(&self.key).expect("HMAC takes keys of any length");
        mac.update(b"GET\n");
        mac.update(object_key.as_bytes());
        mac.update(b"\n");
        mac.update(expires.to_string().as_bytes());
        mac
    }

    /// A server-relative URL that downloads `object_key` until `expires` (Unix seconds).
    pub fn download_url(&self, object_key: &str, expires: i64) -> String {
        let sig = hex::encode(self.mac(object_key, expires).finalize().into_bytes());
        let query = form_urlencoded::Serializer::new(String::new())
            .append_pair("key", object_key)
            .append_pair("expires", &expires.to_string())
            .append_pair("sig", &sig)
            .finish();
        format!("{DOWNLOAD_PATH}?{query}")
    }

    /// A secret derived from the key for `purpose` (HMAC-SHA256 of it, in hex): the same on
    /// every server replica and after restarts, never stored, and unrelated to any other
    /// purpose's. Interactive sessions' upstream secrets are made so.
    pub fn derived_secret(&self, purpose: &str) -> String {
        let mut mac = Hmac::<Sha256>::new_from_slice(&self.key).expect("HMAC takes keys of any length");
        mac.update(b"derive\n");
        mac.update(purpose.as_bytes());
        hex::encode(mac.finalize().into_bytes())
    }

    /// Checks a URL's signature (in constant time) and then its expiry against `now`.
    pub fn verify(&self, object_key: &str, expires: i64, sig_hex: &str, now: i64) -> Result<(), SignatureError> {
        let sig = hex::decode(sig_hex).map_err(|_| SignatureError::Invalid)?;
        self.mac(object_key, expires).verify_slice(&sig).map_err(|_| SignatureError::Invalid)?;
        if now >= expires {
            return Err(SignatureError::Expired);
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn query_of(url: &str) -> (String, i64, String) {
        let query = url.split_once('?').unwrap().1;
        let pairs: std::collections::HashMap<String, String> =
            form_urlencoded::parse(query.as_bytes()).into_owned().collect();
        (pairs["key"].clone(), pairs["expires"].parse().unwrap(), pairs["sig"].clone())
    }

    #[test]
    fn valid_until_expiry_and_tamper_evident() {
        let signer = UrlSigner::new(b"k".to_vec());
        let url = signer.download_url("tenants/a/jobs/b/artifacts/x y.bin", 100);
        let (key, expires, sig) = query_of(&url);
        assert_eq!(signer.verify(&key, expires, &sig, 99), Ok(()));
        assert_eq!(signer.verify(&key, expires, &sig, 100), Err(SignatureError::Expired));
        assert_eq!(signer.verify(&key, expires + 1000, &sig, 99), Err(SignatureError::Invalid));
        assert_eq!(signer.verify("tenants/other/x", expires, &sig, 99), Err(SignatureError::Invalid));
        assert_eq!(signer.verify(&key, expires, "zz", 99), Err(SignatureError::Invalid));
        let other = UrlSigner::new(b"another key".to_vec());
        assert_eq!(other.verify(&key, expires, &sig, 99), Err(SignatureError::Invalid));
    }
}
