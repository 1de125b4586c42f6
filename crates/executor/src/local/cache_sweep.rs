//! The machine-wide budget of the node's shard cache, held by the server.
//!
//! The engine's cache (`templates/pytorch-ddp/engine/cache.py`) evicts after each fill, but a
//! replica sees only the namespaces its user can read: with one Unix user per tenant (the local
//! executor's isolation), each tenant's processes hold the machine's budget with their own
//! entries alone, and ten tenants could fill ten budgets. The server reads every namespace, so
//! after an attempt ends it evicts, across all of them, the least recently used entries no
//! process holds until the cache is within the machine's budget.
//!
//! The protocol is cache.py's, so that the two never disagree: entries are shards
//! (`<namespace>/<sha[:2]>/<sha>`) and dataset indexes (`<namespace>/indexes/<content hash>/
//! <name>`); recency is the access time, which every use sets; an entry is deleted only under
//! an exclusive non-blocking `flock` of its fill lock (`<path>.lock`, when there is one) and of
//! the entry itself, so a shard a reader holds (a shared `flock`) or one being filled or checked
//! is kept, and the entry is deleted only if its name still points at the file locked.

use std::path::{Path, PathBuf};

use cap_fs_ext::{FollowSymlinks, OpenOptionsFollowExt};
use cap_std::fs::{Dir, MetadataExt, OpenOptions};
use nix::fcntl::{Flock, FlockArg};
use trainyard_core::job::is_sha256_hex;

use super::tenant_fs;

/// One cached entry: when last used (ns since the epoch), its size and where it is: a file
/// `name` in `folder` (relative) of a namespace. Never a path to follow: every folder under a
/// namespace is the tenant's, and a replica can swap any of them for a link at any time, so each
/// is opened from its parent's handle with no link followed ([`tenant_fs`]).
struct Entry {
    used_ns: i128,
    size: u64,
    namespace: String,
    folder: PathBuf,
    name: String,
}

/// What a sweep did.
#[derive(Debug, Default, PartialEq, Eq)]
pub struct Swept {
    /// Entries deleted.
    pub evicted: usize,
    /// Bytes the cache holds afterwards (over the budget only when the rest is in use).
    pub bytes_left: u64,
}

/// Evicts the least recently used entries not in use, in every namespace under `root`, until
/// the cache holds at most `budget` bytes.
pub fn sweep(root: &Path, budget: u64) -> Swept {
    sweep_in(root, None, budget)
}

/// [`sweep`] within one namespace (a tenant's share of the cache): its own least recently used
/// entries not in use go until it holds at most `budget` bytes.
pub fn sweep_namespace(root: &Path, namespace: &str, budget: u64) -> Swept {
    sweep_in(root, Some(namespace), budget)
}

fn sweep_in(root: &Path, only: Option<&str>, budget: u64) -> Swept {
    // The root is the server's own folder (0755, nobody else writes in it).
    let Ok(root) = Dir::open_ambient_dir(root, cap_std::ambient_authority()) else {
        return Swept::default();
    };
    evict_to(&root, entries(&root, only), budget)
}

fn evict_to(root: &Dir, mut entries: Vec<Entry>, budget: u64) -> Swept {
    let mut total: u64 = entries.iter().map(|e| e.size).sum();
    let mut swept = Swept::default();
    entries.sort_by_key(|e| e.used_ns);
    for entry in &entries {
        if total <= budget {
            break;
        }
        match evict(root, entry) {
            Outcome::Evicted => {
                total -= entry.size;
                swept.evicted += 1;
            }
            Outcome::Gone => total -= entry.size,
            Outcome::Kept => {}
        }
    }
    swept.bytes_left = total;
    swept
}

/// Every shard and index under `root` (in `only` namespace, when given), as cache.py lists them.
fn entries(root: &Dir, only: Option<&str>) -> Vec<Entry> {
    let mut found = Vec::new();
    for namespace in names(root).filter(|n| is_namespace(n) && only.is_none_or(|only| only == n)) {
        let Ok(namespace_dir) = tenant_fs::open_subdir(root, namespace.as_ref()) else { continue };
        for prefix in names(&namespace_dir) {
            let Ok(folder) = tenant_fs::open_subdir(&namespace_dir, prefix.as_ref()) else { continue };
            if prefix == "indexes" {
                for content in names(&folder).filter(|c| is_sha256_hex(c)) {
                    let Ok(content_dir) = tenant_fs::open_subdir(&folder, content.as_ref()) else { continue };
                    let relative = Path::new(&prefix).join(&content);
                    for name in names(&content_dir).filter(|n| !n.starts_with(".fill-")) {
                        found.extend(entry(&content_dir, &namespace, &relative, name));
                    }
                }
            } else {
                for name in names(&folder).filter(|n| is_sha256_hex(n) && n.get(..2) == Some(prefix.as_str())) {
                    found.extend(entry(&folder, &namespace, Path::new(&prefix), name));
                }
            }
        }
    }
    found
}

