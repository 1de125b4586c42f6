//! The local executor: each replica is a child process on this machine.
//!
//! Layout under the data directory, per job:
//! - `jobs/<job>/work-<n>/replica-<r>/`: the replica's working directory (and `HOME`) in attempt
//!   `n`: made fresh for each attempt, as a pod's is on Kubernetes (what must outlive an attempt,
//!   such as checkpoints, goes to a volume), filled with the job's code and given to the tenant's
//!   user; the folders of earlier attempts go when a new attempt launches;
//! - `jobs/<job>/attempt-<n>/replica-<r>.log`: its stdout and stderr;
//! - `jobs/<job>/attempt-<n>/intent.json`: the launch's intent (each replica's GPUs and the
//!   rendezvous port), written whole (aside, then renamed) before the first replica starts;
//! - `jobs/<job>/attempt-<n>/replica-<r>.pid`: the supervisor's pid and start time, written by
//!   the supervisor before its replica starts;
//! - `jobs/<job>/attempt-<n>/replica-<r>.exit`: how it ended, written by the supervisor.
//!
//! And for every job on the machine, `shard-cache/<tenant id>/`: the node's dataset shard cache
//! (the engine's `cache.py`), one namespace folder per tenant, given to each replica as
//! `TRAINYARD_CACHE_DIR` (the root), `TRAINYARD_CACHE_NAMESPACE` (the tenant's id: the folder
//! names say no tenant's name to a replica that lists the root) and
//! `TRAINYARD_CACHE_BUDGET_BYTES` (`--shard-cache-bytes`, else a tenth of the data directory's
//! file system, so the cache cannot fill the disk the supervisors' records are written to) and,
//! when set, `TRAINYARD_CACHE_TENANT_BUDGET_BYTES` (`--shard-cache-tenant-bytes`: one tenant's
//! share). The root is the server's and
//! only readable to others (0755), so no replica can make or take a namespace folder; each
//! tenant's folder is made here, belongs to the tenant's user and is private to it (0700), so
//! tenants never read or plant each other's cached shards.
//!
//! **Launching is resumable.** A control plane killed in the middle of a launch (or one whose
//! database went away before it stored the placement) launches the same attempt again, and
//! that launch starts only the ranks that never started: it reads the intent back (same GPUs,
//! same port, so late ranks join the same rendezvous), adopts every rank with a pid file (or a
//! supervisor already in the process table), and starts the rest. No rank starts twice, none is
//! left out.
//!
//! Each replica runs under a supervisor ([`shim`]) that leads its own process group, so that
//! stopping a replica stops everything it started, a Ctrl-C to the server does not reach jobs,
//! and replicas keep running (and are re-adopted) when the server restarts.

pub mod cache_sweep;
pub mod cgroup;
pub mod gpus;
pub mod isolation;
pub mod process;
pub mod shim;
pub mod tenant_fs;

use std::collections::{BTreeMap, HashMap};
use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use nix::sys::signal::Signal;
use serde::{Deserialize, Serialize};
use tokio::io::AsyncRead;
use tokio::sync::Notify;
use uuid::Uuid;

use crate::{AttemptRef, Executor, ExecutorError, Inventory, LaunchRequest, ReplicaStatus};
use isolation::{Isolation, TenantUser};

/// Settings of the local executor.
#[derive(Debug, Clone)]
pub struct LocalConfig {
    /// Where job folders live.
    pub data_dir: PathBuf,
    /// The supervisor binary (`trainyard-shim`, beside `trainyard`), run in front of each
    /// replica. Its folder holds Trainyard's other tools (`yard`, `yard-data`) too.
    pub supervisor: PathBuf,
    /// CPU cores offered to jobs; this machine's count when `None`.
    pub cpus: Option<f64>,
    /// Memory offered to jobs; this machine's total when `None`.
    pub memory_bytes: Option<u64>,
    /// Offer this many GPUs of this type instead of the machine's: for trying quotas and
    /// scheduling where there are no GPUs. Replicas get indices in `CUDA_VISIBLE_DEVICES` that
    /// name no device.
    pub simulated_gpus: Option<(u32, String)>,
    /// The shard cache's budget on this machine, in bytes; a tenth of the data directory's file
    /// system (at least 1 GiB) when `None`.
    pub shard_cache_bytes: Option<u64>,
    /// What one tenant's shards may take of it, in bytes; no bound of its own when `None`.
    pub shard_cache_tenant_bytes: Option<u64>,
    /// Processes and threads one replica may have at once (its cgroup's `pids.max`).
    pub pids_limit: u64,
    /// Cap each replica's CPU time at its request (a CFS quota), not only weigh it.
    pub cpu_hard_limit: bool,
    /// Confine each replica in a cgroup of its own when the machine allows it; `false` leaves
    /// confinement to someone else (a container runtime around the server), and says so.
    pub cgroups: bool,
    /// Run each replica in a PID namespace of its own, with its own `/proc`, when replicas run
    /// as their tenants' users (root); `false` leaves them in the machine's, and says so.
    pub pid_namespace: bool,
}

/// The default of [`LocalConfig::pids_limit`]: room for a data loader's workers and their
/// threads, far below what starves the machine.
pub const DEFAULT_PIDS_LIMIT: u64 = 4096;

/// Where one replica ran, as stored in Postgres.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ReplicaPlacement {
    pub rank: u32,
    /// The supervisor's pid, which is also the replica's process group id.
    pub pid: u32,
    /// Its start time, so that a recycled pid is never mistaken for it.
    pub start_time: u64,
    pub gpus: Vec<u32>,
}

/// Where an attempt ran.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct LocalPlacement {
    pub executor: String,
    pub host: String,
    pub master_port: u16,
    pub replicas: Vec<ReplicaPlacement>,
    /// Who the replicas ran as: `user tyt-... (uid N)`, or `none: <why>` (see [`isolation`]).
    #[serde(default)]
    pub isolation: String,
}

pub struct LocalExecutor {
    config: LocalConfig,
    inventory: Inventory,
    /// GPUs held by live attempts. Rebuilt from placements as attempts are observed after a
    /// restart; durable truth is the placement in Postgres.
    gpus_held: Mutex<HashMap<(Uuid, i32), Vec<u32>>>,
    changes: Arc<Notify>,
    /// Supervisors this process started and has not reaped yet: pid -> kernel start time. A
    /// replica whose supervisor is among them is running, known without a look at the process
    /// table or its exit record; once the supervisor has ended and been reaped, observing reads
    /// its record (and finds its process group gone in one call).
    supervisors_unreaped: Arc<Mutex<HashMap<u32, u64>>>,
    /// Fault injection for tests (`TRAINYARD_FAULT_LAUNCH_PAUSE=RANK:MILLIS`): a launch waits
    /// this long before starting that rank (rank 0: after the intent is stored, before any
    /// replica), widening the window in which a crash interrupts it.
    fault_pause: Option<(u32, Duration)>,
    /// Whether replicas run as their tenant's user.
    isolation: Isolation,
    /// The cgroups each replica is confined in, or why there are none.
    cgroups: Result<cgroup::Cgroups, String>,
    /// Whether each replica's supervisor starts as PID 1 of a PID and mount namespace of its
    /// own, or why not.
    namespaces: Result<(), String>,
    /// Whether replicas find the tenant's volumes at `/volumes/<name>` (bound there in their
    /// mount namespace), as on Kubernetes, rather than at the server's folders.
    volumes_bound: bool,
    /// Tenant users looked up or created so far.
    users: Mutex<HashMap<Uuid, TenantUser>>,
    /// Set while a sweep of the shard cache runs (one at a time).
    sweeping: Arc<std::sync::atomic::AtomicBool>,
}

