//! Properties that hold for every cluster and workload, checked over random ones, cycle after
//! cycle: capacity, quotas, lending limits, gangs, preemption order, no preemption cycles,
//! determinism.

mod common;

use std::collections::{BTreeMap, BTreeSet};

use common::*;
use proptest::prelude::*;
use trainyard_scheduler::{CycleResult, PreemptionKind, RunningJob, Snapshot, admission_cycle};
use uuid::Uuid;

fn cluster() -> impl Strategy<Value = Snapshot> {
    let nodes = prop::collection::vec((0usize..2, prop::sample::select(vec![4u32, 8]), 0usize..3), 1..8);
    let tenants = prop::collection::vec(
        (
            prop::option::of(Just("c")),
            0u64..16,
            prop::option::of(0u64..8),
            prop::option::of(0u64..8),
            0u64..16,
            any::<bool>(),
        ),
        1..5,
    );
    let jobs = prop::collection::vec(
        (0usize..4, 1u32..4, 1u32..9, prop::option::of(0usize..2), 0i32..4, 0i64..4000, 0u8..4),
        0..40,
    );
    (nodes, tenants, jobs).prop_map(|(nodes, tenants, jobs)| {
        let flavors = [A100, H100];
        let nodes = nodes
            .into_iter()
            .enumerate()
            .map(|(i, (f, gpus, rack))| node(&format!("n{i}"), &format!("r{rack}"), flavors[f], gpus))
            .collect();
        let tenant_count = tenants.len();
        let tenants = tenants
            .into_iter()
            .enumerate()
            .map(|(i, (cohort, a100, borrow, lend, h100, preempt))| {
                let mut t = tenant(
                    &format!("t{i}"),
                    cohort,
                    &[(A100, quota(a100, borrow, lend)), (H100, quota(h100, borrow, lend))],
                );
                t.preempt_lower_priority = preempt;
                t
            })
            .collect();
        let pending = jobs
            .into_iter()
            .enumerate()
            .map(|(i, (t, replicas, gpus, flavor, priority, age, spare))| {
                let mut job = pending(
                    &format!("j{i}"),
                    &format!("t{}", t % tenant_count),
                    priority,
                    i as u64,
                    demand(replicas, gpus, flavor.map(|f| flavors[f])),
                );
                job.submitted_at = 1_000_100 - age;
                // One job in four on spare room.
                job.spare = spare == 0;
                job
            })
            .collect();
        snapshot(nodes, tenants, vec![], pending)
    })
}

/// Applies a cycle (admitted jobs start, victims requeue) and moves the clock on.
fn apply(snap: &mut Snapshot, result: &CycleResult, round: i64) {
    snap.apply(result, 1_000 + round as u64);
    snap.now += 60;
}

fn check_invariants(snap: &Snapshot) -> Result<(), TestCaseError> {
    // Capacity per node.
    for (i, node) in snap.nodes.iter().enumerate() {
        let on: Vec<&RunningJob> = snap.running.iter().filter(|r| r.nodes.contains(&node.name)).collect();
        let count = |r: &RunningJob| r.nodes.iter().filter(|n| **n == node.name).count() as u64;
        let gpus: u64 = on.iter().map(|r| count(r) * u64::from(r.demand.gpus)).sum();
        let cpu: u64 = on.iter().map(|r| count(r) * r.demand.cpu_millis).sum();
        prop_assert!(gpus <= u64::from(node.gpus), "node {i} holds {gpus} GPUs of {}", node.gpus);
        prop_assert!(cpu <= node.cpu_millis);
        for r in &on {
            prop_assert_eq!(r.flavor.as_deref(), node.gpu_type.as_deref(), "a job runs on its flavor's nodes");
        }
    }
    // Gangs whole; quotas and lending limits.
    let mut usage: BTreeMap<(Uuid, &str), u64> = BTreeMap::new();
    for r in &snap.running {
        prop_assert_eq!(r.nodes.len(), r.demand.replicas as usize, "a gang runs whole");
        if r.spare {
            continue; // counted in no quota
        }
        *usage.entry((r.tenant, r.flavor.as_deref().unwrap())).or_default() += r.demand.total_gpus();
    }
    for flavor in [A100, H100] {
        let (mut borrowed, mut lendable) = (0u64, 0u64);
        for t in &snap.tenants {
            let q = t.quotas[flavor];
            let u = usage.get(&(t.id, flavor)).copied().unwrap_or(0);
            let limit =
                if t.cohort.is_none() { q.nominal } else { q.nominal + q.borrowing_limit.unwrap_or(u64::MAX / 4) };
            prop_assert!(u <= limit, "{} uses {u} of {flavor}, limit {limit}", t.name);
            if t.cohort.is_some() {
                borrowed += u.saturating_sub(q.nominal);
                let idle = q.nominal.saturating_sub(u);
                lendable += q.lending_limit.map_or(idle, |l| idle.min(l));
            }
        }
        prop_assert!(borrowed <= lendable, "{flavor}: {borrowed} borrowed, {lendable} lendable");
    }
    Ok(())
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(300))]

    #[test]
    fn invariants_hold_cycle_after_cycle(mut snap in cluster()) {
        let mut preempted: BTreeSet<(Uuid, Uuid)> = BTreeSet::new();
        for round in 0..6 {
            let result = admission_cycle(&snap);
            // Determinism, and independence from the order the snapshot lists jobs in.
            prop_assert_eq!(&result, &admission_cycle(&snap));
            let mut reversed = snap.clone();
            reversed.pending.reverse();
            reversed.running.reverse();
            prop_assert_eq!(&result, &admission_cycle(&reversed));

            let priority: BTreeMap<Uuid, i32> =
                snap.pending.iter().map(|j| (j.id, j.priority)).chain(snap.running.iter().map(|r| (r.id, r.priority))).collect();
            let spare: BTreeSet<Uuid> =
                snap.pending.iter().filter(|j| j.spare).map(|j| j.id).chain(snap.running.iter().filter(|r| r.spare).map(|r| r.id)).collect();
            for p in &result.preemptions {
                prop_assert!(!spare.contains(&p.for_job), "a job on spare room preempts nothing");
                prop_assert_eq!(spare.contains(&p.victim), p.kind == PreemptionKind::Spare, "spare victims are preempted as such");
                prop_assert!(p.kind == PreemptionKind::Spare || priority[&p.victim] <= priority[&p.for_job], "never a higher priority for a lower one");
                prop_assert!(!preempted.contains(&(p.victim, p.for_job)), "no preemption cycle: {} preempted {} before", name_of(p.victim), name_of(p.for_job));
                preempted.insert((p.for_job, p.victim));
            }
            for a in &result.admissions {
                let job = snap.pending.iter().find(|j| j.id == a.job).unwrap();
                prop_assert_eq!(a.nodes.len(), job.demand.replicas as usize, "all or nothing");
            }
            apply(&mut snap, &result, round);
            check_invariants(&snap)?;
        }
    }
}