fn entry(dir: &Dir, namespace: &str, folder: &Path, name: String) -> Option<Entry> {
    // The entry itself, not what it may link to: a link is no entry.
    let info = dir.symlink_metadata(&name).ok()?;
    info.is_file().then(|| Entry {
        used_ns: i128::from(info.atime()) * 1_000_000_000 + i128::from(info.atime_nsec()),
        size: info.len(),
        namespace: namespace.to_string(),
        folder: folder.to_path_buf(),
        name,
    })
}

enum Outcome {
    Evicted,
    Gone,
    Kept,
}

/// Opens a file in `dir` to read, refusing a link in its place.
fn open_nofollow(dir: &Dir, name: &str) -> std::io::Result<std::fs::File> {
    let mut options = OpenOptions::new();
    options.read(true).follow(FollowSymlinks::No);
    Ok(dir.open_with(name, &options)?.into_std())
}

/// Deletes the entry unless it is in use or being filled or checked.
fn evict(root: &Dir, entry: &Entry) -> Outcome {
    let Ok(folder) = tenant_fs::open_subdir(root, entry.namespace.as_ref())
        .and_then(|namespace| tenant_fs::open_dir_beneath(&namespace, &entry.folder, false))
    else {
        return Outcome::Gone;
    };
    // Held until the entry is deleted: a fill waiting on it finds the entry gone, and fetches.
    let _fill_lock = match open_nofollow(&folder, &format!("{}.lock", entry.name)) {
        Ok(file) => match Flock::lock(file, FlockArg::LockExclusiveNonblock) {
            Ok(locked) => Some(locked),
            Err(_) => return Outcome::Kept,
        },
        Err(_) => None, // never filled beside it (an index): the entry's own lock is enough
    };
    let Ok(file) = open_nofollow(&folder, &entry.name) else { return Outcome::Gone };
    let Ok(locked) = Flock::lock(file, FlockArg::LockExclusiveNonblock) else { return Outcome::Kept };
    // Replaced since it was listed: the file under the name is someone's new fill.
    let same = match (locked.metadata(), folder.symlink_metadata(&entry.name)) {
        (Ok(opened), Ok(named)) => {
            use std::os::unix::fs::MetadataExt as _;
            (opened.dev(), opened.ino()) == (named.dev(), named.ino())
        }
        _ => false,
    };
    if !same {
        return Outcome::Kept;
    }
    // `unlinkat` in the folder's handle: the name itself goes, whatever it is.
    match folder.remove_file(&entry.name) {
        Ok(()) => Outcome::Evicted,
        Err(err) if err.kind() == std::io::ErrorKind::NotFound => Outcome::Gone,
        Err(_) => Outcome::Kept,
    }
}

/// The names in `folder`, sorted; none when it cannot be read.
fn names(folder: &Dir) -> impl Iterator<Item = String> + use<> {
    let mut names: Vec<String> =
        folder.entries().into_iter().flatten().flatten().filter_map(|e| e.file_name().into_string().ok()).collect();
    names.sort();
    names.into_iter()
}