/// What a launch will start where, stored before its first replica starts.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
struct LaunchIntent {
    master_port: u16,
    /// Each rank's GPUs.
    gpus: Vec<Vec<u32>>,
}

impl LocalExecutor {
    pub fn new(config: LocalConfig) -> std::io::Result<LocalExecutor> {
        std::fs::create_dir_all(config.data_dir.join("jobs"))?;
        let cache_root = config.data_dir.join(SHARD_CACHE_DIR);
        std::fs::create_dir_all(&cache_root)?;
        // Replicas pass through to their own tenant's folder; none may list it (its names are
        // the tenants' ids) or create anything in it. cache.py's budget counts its own folder.
        isolation::chmod(&cache_root, 0o711)?;
        let isolation = Isolation::detect();
        match &isolation {
            Isolation::TenantUsers => {
                // Replicas may pass through to their own folders, and see nothing else here.
                isolation::chmod(&config.data_dir, 0o711)?;
                isolation::chmod(&config.data_dir.join("jobs"), 0o711)?;
                tracing::info!("replicas run as their tenant's own unprivileged user");
            }
            Isolation::None(why) => {
                tracing::warn!(%why, "replicas are NOT isolated: they run as the server's user and can read its files")
            }
        }
        let cpus =
            config.cpus.unwrap_or_else(|| std::thread::available_parallelism().map(|n| n.get() as f64).unwrap_or(1.0));
        let inventory = Inventory {
            cpu_millis: (cpus * 1000.0) as u64,
            memory_bytes: config.memory_bytes.unwrap_or_else(total_memory),
            gpus: match &config.simulated_gpus {
                Some((count, gpu_type)) => {
                    (0..*count).map(|index| crate::Gpu { index, gpu_type: gpu_type.clone() }).collect()
                }
                None => gpus::discover(),
            },
        };
        let cgroups =
            if config.cgroups { cgroup::Cgroups::detect() } else { Err("turned off (--no-cgroups)".to_string()) };
        match &cgroups {
            Ok(found) => {
                tracing::info!(version = ?found.version, "each replica runs in a cgroup of its own (memory, CPU, processes, devices)")
            }
            Err(why) => {
                tracing::warn!(%why, "replicas are NOT confined: no memory, CPU or process limits, and a process a job leaves behind outlives it")
            }
        }
        let fault_pause = std::env::var("TRAINYARD_FAULT_LAUNCH_PAUSE").ok().and_then(|v| {
            let (rank, millis) = v.split_once(':')?;
            Some((rank.parse().ok()?, Duration::from_millis(millis.parse().ok()?)))
        });
        let namespaces = match (config.pid_namespace, &isolation) {
            (false, _) => Err("turned off (--no-pid-namespace)".to_string()),
            (true, Isolation::None(_)) => Err("replicas run as the server's own user".to_string()),
            (true, Isolation::TenantUsers) => namespaces_probe(),
        };
        match &namespaces {
            Ok(()) => tracing::info!("each replica runs in a PID namespace of its own, with its own /proc"),
            Err(why) => tracing::warn!(%why, "replicas share the machine's PID namespace"),
        }
        // The empty folder the volumes are bound over in each replica's namespace; made once.
        let volumes_bound = namespaces.is_ok()
            && match std::fs::create_dir_all(VOLUMES_SEEN_AT) {
                Ok(()) => true,
                Err(err) => {
                    tracing::warn!(%err, "cannot make {VOLUMES_SEEN_AT}: replicas see volumes at the server's folders");
                    false
                }
            };
        Ok(LocalExecutor {
            config,
            inventory,
            gpus_held: Mutex::new(HashMap::new()),
            changes: Arc::new(Notify::new()),
            supervisors_unreaped: Default::default(),
            fault_pause,
            isolation,
            cgroups,
            namespaces,
            volumes_bound,
            users: Mutex::new(HashMap::new()),
            sweeping: Arc::default(),
        })
    }

    /// The user a tenant's replicas run as, when replicas are isolated.
    fn tenant_user(&self, tenant_id: Uuid) -> Result<Option<TenantUser>, ExecutorError> {
        if self.isolation != Isolation::TenantUsers {
            return Ok(None);
        }
        if let Some(user) = self.users.lock().expect("user table poisoned").get(&tenant_id) {
            return Ok(Some(user.clone()));
        }
        let user = isolation::tenant_user_ensure(tenant_id)
            .map_err(|err| ExecutorError::Launch(format!("cannot provide the tenant's user: {err}")))?;
        self.users.lock().expect("user table poisoned").insert(tenant_id, user.clone());
        Ok(Some(user))
    }

    fn isolation_note(&self, user: Option<&TenantUser>) -> String {
        match (&self.isolation, user) {
            (_, Some(user)) => format!("user {} (uid {})", user.name, user.uid),
            (Isolation::None(why), None) => format!("none: {why}"),
            (Isolation::TenantUsers, None) => "none".into(),
        }
    }

    /// What one replica of `request` may use: its request, its GPUs' device files.
    fn replica_limits(&self, request: &LaunchRequest, gpus: &[u32]) -> cgroup::Limits {
        let devices = if self.config.simulated_gpus.is_some() {
            Vec::new()
        } else {
            cgroup::nvidia_devices(Path::new("/dev"), gpus)
        };
        cgroup::Limits {
            memory_bytes: request.spec.resources.memory.bytes(),
            cpu_millis: request.spec.resources.cpu.0,
            cpu_hard_limit: self.config.cpu_hard_limit,
            pids_max: self.config.pids_limit,
            devices,
        }
    }

    /// Whether the attempt is more than strays: a launch begun a moment ago, or a live
    /// supervisor. Garbage collection takes only strays.
    fn attempt_runs_beyond_strays(&self, job_id: Uuid, attempt: i32) -> bool {
        self.launch_recent(job_id, attempt) || self.supervisors_alive(job_id, attempt)
    }

    /// Whether a supervisor of the attempt runs (a rank's pid file names a live process).
    fn supervisors_alive(&self, job_id: Uuid, attempt: i32) -> bool {
        let dir = self.attempt_dir(job_id, attempt);
        let Some(intent) = read_intent(&dir.join("intent.json")) else { return false };
        (0..intent.gpus.len()).any(|rank| {
            let pid_file = shim::pid_file_of(&dir.join(format!("replica-{rank}.exit")));
            shim::read_pid_record(&pid_file).is_some_and(|record| process::is_alive(record.pid, record.start_time))
        })
    }

