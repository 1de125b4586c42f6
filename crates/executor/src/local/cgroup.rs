//! Each replica of the local executor in a control group of its own, as Slurm's cgroup plugins
//! confine a job step (`proctrack/cgroup`, `task/cgroup`): memory (swap included) at the job's
//! request, a CPU weight at its request (and, when the operator asks, a hard quota), a limit on
//! processes, and a device filter (the devices controller on v1, an eBPF program on v2:
//! `trainyard-device-filter`), so a replica opens only its own GPUs' device files. Every process a replica starts stays in its group whatever it does (`setsid`,
//! double forks, `nohup`): ending a replica kills the group, and its GPUs are free only once the
//! group is empty.
//!
//! The group is `<the server's own group>/trainyard/<job>-<attempt>-<rank>` on each controller
//! the machine mounts (v1, as on these machines: `memory`, `cpu`, `pids`, `devices`, `freezer`;
//! under the server's own group, so that whatever confines the server confines its jobs too), or
//! `/sys/fs/cgroup/trainyard/...` in the unified hierarchy (v2, where a group holding processes
//! cannot hand controllers down). The supervisor joins it before it starts the replica
//! (`trainyard-shim --cgroup DIR`); the replica and all it starts inherit it.
//!
//! Written against the kernel's files directly rather than through `cgroups-rs`: that crate
//! (0.5) brings a D-Bus client (`zbus`, for systemd) and a second `nix`, about 60 crates, for the
//! dozen files written here. docs/security.md has the whole threat model.

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use trainyard_device_filter::{Access, DeviceRule, Kind};

/// The controllers a v1 machine must mount for replicas to be confined.
const V1_CONTROLLERS: [&str; 5] = ["memory", "cpu", "pids", "devices", "freezer"];

/// Where cgroups are mounted.
const CGROUP_ROOT: &str = "/sys/fs/cgroup";

/// The folder under each hierarchy that holds Trainyard's groups.
pub const PARENT: &str = "trainyard";

/// Which cgroup interface the machine has.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Version {
    /// One folder per controller (`/sys/fs/cgroup/memory/...`).
    V1,
    /// The unified hierarchy (`/sys/fs/cgroup/...` with `cgroup.controllers`).
    V2,
}

/// What one replica may use.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Limits {
    /// Memory and swap together (the request: a replica that needs more is killed, not swapped).
    pub memory_bytes: u64,
    /// The CPU request in millicores: the group's weight against other jobs' groups.
    pub cpu_millis: u64,
    /// Also cap CPU time at the request (CFS quota), not only weigh it.
    pub cpu_hard_limit: bool,
    /// Processes and threads at once.
    pub pids_max: u64,
    /// The device files (char major, minor) the replica may open beyond the usual pseudo
    /// devices: its GPUs and the driver's control files.
    pub devices: Vec<(u32, u32)>,
}

/// The machine's cgroups, when replicas can be confined in them.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Cgroups {
    pub version: Version,
    /// The `trainyard` folder of each controller (v1), or the one folder (v2, keyed `unified`).
    bases: Vec<(&'static str, PathBuf)>,
}

impl Cgroups {
    /// The machine's cgroups, when this process can make groups in them, or why not.
    pub fn detect() -> Result<Cgroups, String> {
        Cgroups::at(Path::new(CGROUP_ROOT))
    }

    fn at(root: &Path) -> Result<Cgroups, String> {
        if !nix::unistd::geteuid().is_root() {
            return Err(format!(
                "the server runs as uid {}, not root, so it cannot make cgroups",
                nix::unistd::geteuid()
            ));
        }
        let unified = std::fs::read_to_string(root.join("cgroup.controllers")).ok();
        let own = std::fs::read_to_string("/proc/self/cgroup").unwrap_or_default();
        let cgroups = match unified {
            Some(controllers) => {
                let missing: Vec<&str> = ["memory", "cpu", "pids"]
                    .into_iter()
                    .filter(|c| !controllers.split_whitespace().any(|h| h == *c))
                    .collect();
                if !missing.is_empty() {
                    return Err(format!("cgroup v2 lacks the controllers {}", missing.join(", ")));
                }
                Cgroups { version: Version::V2, bases: vec![("unified", root.join(PARENT))] }
            }
            None => {
                let missing: Vec<&str> =
                    V1_CONTROLLERS.into_iter().filter(|c| !root.join(c).join("cgroup.procs").exists()).collect();
                if !missing.is_empty() {
                    return Err(format!(
                        "cgroup v1 lacks the controllers {} under {}",
                        missing.join(", "),
                        root.display()
                    ));
                }
                let bases = V1_CONTROLLERS
                    .into_iter()
                    .map(|c| (c, root.join(c).join(own_group(&own, c).trim_start_matches('/')).join(PARENT)))
                    .collect();
                Cgroups { version: Version::V1, bases }
            }
        };
        cgroups.parents_make().map_err(|err| format!("cannot make {PARENT}/ in the cgroup hierarchy: {err}"))?;
        if cgroups.version == Version::V2 {
            // Said at start, not at each launch: a kernel that refuses the device filter
            // (no BPF, or lockdown) would otherwise fail every job.
            cgroups.device_filter_probe().map_err(|err| format!("cgroup v2 cannot limit devices here: {err}"))?;
        }
        Ok(cgroups)
    }

