//! Which device files a control group's processes may open, on cgroup v2.
//!
//! cgroup v1 has a devices controller that takes rules as text (`c 195:0 rw`). cgroup v2 has
//! none: the kernel asks an eBPF program of type `BPF_PROG_TYPE_CGROUP_DEVICE`, attached to the
//! group, at every open or `mknod` of a device file, and refuses with `EPERM` when it returns 0.
//! This crate turns the same rules into that program and attaches it, as runc
//! (`libcontainer/cgroups/devices`) and crun (`src/libcrun/ebpf.c`) do for containers: a
//! replica then opens only its own GPUs' `/dev/nvidia<i>` and the usual pseudo devices.
//!
//! The program is a straight line of tests, one block per rule, first match allows:
//!
//! ```text
//!   r2 = ctx.access_type >> 16     (the access asked: mknod 1, read 2, write 4)
//!   r3 = ctx.access_type & 0xffff  (the kind: block 1, char 2)
//!   r4 = ctx.major, r5 = ctx.minor
//!   rule: kind differs?           -> next rule
//!         asks more than allowed? -> next rule
//!         major or minor differs? -> next rule
//!         return 1
//!   ...
//!   return 0
//! ```
//!
//! Why written here: no maintained crate loads a program from instructions. `aya` loads ELF
//! objects only (made by a BPF compiler this build does not have), and youki's `libcgroups`
//! brings `libbpf-sys` (libbpf and libelf built from C) and the OCI runtime types for this one
//! program. The instruction set and its encoding are `rbpf`'s, whose interpreter also runs the
//! program in the tests below, rule by rule against [`DeviceRule::allows`]; the kernel test
//! (`the_kernel_refuses_what_the_filter_does_not_allow`) runs it for real on this machine's
//! unified hierarchy. The one `unsafe` is the `bpf(2)` call itself, which neither `nix` nor
//! `rustix` wraps.

use std::io;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::path::Path;

use rbpf::ebpf::{self, Insn};

/// Which kind of device file a rule is about.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kind {
    Char,
    Block,
    Any,
}

impl Kind {
    /// The kernel's `BPF_DEVCG_DEV_*` number.
    fn code(self) -> Option<i32> {
        match self {
            Kind::Block => Some(1),
            Kind::Char => Some(2),
            Kind::Any => None,
        }
    }

    fn letter(self) -> char {
        match self {
            Kind::Char => 'c',
            Kind::Block => 'b',
            Kind::Any => 'a',
        }
    }
}

/// What a rule allows: any of mknod, read, write (the kernel's `BPF_DEVCG_ACC_*` bits).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Access(u8);

impl Access {
    pub const MKNOD: Access = Access(1);
    pub const READ: Access = Access(2);
    pub const WRITE: Access = Access(4);
    pub const READ_WRITE: Access = Access(2 | 4);
    pub const ALL: Access = Access(1 | 2 | 4);

    /// Whether everything `asked` asks for is allowed here.
    pub fn covers(self, asked: Access) -> bool {
        asked.0 & !self.0 == 0
    }

    fn letters(self) -> String {
        [(Access::READ, 'r'), (Access::WRITE, 'w'), (Access::MKNOD, 'm')]
            .into_iter()
            .filter(|(bit, _)| self.0 & bit.0 != 0)
            .map(|(_, letter)| letter)
            .collect()
    }
}

/// One allow rule: a kind, a major and minor number (`None`: any), and what may be done.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct DeviceRule {
    pub kind: Kind,
    pub major: Option<u32>,
    pub minor: Option<u32>,
    pub access: Access,
}

impl DeviceRule {
    /// A character device `major:minor`.
    pub const fn char(major: u32, minor: u32, access: Access) -> DeviceRule {
        DeviceRule { kind: Kind::Char, major: Some(major), minor: Some(minor), access }
    }

    /// The same rule in the v1 devices controller's words (`devices.allow`): `c 1:3 rwm`.
    pub fn v1_rule(&self) -> String {
        let number = |n: Option<u32>| n.map_or("*".to_string(), |n| n.to_string());
        format!("{} {}:{} {}", self.kind.letter(), number(self.major), number(self.minor), self.access.letters())
    }

    /// Whether this rule lets a process do `asked` to device `kind major:minor` (what the
    /// kernel's v1 controller decides, and what the program must decide too).
    pub fn allows(&self, kind: Kind, major: u32, minor: u32, asked: Access) -> bool {
        (self.kind == Kind::Any || self.kind == kind)
            && self.major.is_none_or(|m| m == major)
            && self.minor.is_none_or(|m| m == minor)
            && self.access.covers(asked)
    }
}