    /// Whether the attempt's launch began a moment ago (its intent is younger than
    /// [`LAUNCH_SETTLES`]): its supervisors may not have announced themselves yet, nor the
    /// database recorded it, so what it holds is not taken from it.
    fn launch_recent(&self, job_id: Uuid, attempt: i32) -> bool {
        std::fs::metadata(self.attempt_dir(job_id, attempt).join("intent.json"))
            .and_then(|meta| meta.modified())
            .is_ok_and(|at| at.elapsed().is_ok_and(|age| age < LAUNCH_SETTLES))
    }

    /// Whether anything of the attempt runs: a supervisor, or a process left in its cgroups.
    fn attempt_runs(&self, job_id: Uuid, attempt: i32) -> bool {
        self.supervisors_alive(job_id, attempt)
            || self.cgroups.as_ref().is_ok_and(|cgroups| {
                (0..MAX_REPLICAS_LOOKED_AT)
                    .map(|rank| cgroup::group_name(job_id, attempt, rank))
                    .take_while(|name| cgroups.exists(name))
                    .any(|name| !cgroups.procs(&name).is_empty())
            })
    }

    /// The node's shard cache root.
    /// Whether replicas run in PID namespaces of their own: only where they run as their
    /// tenants' users (the server is root), unless turned off.
    fn pid_namespaces(&self) -> bool {
        self.namespaces.is_ok()
    }

    /// The server's folder of each volume the job uses and where its replicas see it, for
    /// each volume that is not used at the folder itself.
    fn volume_binds(&self, request: &LaunchRequest) -> Result<Vec<(PathBuf, String)>, ExecutorError> {
        let mut binds = Vec::new();
        for volume in &request.spec.volumes {
            trainyard_core::names::VolumeName::parse(&volume.name)
                .map_err(|why| ExecutorError::Launch(format!("volume {:?}: {why}", volume.name)))?;
            let folder = self.config.data_dir.join(VOLUMES_DIR).join(request.tenant_id.to_string()).join(&volume.name);
            if Path::new(&volume.path) == folder {
                continue;
            }
            if volume.path != volume_seen_at(&volume.name) {
                return Err(ExecutorError::Launch(format!(
                    "volume {} is mounted at {}, which this executor cannot provide",
                    volume.name, volume.path
                )));
            }
            if !self.volumes_bound {
                return Err(ExecutorError::Launch(format!(
                    "volume {} is at {} in the replicas' own mount namespaces, which this server does not make ({})",
                    volume.name,
                    volume.path,
                    match &self.namespaces {
                        Err(why) => why.clone(),
                        Ok(()) => format!("it could not make {VOLUMES_SEEN_AT}"),
                    }
                )));
            }
            binds.push((folder, volume.path.clone()));
        }
        Ok(binds)
    }

    fn shard_cache_root(&self) -> PathBuf {
        self.config.data_dir.join(SHARD_CACHE_DIR)
    }

    /// Holds the machine's shard cache budget across every tenant's namespace (`cache_sweep`),
    /// beside the control loops; one sweep at a time, the next after an attempt ends.
    fn shard_cache_sweep(&self) {
        use std::sync::atomic::Ordering;
        if self.sweeping.swap(true, Ordering::SeqCst) {
            return;
        }
        let root = self.shard_cache_root();
        let budget = self.config.shard_cache_bytes.unwrap_or_else(|| shard_cache_budget(&root));
        let sweeping = Arc::clone(&self.sweeping);
        tokio::task::spawn_blocking(move || {
            let swept = cache_sweep::sweep(&root, budget);
            if swept.evicted > 0 {
                tracing::info!(evicted = swept.evicted, bytes_left = swept.bytes_left, budget, "shard cache swept");
            }
            sweeping.store(false, Ordering::SeqCst);
        });
    }

    /// Makes the tenant's namespace folder in the shard cache, private to the user its replicas
    /// run as (the server's own when replicas are not isolated): cache.py refuses a namespace
    /// folder another user owns. Cheap when it is there already.
    fn shard_cache_prepare(&self, tenant_id: Uuid, user: Option<&TenantUser>) -> Result<PathBuf, ExecutorError> {
        use std::os::unix::fs::MetadataExt;
        let namespace = self.shard_cache_root().join(tenant_id.to_string());
        match std::fs::create_dir(&namespace) {
            Ok(()) => isolation::chmod(&namespace, 0o700)?,
            Err(err) if err.kind() == std::io::ErrorKind::AlreadyExists => {
                // Only a real folder (a link planted there would send the chmod below elsewhere).
                if !std::fs::symlink_metadata(&namespace)?.file_type().is_dir() {
                    return Err(ExecutorError::Launch(format!(
                        "{} is not a folder; remove it so that the tenant's shard cache can be made",
                        namespace.display()
                    )));
                }
            }
            Err(err) => return Err(err.into()),
        }
        if let Some(user) = user
            && std::fs::symlink_metadata(&namespace)?.uid() != user.uid
        {
            // Made while replicas were not isolated (the server ran as another user): the
            // tenant's user takes it over, with what it holds.
            isolation::give_to(&namespace, user)?;
        }
        Ok(self.shard_cache_root())
    }

    fn attempt_dir(&self, job_id: Uuid, attempt: i32) -> PathBuf {
        self.config.data_dir.join("jobs").join(job_id.to_string()).join(format!("attempt-{attempt}"))
    }

    fn job_dir(&self, job_id: Uuid) -> PathBuf {
        self.config.data_dir.join("jobs").join(job_id.to_string())
    }

    /// The folder holding an attempt's working directories (the server's: no replica can
    /// create, rename or replace anything in it).
    fn attempt_work_dir(&self, job_id: Uuid, attempt: i32) -> PathBuf {
        self.job_dir(job_id).join(format!("work-{attempt}"))
    }

    fn replica_workdir(&self, job_id: Uuid, attempt: i32, rank: u32) -> PathBuf {
        self.attempt_work_dir(job_id, attempt).join(format!("replica-{rank}"))
    }

    /// Removes the working folders of the job's attempts before `attempt` (std's
    /// `remove_dir_all` removes links, never what they point at).
    fn earlier_work_dirs_remove(&self, job_id: Uuid, attempt: i32) {
        let Ok(entries) = std::fs::read_dir(self.job_dir(job_id)) else { return };
        for entry in entries.flatten() {
            let earlier = entry
                .file_name()
                .to_str()
                .and_then(|name| name.strip_prefix("work-")?.parse::<i32>().ok())
                .is_some_and(|n| n < attempt);
            if earlier && let Err(err) = std::fs::remove_dir_all(entry.path()) {
                tracing::warn!(job = %job_id, %err, "removing an earlier attempt's working folders");
            }
        }
    }

