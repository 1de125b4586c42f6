//! File operations of the server (root) inside folders a tenant's processes can write: only
//! through directory handles, one name at a time, never following a link.
//!
//! A path like `<workdir>/pkg/train.py` names a file through folders the tenant controls: between
//! any check and any use, a replica can swap `pkg` for a link to `/etc` or to another tenant's
//! folder, and a root process that opens, writes, chmods, chowns or deletes by path then does it
//! there. Here every folder is opened from its parent's handle with `O_NOFOLLOW`
//! ([`open_subdir`]), every file is opened with `O_NOFOLLOW`, and every
//! change of owner or removal names one entry relative to an open folder (`fchownat` with
//! `AT_SYMLINK_NOFOLLOW`, `unlinkat`), so a link is seen as a link and nothing is reached through
//! one. (cap-std's handles also refuse `..` and absolute paths: nothing resolves outside them.)

use std::io::Write;
use std::path::{Component, Path};

use cap_fs_ext::{FollowSymlinks, OpenOptionsFollowExt};
use cap_std::ambient_authority;
use cap_std::fs::{Dir, OpenOptions, Permissions, PermissionsExt};
use rustix::fs::{AtFlags, Gid, Uid};

/// Opens a folder the server itself made, by its path (every folder above it is the server's),
/// refusing a link in its place.
pub fn open_own_dir(path: &Path) -> std::io::Result<Dir> {
    let parent = path.parent().ok_or_else(|| std::io::Error::other(format!("{} has no parent", path.display())))?;
    let name = path.file_name().ok_or_else(|| std::io::Error::other(format!("{} names no folder", path.display())))?;
    open_subdir(&Dir::open_ambient_dir(parent, ambient_authority())?, name)
}

/// Opens the folder `name` in `dir`, refusing a link in its place: a real descriptor
/// (`O_RDONLY|O_DIRECTORY|O_NOFOLLOW`, where cap-std's own opens are `O_PATH`), so that its owner
/// and mode can be changed through it.
pub fn open_subdir(dir: &Dir, name: &std::ffi::OsStr) -> std::io::Result<Dir> {
    use rustix::fs::{Mode, OFlags};
    let flags = OFlags::RDONLY | OFlags::DIRECTORY | OFlags::NOFOLLOW | OFlags::CLOEXEC;
    let fd = rustix::fs::openat(dir, name, flags, Mode::empty())?;
    Ok(Dir::from_std_file(std::fs::File::from(fd)))
}

/// Opens (or, with `create`, makes) the folder at the relative `path` under `root`, one
/// component at a time, following no link.
pub fn open_dir_beneath(root: &Dir, path: &Path, create: bool) -> std::io::Result<Dir> {
    let mut dir = root.try_clone()?;
    for component in path.components() {
        let Component::Normal(name) = component else {
            return Err(std::io::Error::new(
                std::io::ErrorKind::InvalidInput,
                format!("{} is not a plain relative path", path.display()),
            ));
        };
        if create {
            match dir.create_dir(name) {
                Err(err) if err.kind() != std::io::ErrorKind::AlreadyExists => return Err(err),
                _ => {}
            }
        }
        dir = open_subdir(&dir, name)?;
    }
    Ok(dir)
}

/// A plain file in a folder, as [`files_in`] lists it: never a link, a folder or a device.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PlainFile {
    pub name: String,
    pub size_bytes: u64,
    pub modified: std::time::SystemTime,
}

/// The plain files directly in `dir` whose names `keep` accepts, each with its size and time,
/// read from the entry itself (`lstat`): a link is left out, never followed, whatever it names.
pub fn files_in(dir: &Dir, keep: impl Fn(&str) -> bool) -> std::io::Result<Vec<PlainFile>> {
    let mut files = Vec::new();
    for entry in dir.entries()? {
        let entry = entry?;
        let Ok(name) = entry.file_name().into_string() else { continue };
        if !keep(&name) || !entry.file_type()?.is_file() {
            continue;
        }
        let meta = match dir.symlink_metadata(&name) {
            Ok(meta) if meta.is_file() => meta,
            // Gone since the listing (a pruned checkpoint), or replaced by something else.
            Ok(_) => continue,
            Err(err) if err.kind() == std::io::ErrorKind::NotFound => continue,
            Err(err) => return Err(err),
        };
        files.push(PlainFile { name, size_bytes: meta.len(), modified: meta.modified()?.into_std() });
    }
    Ok(files)
}

