//! Who replicas run as on the local executor. When the server runs as root, every tenant gets
//! an unprivileged user of its own (`tyt-` and the last 12 hex digits of the tenant's id, ids
//! from 3,000,000 on, created with `useradd` on first use), and its replicas run as that user: they can read and
//! write their own working directories and their tenant's volumes (owned by that user, mode
//! 0700) and nothing of the control plane (attempt folders with logs, pid and exit records, the
//! object store, the database's files and password: root's, 0700/0600) or of another tenant.
//! Per tenant rather than per job, so that a tenant's jobs share its volumes and a restarted
//! job finds what its last attempt wrote; a per-job user would need volume ACLs.
//!
//! A server that does not run as root cannot switch users: replicas then run as the server's
//! user, the server says so at start, and every placement records `isolation: "none: ..."`.

use std::os::unix::fs::PermissionsExt;
use std::path::Path;
use std::process::Command;

use uuid::Uuid;

/// How replicas are separated from each other and from the control plane.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Isolation {
    /// Each tenant's replicas run as its own unprivileged user.
    TenantUsers,
    /// Replicas run as the server's user; the reason says why.
    None(String),
}

impl Isolation {
    /// Tenant users when this process may switch users (it runs as root).
    pub fn detect() -> Isolation {
        if nix::unistd::geteuid().is_root() {
            Isolation::TenantUsers
        } else {
            Isolation::None(format!(
                "the server runs as uid {}, not root, so it cannot run replicas as other users",
                nix::unistd::geteuid()
            ))
        }
    }
}

/// The user a tenant's replicas run as.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TenantUser {
    pub name: String,
    pub uid: u32,
    pub gid: u32,
}

/// The name of a tenant's user: at most 16 characters, unique per tenant id.
pub fn tenant_user_name(tenant_id: Uuid) -> String {
    let hex = tenant_id.simple().to_string();
    format!("tyt-{}", &hex[hex.len() - 12..])
}

/// The tenant's user, created when it does not exist yet.
pub fn tenant_user_ensure(tenant_id: Uuid) -> std::io::Result<TenantUser> {
    let name = tenant_user_name(tenant_id);
    if let Some(user) = lookup(&name)? {
        return Ok(user);
    }
    let output = Command::new("useradd")
        .args(["--user-group", "--no-create-home", "--home-dir", "/nonexistent", "--no-log-init"])
        .args(["--shell", "/usr/sbin/nologin", "--comment", "Trainyard tenant"])
        .args(TENANT_ID_RANGE.iter().flat_map(|setting| ["-K", setting]))
        .arg(&name)
        .output()?;
    // Another server may have created it meanwhile (exit 9: the name is taken).
    if !output.status.success() && output.status.code() != Some(9) {
        return Err(std::io::Error::other(format!(
            "useradd {name} failed: {}",
            String::from_utf8_lossy(&output.stderr).trim()
        )));
    }
    lookup(&name)?.ok_or_else(|| std::io::Error::other(format!("user {name} does not exist after useradd")))
}

/// The user and group ids tenant users get: a range of their own, a million wide, clear of
/// people's accounts (from 1000), of the system range (under 1000: only 900 ids, which a
/// platform with many tenants, or a test machine, runs out of) and of the subordinate ids
/// container runtimes hand out from 100000 on.
const TENANT_ID_RANGE: [&str; 4] = ["UID_MIN=3000000", "UID_MAX=3999999", "GID_MIN=3000000", "GID_MAX=3999999"];

fn lookup(name: &str) -> std::io::Result<Option<TenantUser>> {
    let user = nix::unistd::User::from_name(name).map_err(std::io::Error::from)?;
    Ok(user.map(|u| TenantUser { name: name.to_string(), uid: u.uid.as_raw(), gid: u.gid.as_raw() }))
}

/// `PATH` without the folders that users other than root cannot reach (search permission for
/// others on the folder and every folder above it).
pub fn reachable_path(path: &str) -> String {
    let reachable = |dir: &Path| {
        dir.is_absolute()
            && dir.ancestors().all(|folder| {
                std::fs::metadata(folder).is_ok_and(|meta| meta.is_dir() && meta.permissions().mode() & 0o001 != 0)
            })
    };
    path.split(':').filter(|dir| !dir.is_empty() && reachable(Path::new(dir))).collect::<Vec<_>>().join(":")
}

