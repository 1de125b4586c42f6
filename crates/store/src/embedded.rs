//! A private Postgres cluster run from the system's `initdb` and `pg_ctl`, for `trainyard dev`
//! and the test suite. Nothing but the binaries is needed: no service, no superuser password.
//!
//! Layout of the directory it owns:
//! - `pgdata/`: the cluster (owned by the user Postgres runs as)
//! - `password`: the generated password of the `trainyard` role (mode 0600)
//! - `postgres.log`: the server log
//!
//! Postgres refuses to run as root. When we are root (containers, CI), the cluster runs as the
//! unprivileged `postgres` user that Debian's package creates, and the data directory is given
//! to it. As any other user, it runs as that user.

use std::fmt;
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::process::Stdio;

use sqlx::Connection;
use tokio::process::Command;

/// The database role the cluster is created with.
pub const ROLE: &str = "trainyard";

#[derive(Debug, thiserror::Error)]
pub enum EmbeddedError {
    #[error(
        "cannot find Postgres: no `initdb` and `pg_ctl` on PATH or under /usr/lib/postgresql/*/bin; \
         install it (Debian: apt-get install postgresql)"
    )]
    NotInstalled,
    #[error(
        "running as root, Postgres must run as the unprivileged user `postgres`, which does not exist; create it or run as another user"
    )]
    NoUnprivilegedUser,
    #[error(
        "Postgres runs as the user `postgres`, which cannot reach {0}: choose a --data-dir it can reach \
         (for example under /var/tmp or /srv), or let it in with `chmod o+x` on the folders above"
    )]
    Unreachable(PathBuf),
    #[error("{what} failed: {detail}")]
    Command { what: String, detail: String },
    #[error("{0}")]
    Io(#[from] std::io::Error),
    #[error("connecting to the private Postgres: {0}")]
    Connect(#[from] sqlx::Error),
}

/// How the cluster is tuned.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Durability {
    /// Normal Postgres durability: for `trainyard dev`, whose data should survive a power cut.
    Durable,
    /// No fsync: for throwaway test clusters, several times faster to create and use.
    Throwaway,
}

/// A running private cluster.
pub struct EmbeddedPostgres {
    dir: PathBuf,
    bin_dir: PathBuf,
    port: u16,
    password: String,
    run_as: Option<(u32, u32)>,
}

impl fmt::Debug for EmbeddedPostgres {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("EmbeddedPostgres")
            .field("dir", &self.dir)
            .field("port", &self.port)
            .field("password", &"<redacted>")
            .finish()
    }
}

impl EmbeddedPostgres {
    /// Starts the cluster in `dir`, creating it on first use. When the cluster is already
    /// running (a previous process was killed), it is reused as it is.
    pub async fn start(dir: &Path, durability: Durability) -> Result<EmbeddedPostgres, EmbeddedError> {
        let bin_dir = find_bin_dir().ok_or(EmbeddedError::NotInstalled)?;
        let run_as = unprivileged_user()?;
        std::fs::create_dir_all(dir)?;
        let dir = dir.canonicalize()?;
        let pgdata = dir.join("pgdata");
        let password_file = dir.join("password");

        if run_as.is_some() {
            reachable_by_others(&dir)?;
        }
        if !pgdata.join("PG_VERSION").exists() {
            init_cluster(&bin_dir, &dir, run_as, durability).await?;
        }
        let password = std::fs::read_to_string(&password_file)?.trim().to_string();

        let mut cluster = EmbeddedPostgres { dir, bin_dir, port: 0, password, run_as };
        if let Some(port) = cluster.running_port().await {
            tracing::info!(port, "reusing the private Postgres that is already running");
            cluster.port = port;
        } else {
            cluster.port = free_port()?;
            cluster.pg_ctl_start().await?;
        }
        Ok(cluster)
    }

    pub fn port(&self) -> u16 {
        self.port
    }

    /// A connection URL for `database`. Holds the password: do not log it.
    pub fn url(&self, database: &str) -> String {
        format!("postgres://{ROLE}:{}@127.0.0.1:{}/{database}", self.password, self.port)
    }

    /// Creates `database` unless it exists.
    pub async fn database_ensure(&self, database: &str) -> Result<(), EmbeddedError> {
        let mut conn = sqlx::PgConnection::connect(&self.url("postgres")).await?;
        let exists: bool = sqlx::query_scalar("SELECT EXISTS (SELECT 1 FROM pg_database WHERE datname = $1)")
            .bind(database)
            .fetch_one(&mut conn)
            .await?;
        if !exists {
            // Identifiers cannot be bound; the name is quoted as an identifier.
            let quoted = database.replace('"', "\"\"");
            sqlx::query(sqlx::AssertSqlSafe(format!("CREATE DATABASE \"{quoted}\""))).execute(&mut conn).await?;
        }
        conn.close().await?;
        Ok(())
    }

