//! The one check for relative paths that come from users (artefact paths, object keys in signed
//! URLs): everything that could reach outside the prefix it is joined to is refused, so that a
//! key built from a [`RelPath`] always stays under its tenant's and job's prefix.

use std::fmt;

/// The longest relative path accepted, in bytes.
pub const MAX_PATH_BYTES: usize = 1024;
/// The longest single segment accepted, in bytes (a common file-name limit).
pub const MAX_SEGMENT_BYTES: usize = 255;
/// The longest segment as the store writes it (escapes included), leaving room for the local
/// store's `#<n>` suffix of a file written aside within a file system's 255-byte names.
pub const MAX_STORED_SEGMENT_BYTES: usize = 240;

/// A relative path that passed [`relative_path`]: non-empty `/`-separated segments, none of them
/// `.` or `..`, no backslash, no control character, no percent-escape.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct RelPath(String);

impl RelPath {
    pub fn as_str(&self) -> &str {
        &self.0
    }

    pub fn segments(&self) -> impl Iterator<Item = &str> {
        self.0.split('/')
    }
}

impl fmt::Display for RelPath {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

/// Why a path was refused, in words for the caller.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{0}")]
pub struct PathRefused(pub &'static str);

/// Checks a user-given relative path. Refuses, rather than normalises, anything unusual: a path
/// that needs cleaning up is more likely an attack than a typo.
pub fn relative_path(text: &str) -> Result<RelPath, PathRefused> {
    if text.is_empty() {
        return Err(PathRefused("must not be empty"));
    }
    if text.len() > MAX_PATH_BYTES {
        return Err(PathRefused("is too long (at most 1024 bytes)"));
    }
    if text.chars().any(char::is_control) {
        return Err(PathRefused("must not contain control characters (NUL, newline, ...)"));
    }
    if text.contains('\\') {
        return Err(PathRefused("must use '/' as separator, never '\\'"));
    }
    if has_percent_escape(text) {
        return Err(PathRefused("must not be percent-encoded (%2f, %2e, ...); send the path as it is"));
    }
    if text.starts_with('/') {
        return Err(PathRefused("must be relative, not start with '/'"));
    }
    for segment in text.split('/') {
        match segment {
            "" => return Err(PathRefused("must not contain empty segments ('//' or a trailing '/')")),
            "." | ".." => return Err(PathRefused("must not contain '.' or '..' segments")),
            s if s.len() > MAX_SEGMENT_BYTES => return Err(PathRefused("has a segment over 255 bytes")),
            // As stored: object_store escapes some characters (three bytes each), and the local
            // store writes an upload aside under the name plus a short suffix first.
            s if object_store::path::PathPart::from(s).as_ref().len() > MAX_STORED_SEGMENT_BYTES => {
                return Err(PathRefused(
                    "has a segment too long to store (at most 240 bytes, each character the store must escape counting 3)",
                ));
            }
            _ => {}
        }
    }
    Ok(RelPath(text.to_string()))
}

/// True when `text` has a `%` followed by two hex digits: an escape some layer might decode
/// into a separator or a dot after this check.
fn has_percent_escape(text: &str) -> bool {
    let bytes = text.as_bytes();
    bytes.windows(3).any(|w| w[0] == b'%' && w[1].is_ascii_hexdigit() && w[2].is_ascii_hexdigit())
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn ordinary_paths_pass() {
        for ok in ["model.pt", "checkpoints/step-100/model.pt", "a b/c.txt", "100%", "ünïcode/名前.bin", ".hidden"]
        {
            assert_eq!(relative_path(ok).map(|p| p.to_string()), Ok(ok.to_string()), "{ok}");
        }
    }

    #[test]
    fn escapes_are_refused() {
        for bad in [
            "",
            "..",
            "../x",
            "a/../../b",
            "a/./b",
            ".",
            "/etc/passwd",
            "a//b",
            "a/",
            "a\\..\\b",
            "..\\x",
            "%2e%2e/x",
            "a%2fb",
            "a%2F..",
            "%2E%2E%2Fx",
            "a\0b",
            "a\nb",
        ] {
            assert!(relative_path(bad).is_err(), "{bad:?} was accepted");
        }
    }

    #[test]
    fn segments_are_measured_as_stored() {
        assert!(relative_path(&"a".repeat(240)).is_ok());
        // Too long once the local store writes it aside as `<name>#1`.
        assert!(relative_path(&"a".repeat(241)).is_err());
        // Escaped by the store: 100 characters become 300 bytes or more.
        assert!(relative_path(&"[".repeat(100)).is_err());
        assert!(relative_path(&"é".repeat(100)).is_err());
        assert!(relative_path(&"é".repeat(20)).is_ok());
    }

    fn segment() -> impl Strategy<Value = String> {
        "[A-Za-z0-9_. -]{1,20}".prop_filter("not a dot segment", |s| s != "." && s != "..")
    }

    proptest! {
        /// Paths made of ordinary segments are accepted unchanged.
        #[test]
        fn ordinary_segments_round_trip(segments in prop::collection::vec(segment(), 1..6)) {
            let text = segments.join("/");
            let path = relative_path(&text).unwrap();
            prop_assert_eq!(path.segments().collect::<Vec<_>>(), segments.iter().map(String::as_str).collect::<Vec<_>>());
        }

        /// Whatever hostile string comes in, an accepted path has only segments that name
        /// something inside the folder it is joined to.
        #[test]
        fn accepted_paths_never_escape(text in "([./\\\\%]|%2[eEfF]|%5[cC]|\\.\\.|a|/|\u{0}){0,12}") {
            if let Ok(path) = relative_path(&text) {
                for segment in path.segments() {
                    prop_assert!(!segment.is_empty() && segment != "." && segment != "..", "{:?}", text);
                    prop_assert!(!segment.contains('\\') && !segment.contains('\0'));
                }
                prop_assert!(!has_percent_escape(path.as_str()));
                prop_assert!(!path.as_str().starts_with('/'));
            }
        }

        /// A `..` segment anywhere is refused, whatever surrounds it.
        #[test]
        fn dot_dot_anywhere_is_refused(
            before in prop::collection::vec(segment(), 0..4),
            after in prop::collection::vec(segment(), 0..4),
        ) {
            let mut segments = before;
            segments.push("..".into());
            segments.extend(after);
            prop_assert!(relative_path(&segments.join("/")).is_err());
        }
    }
}