/// The filter program for `rules`: allows what any rule allows, refuses everything else.
pub fn program(rules: &[DeviceRule]) -> Vec<Insn> {
    let insn = |opc: u8, dst: u8, src: u8, off: i16, imm: i32| Insn { opc, dst, src, off, imm };
    let mut code = vec![
        // r1 is the context: struct bpf_cgroup_dev_ctx { u32 access_type, major, minor }.
        insn(ebpf::LD_W_REG, 2, 1, 0, 0),
        insn(ebpf::MOV64_REG, 3, 2, 0, 0),
        insn(ebpf::AND64_IMM, 3, 0, 0, 0xffff),
        insn(ebpf::RSH64_IMM, 2, 0, 0, 16),
        insn(ebpf::LD_W_REG, 4, 1, 4, 0),
        insn(ebpf::LD_W_REG, 5, 1, 8, 0),
    ];
    for rule in rules {
        // Device numbers are Linux's (12-bit major, 20-bit minor): a number no immediate can
        // hold names no device, so its rule can match nothing.
        let (Ok(major), Ok(minor)) =
            (rule.major.map(i32::try_from).transpose(), rule.minor.map(i32::try_from).transpose())
        else {
            continue;
        };
        // Each test jumps past the end of the block when it fails; the offsets are set once
        // the block's length is known.
        let mut block: Vec<Insn> = Vec::new();
        if let Some(kind) = rule.kind.code() {
            block.push(insn(ebpf::JNE_IMM, 3, 0, 0, kind));
        }
        if rule.access != Access::ALL {
            let refused = i32::from(!rule.access.0 & Access::ALL.0);
            block.push(insn(ebpf::MOV64_REG, 6, 2, 0, 0));
            block.push(insn(ebpf::AND64_IMM, 6, 0, 0, refused));
            block.push(insn(ebpf::JNE_IMM, 6, 0, 0, 0));
        }
        if let Some(major) = major {
            block.push(insn(ebpf::JNE_IMM, 4, 0, 0, major));
        }
        if let Some(minor) = minor {
            block.push(insn(ebpf::JNE_IMM, 5, 0, 0, minor));
        }
        block.push(insn(ebpf::MOV64_IMM, 0, 0, 0, 1));
        block.push(insn(ebpf::EXIT, 0, 0, 0, 0));
        let len = block.len();
        for (at, step) in block.iter_mut().enumerate() {
            if step.opc == ebpf::JNE_IMM {
                step.off = i16::try_from(len - at - 1).expect("a rule's block is a few instructions");
            }
        }
        code.extend(block);
    }
    code.push(insn(ebpf::MOV64_IMM, 0, 0, 0, 0));
    code.push(insn(ebpf::EXIT, 0, 0, 0, 0));
    code
}

/// The program's bytes, as the kernel (and `rbpf`) reads them.
pub fn bytecode(rules: &[DeviceRule]) -> Vec<u8> {
    program(rules).iter().flat_map(|insn| insn.to_array()).collect()
}

/// Attaches the filter for `rules` to the v2 group at `group_dir`: from then on its processes
/// (and all they start) open only what the rules allow. Alongside any filter an ancestor group
/// has (`BPF_F_ALLOW_MULTI`): every one must allow. The program lives as long as the group.
pub fn attach(group_dir: &Path, rules: &[DeviceRule]) -> io::Result<()> {
    let group = std::fs::File::open(group_dir)?;
    let program = prog_load(&bytecode(rules))?;
    let mut attr = ProgAttachAttr {
        target_fd: fd_u32(&group),
        attach_bpf_fd: fd_u32(&program),
        attach_type: BPF_CGROUP_DEVICE,
        attach_flags: BPF_F_ALLOW_MULTI,
    };
    bpf(BPF_PROG_ATTACH, &mut attr).map(drop)
}

/// Loads the program; the verifier's words are in the error when it refuses it. Without a log
/// first: asking the verifier for its log makes a load several times slower.
fn prog_load(code: &[u8]) -> io::Result<OwnedFd> {
    match prog_load_logged(code, None) {
        Ok(fd) => Ok(fd),
        Err(_) => {
            let mut log = vec![0u8; 64 * 1024];
            let err = match prog_load_logged(code, Some(&mut log)) {
                Ok(fd) => return Ok(fd),
                Err(err) => err,
            };
            let said = String::from_utf8_lossy(&log[..log.iter().position(|b| *b == 0).unwrap_or(0)]).into_owned();
            Err(io::Error::new(err.kind(), format!("loading the device filter: {err}; the verifier said: {said}")))
        }
    }
}

