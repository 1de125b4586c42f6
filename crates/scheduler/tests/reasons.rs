//! Every reason a waiting job is given states CPUs, memory and GPUs as people write them
//! (`2.5 CPUs`, `16 GiB`, `8 GPUs of nvidia-a100-40gb`), never as the scheduler holds them
//! (millicores, bytes). Each kind of reason is produced by a real cycle, from a job that asks
//! for 2.5 CPUs and 16 GiB per replica.

mod common;

use common::*;
use trainyard_scheduler::{Demand, Node, PendingReason, RunningJob, Snapshot, admission_cycle};

const CPU_MILLIS: u64 = 2500;
const MEMORY_BYTES: u64 = 16 << 30;

/// A job of `replicas` x `gpus` that also asks for 2.5 CPUs and 16 GiB per replica.
fn asks(replicas: u32, gpus: u32, flavor: Option<&str>) -> Demand {
    Demand { cpu_millis: CPU_MILLIS, memory_bytes: MEMORY_BYTES, ..demand(replicas, gpus, flavor) }
}

fn cpu_node(name: &str, cpu_millis: u64, memory_bytes: u64) -> Node {
    Node { name: name.into(), rack: None, gpu_type: None, gpus: 0, cpu_millis, memory_bytes, drained: None }
}

/// A CPU-only job holding `cpu_millis` of `node`.
fn running_cpu(name: &str, node: &str, cpu_millis: u64) -> RunningJob {
    RunningJob {
        demand: Demand { cpu_millis, ..demand(1, 0, None) },
        flavor: None,
        nodes: vec![node.into()],
        ..running(name, "a", 0, A100, &[node], 0, 0)
    }
}

/// The reason the cycle gives job `j`.
fn reason(snap: &Snapshot) -> PendingReason {
    let result = admission_cycle(snap);
    result
        .pending
        .iter()
        .find(|p| p.job == id("j"))
        .unwrap_or_else(|| panic!("j is not pending: {result:?}"))
        .reason
        .clone()
}

/// Fails when `text` shows an amount as the scheduler holds it.
fn assert_in_human_units(text: &str) {
    for raw in [CPU_MILLIS.to_string(), MEMORY_BYTES.to_string(), "millicore".into(), "bytes".into()] {
        assert!(!text.contains(&raw), "a raw amount ({raw}) in: {text}");
    }
}

#[test]
fn every_kind_of_reason_states_amounts_in_human_units() {
    let quota_of = |nominal| vec![tenant("a", None, &[(A100, quota(nominal, None, None))])];
    let gpu_nodes = || vec![node("n1", "r1", A100, 8), node("n2", "r1", A100, 8)];
    let one = |demand| vec![pending("j", "a", 0, 1, demand)];
    let cases: Vec<(&str, Snapshot, &[&str])> = vec![
        (
            "no quota",
            snapshot(gpu_nodes(), vec![tenant("a", None, &[])], vec![], one(asks(1, 1, Some(A100)))),
            &["no quota for nvidia-a100-40gb"],
        ),
        (
            "quota exceeded",
            snapshot(gpu_nodes(), quota_of(4), vec![], one(asks(1, 6, Some(A100)))),
            &["0 of 4 GPUs in use", "the job needs 6 GPUs"],
        ),
        (
            "cohort exhausted",
            snapshot(
                gpu_nodes(),
                vec![
                    tenant("a", Some("c"), &[(A100, quota(2, None, None))]),
                    tenant("b", Some("c"), &[(A100, quota(6, None, Some(1)))]),
                ],
                vec![],
                one(asks(1, 4, Some(A100))),
            ),
            &["0 of 2 GPUs in use", "the job needs 4 GPUs"],
        ),
        (
            "no room for GPUs now",
            snapshot(
                gpu_nodes(),
                quota_of(64),
                vec![running("x", "a", 0, A100, &["n1"], 5, 0), running("y", "a", 0, A100, &["n2"], 5, 0)],
                one(asks(2, 4, Some(A100))),
            ),
            &["2 x 4 GPUs of nvidia-a100-40gb free now"],
        ),
        (
            "no room for CPUs now",
            snapshot(
                vec![cpu_node("c1", 4000, 64 << 30)],
                quota_of(0),
                vec![running_cpu("x", "c1", 3000)],
                one(asks(1, 0, None)),
            ),
            &["room now for 1 replica of 2.5 CPUs and 16 GiB of memory"],
        ),
        (
            "more CPUs and memory than any node",
            snapshot(vec![cpu_node("c1", 2000, 8 << 30)], quota_of(0), vec![], one(asks(1, 0, None))),
            &["no node has 2.5 CPUs and 16 GiB of memory for one replica"],
        ),
        (
            "more GPUs than any node",
            snapshot(gpu_nodes(), quota_of(64), vec![], one(asks(1, 16, Some(A100)))),
            &["no node has 16 GPUs of nvidia-a100-40gb, 2.5 CPUs and 16 GiB of memory"],
        ),
        (
            "a gang larger than the cluster",
            snapshot(gpu_nodes(), quota_of(64), vec![], one(asks(3, 8, Some(A100)))),
            &["at most 2 replicas of 8 GPUs of nvidia-a100-40gb; the job needs 3"],
        ),
        (
            "no GPUs at all",
            snapshot(
                vec![cpu_node("c1", 64_000, 512 << 30)],
                vec![tenant("a", None, &[])],
                vec![],
                one(asks(1, 2, None)),
            ),
            &["asks for 2 GPUs per replica"],
        ),
    ];
    for (case, snap, wanted) in cases {
        let text = reason(&snap).to_string();
        assert_in_human_units(&text);
        for part in wanted {
            assert!(text.contains(part), "{case}: {text:?} lacks {part:?}");
        }
    }
}