    /// Attaches a device filter to a group made for the purpose, and removes it.
    fn device_filter_probe(&self) -> std::io::Result<()> {
        let probe = self.dir("pids", &format!("probe-{}", std::process::id()));
        std::fs::create_dir_all(&probe)?;
        let attached = trainyard_device_filter::attach(&probe, &device_rules(&[]));
        std::fs::remove_dir(&probe)?;
        attached
    }

    /// The folders of group `name`: one per controller on v1, one on v2. The supervisor joins
    /// each (`trainyard-shim --cgroup DIR`).
    pub fn dirs(&self, name: &str) -> Vec<PathBuf> {
        self.bases.iter().map(|(_, base)| base.join(name)).collect()
    }

    fn dir(&self, controller: &str, name: &str) -> PathBuf {
        let base = match self.version {
            Version::V1 => self.bases.iter().find(|(c, _)| *c == controller),
            Version::V2 => self.bases.first(),
        };
        base.map(|(_, base)| base.join(name)).unwrap_or_default()
    }

    fn parents_make(&self) -> std::io::Result<()> {
        for (_, base) in &self.bases {
            std::fs::create_dir_all(base)?;
        }
        match self.version {
            // v1 memory: a child's use counts against its parents only when hierarchical.
            Version::V1 => {
                let _ = std::fs::write(self.dir("memory", "memory.use_hierarchy"), "1");
            }
            // Hand the controllers down to each replica's group.
            Version::V2 => std::fs::write(self.dir("memory", "cgroup.subtree_control"), "+memory +cpu +pids")?,
        }
        Ok(())
    }

    /// Makes group `name` with `limits` (again from scratch when a crashed launch left it).
    pub fn create(&self, name: &str, limits: &Limits) -> std::io::Result<()> {
        for dir in self.dirs(name) {
            match std::fs::create_dir(&dir) {
                Err(err) if err.kind() != std::io::ErrorKind::AlreadyExists => return Err(err),
                _ => {}
            }
        }
        let write = |controller: &str, file: &str, value: String| -> std::io::Result<()> {
            let path = self.dir(controller, name).join(file);
            std::fs::write(&path, &value).map_err(|err| {
                std::io::Error::new(err.kind(), format!("writing {value:?} to {}: {err}", path.display()))
            })
        };
        let memory = limits.memory_bytes.max(MEMORY_FLOOR);
        match self.version {
            Version::V1 => {
                write("memory", "memory.limit_in_bytes", memory.to_string())?;
                // Swap accounting is a boot option; where it is on, swap is held to the same sum.
                if self.dir("memory", name).join("memory.memsw.limit_in_bytes").exists() {
                    write("memory", "memory.memsw.limit_in_bytes", memory.to_string())?;
                }
                write("memory", "memory.swappiness", "0".into())?;
                write("cpu", "cpu.shares", cpu_shares(limits.cpu_millis).to_string())?;
                if limits.cpu_hard_limit {
                    write("cpu", "cpu.cfs_period_us", CFS_PERIOD_US.to_string())?;
                    write("cpu", "cpu.cfs_quota_us", cpu_quota_us(limits.cpu_millis).to_string())?;
                }
                write("pids", "pids.max", limits.pids_max.to_string())?;
                // Nothing, then the pseudo devices every program uses, then its GPUs.
                write("devices", "devices.deny", "a".into())?;
                for rule in device_rules(&limits.devices) {
                    write("devices", "devices.allow", rule.v1_rule())?;
                }
            }
            Version::V2 => {
                write("memory", "memory.max", memory.to_string())?;
                if self.dir("memory", name).join("memory.swap.max").exists() {
                    write("memory", "memory.swap.max", "0".into())?;
                }
                write("cpu", "cpu.weight", cpu_weight(limits.cpu_millis).to_string())?;
                if limits.cpu_hard_limit {
                    write("cpu", "cpu.max", format!("{} {CFS_PERIOD_US}", cpu_quota_us(limits.cpu_millis)))?;
                }
                write("pids", "pids.max", limits.pids_max.to_string())?;
                // v2 has no devices controller: the same rules as an eBPF filter on the group.
                let dir = self.dir("pids", name);
                trainyard_device_filter::attach(&dir, &device_rules(&limits.devices)).map_err(|err| {
                    std::io::Error::new(err.kind(), format!("limiting the devices of {}: {err}", dir.display()))
                })?;
            }
        }
        Ok(())
    }