/// Opens the plain file `name` in `dir` to read it: a link in its place is an error
/// (`O_NOFOLLOW`), and so is anything but a regular file (opened without blocking, so that a
/// FIFO planted under the name cannot hold the reader).
pub fn open_plain_file(dir: &Dir, name: &str) -> std::io::Result<std::fs::File> {
    use rustix::fs::{Mode, OFlags};
    let flags = OFlags::RDONLY | OFlags::NOFOLLOW | OFlags::NONBLOCK | OFlags::CLOEXEC;
    let file = std::fs::File::from(rustix::fs::openat(dir, name, flags, Mode::empty())?);
    if !file.metadata()?.is_file() {
        return Err(std::io::Error::new(std::io::ErrorKind::InvalidInput, format!("{name} is not a plain file")));
    }
    Ok(file)
}

/// Writes `content` to the relative `path` under `root` with `mode`, making the folders on the
/// way; a link anywhere on the way (or in the file's place) is an error, never followed.
pub fn write_beneath(root: &Dir, path: &Path, content: &[u8], mode: u32) -> std::io::Result<()> {
    let name = path.file_name().ok_or_else(|| {
        std::io::Error::new(std::io::ErrorKind::InvalidInput, format!("{} names no file", path.display()))
    })?;
    let folder = match path.parent() {
        Some(parent) if !parent.as_os_str().is_empty() => open_dir_beneath(root, parent, true)?,
        _ => root.try_clone()?,
    };
    let mut options = OpenOptions::new();
    options.write(true).create(true).truncate(true).follow(FollowSymlinks::No);
    let mut file = folder.open_with(name, &options)?;
    file.write_all(content)?;
    // On the open file, not by name: the mode lands on what was written.
    file.set_permissions(Permissions::from_mode(mode))
}