fn prog_load_logged(code: &[u8], log: Option<&mut [u8]>) -> io::Result<OwnedFd> {
    let license = c"Apache-2.0";
    let (log_level, log_size, log_buf) = match log {
        Some(log) => (1, u32::try_from(log.len()).map_err(io::Error::other)?, log.as_mut_ptr() as u64),
        None => (0, 0, 0),
    };
    let mut attr = ProgLoadAttr {
        prog_type: BPF_PROG_TYPE_CGROUP_DEVICE,
        insn_cnt: u32::try_from(code.len() / ebpf::INSN_SIZE).map_err(io::Error::other)?,
        insns: code.as_ptr() as u64,
        license: license.as_ptr() as u64,
        log_level,
        log_size,
        log_buf,
        kern_version: 0,
        prog_flags: 0,
        prog_name: *b"trainyard_dev\0\0\0",
    };
    let fd = bpf(BPF_PROG_LOAD, &mut attr)?;
    // SAFETY: a successful BPF_PROG_LOAD returns a new file descriptor that nothing else owns.
    #[allow(unsafe_code)]
    let fd = unsafe { OwnedFd::from_raw_fd(fd) };
    Ok(fd)
}

fn fd_u32(fd: &impl AsRawFd) -> u32 {
    u32::try_from(fd.as_raw_fd()).expect("an open file descriptor is not negative")
}

/// The `bpf(2)` system call with `attr` as its argument.
fn bpf<T>(command: libc::c_int, attr: &mut T) -> io::Result<libc::c_int> {
    // SAFETY: `attr` is a live, fully initialised `repr(C)` value laid out as the kernel's
    // `union bpf_attr` member for `command` (the kernel zero-extends the rest), passed with its
    // exact size; the only pointers in it point to buffers that outlive the call.
    #[allow(unsafe_code)]
    let result = unsafe { libc::syscall(libc::SYS_bpf, command, std::ptr::from_mut(attr), std::mem::size_of::<T>()) };
    if result < 0 { Err(io::Error::last_os_error()) } else { libc::c_int::try_from(result).map_err(io::Error::other) }
}

const BPF_PROG_LOAD: libc::c_int = 5;
const BPF_PROG_ATTACH: libc::c_int = 8;
const BPF_PROG_TYPE_CGROUP_DEVICE: u32 = 15;
const BPF_CGROUP_DEVICE: u32 = 6;
const BPF_F_ALLOW_MULTI: u32 = 2;

/// `union bpf_attr` for `BPF_PROG_LOAD`, up to the program's name.
#[repr(C)]
struct ProgLoadAttr {
    prog_type: u32,
    insn_cnt: u32,
    insns: u64,
    license: u64,
    log_level: u32,
    log_size: u32,
    log_buf: u64,
    kern_version: u32,
    prog_flags: u32,
    prog_name: [u8; 16],
}

/// `union bpf_attr` for `BPF_PROG_ATTACH`.
#[repr(C)]
struct ProgAttachAttr {
    target_fd: u32,
    attach_bpf_fd: u32,
    attach_type: u32,
    attach_flags: u32,
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Runs the program as the kernel would for one access, in rbpf's interpreter.
    fn decides(rules: &[DeviceRule], kind: Kind, major: u32, minor: u32, asked: Access) -> bool {
        let code = bytecode(rules);
        let vm = rbpf::EbpfVmRaw::new(Some(&code)).expect("the program passes rbpf's verifier");
        let kind_code = u32::try_from(kind.code().expect("a real access has a kind")).unwrap();
        let mut ctx = Vec::new();
        for field in [(u32::from(asked.0) << 16) | kind_code, major, minor] {
            ctx.extend_from_slice(&field.to_le_bytes());
        }
        match vm.execute_program(&mut ctx).expect("the program runs") {
            0 => false,
            1 => true,
            other => panic!("a device filter returns 0 or 1, not {other}"),
        }
    }

    fn runc_defaults_and_gpu_0() -> Vec<DeviceRule> {
        vec![
            DeviceRule { kind: Kind::Char, major: None, minor: None, access: Access::MKNOD },
            DeviceRule::char(1, 3, Access::ALL),
            DeviceRule::char(1, 5, Access::ALL),
            DeviceRule { kind: Kind::Char, major: Some(136), minor: None, access: Access::ALL },
            DeviceRule::char(195, 0, Access::READ_WRITE),
            DeviceRule::char(195, 255, Access::READ_WRITE),
        ]
    }