    /// The processes in group `name` (none when it does not exist).
    pub fn procs(&self, name: &str) -> Vec<u32> {
        let mut pids: Vec<u32> = self
            .dirs(name)
            .iter()
            .filter_map(|dir| std::fs::read_to_string(dir.join("cgroup.procs")).ok())
            .flat_map(|text| text.lines().filter_map(|l| l.trim().parse().ok()).collect::<Vec<u32>>())
            .collect();
        pids.sort_unstable();
        pids.dedup();
        pids
    }

    /// Whether group `name` exists.
    pub fn exists(&self, name: &str) -> bool {
        self.dir("pids", name).is_dir()
    }

    /// Kills every process in group `name`, however it hides (a process forking while it is
    /// killed cannot escape: the group is frozen first on v1, killed at once on v2), and waits
    /// up to `wait` for the group to be empty. True when it is.
    pub fn kill_all(&self, name: &str, wait: Duration) -> bool {
        let deadline = Instant::now() + wait;
        loop {
            let pids = self.procs(name);
            if pids.is_empty() {
                return true;
            }
            match self.version {
                Version::V2 if self.dir("pids", name).join("cgroup.kill").exists() => {
                    let _ = std::fs::write(self.dir("pids", name).join("cgroup.kill"), "1");
                }
                _ => self.freeze_and_kill(name, &pids),
            }
            if Instant::now() >= deadline {
                return self.procs(name).is_empty();
            }
            std::thread::sleep(Duration::from_millis(5));
        }
    }

    /// v1 (and v2 before 5.14): freeze the group so nothing in it forks, SIGKILL each process,
    /// thaw so the kills land.
    fn freeze_and_kill(&self, name: &str, pids: &[u32]) {
        let state = match self.version {
            Version::V1 => Some((self.dir("freezer", name).join("freezer.state"), "FROZEN", "THAWED")),
            Version::V2 => Some((self.dir("pids", name).join("cgroup.freeze"), "1", "0")),
        };
        let frozen = state.as_ref().is_some_and(|(file, frozen, _)| std::fs::write(file, frozen).is_ok());
        if frozen && self.version == Version::V1 {
            // FREEZING until every task stopped; a short wait, never forever.
            let file = self.dir("freezer", name).join("freezer.state");
            let until = Instant::now() + Duration::from_millis(200);
            while std::fs::read_to_string(&file).is_ok_and(|s| s.trim() != "FROZEN") && Instant::now() < until {
                std::thread::sleep(Duration::from_millis(1));
            }
        }
        for pid in self.procs(name).iter().chain(pids) {
            if let Ok(raw) = i32::try_from(*pid) {
                let _ = nix::sys::signal::kill(nix::unistd::Pid::from_raw(raw), nix::sys::signal::Signal::SIGKILL);
            }
        }
        if let Some((file, _, thawed)) = state {
            let _ = std::fs::write(file, thawed);
        }
    }

    /// How many times the kernel killed a process of group `name` for its memory limit.
    pub fn oom_kills(&self, name: &str) -> u64 {
        let file = match self.version {
            Version::V1 => self.dir("memory", name).join("memory.oom_control"),
            Version::V2 => self.dir("memory", name).join("memory.events"),
        };
        std::fs::read_to_string(file).ok().map(|text| counter(&text, "oom_kill")).unwrap_or(0)
    }

    /// The memory limit of group `name`, as set.
    pub fn memory_limit(&self, name: &str) -> Option<u64> {
        let file = match self.version {
            Version::V1 => "memory.limit_in_bytes",
            Version::V2 => "memory.max",
        };
        std::fs::read_to_string(self.dir("memory", name).join(file)).ok()?.trim().parse().ok()
    }

    /// Removes group `name` (only an empty group can go). Gone already is fine.
    pub fn remove(&self, name: &str) -> std::io::Result<()> {
        for dir in self.dirs(name) {
            match std::fs::remove_dir(&dir) {
                Err(err) if err.kind() != std::io::ErrorKind::NotFound => return Err(err),
                _ => {}
            }
        }
        Ok(())
    }

