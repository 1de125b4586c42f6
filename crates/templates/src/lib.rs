//! Task templates: how a team's job is described once and submitted many times with a few typed
//! parameters.
//!
//! A template is a [`Bundle`]: the text of `template.yaml` plus the files the job receives. Loading
//! it ([`Template::load`]) parses and checks the manifest completely, so a broken template fails at
//! load, naming the file, the field and the rule, never at submit. Submitting checks the
//! parameters against their declared types and bounds ([`Template::check_params`]) and renders the
//! manifest to a job spec ([`Template::render`]): data in, argv out. A parameter value becomes at
//! most part of one argv element; it can never add arguments, reach a shell, or read the
//! environment or files; the same template and parameters always give the same spec.

mod manifest;
mod params;
mod render;

use std::collections::BTreeMap;
use std::fmt;

use sha2::{Digest, Sha256};

pub use manifest::{ArgSpec, Manifest, OutputSpec, ParamKind, ParamSpec, Quantity};
pub use params::{CheckpointRef, Params};

/// The manifest's file name inside a template folder.
pub const MANIFEST_FILE: &str = "template.yaml";
pub use trainyard_core::job::TEMPLATE_FILES_DIR;
/// The most a bundle's files may weigh together.
pub const MAX_BUNDLE_BYTES: usize = 1024 * 1024;

/// A template as uploaded or read from a folder: the manifest text and the other files by
/// relative path.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct Bundle {
    pub manifest: String,
    pub files: BTreeMap<String, Vec<u8>>,
}

/// A problem found while loading a template: the file, the field path within it, and the rule.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{file}: {field}: {message}")]
pub struct LoadError {
    pub file: String,
    pub field: String,
    pub message: String,
}

impl LoadError {
    pub(crate) fn manifest(field: impl Into<String>, message: impl Into<String>) -> LoadError {
        LoadError { file: MANIFEST_FILE.to_string(), field: field.into(), message: message.into() }
    }
}

impl From<LoadError> for trainyard_core::Error {
    fn from(err: LoadError) -> Self {
        trainyard_core::Error::invalid(err.field.clone(), format!("{}: {}", err.file, err.message))
    }
}

/// A loaded, fully checked template.
#[derive(Debug, Clone)]
pub struct Template {
    pub manifest: Manifest,
    pub files: BTreeMap<String, Vec<u8>>,
    /// `sha256:<hex>` over the canonical manifest and the files; see [`Template::digest_of`].
    pub digest: String,
}

impl Template {
    /// Parses and checks a bundle.
    pub fn load(bundle: &Bundle) -> Result<Template, LoadError> {
        for (path, content) in &bundle.files {
            check_file_path(path)?;
            if std::str::from_utf8(content).is_err() && path.ends_with(".yaml") {
                return Err(LoadError { file: path.clone(), field: "-".into(), message: "is not UTF-8".into() });
            }
        }
        let total: usize = bundle.files.values().map(Vec::len).sum::<usize>() + bundle.manifest.len();
        if total > MAX_BUNDLE_BYTES {
            return Err(LoadError::manifest(
                "files",
                format!("the template weighs {total} bytes; at most {MAX_BUNDLE_BYTES}"),
            ));
        }
        let manifest = manifest::parse(&bundle.manifest)?;
        manifest::check(&manifest, &bundle.files)?;
        let files: BTreeMap<String, Vec<u8>> = bundle
            .files
            .iter()
            .filter(|(path, _)| manifest.delivers(path))
            .map(|(p, c)| (p.clone(), c.clone()))
            .collect();
        let digest = Template::digest_of(&manifest, &files);
        Ok(Template { manifest, files, digest })
    }

    /// The content digest: SHA-256 over the manifest as canonical JSON (so comments and
    /// formatting do not count, but every value does) followed by each delivered file in path
    /// order as `path NUL length NUL bytes`.
    pub fn digest_of(manifest: &Manifest, files: &BTreeMap<String, Vec<u8>>) -> String {
        let mut hasher = Sha256::new();
        hasher.update(serde_json::to_vec(manifest).expect("manifest serialises"));
        for (path, content) in files {
            hasher.update([0u8]);
            hasher.update(path.as_bytes());
            hasher.update([0u8]);
            hasher.update(content.len().to_string().as_bytes());
            hasher.update([0u8]);
            hasher.update(content);
        }
        format!("sha256:{}", hex::encode(hasher.finalize()))
    }

    pub fn name(&self) -> &str {
        &self.manifest.name
    }

    pub fn version(&self) -> &semver::Version {
        &self.manifest.version
    }
}

impl fmt::Display for Template {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}@{}", self.manifest.name, self.manifest.version)
    }
}

/// Bundle paths are relative, plain, and stay inside the bundle.
fn check_file_path(path: &str) -> Result<(), LoadError> {
    let bad = |message: &str| LoadError { file: path.to_string(), field: "-".into(), message: message.into() };
    if path.is_empty() || path.len() > 255 {
        return Err(bad("a file path is 1 to 255 bytes"));
    }
    if path.starts_with('/') || path.contains('\\') || path.contains('\0') {
        return Err(bad("file paths are relative, with '/' between folders"));
    }
    if path.split('/').any(|part| part.is_empty() || part == "." || part == "..") {
        return Err(bad("file paths may not contain empty, '.' or '..' parts"));
    }
    Ok(())
}

#[cfg(test)]
mod tests;