/// Sets a folder's mode.
pub fn chmod(path: &Path, mode: u32) -> std::io::Result<()> {
    std::fs::set_permissions(path, std::fs::Permissions::from_mode(mode))
}

/// Gives a folder the server made, and everything in it, to `user`, readable by that user alone
/// (0700): through directory handles, following no link ([`super::tenant_fs::give_tree`]), since
/// the tenant's processes may be writing in it at the same time.
pub fn give_to(path: &Path, user: &TenantUser) -> std::io::Result<()> {
    super::tenant_fs::give_tree(path, user.uid, user.gid)
}

/// Why other users' processes show in `/proc`, from `/proc/self/mountinfo`'s text: `None` when
/// `/proc` is mounted with `hidepid` 1 (`noaccess`) or 2 (`invisible`), under which a tenant's
/// user reads no other user's command lines or environment; otherwise the reason, for
/// `/readyz`. Slurm's advice for shared nodes is the same mount option (proc(5): "hidepid").
pub fn proc_exposure(mountinfo: &str) -> Option<String> {
    let Some(line) = mountinfo.lines().find(|line| line.split(' ').nth(4) == Some("/proc")) else {
        return Some("no /proc mount found".to_string());
    };
    // After the " - " separator: file system type, source, then the super block's options.
    let options = line.split(" - ").nth(1).and_then(|rest| rest.split(' ').nth(2)).unwrap_or_default();
    let hidepid = options.split(',').find_map(|option| option.strip_prefix("hidepid="));
    match hidepid {
        Some("1" | "2" | "noaccess" | "invisible") => None,
        _ => Some(
            "every tenant's replicas can read the others' command lines in /proc: mount it with \
             hidepid=invisible (`mount -o remount,hidepid=invisible /proc`, and in /etc/fstab)"
                .to_string(),
        ),
    }
}

#[cfg(test)]
mod tests {
    #[test]
    fn proc_hides_other_users_processes_only_with_hidepid_1_or_2() {
        let mounted = |options: &str| {
            format!(
                "21 26 0:20 / /sys rw,nosuid - sysfs sysfs rw\n\
                 22 26 0:21 / /proc rw,nosuid,nodev,noexec,relatime shared:12 - proc proc {options}\n"
            )
        };
        for hidden in ["rw,hidepid=2", "rw,hidepid=invisible", "rw,hidepid=noaccess,gid=4", "rw,hidepid=1"] {
            assert_eq!(proc_exposure(&mounted(hidden)), None, "{hidden}");
        }
        for shown in ["rw", "rw,hidepid=0", "rw,hidepid=off", "rw,hidepid=ptraceable", "rw,subset=pid"] {
            let why = proc_exposure(&mounted(shown)).unwrap_or_else(|| panic!("{shown} hides nothing"));
            assert!(why.contains("hidepid=invisible"), "{why}");
        }
        assert!(proc_exposure("").unwrap().contains("no /proc"));
    }

    use super::*;

    #[test]
    fn path_keeps_only_folders_others_can_reach() {
        let dir = tempfile::tempdir().unwrap();
        let closed = dir.path().join("closed");
        let open = dir.path().join("open");
        std::fs::create_dir_all(closed.join("bin")).unwrap();
        std::fs::create_dir_all(open.join("bin")).unwrap();
        chmod(dir.path(), 0o711).unwrap();
        chmod(&closed, 0o700).unwrap();
        chmod(&open, 0o755).unwrap();
        let path = format!("{0}/bin:{1}/bin:relative:/usr/bin", closed.display(), open.display());
        assert_eq!(reachable_path(&path), format!("{}/bin:/usr/bin", open.display()));
    }

    #[test]
    fn tenant_user_names_fit_linux_and_differ_per_tenant() {
        let a = tenant_user_name(Uuid::parse_str("01a20a51-5927-7732-9299-dfa46075f5d7").unwrap());
        let b = tenant_user_name(Uuid::parse_str("01a20a51-5927-7732-9299-dfa46075f5d8").unwrap());
        assert_eq!(a, "tyt-dfa46075f5d7");
        assert_ne!(a, b);
        assert!(a.len() <= 32);
    }
}