    /// The names of every group Trainyard has on this machine (garbage collection).
    pub fn names(&self) -> Vec<String> {
        let parent = self.dir("pids", "");
        let mut names: Vec<String> = std::fs::read_dir(parent)
            .into_iter()
            .flatten()
            .flatten()
            .filter(|e| e.file_type().is_ok_and(|t| t.is_dir()))
            .filter_map(|e| e.file_name().into_string().ok())
            .collect();
        names.sort();
        names
    }
}

/// Moves the calling process into the groups at `dirs` (the supervisor, before it starts its
/// replica: everything the replica starts is born in them).
pub fn join(dirs: &[PathBuf]) -> std::io::Result<()> {
    for dir in dirs {
        let procs = dir.join("cgroup.procs");
        std::fs::write(&procs, "0")
            .map_err(|err| std::io::Error::new(err.kind(), format!("joining {}: {err}", procs.display())))?;
    }
    Ok(())
}

/// This process's group on v1 controller `controller`, from `/proc/self/cgroup`
/// (`4:memory:/some/path`; `cpu,cpuacct` lines name several).
fn own_group(proc_cgroup: &str, controller: &str) -> String {
    proc_cgroup
        .lines()
        .filter_map(|line| {
            let mut fields = line.splitn(3, ':');
            let (_, controllers, path) = (fields.next()?, fields.next()?, fields.next()?);
            controllers.split(',').any(|c| c == controller).then(|| path.to_string())
        })
        .next()
        .unwrap_or_else(|| "/".into())
}

/// A replica's group name: unique per job, attempt and rank.
pub fn group_name(job_id: uuid::Uuid, attempt: i32, rank: u32) -> String {
    format!("{job_id}-{attempt}-{rank}")
}

/// No replica gets less memory than this, whatever it asked for: below it the supervisor and a
/// shell may not start at all, and the failure would not say why.
pub const MEMORY_FLOOR: u64 = 16 << 20;

/// The CFS period: 100 ms, the kernel's default.
const CFS_PERIOD_US: u64 = 100_000;

/// v1 `cpu.shares`: 1024 a core, as Kubernetes sets it (at least 2, the kernel's minimum).
pub fn cpu_shares(cpu_millis: u64) -> u64 {
    (cpu_millis * 1024 / 1000).max(2)
}

/// v2 `cpu.weight` (1..10000, 100 the default), from the same shares as Kubernetes converts them.
pub fn cpu_weight(cpu_millis: u64) -> u64 {
    let shares = cpu_shares(cpu_millis);
    (1 + ((shares - 2) * 9999) / 262_142).clamp(1, 10_000)
}

/// CFS quota in microseconds a period for a request in millicores (at least 1 ms, the kernel's
/// minimum).
pub fn cpu_quota_us(cpu_millis: u64) -> u64 {
    (cpu_millis * CFS_PERIOD_US / 1000).max(1000)
}

/// The device rules of a replica: what runc gives every container (the null, zero, full,
/// random and urandom devices, terminals, and `mknod` of anything, which opens nothing), then
/// `extra` (its GPUs and the driver's control files), read and write.
pub fn device_rules(extra: &[(u32, u32)]) -> Vec<DeviceRule> {
    let any = |kind| DeviceRule { kind, major: None, minor: None, access: Access::MKNOD };
    let mut rules = vec![any(Kind::Char), any(Kind::Block)];
    rules.extend(
        [(1, 3), (1, 5), (1, 7), (1, 8), (1, 9), (5, 0), (5, 1), (5, 2)]
            .map(|(major, minor)| DeviceRule::char(major, minor, Access::ALL)),
    );
    // Pseudo-terminals: every minor of major 136.
    rules.push(DeviceRule { kind: Kind::Char, major: Some(136), minor: None, access: Access::ALL });
    rules.extend(extra.iter().map(|(major, minor)| DeviceRule::char(*major, *minor, Access::READ_WRITE)));
    rules
}

/// The device numbers of the NVIDIA driver files a replica with `gpus` may open: each GPU's
/// `/dev/nvidia<i>`, and the control files every CUDA program opens (`nvidiactl`, `nvidia-uvm`,
/// `nvidia-uvm-tools`, `nvidia-modeset`), read from `/dev` (none when the machine has none).
pub fn nvidia_devices(dev: &Path, gpus: &[u32]) -> Vec<(u32, u32)> {
    use std::os::unix::fs::MetadataExt;
    let mut names: Vec<String> = gpus.iter().map(|i| format!("nvidia{i}")).collect();
    names.extend(["nvidiactl", "nvidia-uvm", "nvidia-uvm-tools", "nvidia-modeset"].map(str::to_string));
    names
        .iter()
        .filter_map(|name| std::fs::metadata(dev.join(name)).ok())
        .map(|meta| {
            let rdev = meta.rdev();
            (nix::sys::stat::major(rdev) as u32, nix::sys::stat::minor(rdev) as u32)
        })
        .collect()
}

