//! Code archives shipped with jobs, as launches read them: a tar archive in the tenant's storage
//! under its content digest, unpacked into every replica's working directory at each launch (the
//! upload is `app/code.rs`'s). The digest is in the job's spec, so the run record says exactly
//! what code ran, and submitting again runs it again. Below both the control loop (which
//! launches) and the application (which checks uploads with [`unpack`]).

use axum::body::Bytes;
use trainyard_executor::CodeFile;
use trainyard_storage::keys;
use uuid::Uuid;

/// The largest archive a job may ship (bigger code belongs in an image or a volume).
pub const MAX_CODE_BYTES: usize = 32 * 1024 * 1024;
/// The most files an archive may hold.
pub const MAX_CODE_FILES: usize = 10_000;

/// Why a launch could not read its job's code.
#[derive(Debug)]
pub enum CodeUnavailable {
    /// The object store did not answer: the control plane's problem, retried.
    Store(String),
    /// The archive is gone or unreadable: the job cannot run.
    Archive(String),
}

/// Reads an archive's files for a launch.
pub async fn code_files(
    storage: &crate::storage::Storage,
    tenant_id: Uuid,
    digest: &str,
) -> std::result::Result<Vec<CodeFile>, CodeUnavailable> {
    let key = keys::code_key(tenant_id, digest.trim_start_matches("sha256:"));
    let store =
        |err: &dyn std::fmt::Display| CodeUnavailable::Store(format!("reading the code archive {digest}: {err}"));
    let (_, stream) = storage.objects.download(&key).await.map_err(|err| store(&err))?.ok_or_else(|| {
        CodeUnavailable::Archive(format!("the code archive {digest} is gone from the tenant's storage"))
    })?;
    let bytes: Vec<Bytes> = futures::TryStreamExt::try_collect(stream).await.map_err(|err| store(&err))?;
    unpack(&bytes.concat()).map_err(|why| CodeUnavailable::Archive(format!("the code archive {digest}: {why}")))
}

/// The files of an archive: plain files at relative paths with no `..`; folders are implied by
/// the paths; links, devices and anything else are refused, as are more than
/// [`MAX_CODE_FILES`] files.
pub fn unpack(archive: &[u8]) -> std::result::Result<Vec<CodeFile>, String> {
    let mut files = Vec::new();
    let mut entries = tar::Archive::new(archive);
    for entry in entries.entries().map_err(|err| format!("not a tar archive: {err}"))? {
        let mut entry = entry.map_err(|err| format!("not a tar archive: {err}"))?;
        let path = entry.path().map_err(|err| format!("an entry's path does not read: {err}"))?.into_owned();
        let shown = path.display().to_string();
        let relative = path.components().all(|c| matches!(c, std::path::Component::Normal(_)));
        if !relative || path.as_os_str().is_empty() {
            return Err(format!("{shown:?}: paths must be relative, without '..'"));
        }
        let kind = entry.header().entry_type();
        if kind.is_dir() {
            continue;
        }
        if !kind.is_file() {
            return Err(format!("{shown:?}: only plain files and folders can be shipped, not links or devices"));
        }
        if files.len() == MAX_CODE_FILES {
            return Err(format!("more than {MAX_CODE_FILES} files"));
        }
        let path = path.to_str().ok_or_else(|| format!("{shown:?}: paths must be UTF-8"))?.to_string();
        let executable = entry.header().mode().is_ok_and(|mode| mode & 0o111 != 0);
        let mut content = Vec::new();
        std::io::Read::read_to_end(&mut entry, &mut content).map_err(|err| format!("{shown:?}: {err}"))?;
        files.push(CodeFile { path, executable, content });
    }
    Ok(files)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn archive(entries: &[(&str, &[u8], u32)]) -> Vec<u8> {
        let mut builder = tar::Builder::new(Vec::new());
        for (path, content, mode) in entries {
            let mut header = tar::Header::new_gnu();
            header.set_size(content.len() as u64);
            header.set_mode(*mode);
            header.set_cksum();
            builder.append_data(&mut header, path, *content).unwrap();
        }
        builder.into_inner().unwrap()
    }

    #[test]
    fn an_archive_gives_its_files_with_their_executable_bit() {
        let files = unpack(&archive(&[("train.py", b"print(1)", 0o644), ("bin/run.sh", b"#!/bin/sh", 0o755)])).unwrap();
        assert_eq!(files.len(), 2);
        assert_eq!(
            (files[0].path.as_str(), files[0].executable, &files[0].content[..]),
            ("train.py", false, &b"print(1)"[..])
        );
        assert_eq!((files[1].path.as_str(), files[1].executable), ("bin/run.sh", true));
    }

    #[test]
    fn escaping_paths_links_and_garbage_are_refused() {
        // The tar builder refuses `..` itself: write the name into the header by hand.
        let mut header = tar::Header::new_gnu();
        header.as_gnu_mut().unwrap().name[..9].copy_from_slice(b"../x.py\0\0");
        header.set_size(0);
        header.set_cksum();
        let mut escaping = header.as_bytes().to_vec();
        escaping.extend([0u8; 1024]);
        assert!(unpack(&escaping).unwrap_err().contains("relative"), "{:?}", unpack(&escaping));

        let mut builder = tar::Builder::new(Vec::new());
        let mut link = tar::Header::new_gnu();
        link.set_entry_type(tar::EntryType::Symlink);
        link.set_size(0);
        builder.append_link(&mut link, "secrets", "/etc/shadow").unwrap();
        let links = builder.into_inner().unwrap();
        assert!(unpack(&links).unwrap_err().contains("only plain files"));

        assert!(unpack(b"this is not a tar archive, just some text that is long enough").is_err());
    }
}
