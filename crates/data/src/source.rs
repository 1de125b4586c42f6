//! Finding the samples to pack: every regular file under a folder (or listed in a file), grouped
//! by key, in a deterministic order (by key, then extension, bytewise).

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use crate::naming::{member_name_problem, split_key};
use crate::{DataError, Result};

/// One file of a sample.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SourceFile {
    /// Lowercased, as WebDataset's reader sees it.
    pub ext: String,
    pub path: PathBuf,
    pub size: u64,
}

/// One sample: the files sharing a key, sorted by extension (as WebDataset's writer orders them).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SourceSample {
    pub key: String,
    pub files: Vec<SourceFile>,
}

impl SourceSample {
    /// The bytes this sample takes in a tar: a 512-byte header per file, data padded to 512.
    pub fn tar_bytes(&self) -> u64 {
        self.files.iter().map(|f| 512 + f.size.div_ceil(512) * 512).sum()
    }
}

/// What was found, and what was left out on purpose.
#[derive(Debug, Default)]
pub struct Discovery {
    pub samples: Vec<SourceSample>,
    /// Hidden files (`.name`) and non-regular files, skipped as WebDataset does.
    pub skipped: Vec<PathBuf>,
}

/// Every sample under `root`.
pub fn discover_dir(root: &Path) -> Result<Discovery> {
    let mut names = Vec::new();
    let mut skipped = Vec::new();
    let walker = walkdir::WalkDir::new(root).follow_links(false).sort_by_file_name();
    for entry in walker {
        let entry = entry.map_err(|e| {
            let path = e.path().map(Path::to_path_buf).unwrap_or_else(|| root.to_path_buf());
            DataError::Io { path, source: e.into_io_error().unwrap_or_else(|| std::io::Error::other("walk failed")) }
        })?;
        if entry.depth() == 0 {
            continue;
        }
        let hidden = entry.file_name().to_string_lossy().starts_with('.');
        if entry.file_type().is_dir() {
            continue;
        }
        if hidden || !entry.file_type().is_file() {
            skipped.push(entry.path().to_path_buf());
            continue;
        }
        let relative = entry.path().strip_prefix(root).expect("under the root");
        names.push((relative_name(relative)?, entry.path().to_path_buf()));
    }
    let samples = group(names)?;
    Ok(Discovery { samples, skipped })
}

/// Every sample named in `list` (one path per line, relative to `root`; blank lines and `#`
/// comments ignored).
pub fn discover_list(list: &Path, root: &Path) -> Result<Discovery> {
    let text = std::fs::read_to_string(list).map_err(DataError::io(list))?;
    let mut names = Vec::new();
    for (n, line) in text.lines().enumerate() {
        let line = line.trim();
        if line.is_empty() || line.starts_with('#') {
            continue;
        }
        let relative = Path::new(line);
        if relative.is_absolute() || relative.components().any(|c| matches!(c, std::path::Component::ParentDir)) {
            return Err(DataError::BadInput(format!(
                "{}:{}: {line}: paths in a list are relative to {} and stay inside it",
                list.display(),
                n + 1,
                root.display()
            )));
        }
        names.push((relative_name(relative)?, root.join(relative)));
    }
    let samples = group(names)?;
    Ok(Discovery { samples, skipped: Vec::new() })
}

fn relative_name(relative: &Path) -> Result<String> {
    let name = relative
        .to_str()
        .ok_or_else(|| DataError::BadInput(format!("{}: the name is not UTF-8; rename it", relative.display())))?;
    if let Some(problem) = member_name_problem(name) {
        return Err(DataError::BadInput(problem));
    }
    Ok(name.to_string())
}

/// Groups `(member name, path)` by key, checks them, and reads their sizes.
fn group(names: Vec<(String, PathBuf)>) -> Result<Vec<SourceSample>> {
    let mut by_key: BTreeMap<String, BTreeMap<String, PathBuf>> = BTreeMap::new();
    for (name, path) in names {
        let (key, ext) = split_key(&name).ok_or_else(|| {
            DataError::BadInput(format!(
                "{name}: no extension, so it belongs to no sample (WebDataset groups files by name.extension)"
            ))
        })?;
        let ext = ext.to_lowercase();
        let files = by_key.entry(key.to_string()).or_default();
        if let Some(earlier) = files.insert(ext.clone(), path.clone()) {
            return Err(DataError::BadInput(format!(
                "{} and {}: two files for key {key} and extension {ext}; a sample holds one file per extension",
                earlier.display(),
                path.display()
            )));
        }
    }
    by_key
        .into_iter()
        .map(|(key, files)| {
            let files = files
                .into_iter()
                .map(|(ext, path)| {
                    let meta = std::fs::metadata(&path).map_err(DataError::io(&path))?;
                    Ok(SourceFile { ext, path, size: meta.len() })
                })
                .collect::<Result<Vec<_>>>()?;
            Ok(SourceSample { key, files })
        })
        .collect()
}
