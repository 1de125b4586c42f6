//! Start estimates down a chain and through an array's window: held jobs ([`Snapshot::held`])
//! join the simulated queue when what they wait for has ended.

mod common;

use common::*;
use trainyard_scheduler::{ArrayWindow, HeldJob, estimate_starts_explained, run_cycle};

fn held(name: &str, after: &[&str], array: Option<&str>, seq: u64) -> HeldJob {
    HeldJob {
        job: pending(name, "a", 0, seq, demand(1, 1, Some(A100))),
        after: after.iter().map(|d| id(d)).collect(),
        array: array.map(id),
    }
}

/// One 1-GPU node; `first` runs from 1_000_000 for 600 s (ends at 1_000_600).
fn one_gpu_busy() -> trainyard_scheduler::Snapshot {
    snapshot(
        vec![node("n1", "r1", A100, 1)],
        vec![tenant("a", None, &[(A100, quota(8, None, None))])],
        vec![running("first", "a", 0, A100, &["n1"], 1, 1_000_000)],
        Vec::new(),
    )
}

#[test]
fn a_chain_is_estimated_link_by_link_each_after_the_one_before() {
    let mut snap = one_gpu_busy();
    snap.held = vec![held("second", &["first"], None, 1), held("third", &["second"], None, 2)];
    assert!(run_cycle(&snap, Default::default()).admissions.is_empty(), "no cycle admits a held job");
    let starts = estimate_starts_explained(&snap);
    let second = starts[&id("second")].clone().expect("the second link is estimated");
    assert_eq!(second.at, 1_000_600, "when the first ends");
    assert_eq!(&*second.after, &[id("first")], "it names the job it waits for");
    let third = starts[&id("third")].clone().expect("the third link is estimated");
    assert_eq!(third.at, 1_001_200, "600 s after the second starts");
    assert_eq!(&*third.after, &[id("second")]);
}

#[test]
fn a_released_link_that_finds_no_room_waits_for_room_and_names_what_makes_it() {
    // `second` waits on `dep` (on n2, ends at 1_000_300); the only GPU it can use is held by
    // `first` until 1_000_600.
    let mut snap = one_gpu_busy();
    snap.nodes.push(node("n2", "r1", common::H100, 1));
    snap.tenants[0].quotas.insert(H100.into(), quota(8, None, None));
    let mut dep = running("dep", "a", 0, H100, &["n2"], 1, 1_000_000);
    dep.expected_runtime = Some(300);
    snap.running.push(dep);
    snap.held = vec![held("second", &["dep"], None, 1)];
    let start = estimate_starts_explained(&snap)[&id("second")].clone().unwrap();
    assert_eq!(start.at, 1_000_600);
    assert_eq!(&*start.after, &[id("first")], "released at 1_000_300, it waits for the room `first` frees");
}

#[test]
fn a_dependency_the_snapshot_does_not_hold_gives_no_estimate() {
    let mut snap = one_gpu_busy();
    snap.held = vec![held("second", &["elsewhere"], None, 1), held("third", &["second"], None, 2)];
    let starts = estimate_starts_explained(&snap);
    assert_eq!(starts[&id("second")], None, "its dependency is not known to end");
    assert_eq!(starts[&id("third")], None, "nor, then, is anything after it");
}

#[test]
fn an_arrays_window_releases_one_member_per_end() {
    // Four 1-GPU nodes, an array of 6 at %2: members 0 and 1 run (ending at 1_000_600), 2..5
    // are held. Room is never short: only the window holds them back.
    let mut snap = snapshot(
        (1..=4).map(|i| node(&format!("n{i}"), "r1", A100, 1)).collect(),
        vec![tenant("a", None, &[(A100, quota(8, None, None))])],
        vec![running("m0", "a", 0, A100, &["n1"], 1, 1_000_000), running("m1", "a", 0, A100, &["n2"], 1, 1_000_000)],
        Vec::new(),
    );
    snap.held = (2..6).map(|i| held(&format!("m{i}"), &[], Some("arr"), i)).collect();
    snap.arrays = vec![ArrayWindow { id: id("arr"), limit: 2, members: vec![id("m0"), id("m1")] }];
    let starts = estimate_starts_explained(&snap);
    let at = |m: &str| starts[&id(m)].as_ref().map(|s| s.at);
    assert_eq!([at("m2"), at("m3")], [Some(1_000_600); 2], "two go when the first two end");
    assert_eq!([at("m4"), at("m5")], [Some(1_001_200); 2], "the last two when those end, never more than 2 at once");
    assert!(starts[&id("m2")].as_ref().unwrap().after.contains(&id("m0")));
}
