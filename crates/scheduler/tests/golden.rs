//! Golden decision traces for named scenarios, reviewed and committed under tests/snapshots.
//! A change in scheduling behaviour shows up as a diff to review (`cargo insta review`).

mod common;

use std::fmt::Write;

use common::*;
use trainyard_scheduler::{Snapshot, admission_cycle};

/// Runs `rounds` cycles; admitted jobs start, victims requeue, jobs in `finish` end after
/// round 1. Returns one line per decision.
fn trace(mut snap: Snapshot, rounds: usize, finish: &[&str]) -> String {
    let mut out = String::new();
    for round in 1..=rounds {
        let result = admission_cycle(&snap);
        writeln!(out, "round {round}").unwrap();
        for a in &result.admissions {
            writeln!(
                out,
                "  admit   {:<8} {} on {}",
                name_of(a.job),
                a.flavor.as_deref().unwrap_or("cpu"),
                a.nodes.join(",")
            )
            .unwrap();
        }
        for p in &result.preemptions {
            writeln!(out, "  preempt {:<8} for {} ({:?})", name_of(p.victim), name_of(p.for_job), p.kind).unwrap();
        }
        for p in &result.pending {
            writeln!(
                out,
                "  wait    {:<8} #{} in tenant, #{} in cluster: {}",
                name_of(p.job),
                p.tenant_position,
                p.cluster_position,
                p.reason
            )
            .unwrap();
        }
        if round == 1 {
            snap.running.retain(|r| !finish.contains(&name_of(r.id).as_str()));
        }
        snap.apply(&result, 100 + round as u64);
        snap.now += 60;
    }
    out
}

#[test]
fn borrow_then_reclaim() {
    // Two teams share a cohort of 16 A100s, 8 nominal each. Team b bursts while a is idle,
    // borrowing a's quota; then a submits within its nominal quota and reclaims it.
    let mut snap = snapshot(
        vec![node("n1", "r1", A100, 8), node("n2", "r1", A100, 8)],
        vec![
            tenant("a", Some("c"), &[(A100, quota(8, None, None))]),
            tenant("b", Some("c"), &[(A100, quota(8, None, None))]),
        ],
        vec![],
        (0..4).map(|i| pending(&format!("b{i}"), "b", 0, i, demand(1, 4, Some(A100)))).collect(),
    );
    let first = trace(snap.clone(), 1, &[]);
    snap.running = vec![
        running("b0", "b", 0, A100, &["n1"], 4, 10),
        running("b1", "b", 0, A100, &["n1"], 4, 20),
        running("b2", "b", 0, A100, &["n2"], 4, 30),
        running("b3", "b", 0, A100, &["n2"], 4, 40),
    ];
    snap.pending = vec![pending("a0", "a", 0, 10, demand(1, 8, Some(A100)))];
    insta::assert_snapshot!(format!("{first}{}", trace(snap, 3, &[])));
}

#[test]
fn fair_share_between_three_bursts() {
    let tenants = ["x", "y", "z"];
    let pending = tenants
        .iter()
        .flat_map(|t| (0..4).map(move |i| pending(&format!("{t}{i}"), t, 0, i * 3, demand(1, 2, Some(A100)))))
        .collect();
    let snap = snapshot(
        vec![node("n1", "r1", A100, 8), node("n2", "r1", A100, 4)],
        tenants.iter().map(|t| tenant(t, Some("c"), &[(A100, quota(4, None, None))])).collect(),
        vec![],
        pending,
    );
    insta::assert_snapshot!(trace(snap, 1, &[]));
}

#[test]
fn a_starving_gang_stops_backfill() {
    let mut snap = snapshot(
        vec![node("n1", "r1", A100, 8), node("n2", "r2", A100, 8)],
        vec![tenant("a", None, &[(A100, quota(64, None, None))])],
        vec![running("long", "a", 0, A100, &["n1"], 2, 0), running("short", "a", 0, A100, &["n2"], 2, 0)],
        vec![
            pending("gang", "a", 1, 1, demand(2, 8, Some(A100))),
            pending("s1", "a", 0, 2, demand(1, 2, Some(A100))),
            pending("s2", "a", 0, 3, demand(1, 2, Some(A100))),
        ],
    );
    snap.pending[0].submitted_at -= snap.settings.starvation_after_secs;
    insta::assert_snapshot!(trace(snap, 2, &["short"]));
}