    #[test]
    fn the_program_decides_every_access_as_the_rules_do() {
        let rules = runc_defaults_and_gpu_0();
        let accesses = [Access::READ, Access::WRITE, Access::READ_WRITE, Access::MKNOD, Access::ALL];
        let mut checked = 0;
        for kind in [Kind::Char, Kind::Block] {
            for (major, minor) in [(1, 3), (1, 5), (1, 7), (136, 4), (195, 0), (195, 1), (195, 255), (8, 0), (0, 0)] {
                for asked in accesses {
                    let want = rules.iter().any(|rule| rule.allows(kind, major, minor, asked));
                    assert_eq!(decides(&rules, kind, major, minor, asked), want, "{kind:?} {major}:{minor} {asked:?}");
                    checked += 1;
                }
            }
        }
        assert_eq!(checked, 90);
    }

    #[test]
    fn a_replica_opens_its_own_gpu_and_the_null_device_but_no_other_gpu() {
        let rules = runc_defaults_and_gpu_0();
        assert!(decides(&rules, Kind::Char, 195, 0, Access::READ_WRITE), "its GPU");
        assert!(!decides(&rules, Kind::Char, 195, 1, Access::READ), "another GPU");
        assert!(decides(&rules, Kind::Char, 1, 3, Access::WRITE), "/dev/null");
        assert!(decides(&rules, Kind::Char, 195, 7, Access::MKNOD), "mknod of a char device (it opens nothing)");
        assert!(!decides(&rules, Kind::Block, 8, 0, Access::READ), "no disk");
        assert!(!decides(&[], Kind::Char, 1, 3, Access::READ), "no rules: nothing");
    }

    #[test]
    fn rules_read_as_the_v1_controller_writes_them() {
        assert_eq!(DeviceRule::char(1, 3, Access::ALL).v1_rule(), "c 1:3 rwm");
        assert_eq!(DeviceRule::char(195, 0, Access::READ_WRITE).v1_rule(), "c 195:0 rw");
        let any_minor = DeviceRule { kind: Kind::Char, major: Some(136), minor: None, access: Access::ALL };
        assert_eq!(any_minor.v1_rule(), "c 136:* rwm");
        let mknod_block = DeviceRule { kind: Kind::Block, major: None, minor: None, access: Access::MKNOD };
        assert_eq!(mknod_block.v1_rule(), "b *:* m");
    }

    /// As root on a machine with a cgroup2 hierarchy (these machines mount one, empty of
    /// controllers, at /sys/fs/cgroup/unified; a v2 machine at /sys/fs/cgroup): the kernel
    /// loads the program, and a shell in the group opens /dev/null but not /dev/zero.
    #[test]
    fn the_kernel_refuses_what_the_filter_does_not_allow() {
        let Some(root) = ["/sys/fs/cgroup/unified", "/sys/fs/cgroup"]
            .into_iter()
            .map(Path::new)
            .find(|p| p.join("cgroup.procs").exists() && p.join("cgroup.subtree_control").exists())
        else {
            panic!("no cgroup2 hierarchy is mounted; these machines and CI have one");
        };
        if !nix_is_root() {
            eprintln!("SKIPPED (not root): cannot make a cgroup or load a BPF program");
            return;
        }
        let group = root.join(format!("trainyard-device-filter-test-{}", uuid::Uuid::new_v4()));
        std::fs::create_dir(&group).unwrap();
        let rules = [DeviceRule::char(1, 3, Access::ALL)];
        let attached = attach(&group, &rules);
        let script = format!(
            "echo $$ > {}/cgroup.procs && head -c 0 /dev/null && head -c 1 /dev/zero >/dev/null",
            group.display()
        );
        let run = attached
            .as_ref()
            .ok()
            .map(|()| std::process::Command::new("sh").arg("-c").arg(&script).output().expect("sh runs"));
        // The shell has ended: the group is empty and can go.
        let removed = std::fs::remove_dir(&group);
        attached.expect("the kernel loads and attaches the filter");
        removed.expect("the test group is removed");
        let output = run.unwrap();
        let stderr = String::from_utf8_lossy(&output.stderr);
        assert!(!output.status.success(), "/dev/zero opened: {stderr}");
        assert!(stderr.contains("/dev/zero") && stderr.contains("Operation not permitted"), "{stderr}");
        assert!(!stderr.contains("/dev/null"), "/dev/null stays usable: {stderr}");
    }

    fn nix_is_root() -> bool {
        std::fs::read_to_string("/proc/self/status")
            .ok()
            .and_then(|s| s.lines().find(|l| l.starts_with("Uid:")).map(|l| l.split_whitespace().nth(1) == Some("0")))
            .unwrap_or(false)
    }
}