    /// Stops the cluster (fast shutdown: open sessions are ended, data is flushed).
    pub async fn stop(&self) -> Result<(), EmbeddedError> {
        let pgdata = self.dir.join("pgdata");
        self.run(
            self.command("pg_ctl").arg("stop").arg("-D").arg(&pgdata).args(["-m", "fast", "-w", "-t", "60"]),
            "pg_ctl stop",
        )
        .await
    }

    /// Stops the cluster in `dir` that another process started.
    pub async fn stop_in(dir: &Path) -> Result<(), EmbeddedError> {
        let bin_dir = find_bin_dir().ok_or(EmbeddedError::NotInstalled)?;
        let run_as = unprivileged_user()?;
        let pgdata = dir.canonicalize()?.join("pgdata");
        let mut command = command_as(&bin_dir, "pg_ctl", run_as);
        command.arg("stop").arg("-D").arg(&pgdata).args(["-m", "fast", "-w", "-t", "60"]);
        run_checked(&mut command, "pg_ctl stop").await
    }

    async fn running_port(&self) -> Option<u16> {
        let pgdata = self.dir.join("pgdata");
        let status = self
            .command("pg_ctl")
            .arg("status")
            .arg("-D")
            .arg(&pgdata)
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .status()
            .await
            .ok()?;
        if !status.success() {
            return None;
        }
        // The fourth line of postmaster.pid is the port.
        std::fs::read_to_string(pgdata.join("postmaster.pid")).ok()?.lines().nth(3)?.trim().parse().ok()
    }

    async fn pg_ctl_start(&self) -> Result<(), EmbeddedError> {
        let pgdata = self.dir.join("pgdata");
        let log = self.dir.join("postgres.log");
        // Made readable to all by an earlier version: its owner's alone, as a new one is.
        if let Err(err) = std::fs::set_permissions(&log, std::os::unix::fs::PermissionsExt::from_mode(0o600))
            && err.kind() != std::io::ErrorKind::NotFound
        {
            tracing::warn!(%err, log = %log.display(), "cannot make Postgres's log private");
        }
        self.run(
            self.command("pg_ctl")
                .arg("start")
                .arg("-D")
                .arg(&pgdata)
                .arg("-l")
                .arg(&log)
                .args(["-w", "-t", "60", "-o"])
                .arg(format!("-p {}", self.port)),
            "pg_ctl start",
        )
        .await
        .map_err(|err| match err {
            EmbeddedError::Command { what, detail } => {
                let tail = std::fs::read_to_string(&log).unwrap_or_default();
                let tail: Vec<&str> = tail.lines().rev().take(5).collect();
                EmbeddedError::Command {
                    what,
                    detail: format!("{detail}\nlog ({}):\n{}", log.display(), tail.join("\n")),
                }
            }
            other => other,
        })
    }

    fn command(&self, program: &str) -> Command {
        command_as(&self.bin_dir, program, self.run_as)
    }

    async fn run(&self, command: &mut Command, what: &str) -> Result<(), EmbeddedError> {
        run_checked(command, what).await
    }
}

async fn init_cluster(
    bin_dir: &Path,
    dir: &Path,
    run_as: Option<(u32, u32)>,
    durability: Durability,
) -> Result<(), EmbeddedError> {
    let pgdata = dir.join("pgdata");
    let password: String = {
        let mut bytes = [0u8; 24];
        rand::fill(&mut bytes);
        hex::encode(bytes)
    };
    write_private(&dir.join("password"), &password)?;
    // initdb reads the password from a file the cluster user can read; it is removed after.
    let pwfile = dir.join("initdb-password");
    write_private(&pwfile, &password)?;
    std::fs::create_dir_all(&pgdata)?;
    std::fs::set_permissions(&pgdata, std::fs::Permissions::from_mode(0o700))?;
    let log = dir.join("postgres.log");
    {
        // Postgres's log holds other tenants' rows in its error details: its owner's alone.
        use std::os::unix::fs::OpenOptionsExt;
        std::fs::OpenOptions::new().create(true).append(true).mode(0o600).open(&log)?;
    }
    if let Some((uid, gid)) = run_as {
        for path in [&pgdata, &pwfile, &log] {
            std::os::unix::fs::chown(path, Some(uid), Some(gid))?;
        }
    }
    let mut initdb = command_as(bin_dir, "initdb", run_as);
    initdb
        .arg("-D")
        .arg(&pgdata)
        .args(["-U", ROLE, "--auth=scram-sha-256", "-E", "UTF8", "--no-locale"])
        .arg(format!("--pwfile={}", pwfile.display()));
    if durability == Durability::Throwaway {
        initdb.arg("--no-sync");
    }
    let result = run_checked(&mut initdb, "initdb").await;
    let _ = std::fs::remove_file(&pwfile);
    if let Err(err) = result {
        // Leave no half-made cluster behind: the next start tries again from scratch.
        let _ = std::fs::remove_dir_all(&pgdata);
        return Err(err);
    }
    // Loopback TCP only: no Unix socket in a system directory we may not own.
    let mut settings = String::from(
        "\n# added by trainyard\nlisten_addresses = '127.0.0.1'\nunix_socket_directories = ''\nmax_connections = 300\n",
    );
    if durability == Durability::Throwaway {
        settings.push_str("fsync = off\nsynchronous_commit = off\nfull_page_writes = off\n");
    }
    use std::io::Write;
    std::fs::OpenOptions::new().append(true).open(pgdata.join("postgresql.conf"))?.write_all(settings.as_bytes())?;
    Ok(())
}