/// A `key value` counter of a cgroup file such as `memory.events`.
fn counter(text: &str, key: &str) -> u64 {
    text.lines()
        .filter_map(|line| line.split_once(' '))
        .find(|(k, _)| *k == key)
        .and_then(|(_, v)| v.trim().parse().ok())
        .unwrap_or(0)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cpu_requests_become_kubernetes_shares_weights_and_quotas() {
        assert_eq!(cpu_shares(1000), 1024);
        assert_eq!(cpu_shares(250), 256);
        assert_eq!(cpu_shares(1), 2, "the kernel's minimum");
        // Kubernetes: 1 core -> weight 39, 2 cores -> 79 (the shares->weight formula).
        assert_eq!(cpu_weight(1000), 39);
        assert_eq!(cpu_weight(2000), 79);
        assert_eq!(cpu_quota_us(500), 50_000);
        assert_eq!(cpu_quota_us(1), 1000, "the kernel's minimum quota");
    }

    #[test]
    fn device_rules_allow_the_pseudo_devices_and_only_the_given_gpus() {
        let rules: Vec<String> = device_rules(&[(195, 0), (195, 255)]).iter().map(DeviceRule::v1_rule).collect();
        assert!(rules.contains(&"c 1:3 rwm".to_string()), "/dev/null");
        assert!(rules.contains(&"c 195:0 rw".to_string()) && rules.contains(&"c 195:255 rw".to_string()));
        assert!(!rules.iter().any(|r| r.starts_with("c 195:1 ")), "no other GPU");
        assert!(!rules.iter().any(|r| r.starts_with("a")), "never everything");
    }

    #[test]
    fn finds_its_own_group_on_each_v1_controller() {
        let own = "9:name=systemd:/\n4:memory:/process_api/4e0c\n1:cpu,cpuacct:/a\n0::/\n";
        assert_eq!(own_group(own, "memory"), "/process_api/4e0c");
        assert_eq!(own_group(own, "cpu"), "/a");
        assert_eq!(own_group(own, "pids"), "/", "a controller not listed: the root");
    }

    #[test]
    fn reads_the_oom_kill_counter_of_either_version() {
        assert_eq!(counter("oom_kill_disable 0\nunder_oom 0\noom_kill 2\n", "oom_kill"), 2);
        assert_eq!(counter("low 0\nhigh 0\nmax 5\noom 1\noom_kill 1\n", "oom_kill"), 1);
        assert_eq!(counter("", "oom_kill"), 0);
    }

    /// On a machine where this test runs as root with cgroups (tests/run's), a group confines a
    /// process tree for real: a child started in it is listed, and killing the group ends it
    /// even when it left its process group and session.
    #[test]
    fn a_group_holds_and_kills_a_process_that_left_its_session() {
        let cgroups = match Cgroups::detect() {
            Ok(cgroups) => cgroups,
            Err(why) if !nix::unistd::geteuid().is_root() => {
                eprintln!("SKIPPED (not root): {why}");
                return;
            }
            Err(why) => panic!("as root, replicas must be confinable here: {why}"),
        };
        let name = format!("test-{}", uuid::Uuid::new_v4());
        let limits =
            Limits { memory_bytes: 64 << 20, cpu_millis: 500, cpu_hard_limit: false, pids_max: 32, devices: vec![] };
        cgroups.create(&name, &limits).unwrap();
        // A shell that joins the group, then starts a detached sleeper in a new session.
        let procs = cgroups.dir("pids", &name).join("cgroup.procs");
        let script = format!("echo $$ > {}; setsid sleep 300 &", procs.display());
        let mut shell = std::process::Command::new("sh")
            .arg("-c")
            .arg(script)
            .stdout(std::process::Stdio::null())
            .stderr(std::process::Stdio::null())
            .spawn()
            .unwrap();
        shell.wait().unwrap();
        let deadline = Instant::now() + Duration::from_secs(5);
        while cgroups.procs(&name).is_empty() {
            assert!(Instant::now() < deadline, "the sleeper never showed in the group");
            std::thread::sleep(Duration::from_millis(10));
        }
        assert!(cgroups.kill_all(&name, Duration::from_secs(5)), "the group emptied");
        cgroups.remove(&name).unwrap();
        assert!(!cgroups.exists(&name));
    }
}