    /// Picks `per_replica` free GPUs of the wanted type for each of `replicas` replicas.
    fn gpus_reserve(&self, request: &LaunchRequest) -> Result<Vec<Vec<u32>>, ExecutorError> {
        let per_replica = request.spec.resources.gpus as usize;
        let replicas = request.spec.replicas as usize;
        if per_replica == 0 {
            return Ok(vec![Vec::new(); replicas]);
        }
        let mut held = self.gpus_held.lock().expect("gpu table poisoned");
        let busy: Vec<u32> = held.values().flatten().copied().collect();
        let wanted = request.spec.resources.gpu_type.as_deref();
        let mut free = self
            .inventory
            .gpus
            .iter()
            .filter(|gpu| !busy.contains(&gpu.index) && wanted.is_none_or(|t| t == gpu.gpu_type))
            .map(|gpu| gpu.index);
        let mut assignment = Vec::with_capacity(replicas);
        for _ in 0..replicas {
            let chunk: Vec<u32> = free.by_ref().take(per_replica).collect();
            if chunk.len() < per_replica {
                return Err(ExecutorError::Launch(format!(
                    "{} GPUs per replica x {replicas} replicas are not free on this machine",
                    per_replica
                )));
            }
            assignment.push(chunk);
        }
        held.insert((request.job_id, request.attempt), assignment.iter().flatten().copied().collect());
        Ok(assignment)
    }

    fn gpus_free(&self, job_id: Uuid, attempt: i32) {
        self.gpus_held.lock().expect("gpu table poisoned").remove(&(job_id, attempt));
    }

    fn spawn_replica(
        &self,
        request: &LaunchRequest,
        rank: u32,
        gpus: &[u32],
        master_port: u16,
        attempt_dir: &Path,
    ) -> Result<ReplicaPlacement, ExecutorError> {
        // Refused before anything is made for the replica.
        let binds = self.volume_binds(request)?;
        let workdir = self.replica_workdir(request.job_id, request.attempt, rank);
        let work_dir = self.attempt_work_dir(request.job_id, request.attempt);
        std::fs::create_dir_all(&work_dir)?;
        // A launch resumed after a crash may find the folder its first try made (and perhaps
        // gave away): the replica starts from a fresh one all the same.
        match std::fs::remove_dir_all(&workdir) {
            Err(err) if err.kind() != std::io::ErrorKind::NotFound => return Err(err.into()),
            _ => {}
        }
        {
            use std::os::unix::fs::DirBuilderExt;
            std::fs::DirBuilder::new().mode(0o700).create(&workdir)?;
        }
        // The server's own folder until it is given away below: nothing of the tenant's can
        // be in it yet, and every write goes through its handle all the same.
        let folder = tenant_fs::open_own_dir(&workdir)?;
        deliver_code(&folder, &request.code)?;
        deliver_files(&folder, &request.files)?;
        drop(folder);
        let user = self.tenant_user(request.tenant_id)?;
        if let Some(user) = &user {
            // The job's folders let its replicas through to their own working directories.
            for dir in [self.job_dir(request.job_id), work_dir] {
                isolation::chmod(&dir, 0o711)?;
            }
            isolation::give_to(&workdir, user)?;
        }
        // The replica's environment (its job token among it) goes to the shim in a file only
        // root reads, never on a command line, and never into the shim's own environment.
        let env_file = attempt_dir.join(format!("replica-{rank}.env"));
        let cache = self.shard_cache_prepare(request.tenant_id, user.as_ref())?;
        let places = ReplicaPlaces {
            workdir: &workdir,
            tools: self.config.supervisor.parent(),
            shard_cache: &cache,
            shard_cache_bytes: self.config.shard_cache_bytes.unwrap_or_else(|| shard_cache_budget(&cache)),
            shard_cache_private: self.isolation == Isolation::TenantUsers,
            shard_cache_tenant_bytes: self.config.shard_cache_tenant_bytes,
        };
        let mut env = replica_env(request, rank, gpus, master_port, &places);
        if user.is_some()
            && let Some(path) = env.get_mut("PATH")
        {
            // A folder the replica's user cannot reach (an interpreter under /root, say) would
            // only turn `python3` into "permission denied": leave it out, so the next one is found.
            *path = isolation::reachable_path(path);
        }
        write_private(&env_file, &serde_json::to_vec(&env).expect("environment serialises"))?;
        let cgroup_dirs = match &self.cgroups {
            Ok(cgroups) => {
                let name = cgroup::group_name(request.job_id, request.attempt, rank);
                cgroups.create(&name, &self.replica_limits(request, gpus))?;
                cgroups.dirs(&name)
            }
            Err(_) => Vec::new(),
        };
        let log = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(attempt_dir.join(format!("replica-{rank}.log")))?;
        let argv = request.spec.argv();
        let mut command = tokio::process::Command::new(&self.config.supervisor);
        command
            .arg("--exit-file")
            .arg(attempt_dir.join(format!("replica-{rank}.exit")))
            .arg("--env-file")
            .arg(&env_file);
        if let Some(user) = &user {
            command.arg("--uid").arg(user.uid.to_string()).arg("--gid").arg(user.gid.to_string());
        }
        for dir in &cgroup_dirs {
            command.arg("--cgroup").arg(dir);
        }
        if self.pid_namespaces() {
            command.arg("--pid-namespace");
        }
        for (folder, seen_at) in binds {
            command.arg("--bind").arg(format!("{}={}", folder.display(), seen_at));
        }
        command
            .arg("--")
            .args(&argv)
            .current_dir(&workdir)
            // Jobs see only what they are given: never the server's own environment, which may
            // hold database credentials; the shim itself gets nothing of the job's.
            .env_clear()
            .env("PATH", "/usr/local/bin:/usr/bin:/bin")
            .stdin(Stdio::null())
            .stdout(log.try_clone()?)
            .stderr(log)
            .process_group(0)
            .kill_on_drop(false);
        let mut child = spawn_supervisor(command, self.pid_namespaces()).map_err(|err| {
            ExecutorError::Launch(format!("cannot start the supervisor {}: {err}", self.config.supervisor.display()))
        })?;
        let pid = child.id().ok_or_else(|| ExecutorError::Launch("the supervisor exited at once".into()))?;
        // The supervisor writes its own pid file (with this start time) before the replica starts.
        let start_time = process::start_time(pid).unwrap_or_default();
        // Reap the supervisor when it ends and wake the reconciler. After a restart of the
        // server, supervisors are no longer our children; observing finds their end instead.
        self.supervisors_unreaped.lock().unwrap_or_else(PoisonError::into_inner).insert(pid, start_time);
        let (changes, unreaped) = (Arc::clone(&self.changes), Arc::clone(&self.supervisors_unreaped));
        tokio::spawn(async move {
            let _ = child.wait().await;
            let mut unreaped = unreaped.lock().unwrap_or_else(PoisonError::into_inner);
            // A pid reused meanwhile by a later supervisor of ours is that one's entry.
            if unreaped.get(&pid) == Some(&start_time) {
                unreaped.remove(&pid);
            }
            drop(unreaped);
            changes.notify_one();
        });
        Ok(ReplicaPlacement { rank, pid, start_time, gpus: gpus.to_vec() })
    }