fn write_private(path: &Path, contents: &str) -> std::io::Result<()> {
    use std::io::Write;
    use std::os::unix::fs::OpenOptionsExt;
    let mut file = std::fs::OpenOptions::new().create(true).write(true).truncate(true).mode(0o600).open(path)?;
    file.write_all(contents.as_bytes())
}

fn command_as(bin_dir: &Path, program: &str, run_as: Option<(u32, u32)>) -> Command {
    let mut command = Command::new(bin_dir.join(program));
    // Its own process group: a Ctrl-C meant for `trainyard dev` must not reach Postgres, which
    // we stop ourselves, in order, after the server.
    command.process_group(0).stdin(Stdio::null()).kill_on_drop(false);
    if let Some((uid, gid)) = run_as {
        command.uid(uid).gid(gid).env("HOME", "/tmp");
    }
    command
}

async fn run_checked(command: &mut Command, what: &str) -> Result<(), EmbeddedError> {
    let output = command.output().await?;
    if output.status.success() {
        return Ok(());
    }
    let mut detail = String::from_utf8_lossy(&output.stderr).trim().to_string();
    if detail.is_empty() {
        detail = String::from_utf8_lossy(&output.stdout).trim().to_string();
    }
    Err(EmbeddedError::Command { what: what.to_string(), detail: format!("{} ({})", detail, output.status) })
}

/// Checks that every folder down to `dir` lets other users pass, so that the unprivileged
/// Postgres user can reach its data directory.
fn reachable_by_others(dir: &Path) -> Result<(), EmbeddedError> {
    for folder in dir.ancestors() {
        let mode = std::fs::metadata(folder)?.permissions().mode();
        if mode & 0o001 == 0 {
            return Err(EmbeddedError::Unreachable(folder.to_path_buf()));
        }
    }
    Ok(())
}

/// `initdb` and `pg_ctl` on PATH, or the newest `/usr/lib/postgresql/<version>/bin`.
pub fn find_bin_dir() -> Option<PathBuf> {
    let has_both = |dir: &Path| dir.join("initdb").is_file() && dir.join("pg_ctl").is_file();
    if let Some(path) = std::env::var_os("PATH") {
        for dir in std::env::split_paths(&path) {
            if has_both(&dir) {
                // Debian links initdb into /usr/local/bin on some images; prefer the real folder so
                // that initdb finds the rest of its installation.
                let resolved = dir.join("initdb").canonicalize().ok().and_then(|p| p.parent().map(Path::to_path_buf));
                return Some(resolved.filter(|d| has_both(d)).unwrap_or(dir));
            }
        }
    }
    let mut versions: Vec<(u32, PathBuf)> = std::fs::read_dir("/usr/lib/postgresql")
        .ok()?
        .filter_map(|entry| {
            let entry = entry.ok()?;
            let version: u32 = entry.file_name().to_str()?.parse().ok()?;
            let bin = entry.path().join("bin");
            has_both(&bin).then_some((version, bin))
        })
        .collect();
    versions.sort();
    versions.pop().map(|(_, bin)| bin)
}

/// The uid and gid to run Postgres as: `None` (ourselves) unless we are root.
fn unprivileged_user() -> Result<Option<(u32, u32)>, EmbeddedError> {
    if !nix::unistd::Uid::effective().is_root() {
        return Ok(None);
    }
    let user = nix::unistd::User::from_name("postgres").ok().flatten().ok_or(EmbeddedError::NoUnprivilegedUser)?;
    Ok(Some((user.uid.as_raw(), user.gid.as_raw())))
}

/// A TCP port that was free a moment ago on the loopback interface.
pub fn free_port() -> std::io::Result<u16> {
    Ok(std::net::TcpListener::bind("127.0.0.1:0")?.local_addr()?.port())
}
