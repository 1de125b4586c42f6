//! Shipping code with a job: `yard submit` packs the folder it runs in (as git sees it: what
//! `.gitignore` and `.yardignore` leave out stays out, and `.git` itself) into a tar archive,
//! uploads it by its SHA-256, and names that digest in the job. The archive is deterministic (sorted
//! paths, no times or owners), so the same files always give the same digest.

use std::path::Path;

use anyhow::{Context, bail};
use sha2::{Digest, Sha256};

/// The largest archive the server takes.
pub const MAX_BYTES: usize = 32 * 1024 * 1024;
/// The most files the server takes.
pub const MAX_FILES: usize = 10_000;

/// A packed folder.
pub struct Packed {
    pub archive: Vec<u8>,
    /// `sha256:<hex>` of `archive`.
    pub digest: String,
    pub files: usize,
    /// Symbolic links and other non-files left out.
    pub skipped: Vec<String>,
}

/// Packs `dir` as described above, or says why it cannot (too big, too many files).
pub fn pack(dir: &Path) -> anyhow::Result<Packed> {
    let mut paths = Vec::new();
    let mut skipped = Vec::new();
    let walk = ignore::WalkBuilder::new(dir)
        .hidden(false)
        .require_git(false)
        .add_custom_ignore_filename(".yardignore")
        .filter_entry(|entry| entry.file_name() != ".git")
        .build();
    for entry in walk {
        let entry = entry.with_context(|| format!("reading {}", dir.display()))?;
        let Some(kind) = entry.file_type() else { continue };
        if kind.is_dir() {
            continue;
        }
        let relative = entry.path().strip_prefix(dir).unwrap_or(entry.path()).to_path_buf();
        if !kind.is_file() {
            skipped.push(relative.display().to_string());
            continue;
        }
        paths.push(relative);
        if paths.len() > MAX_FILES {
            bail!(
                "{} holds more than {MAX_FILES} files to ship; list what the job does not need in .yardignore, \
                 or submit with --no-code",
                dir.display()
            );
        }
    }
    paths.sort();
    let mut builder = tar::Builder::new(Vec::new());
    let mut total = 0usize;
    for relative in &paths {
        let path = dir.join(relative);
        let content = std::fs::read(&path).with_context(|| format!("reading {}", path.display()))?;
        total += content.len();
        if total > MAX_BYTES {
            bail!(
                "{} holds more than {} MiB to ship; list what the job does not need (data, checkpoints) in \
                 .yardignore, put data in a volume or dataset, or submit with --no-code",
                dir.display(),
                MAX_BYTES >> 20
            );
        }
        let executable = std::os::unix::fs::PermissionsExt::mode(&std::fs::metadata(&path)?.permissions()) & 0o111 != 0;
        let mut header = tar::Header::new_ustar();
        header.set_size(content.len() as u64);
        header.set_mode(if executable { 0o755 } else { 0o644 });
        header.set_mtime(0);
        header.set_cksum();
        let name = relative.to_str().with_context(|| format!("{}: the path is not UTF-8", relative.display()))?;
        builder.append_data(&mut header, name, content.as_slice())?;
    }
    let archive = builder.into_inner()?;
    if archive.len() > MAX_BYTES {
        bail!(
            "{} packs to more than {} MiB; list what the job does not need in .yardignore",
            dir.display(),
            MAX_BYTES >> 20
        );
    }
    let digest = format!("sha256:{}", hex::encode(Sha256::digest(&archive)));
    Ok(Packed { archive, digest, files: paths.len(), skipped })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_same_files_give_the_same_digest_and_ignored_ones_stay_out() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(dir.path().join("train.py"), "print(1)\n").unwrap();
        std::fs::create_dir(dir.path().join("data")).unwrap();
        std::fs::write(dir.path().join("data/big.bin"), vec![0u8; 1000]).unwrap();
        std::fs::write(dir.path().join(".yardignore"), "data/\n").unwrap();
        std::fs::create_dir(dir.path().join(".git")).unwrap();
        std::fs::write(dir.path().join(".git/HEAD"), "ref: refs/heads/main\n").unwrap();
        let first = pack(dir.path()).unwrap();
        assert_eq!(first.files, 2, "train.py and .yardignore; not data/ nor .git");
        let names: Vec<String> = tar::Archive::new(first.archive.as_slice())
            .entries()
            .unwrap()
            .map(|e| e.unwrap().path().unwrap().display().to_string())
            .collect();
        assert_eq!(names, [".yardignore", "train.py"]);
        // Touching a file changes nothing that is shipped: the digest stays.
        std::fs::write(dir.path().join("train.py"), "print(1)\n").unwrap();
        assert_eq!(pack(dir.path()).unwrap().digest, first.digest);
        std::fs::write(dir.path().join("train.py"), "print(2)\n").unwrap();
        assert_ne!(pack(dir.path()).unwrap().digest, first.digest, "other content, another digest");
    }
}