/// A tenant namespace's folder name, as cache.py accepts it: `[a-z0-9][a-z0-9-]{0,62}`.
fn is_namespace(name: &str) -> bool {
    let bytes = name.as_bytes();
    !bytes.is_empty()
        && bytes.len() <= 63
        && (bytes[0].is_ascii_lowercase() || bytes[0].is_ascii_digit())
        && bytes.iter().all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || *b == b'-')
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::{Duration, SystemTime};

    /// A cached entry of `size` bytes at `relative`, last used `age` ago.
    fn put(root: &Path, relative: &str, size: usize, age: Duration) -> PathBuf {
        let path = root.join(relative);
        std::fs::create_dir_all(path.parent().unwrap()).unwrap();
        std::fs::write(&path, vec![7u8; size]).unwrap();
        let used = SystemTime::now() - age;
        let file = std::fs::File::options().write(true).open(&path).unwrap();
        file.set_times(std::fs::FileTimes::new().set_accessed(used)).unwrap();
        path
    }

    fn sha(n: u8) -> String {
        format!("{n:02x}{}", "0".repeat(62))
    }

    fn shard(namespace: &str, n: u8) -> String {
        let sha = sha(n);
        format!("{namespace}/{}/{sha}", &sha[..2])
    }

    #[test]
    fn evicts_the_least_recently_used_across_tenants_until_within_budget() {
        let dir = tempfile::tempdir().unwrap();
        let root = dir.path();
        let minutes = |m: u64| Duration::from_secs(60 * m);
        let a_old = put(root, &shard("tenant-a", 1), 1000, minutes(50));
        let b_old = put(root, &shard("tenant-b", 2), 1000, minutes(40));
        let index = put(root, &format!("tenant-b/indexes/{}/data.idx.json", sha(9)), 500, minutes(30));
        let a_new = put(root, &shard("tenant-a", 3), 1000, minutes(1));
        let b_new = put(root, &shard("tenant-b", 4), 1000, minutes(2));
        // Not entries: a lock file, a fill in progress, a folder that is no namespace.
        let lock = put(root, &format!("{}.lock", shard("tenant-a", 1)), 0, minutes(99));
        let fill = put(root, "tenant-a/01/.fill-x", 5000, minutes(99));
        let stranger = put(root, &format!("Not_A_Tenant/01/{}", sha(1)), 5000, minutes(99));

        let swept = sweep(root, 2000);
        assert_eq!(swept, Swept { evicted: 3, bytes_left: 2000 });
        for (path, kept) in [(&a_old, false), (&b_old, false), (&index, false), (&a_new, true), (&b_new, true)] {
            assert_eq!(path.exists(), kept, "{}", path.display());
        }
        assert!(lock.exists() && fill.exists() && stranger.exists());
        assert_eq!(sweep(root, 2000), Swept { evicted: 0, bytes_left: 2000 }, "within budget: nothing more");
    }

    #[test]
    fn a_namespace_sweep_evicts_only_that_namespace_s_entries() {
        let dir = tempfile::tempdir().unwrap();
        let root = dir.path();
        let minutes = |m: u64| Duration::from_secs(60 * m);
        let a_old = put(root, &shard("tenant-a", 1), 1000, minutes(50));
        let a_new = put(root, &shard("tenant-a", 2), 1000, minutes(10));
        let b_oldest = put(root, &shard("tenant-b", 3), 1000, minutes(90));

        assert_eq!(sweep_namespace(root, "tenant-a", 1000), Swept { evicted: 1, bytes_left: 1000 });
        assert!(!a_old.exists() && a_new.exists(), "tenant A's own oldest went");
        assert!(b_oldest.exists(), "tenant B's entries are not A's share to sweep, however old");
    }

    /// The attack of issue 37: a tenant plants links in its namespace, to a folder outside the
    /// cache (as a shard prefix, as an index folder) and to a file (as a shard); the sweep, over
    /// budget, deletes its own entries and nothing a link points at.
    #[test]
    fn links_a_tenant_plants_lead_the_sweep_nowhere() {
        let dir = tempfile::tempdir().unwrap();
        let root = dir.path().join("cache");
        let outside = dir.path().join("outside");
        let minutes = |m: u64| Duration::from_secs(60 * m);
        // Files outside every cache, named as entries would be, and old.
        let victim_shard = put(&outside, &sha(1), 1000, minutes(500));
        let victim_index = put(&outside, &format!("{}/data.idx.json", sha(2)), 1000, minutes(500));
        let victim_file = put(&outside, "secret", 1000, minutes(500));
        let own = put(&root, &shard("tenant-a", 3), 1000, minutes(10));
        let ns = root.join("tenant-a");
        // `01/` -> outside (holds a file named like a 01... shard), `indexes` -> outside,
        // and a shard name that is a link to a file.
        std::os::unix::fs::symlink(&outside, ns.join("01")).unwrap();
        std::os::unix::fs::symlink(&outside, ns.join("indexes")).unwrap();
        std::fs::create_dir_all(ns.join("05")).unwrap();
        std::os::unix::fs::symlink(&victim_file, ns.join("05").join(sha(5))).unwrap();

        let swept = sweep(&root, 0);
        assert_eq!(swept, Swept { evicted: 1, bytes_left: 0 }, "only the tenant's own entry counts and goes");
        assert!(!own.exists());
        for victim in [&victim_shard, &victim_index, &victim_file] {
            assert!(victim.exists(), "{} was deleted through a link", victim.display());
        }
        assert!(ns.join("05").join(sha(5)).symlink_metadata().is_ok(), "the link itself is no entry either");
    }

    #[test]
    fn keeps_an_entry_a_reader_holds_and_one_being_filled() {
        let dir = tempfile::tempdir().unwrap();
        let root = dir.path();
        let held = put(root, &shard("tenant-a", 1), 1000, Duration::from_secs(3000));
        let filling = put(root, &shard("tenant-b", 2), 1000, Duration::from_secs(2000));
        let free = put(root, &shard("tenant-b", 3), 1000, Duration::from_secs(1000));
        // A reader's shared lock on the shard; a fill's exclusive lock on the other's lock file.
        let _reader = Flock::lock(std::fs::File::open(&held).unwrap(), FlockArg::LockShared).unwrap();
        let mut lock_path = filling.as_os_str().to_owned();
        lock_path.push(".lock");
        std::fs::write(&lock_path, b"").unwrap();
        let _filler = Flock::lock(std::fs::File::open(&lock_path).unwrap(), FlockArg::LockExclusive).unwrap();

        assert_eq!(sweep(root, 0), Swept { evicted: 1, bytes_left: 2000 }, "over budget, the rest in use");
        assert!(held.exists() && filling.exists() && !free.exists());
    }
}
