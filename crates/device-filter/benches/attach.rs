//! What the cgroup v2 device filter adds to a replica's launch: a group made and removed on
//! the machine's cgroup2 hierarchy, alone and with the filter loaded and attached (a replica's
//! rules with 8 GPUs), side by side in one run. Needs root and a cgroup2 hierarchy (these
//! machines mount one at /sys/fs/cgroup/unified); without, it says it skipped.
//!
//! `cargo bench -p trainyard-device-filter --bench attach`

use std::path::Path;

use criterion::{Criterion, criterion_group, criterion_main};
use trainyard_device_filter::{Access, DeviceRule, attach};

fn replica_rules() -> Vec<DeviceRule> {
    let mut rules: Vec<DeviceRule> = [(1, 3), (1, 5), (1, 7), (1, 8), (1, 9), (5, 0), (5, 1), (5, 2)]
        .map(|(a, b)| DeviceRule::char(a, b, Access::ALL))
        .into();
    rules.extend((0..8).map(|gpu| DeviceRule::char(195, gpu, Access::READ_WRITE)));
    rules.extend([255, 254].map(|minor| DeviceRule::char(195, minor, Access::READ_WRITE)));
    rules
}

fn group_with_and_without_filter(c: &mut Criterion) {
    let Some(root) = ["/sys/fs/cgroup/unified", "/sys/fs/cgroup"]
        .into_iter()
        .map(Path::new)
        .find(|p| p.join("cgroup.subtree_control").exists())
    else {
        eprintln!("SKIPPED: no cgroup2 hierarchy is mounted");
        return;
    };
    let parent = root.join(format!("trainyard-device-filter-bench-{}", std::process::id()));
    if let Err(err) = std::fs::create_dir_all(&parent) {
        eprintln!("SKIPPED: cannot make {}: {err}", parent.display());
        return;
    }
    let rules = replica_rules();
    let mut group = c.benchmark_group("cgroup2 group, made and removed");
    let mut n = 0u64;
    for filtered in [false, true] {
        let name = if filtered { "with the device filter attached" } else { "alone" };
        group.bench_function(name, |b| {
            b.iter(|| {
                n += 1;
                let dir = parent.join(n.to_string());
                std::fs::create_dir(&dir).unwrap_or_else(|err| panic!("{err}"));
                if filtered {
                    attach(&dir, &rules).unwrap_or_else(|err| panic!("{err}"));
                }
                std::fs::remove_dir(&dir).unwrap_or_else(|err| panic!("{err}"));
            })
        });
    }
    group.finish();
    let _ = std::fs::remove_dir(&parent);
}

criterion_group!(benches, group_with_and_without_filter);
criterion_main!(benches);