    /// Rank `rank` of an attempt, if it ever started: its supervisor's pid file, or (for the
    /// instant between a supervisor's start and its announcement) the supervisor itself in the
    /// process table.
    fn replica_started(&self, attempt_dir: &Path, rank: u32, gpus: &[u32]) -> Option<ReplicaPlacement> {
        let exit_file = attempt_dir.join(format!("replica-{rank}.exit"));
        let placement = |pid, start_time| ReplicaPlacement { rank, pid, start_time, gpus: gpus.to_vec() };
        if let Some(record) = shim::read_pid_record(&shim::pid_file_of(&exit_file)) {
            return Some(placement(record.pid, record.start_time));
        }
        process::find_shim(&exit_file).map(|(pid, start_time)| placement(pid, start_time))
    }

    /// Where an attempt runs: its stored placement, or, for a launch the control plane did not
    /// get to record, what the attempt's folder says (the intent and the ranks that started).
    fn placement_of(&self, attempt: &AttemptRef) -> Option<LocalPlacement> {
        if let Some(stored) = attempt.placement.clone().and_then(|p| serde_json::from_value(p).ok()) {
            return Some(stored);
        }
        let dir = self.attempt_dir(attempt.job_id, attempt.attempt);
        let intent = read_intent(&dir.join("intent.json"))?;
        let replicas = intent
            .gpus
            .iter()
            .enumerate()
            .filter_map(|(rank, gpus)| self.replica_started(&dir, rank as u32, gpus))
            .collect();
        Some(LocalPlacement {
            executor: "local".into(),
            host: String::new(),
            master_port: intent.master_port,
            replicas,
            isolation: String::new(),
        })
    }
}

/// Writes the job's code into a replica's fresh working directory, each file as shipped
/// (executable or not).
fn deliver_code(workdir: &cap_std::fs::Dir, code: &[crate::CodeFile]) -> std::io::Result<()> {
    for file in code {
        // Paths were checked when the archive was uploaded (relative, no '..'); the handle
        // refuses anything else again.
        let mode = if file.executable { 0o755 } else { 0o644 };
        tenant_fs::write_beneath(workdir, Path::new(&file.path), &file.content, mode)?;
    }
    Ok(())
}

/// Writes the template's files under `template/` in a replica's fresh working directory.
fn deliver_files(workdir: &cap_std::fs::Dir, files: &BTreeMap<String, Vec<u8>>) -> std::io::Result<()> {
    let root = Path::new(trainyard_core::job::TEMPLATE_FILES_DIR);
    for (path, content) in files {
        // Paths were checked when the template was loaded: relative, no '..'.
        tenant_fs::write_beneath(workdir, &root.join(path), content, 0o644)?;
    }
    Ok(())
}

/// The folders a replica's environment names.
struct ReplicaPlaces<'a> {
    /// Its working directory (and `HOME`).
    workdir: &'a Path,
    /// Trainyard's own tools (the supervisor's folder).
    tools: Option<&'a Path>,
    /// The node's shard cache root.
    shard_cache: &'a Path,
    shard_cache_bytes: u64,
    /// Each tenant's part of the cache is its own Unix user's (replicas are isolated).
    shard_cache_private: bool,
    shard_cache_tenant_bytes: Option<u64>,
}

/// The environment of one replica: a clean base, the job's own variables, then the
/// distributed-training variables Trainyard owns.
fn replica_env(
    request: &LaunchRequest,
    rank: u32,
    gpus: &[u32],
    master_port: u16,
    places: &ReplicaPlaces<'_>,
) -> BTreeMap<String, String> {
    let ReplicaPlaces { workdir, tools, shard_cache, shard_cache_bytes, shard_cache_private, shard_cache_tenant_bytes } =
        *places;
    let mut env = BTreeMap::new();
    let path = std::env::var("PATH").unwrap_or_else(|_| "/usr/local/bin:/usr/bin:/bin".into());
    // Trainyard's own tools (yard-data, yard) sit beside the supervisor and come first.
    let path = match tools {
        Some(dir) => format!("{}:{path}", dir.display()),
        None => path,
    };
    env.insert("PATH".into(), path);
    env.insert("HOME".into(), workdir.display().to_string());
    env.insert("LANG".into(), "C.UTF-8".into());
    env.insert("PYTHONUNBUFFERED".into(), "1".into());
    env.extend(request.spec.env.clone());
    env.extend(request.env.clone());
    if let Some(own) = request.env_by_rank.get(rank as usize) {
        env.extend(own.clone());
    }
    let replicas = request.spec.replicas.to_string();
    let gpu_list: Vec<String> = gpus.iter().map(u32::to_string).collect();
    for (key, value) in [
        ("RANK", rank.to_string()),
        ("WORLD_SIZE", replicas.clone()),
        // All replicas share this one machine, so the local rank is the rank.
        ("LOCAL_RANK", rank.to_string()),
        ("LOCAL_WORLD_SIZE", replicas),
        ("MASTER_ADDR", "127.0.0.1".to_string()),
        ("MASTER_PORT", master_port.to_string()),
        // Empty when the replica has no GPU: it must not see any.
        ("CUDA_VISIBLE_DEVICES", gpu_list.join(",")),
        ("TRAINYARD_JOB_ID", request.job_id.to_string()),
        ("TRAINYARD_ATTEMPT", request.attempt.to_string()),
        // The scheduler's name for this machine, which the engine's cache reports give.
        ("TRAINYARD_NODE", request.nodes.get(rank as usize).cloned().unwrap_or_else(|| LOCAL_NODE.to_string())),
        // The node's shard cache, shared by every job here, and the tenant's part of it.
        ("TRAINYARD_CACHE_DIR", shard_cache.display().to_string()),
        ("TRAINYARD_CACHE_NAMESPACE", request.tenant_id.to_string()),
        ("TRAINYARD_CACHE_BUDGET_BYTES", shard_cache_bytes.to_string()),
        // Whether no other tenant can write there: the engine then trusts what earlier jobs
        // verified instead of hashing every cached shard again.
        ("TRAINYARD_CACHE_PRIVATE", if shard_cache_private { "1" } else { "0" }.to_string()),
    ] {
        env.insert(key.to_string(), value);
    }
    if let Some(bytes) = shard_cache_tenant_bytes {
        env.insert("TRAINYARD_CACHE_TENANT_BUDGET_BYTES".into(), bytes.to_string());
    }
    env
}