/// Gives the folder at `path` (a folder the server made: see [`open_own_dir`]) and everything
/// in it to `uid:gid`, and makes the folder private to them (0700). Links are left as they are,
/// never followed; a file with several names (a hard link, which could be another user's file
/// linked in) keeps its owner.
pub fn give_tree(path: &Path, uid: u32, gid: u32) -> std::io::Result<()> {
    let top = open_own_dir(path)?;
    let owner = (Some(Uid::from_raw(uid)), Some(Gid::from_raw(gid)));
    rustix::fs::fchown(&top, owner.0, owner.1)?;
    rustix::fs::fchmod(&top, rustix::fs::Mode::from_raw_mode(0o700))?;
    let mut pending = vec![top];
    while let Some(dir) = pending.pop() {
        for entry in dir.entries()? {
            let entry = entry?;
            let name = entry.file_name();
            // The entry's own type (a link is a link), read without following it.
            let kind = entry.file_type()?;
            if kind.is_dir() {
                let child = open_subdir(&dir, &name)?;
                rustix::fs::fchown(&child, owner.0, owner.1)?;
                pending.push(child);
            } else if kind.is_file() {
                use cap_std::fs::MetadataExt;
                if dir.symlink_metadata(&name)?.nlink() > 1 {
                    tracing::warn!(name = %name.to_string_lossy(), "a file with several names keeps its owner");
                    continue;
                }
                rustix::fs::chownat(&dir, &name, owner.0, owner.1, AtFlags::SYMLINK_NOFOLLOW)?;
            }
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn writing_through_a_planted_link_is_refused_and_reaches_nothing() {
        let dir = tempfile::tempdir().unwrap();
        let outside = dir.path().join("outside");
        std::fs::create_dir(&outside).unwrap();
        std::fs::write(outside.join("victim"), "precious").unwrap();
        let work = dir.path().join("work");
        std::fs::create_dir(&work).unwrap();
        // A file replaced by a link, and a folder replaced by a link.
        std::os::unix::fs::symlink(outside.join("victim"), work.join("train.py")).unwrap();
        std::os::unix::fs::symlink(&outside, work.join("pkg")).unwrap();

        let root = open_own_dir(&work).unwrap();
        assert!(write_beneath(&root, Path::new("train.py"), b"evil", 0o644).is_err());
        assert!(write_beneath(&root, Path::new("pkg/victim"), b"evil", 0o644).is_err());
        assert!(write_beneath(&root, Path::new("pkg/new"), b"evil", 0o644).is_err());
        assert!(write_beneath(&root, Path::new("../outside/victim"), b"evil", 0o644).is_err());
        assert_eq!(std::fs::read_to_string(outside.join("victim")).unwrap(), "precious");
        assert!(!outside.join("new").exists());

        // A link in the folder's own place is refused too.
        std::os::unix::fs::symlink(&outside, dir.path().join("work-link")).unwrap();
        assert!(open_own_dir(&dir.path().join("work-link")).is_err());
    }

    #[test]
    fn reading_lists_and_opens_plain_files_only_and_follows_no_link() {
        let dir = tempfile::tempdir().unwrap();
        let outside = dir.path().join("outside");
        std::fs::create_dir(&outside).unwrap();
        std::fs::write(outside.join("secret"), "another tenant's").unwrap();
        let work = dir.path().join("work");
        std::fs::create_dir_all(work.join("sub")).unwrap();
        std::fs::write(work.join("sub/real"), "mine").unwrap();
        std::os::unix::fs::symlink(outside.join("secret"), work.join("sub/link")).unwrap();
        std::os::unix::fs::symlink(&outside, work.join("linked")).unwrap();
        rustix::fs::mknodat(
            rustix::fs::CWD,
            work.join("sub/fifo"),
            rustix::fs::FileType::Fifo,
            rustix::fs::Mode::from_raw_mode(0o600),
            0,
        )
        .unwrap();

        let root = open_own_dir(&work).unwrap();
        let sub = open_dir_beneath(&root, Path::new("sub"), false).unwrap();
        let listed: Vec<String> = files_in(&sub, |_| true).unwrap().into_iter().map(|f| f.name).collect();
        assert_eq!(listed, ["real"], "neither the link nor the FIFO is listed");
        assert!(open_plain_file(&sub, "link").is_err(), "a link is not followed");
        assert!(open_plain_file(&sub, "fifo").is_err(), "a FIFO is refused without blocking");
        assert_eq!(std::io::read_to_string(open_plain_file(&sub, "real").unwrap()).unwrap(), "mine");
        assert!(open_dir_beneath(&root, Path::new("linked"), false).is_err(), "a linked folder is not entered");
    }

    #[test]
    fn writes_files_and_folders_with_their_modes() {
        use std::os::unix::fs::PermissionsExt as _;
        let dir = tempfile::tempdir().unwrap();
        let root = open_own_dir(dir.path()).unwrap();
        write_beneath(&root, Path::new("a/b/run.sh"), b"#!/bin/sh\n", 0o755).unwrap();
        write_beneath(&root, Path::new("a/b/run.sh"), b"#!/bin/sh\ntrue\n", 0o755).unwrap();
        write_beneath(&root, Path::new("top.txt"), b"x", 0o644).unwrap();
        let script = dir.path().join("a/b/run.sh");
        assert_eq!(std::fs::read_to_string(&script).unwrap(), "#!/bin/sh\ntrue\n");
        assert_eq!(std::fs::metadata(&script).unwrap().permissions().mode() & 0o777, 0o755);
        assert_eq!(std::fs::metadata(dir.path().join("top.txt")).unwrap().permissions().mode() & 0o777, 0o644);
    }

    #[test]
    fn giving_a_tree_away_leaves_what_links_point_at_alone() {
        use std::os::unix::fs::MetadataExt as _;
        let me = (nix::unistd::getuid().as_raw(), nix::unistd::getgid().as_raw());
        let dir = tempfile::tempdir().unwrap();
        let outside = dir.path().join("outside.txt");
        std::fs::write(&outside, "x").unwrap();
        let tree = dir.path().join("tree");
        std::fs::create_dir_all(tree.join("sub")).unwrap();
        std::fs::write(tree.join("sub/file"), "y").unwrap();
        std::os::unix::fs::symlink(&outside, tree.join("sub/link")).unwrap();
        // Giving to ourselves works everywhere (root or not); what it touches is what counts.
        give_tree(&tree, me.0, me.1).unwrap();
        assert_eq!(std::fs::metadata(&tree).unwrap().mode() & 0o777, 0o700);
        assert_eq!(std::fs::metadata(&outside).unwrap().uid(), me.0);
        if nix::unistd::geteuid().is_root() {
            let (uid, gid) = (3_999_001, 3_999_001);
            give_tree(&tree, uid, gid).unwrap();
            assert_eq!(std::fs::metadata(tree.join("sub/file")).unwrap().uid(), uid);
            assert_eq!(
                std::fs::symlink_metadata(tree.join("sub/link")).unwrap().uid(),
                me.0,
                "the link itself untouched"
            );
            assert_eq!(std::fs::metadata(&outside).unwrap().uid(), me.0, "what the link names untouched");
        }
    }
}