/// One reason of every kind, with amounts: a kind added later fails to compile here until it
/// has a sample, and then must read in human units too.
#[test]
fn no_kind_of_reason_prints_millicores_or_bytes() {
    let flavor: trainyard_scheduler::decision::FlavorName = A100.into();
    let samples = [
        PendingReason::NoQuota { flavor: flavor.clone() },
        PendingReason::NeverFits { detail: "no node has 2.5 CPUs".into() },
        PendingReason::QuotaExceeded { flavor: flavor.clone(), used: 3, nominal: 4, borrowing_limit: None, needed: 2 },
        PendingReason::CohortExhausted { flavor: flavor.clone(), used: 3, nominal: 4, lendable: 0, needed: 2 },
        PendingReason::NoRoom {
            flavor: Some(flavor.clone()),
            replicas: 2,
            gpus_per_replica: 8,
            cpu_millis: CPU_MILLIS,
            memory_bytes: MEMORY_BYTES,
            free_gpus: 6,
        },
        PendingReason::NoRoom {
            flavor: None,
            replicas: 2,
            gpus_per_replica: 0,
            cpu_millis: CPU_MILLIS,
            memory_bytes: MEMORY_BYTES,
            free_gpus: 0,
        },
        PendingReason::Reserved { for_job: id("holder") },
        PendingReason::WaitingForPreemption { victims: 2 },
        // 2026-11-29 22:05:00 UTC
        PendingReason::WaitingForCache { nodes: 2, until: 1_795_989_900 },
        PendingReason::NoSpareRoom { flavor: Some(flavor.clone()), replicas: 2, gpus_per_replica: 8, free_gpus: 6 },
        PendingReason::Drained { nodes: vec!["n1".into()], reason: "new cooling".into() },
    ];
    for sample in &samples {
        // Exhaustive on purpose: no wildcard.
        let wanted = match sample {
            PendingReason::NoQuota { .. } | PendingReason::NeverFits { .. } => "",
            PendingReason::QuotaExceeded { .. } | PendingReason::CohortExhausted { .. } => "of 4 GPUs in use",
            PendingReason::NoRoom { flavor: Some(_), .. } => "2 x 8 GPUs of nvidia-a100-40gb",
            PendingReason::NoRoom { flavor: None, .. } => "2 replicas of 2.5 CPUs and 16 GiB of memory",
            PendingReason::Reserved { .. } | PendingReason::WaitingForPreemption { .. } => "",
            PendingReason::WaitingForCache { .. } => {
                "the 2 nodes that cache its data, as the job asked, until 22:05:00 UTC"
            }
            PendingReason::Drained { .. } => "node n1 is drained: new cooling",
            PendingReason::NoSpareRoom { .. } => {
                "spare room only (GPUs no job within its quota waits for): no set of nodes has 2 x 8 GPUs of nvidia-a100-40gb free now (6 free in all)"
            }
        };
        let text = sample.to_string();
        assert_in_human_units(&text);
        assert!(text.contains(wanted), "{text:?} lacks {wanted:?}");
    }
}