#[async_trait::async_trait]
impl Executor for LocalExecutor {
    fn name(&self) -> &'static str {
        "local"
    }

    fn inventory(&self) -> Inventory {
        self.inventory.clone()
    }

    fn launch_resuming(&self, job_id: Uuid, attempt: i32) {
        // The GPUs its launch's intent chose are its own again, from now: a launch of another
        // job in the same pass (after a restart nothing else holds them yet) must not take them.
        if let Some(intent) = read_intent(&self.attempt_dir(job_id, attempt).join("intent.json")) {
            let held = intent.gpus.iter().flatten().copied().collect();
            self.gpus_held.lock().expect("gpu table poisoned").insert((job_id, attempt), held);
        }
    }

    async fn launch(&self, request: &LaunchRequest) -> Result<serde_json::Value, ExecutorError> {
        let attempt_dir = self.attempt_dir(request.job_id, request.attempt);
        std::fs::create_dir_all(&attempt_dir)?;
        // Logs, pid and exit records and environment files are the control plane's alone.
        if self.isolation == Isolation::TenantUsers {
            isolation::chmod(&attempt_dir, 0o700)?;
        }
        // One launcher of an attempt at a time, across server replicas sharing this machine's
        // data directory; released when this launch returns (or its process dies).
        let lock = std::fs::File::create(attempt_dir.join("launch.lock"))?;
        let _lock = nix::fcntl::Flock::lock(lock, nix::fcntl::FlockArg::LockExclusiveNonblock).map_err(|_| {
            ExecutorError::Unavailable(format!("another launch of attempt {} is under way", request.attempt))
        })?;
        let intent_path = attempt_dir.join("intent.json");
        let stored = read_intent(&intent_path);
        // Only a launch begun before (its intent stored) can have started ranks: a fresh one
        // does not look for them (a look can mean reading every process's command line).
        let resuming = stored.is_some();
        let intent = match stored {
            Some(intent) => {
                // Resuming an interrupted launch: the same GPUs are this attempt's again.
                let held = intent.gpus.iter().flatten().copied().collect();
                self.gpus_held.lock().expect("gpu table poisoned").insert((request.job_id, request.attempt), held);
                intent
            }
            None => {
                let gpus = self.gpus_reserve(request)?;
                let intent = LaunchIntent { master_port: free_port()?, gpus };
                if let Err(err) = write_whole(&intent_path, &serde_json::to_vec(&intent).expect("intent serialises")) {
                    self.gpus_free(request.job_id, request.attempt);
                    return Err(err.into());
                }
                intent
            }
        };
        // Each attempt starts in fresh folders; the earlier ones' go (as a pod's do).
        self.earlier_work_dirs_remove(request.job_id, request.attempt);
        let mut replicas = Vec::with_capacity(intent.gpus.len());
        let mut started_now = Vec::new();
        for (rank, replica_gpus) in intent.gpus.iter().enumerate() {
            let rank = rank as u32;
            if resuming && let Some(placement) = self.replica_started(&attempt_dir, rank, replica_gpus) {
                replicas.push(placement);
                continue;
            }
            if let Some((_, pause)) = self.fault_pause.filter(|(at, _)| *at == rank) {
                tracing::warn!(job = %request.job_id, rank, ?pause, "fault injection: pausing the launch");
                tokio::time::sleep(pause).await;
            }
            match self.spawn_replica(request, rank, replica_gpus, intent.master_port, &attempt_dir) {
                Ok(placement) => {
                    started_now.push(placement.pid);
                    replicas.push(placement);
                }
                Err(err) => {
                    // All or nothing: stop every replica of the attempt that runs.
                    for started in &replicas {
                        process::signal_group(started.pid, Signal::SIGKILL);
                    }
                    self.gpus_free(request.job_id, request.attempt);
                    return Err(err);
                }
            }
        }
        if started_now.len() < replicas.len() {
            tracing::info!(job = %request.job_id, attempt = request.attempt, adopted = replicas.len() - started_now.len(),
                started = started_now.len(), "resumed an interrupted launch");
        }
        let placement = LocalPlacement {
            executor: "local".into(),
            host: nix::unistd::gethostname().map(|h| h.to_string_lossy().into_owned()).unwrap_or_default(),
            master_port: intent.master_port,
            replicas,
            isolation: self.isolation_note(self.tenant_user(request.tenant_id)?.as_ref()),
        };
        Ok(serde_json::to_value(placement).expect("placement serialises"))
    }

    async fn observe(&self, attempt: &AttemptRef) -> Vec<ReplicaStatus> {
        let Some(placement) = self.placement_of(attempt) else {
            return vec![ReplicaStatus::Lost; attempt.replicas as usize];
        };
        let dir = self.attempt_dir(attempt.job_id, attempt.attempt);
        // Ranks whose supervisor this process started and has not reaped: running.
        let unreaped: Vec<u32> = {
            let unreaped = self.supervisors_unreaped.lock().unwrap_or_else(PoisonError::into_inner);
            placement.replicas.iter().filter(|r| unreaped.get(&r.pid) == Some(&r.start_time)).map(|r| r.rank).collect()
        };
        // By rank: a rank the placement lacks (a launch interrupted before it started it) is lost.
        let statuses: Vec<ReplicaStatus> = (0..attempt.replicas)
            .map(|rank| {
                let Some(replica) = placement.replicas.iter().find(|r| r.rank == rank) else {
                    return ReplicaStatus::Lost;
                };
                if unreaped.contains(&replica.rank) {
                    return ReplicaStatus::Running;
                }
                // Liveness first, then the exit file: the supervisor writes the file before it
                // exits, so a dead supervisor without a file really vanished.
                let alive = process::is_alive(replica.pid, replica.start_time);
                match shim::read_exit_record(&dir.join(format!("replica-{}.exit", replica.rank))) {
                    Some(record) => ReplicaStatus::Exited(record.exit_code),
                    None if alive => ReplicaStatus::Running,
                    None => ReplicaStatus::Lost,
                }
            })
            .collect();
        if statuses.contains(&ReplicaStatus::Running) {
            // Re-adopting after a restart: remember the GPUs this attempt holds.
            let held: Vec<u32> = placement.replicas.iter().flat_map(|r| r.gpus.iter().copied()).collect();
            self.gpus_held.lock().expect("gpu table poisoned").entry((attempt.job_id, attempt.attempt)).or_insert(held);
        }
        statuses
    }

    async fn terminate(&self, attempt: &AttemptRef, grace: Duration) {
        let Some(placement) = self.placement_of(attempt) else {
            return;
        };
        let live: Vec<u32> =
            placement.replicas.iter().filter(|r| process::is_alive(r.pid, r.start_time)).map(|r| r.pid).collect();
        for pgid in &live {
            process::signal_group(*pgid, Signal::SIGTERM);
        }
        // What left the replica's process group (setsid, a double fork) is still in its
        // cgroup: it is asked to stop too, and killed with the rest after the grace period.
        let groups: Vec<String> =
            (0..attempt.replicas).map(|rank| cgroup::group_name(attempt.job_id, attempt.attempt, rank)).collect();
        let cgroups = self.cgroups.clone().ok();
        if let Some(cgroups) = &cgroups {
            for name in &groups {
                for pid in cgroups.procs(name) {
                    process::signal(pid, Signal::SIGTERM);
                }
            }
        }
        let changes = Arc::clone(&self.changes);
        tokio::spawn(async move {
            tokio::time::sleep(grace).await;
            for pgid in live {
                if process::group_has_live_members(pgid) {
                    tracing::info!(pgid, "replica outlived its grace period; killing it");
                    process::signal_group(pgid, Signal::SIGKILL);
                }
            }
            if let Some(cgroups) = cgroups {
                let _ = tokio::task::spawn_blocking(move || {
                    for name in groups {
                        cgroups.kill_all(&name, Duration::ZERO);
                    }
                })
                .await;
            }
            changes.notify_one();
        });
    }

    async fn release(&self, attempt: &AttemptRef) {
        if let Some(placement) = self.placement_of(attempt) {
            // Whatever a replica left running in its group goes with it; wait (briefly) until
            // the kernel has ended them, so that "ended" means no process is left.
            let groups: Vec<u32> = placement.replicas.iter().map(|r| r.pid).collect();
            for _ in 0..100 {
                let live: Vec<u32> = groups.iter().copied().filter(|g| process::group_has_live_members(*g)).collect();
                if live.is_empty() {
                    break;
                }
                for pgid in live {
                    process::signal_group(pgid, Signal::SIGKILL);
                }
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
        }
        // Everything the replicas started, wherever it hid, goes with them; their GPUs are free
        // only once their cgroups are empty.
        let emptied = match self.cgroups.clone() {
            Ok(cgroups) => {
                let (job_id, number, replicas) = (attempt.job_id, attempt.attempt, attempt.replicas);
                tokio::task::spawn_blocking(move || cgroups_empty(&cgroups, job_id, number, replicas))
                    .await
                    .unwrap_or(false)
            }
            Err(_) => true,
        };
        if emptied {
            self.gpus_free(attempt.job_id, attempt.attempt);
        }
        self.shard_cache_sweep();
    }

    async fn replica_details(&self, attempt: &AttemptRef) -> Vec<crate::ReplicaDetail> {
        let statuses = self.observe(attempt).await;
        statuses
            .into_iter()
            .enumerate()
            .map(|(rank, status)| {
                let mut detail = crate::ReplicaDetail::from_status(rank as u32, status);
                // Killed by SIGKILL in a group the kernel OOM-killed in: its memory limit.
                if let (ReplicaStatus::Exited(137), Ok(cgroups)) = (status, &self.cgroups) {
                    let name = cgroup::group_name(attempt.job_id, attempt.attempt, rank as u32);
                    if cgroups.oom_kills(&name) > 0 {
                        detail.reason = Some(crate::FailureReason::OomKilled);
                        detail.message = cgroups.memory_limit(&name).map(|limit| {
                            format!(
                                "used more than its memory limit of {}",
                                trainyard_core::resources::human_memory(limit)
                            )
                        });
                    }
                }
                detail
            })
            .collect()
    }

    async fn garbage_collect(&self, live: &[(Uuid, i32)]) -> usize {
        let Ok(cgroups) = &self.cgroups else { return 0 };
        let mut collected = 0;
        for name in cgroups.names() {
            // `<job uuid>-<attempt>-<rank>`: a uuid has four dashes of its own.
            let mut parts = name.rsplitn(3, '-');
            let (_, attempt, job) = (parts.next(), parts.next(), parts.next());
            let Some((job, attempt)) =
                job.and_then(|j| Uuid::parse_str(j).ok()).zip(attempt.and_then(|a| a.parse().ok()))
            else {
                continue;
            };
            // Only what an ended attempt left behind: a group whose supervisor still runs belongs
            // to an attempt the database may not show yet (its launch finished after the pass
            // read it), and is observed, not collected.
            // Another data directory's (servers of several data directories share the
            // machine's cgroups: tests do), or not an ended attempt's strays: not ours to take.
            let ours = self.attempt_dir(job, attempt).is_dir();
            if !ours || live.contains(&(job, attempt)) || self.attempt_runs_beyond_strays(job, attempt) {
                continue;
            }
            let cgroups = cgroups.clone();
            let removed = tokio::task::spawn_blocking(move || {
                cgroups.kill_all(&name, CGROUP_KILL_WAIT) && cgroups.remove(&name).is_ok()
            })
            .await
            .unwrap_or(false);
            collected += usize::from(removed);
        }
        collected
    }

    fn holdings_retain(&self, live: &[(Uuid, i32)]) {
        let mut held = self.gpus_held.lock().expect("gpu table poisoned");
        if held.is_empty() {
            return; // every pass, most often with nothing held: no set of the live attempts
        }
        let live: std::collections::HashSet<&(Uuid, i32)> = live.iter().collect();
        // Not over as the database has it, or processes of it still run (a launch that finished
        // after the pass read the database; strays of an attempt that ended): then its GPUs
        // are not free, whatever the database says.
        held.retain(|(job, attempt), _| live.contains(&(*job, *attempt)) || self.attempt_runs(*job, *attempt));
    }

    fn node_warnings(&self) -> Vec<String> {
        let mut warnings = Vec::new();
        if let Isolation::None(why) = &self.isolation {
            warnings.push(format!("replicas are not isolated: {why}"));
        }
        if let Err(why) = &self.cgroups {
            warnings.push(format!("replicas are not confined in cgroups (no memory, CPU or process limits): {why}"));
        }
        if self.isolation == Isolation::TenantUsers
            && let Err(shared) = &self.namespaces
            && let Some(why) = std::fs::read_to_string("/proc/self/mountinfo").map_or_else(
                |err| Some(format!("cannot read /proc/self/mountinfo: {err}")),
                |text| isolation::proc_exposure(&text),
            )
        {
            warnings.push(format!("replicas share the machine's process table ({shared}): {why}"));
        }
        warnings
    }

    async fn log_last_line(&self, job_id: Uuid, attempt: i32, replica: u32) -> Option<String> {
        use std::io::{Read, Seek, SeekFrom};
        let path = self.attempt_dir(job_id, attempt).join(format!("replica-{replica}.log"));
        let mut file = std::fs::File::open(path).ok()?;
        let size = file.metadata().ok()?.len();
        file.seek(SeekFrom::Start(size.saturating_sub(4096))).ok()?;
        let mut tail = Vec::new();
        file.read_to_end(&mut tail).ok()?;
        crate::last_line(&tail)
    }

    async fn log_reader(
        &self,
        job_id: Uuid,
        attempt: i32,
        replica: u32,
        _follow: bool,
    ) -> Result<Option<Box<dyn AsyncRead + Send + Unpin>>, ExecutorError> {
        // The file as it is: a follower reads it again as it grows.
        crate::log_file(&self.attempt_dir(job_id, attempt).join(format!("replica-{replica}.log"))).await
    }

    async fn logs_remove(&self, job_id: Uuid) -> Result<(), ExecutorError> {
        let job_dir = self.config.data_dir.join("jobs").join(job_id.to_string());
        let Ok(attempts) = std::fs::read_dir(&job_dir) else { return Ok(()) };
        for attempt in attempts.flatten().filter(|e| e.file_name().to_string_lossy().starts_with("attempt-")) {
            for file in std::fs::read_dir(attempt.path())?.flatten() {
                if file.path().extension().is_some_and(|e| e == "log") {
                    std::fs::remove_file(file.path())?;
                }
            }
        }
        Ok(())
    }

    fn changes(&self) -> Arc<Notify> {
        Arc::clone(&self.changes)
    }

    async fn tenant_remove(&self, tenant_id: Uuid, _tenant: &str) -> Result<(), ExecutorError> {
        // Its cached shards: nobody may read them any more.
        match std::fs::remove_dir_all(self.shard_cache_root().join(tenant_id.to_string())) {
            Err(err) if err.kind() != std::io::ErrorKind::NotFound => Err(err.into()),
            _ => Ok(()),
        }
    }

    fn volume_path(&self, name: &str) -> Option<String> {
        self.volumes_bound.then(|| volume_seen_at(name))
    }

    async fn volume_dir_prepare(&self, tenant_id: Uuid, dir: &Path) -> Result<(), ExecutorError> {
        let Some(user) = self.tenant_user(tenant_id)? else { return Ok(()) };
        // `<volumes>/<tenant>/<name>`: the folders above it let only the tenant's user through.
        for ancestor in [dir.parent().and_then(Path::parent), dir.parent()].into_iter().flatten() {
            isolation::chmod(ancestor, 0o711)?;
        }
        isolation::give_to(dir, &user)?;
        Ok(())
    }
}

/// Kills whatever is left in the cgroups of an attempt's replicas and removes them; true
/// when every group is empty (then, and only then, its GPUs may go to another job).
fn cgroups_empty(cgroups: &cgroup::Cgroups, job_id: Uuid, attempt: i32, replicas: u32) -> bool {
    let mut empty = true;
    for rank in 0..replicas {
        let name = cgroup::group_name(job_id, attempt, rank);
        if !cgroups.exists(&name) {
            continue;
        }
        if cgroups.kill_all(&name, CGROUP_KILL_WAIT) {
            if let Err(err) = cgroups.remove(&name) {
                tracing::warn!(group = %name, %err, "removing an emptied cgroup");
            }
        } else {
            tracing::error!(group = %name, pids = ?cgroups.procs(&name), "processes of an ended replica survive SIGKILL; its GPUs stay held");
            empty = false;
        }
    }
    empty
}

/// How long after its launch began an attempt's holdings and cgroups are its own whatever the
/// database says: longer than a launch takes to be recorded, shorter than garbage collection's
/// cadence.
const LAUNCH_SETTLES: Duration = Duration::from_secs(30);

/// The most ranks of one attempt whose cgroups are looked at when its GPUs may go.
const MAX_REPLICAS_LOOKED_AT: u32 = 1024;

/// How long ending an attempt waits for the kernel to empty a replica's cgroup.
const CGROUP_KILL_WAIT: Duration = Duration::from_secs(10);

/// The node's shard cache, under the data directory.
/// Starts a replica's supervisor; with `pid_namespace`, as PID 1 of a new PID namespace in a new
/// mount namespace (its `--pid-namespace` then mounts the namespace's `/proc`). The namespaces
/// a process's children are born in are a setting of the thread that starts them: a thread of
/// its own unshares, spawns and ends, and no other thread of the server is touched. (No second
/// process as the namespace's init: the supervisor is it.)
fn spawn_supervisor(
    mut command: tokio::process::Command,
    pid_namespace: bool,
) -> std::io::Result<tokio::process::Child> {
    if !pid_namespace {
        return command.spawn();
    }
    let runtime = tokio::runtime::Handle::current();
    std::thread::spawn(move || {
        let _runtime = runtime.enter();
        nix::sched::unshare(nix::sched::CloneFlags::CLONE_NEWPID | nix::sched::CloneFlags::CLONE_NEWNS)
            .map_err(std::io::Error::from)?;
        command.spawn()
    })
    .join()
    .unwrap_or_else(|_| Err(std::io::Error::other("the thread starting the supervisor panicked")))
}

/// Whether this server may give replicas PID and mount namespaces (root, and a kernel and
/// container that allow them): a thread unshares both and ends, starting nothing.
fn namespaces_probe() -> Result<(), String> {
    std::thread::spawn(|| {
        nix::sched::unshare(nix::sched::CloneFlags::CLONE_NEWPID | nix::sched::CloneFlags::CLONE_NEWNS)
    })
    .join()
    .map_err(|_| "the probe panicked".to_string())?
    .map_err(|err| format!("the kernel refuses new PID and mount namespaces: {err}"))
}

const SHARD_CACHE_DIR: &str = "shard-cache";

/// The tenants' volumes, under the data directory: `volumes/<tenant id>/<name>/`.
pub const VOLUMES_DIR: &str = "volumes";

/// Where replicas in mount namespaces of their own see their tenant's volumes (as on
/// Kubernetes): `/volumes/<name>`.
const VOLUMES_SEEN_AT: &str = "/volumes";

fn volume_seen_at(name: &str) -> String {
    format!("{VOLUMES_SEEN_AT}/{name}")
}

/// The scheduler's name for this machine (a node of its GPU type when it has several is named
/// `local-<type>`).
pub const LOCAL_NODE: &str = "local";

/// The shard cache's budget on this machine: a tenth of the file system holding it (at least
/// 1 GiB), so that cached shards never fill the disk the supervisors write their records to.
fn shard_cache_budget(root: &Path) -> u64 {
    const FLOOR: u64 = 1 << 30;
    match nix::sys::statvfs::statvfs(root) {
        Ok(fs) => (fs.blocks().saturating_mul(fs.fragment_size()) / 10).max(FLOOR),
        Err(_) => FLOOR,
    }
}

/// Writes a file only its owner (the server) can read.
fn write_private(path: &Path, content: &[u8]) -> std::io::Result<()> {
    use std::io::Write;
    use std::os::unix::fs::OpenOptionsExt;
    let mut file = std::fs::OpenOptions::new().write(true).create(true).truncate(true).mode(0o600).open(path)?;
    file.write_all(content)
}

fn read_intent(path: &Path) -> Option<LaunchIntent> {
    serde_json::from_slice(&std::fs::read(path).ok()?).ok()
}

/// Writes a file aside and renames it into place: a reader, or a server or supervisor killed
/// at any instant, sees it whole or absent.
///
/// Not synced to disk, on purpose: the files written so (a launch's intent, a supervisor's pid
/// file) describe processes that live only while this machine runs, and the page cache
/// outlives every process crash. After a crash of the machine itself nothing of the attempt
/// runs; a file lost or left empty then reads as absent, and the launch starts its replicas
/// afresh, which is what it must do. (Syncing them cost four `fsync`s a launch, each waiting on
/// the file system's journal beside Postgres's own.)
pub(crate) fn write_whole(path: &Path, content: &[u8]) -> std::io::Result<()> {
    let aside = path.with_file_name(format!("{}.partial", path.file_name().unwrap_or_default().to_string_lossy()));
    std::fs::write(&aside, content)?;
    std::fs::rename(&aside, path)
}

fn free_port() -> std::io::Result<u16> {
    Ok(std::net::TcpListener::bind("127.0.0.1:0")?.local_addr()?.port())
}

fn total_memory() -> u64 {
    std::fs::read_to_string("/proc/meminfo")
        .ok()
        .and_then(|info| {
            let line = info.lines().find(|l| l.starts_with("MemTotal:"))?;
            let kib: u64 = line.split_whitespace().nth(1)?.parse().ok()?;
            Some(kib * 1024)
        })
        .unwrap_or(8 << 30)
}
