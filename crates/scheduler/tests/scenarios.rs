//! One scenario per rule: a fixed snapshot and the decisions it must produce.

mod common;

use common::*;
use trainyard_scheduler::{PendingReason, PreemptionKind, admission_cycle, estimate_starts, what_if};

fn admitted(result: &trainyard_scheduler::CycleResult) -> Vec<String> {
    result.admissions.iter().map(|a| name_of(a.job)).collect()
}

fn reason_of(result: &trainyard_scheduler::CycleResult, job: &str) -> PendingReason {
    result.pending.iter().find(|p| p.job == id(job)).unwrap_or_else(|| panic!("{job} is not pending")).reason.clone()
}

#[test]
fn a_tenant_alone_stops_at_its_nominal_quota() {
    let snap = snapshot(
        vec![node("n1", "r1", A100, 8)],
        vec![tenant("a", None, &[(A100, quota(4, None, None))])],
        vec![running("r", "a", 0, A100, &["n1"], 4, 0)],
        vec![pending("j", "a", 0, 1, demand(1, 1, Some(A100)))],
    );
    let result = admission_cycle(&snap);
    assert!(result.admissions.is_empty());
    let reason = reason_of(&result, "j");
    assert_eq!(
        reason.to_string(),
        "tenant quota for nvidia-a100-40gb: 4 of 4 GPUs in use, may borrow 0 more; the job needs 1 GPU"
    );
}

#[test]
fn a_tenant_borrows_idle_quota_of_its_cohort_up_to_its_limits() {
    let tenants = || {
        vec![
            tenant("a", Some("c"), &[(A100, quota(4, Some(2), None))]),
            tenant("b", Some("c"), &[(A100, quota(4, None, None))]),
        ]
    };
    let nodes = || vec![node("n1", "r1", A100, 8)];
    // 4 of its own plus 2 borrowed from b's idle quota: fine.
    let snap = snapshot(nodes(), tenants(), vec![], vec![pending("j", "a", 0, 1, demand(1, 6, Some(A100)))]);
    assert_eq!(admitted(&admission_cycle(&snap)), ["j"]);
    // 3 borrowed is over the borrowing limit of 2.
    let snap = snapshot(nodes(), tenants(), vec![], vec![pending("j", "a", 0, 1, demand(1, 7, Some(A100)))]);
    let result = admission_cycle(&snap);
    assert!(matches!(reason_of(&result, "j"), PendingReason::QuotaExceeded { borrowing_limit: Some(2), .. }));
}

#[test]
fn a_lending_limit_caps_what_others_borrow() {
    let snap = snapshot(
        vec![node("n1", "r1", A100, 8)],
        vec![
            tenant("a", Some("c"), &[(A100, quota(2, None, None))]),
            tenant("b", Some("c"), &[(A100, quota(6, None, Some(1)))]),
        ],
        vec![],
        vec![pending("big", "a", 0, 1, demand(1, 4, Some(A100))), pending("ok", "a", 0, 2, demand(1, 3, Some(A100)))],
    );
    let result = admission_cycle(&snap);
    assert_eq!(admitted(&result), ["ok"], "2 own + 1 lent = 3, not 4");
    assert!(matches!(reason_of(&result, "big"), PendingReason::CohortExhausted { lendable: 1, .. }), "{:?}", result);
}

#[test]
fn the_tenant_using_less_of_its_share_goes_first() {
    let snap = snapshot(
        vec![node("n1", "r1", A100, 8)],
        vec![
            tenant("a", Some("c"), &[(A100, quota(8, None, None))]),
            tenant("b", Some("c"), &[(A100, quota(8, None, None))]),
        ],
        vec![running("ra", "a", 0, A100, &["n1"], 7, 0)],
        vec![pending("a2", "a", 5, 1, demand(1, 1, Some(A100))), pending("b1", "b", 0, 2, demand(1, 1, Some(A100)))],
    );
    let result = admission_cycle(&snap);
    assert_eq!(admitted(&result), ["b1"], "b uses 0/8, a 7/8: b first, whatever a's priority");
}

#[test]
fn within_a_tenant_priority_then_submission_order() {
    let snap = snapshot(
        vec![node("n1", "r1", A100, 2)],
        vec![tenant("a", None, &[(A100, quota(8, None, None))])],
        vec![],
        vec![
            pending("old", "a", 0, 1, demand(1, 1, Some(A100))),
            pending("new", "a", 0, 2, demand(1, 1, Some(A100))),
            pending("urgent", "a", 10, 3, demand(1, 1, Some(A100))),
        ],
    );
    let result = admission_cycle(&snap);
    assert_eq!(admitted(&result), ["urgent", "old"]);
    let new = result.pending.iter().find(|p| p.job == id("new")).unwrap();
    assert_eq!((new.tenant_position, new.cluster_position), (1, 1));
}

#[test]
fn a_gang_is_admitted_whole_or_not_at_all() {
    let snap = snapshot(
        vec![node("n1", "r1", A100, 8), node("n2", "r1", A100, 8)],
        vec![tenant("a", None, &[(A100, quota(64, None, None))])],
        vec![running("x", "a", 0, A100, &["n1"], 5, 0), running("y", "a", 0, A100, &["n2"], 5, 0)],
        vec![pending("gang", "a", 0, 1, demand(2, 4, Some(A100)))],
    );
    let result = admission_cycle(&snap);
    assert!(result.admissions.is_empty(), "6 GPUs are free, but no node has 4");
    assert!(matches!(reason_of(&result, "gang"), PendingReason::NoRoom { free_gpus: 6, .. }));
}

#[test]
fn a_gang_takes_as_few_nodes_as_possible_in_one_rack() {
    let snap = snapshot(
        vec![
            node("r1-a", "r1", A100, 8),
            node("r1-b", "r1", A100, 8),
            node("r2-a", "r2", A100, 8),
            node("r2-b", "r2", A100, 8),
        ],
        vec![tenant("a", None, &[(A100, quota(64, None, None))])],
        vec![running("x", "a", 0, A100, &["r1-a"], 4, 0), running("y", "a", 0, A100, &["r2-b"], 6, 0)],
        vec![pending("gang", "a", 0, 1, demand(3, 4, Some(A100)))],
    );
    let result = admission_cycle(&snap);
    let nodes = &result.admissions[0].nodes;
    // r1 has 4 + 8 free (3 replicas), r2 has 8 + 2 (2 replicas): r1, two replicas on r1-b.
    assert_eq!(nodes.iter().filter(|n| n.as_str() == "r1-b").count(), 2);
    assert!(nodes.iter().all(|n| n.starts_with("r1")), "{nodes:?}");
}

/// A job whose dataset node-2's shard cache holds: placed there while node 2 has room, even
/// though best fit alone would pick the busier node 1.
#[test]
fn a_job_goes_to_the_node_that_holds_its_data_when_it_has_room() {
    let warm_job = || {
        let mut job = pending("reader", "a", 0, 1, demand(1, 2, Some(A100)));
        job.warm_nodes = vec!["node-2".into()];
        job
    };
    let snap = snapshot(
        vec![node("node-1", "r1", A100, 8), node("node-2", "r1", A100, 8)],
        vec![tenant("a", None, &[(A100, quota(64, None, None))])],
        vec![running("x", "a", 0, A100, &["node-1"], 4, 0)],
        vec![warm_job()],
    );
    assert_eq!(admission_cycle(&snap).admissions[0].nodes, ["node-2"]);

    // Node 2 full: the job starts on node 1 in the same cycle, never held back for its data.
    let snap = snapshot(
        vec![node("node-1", "r1", A100, 8), node("node-2", "r1", A100, 8)],
        vec![tenant("a", None, &[(A100, quota(64, None, None))])],
        vec![running("x", "a", 0, A100, &["node-2"], 8, 0)],
        vec![warm_job()],
    );
    let result = admission_cycle(&snap);
    assert_eq!(result.admissions.len(), 1, "{:?}", result.pending);
    assert_eq!(result.admissions[0].nodes, ["node-1"]);
}

/// A job that asked to wait for its data's node (`cache_wait_secs`) waits while node 2 is full,
/// with a reason that says so and until when, preempting nothing (its tenant could reclaim a
/// borrower on node 1) and reserving nothing; once its wait is over it takes node 1. A job
/// whose warm node is not in the cluster never waits, and a CPU-only job waits the same way.
#[test]
fn a_job_that_asked_waits_for_its_datas_node_until_its_wait_is_over() {
    let reader = |gpus: u32, wait: u32, warm: &str| {
        let mut job = pending("reader", "a", 0, 1, demand(1, gpus, (gpus > 0).then_some(A100)));
        job.warm_nodes = vec![warm.into()];
        job.cache_wait_secs = wait;
        job
    };
    // Tenant b borrows every GPU, its quota is 0: tenant a's nominal quota would reclaim some.
    let world = |job: trainyard_scheduler::PendingJob, now_after_submit: i64| {
        let mut snap = snapshot(
            vec![node("node-1", "r1", A100, 8), node("node-2", "r1", A100, 8)],
            vec![
                tenant("a", Some("c"), &[(A100, quota(16, None, None))]),
                tenant("b", Some("c"), &[(A100, quota(0, None, None))]),
            ],
            vec![
                running("filler", "b", 0, A100, &["node-2"], 8, 0),
                running("borrower", "b", 0, A100, &["node-1"], 8, 0),
            ],
            vec![job],
        );
        snap.now = snap.pending[0].submitted_at + now_after_submit;
        snap.settings.starvation_after_secs = 60;
        snap
    };
    let result = admission_cycle(&world(reader(2, 600, "node-2"), 120));
    assert!(result.admissions.is_empty() && result.preemptions.is_empty(), "{result:?}");
    let until = world(reader(2, 600, "node-2"), 0).now + 600;
    assert_eq!(reason_of(&result, "reader"), PendingReason::WaitingForCache { nodes: 1, until });
    let said = reason_of(&result, "reader").to_string();
    assert!(said.starts_with("waiting for room on the node that caches its data, as the job asked, until "), "{said}");

    // Its wait over: the usual rules, which reclaim node 1 from the borrower.
    let result = admission_cycle(&world(reader(2, 600, "node-2"), 600));
    assert_eq!(result.preemptions.len(), 1, "{result:?}");
    // Without a wait, or with a warm node the cluster does not have: the same at once.
    assert_eq!(admission_cycle(&world(reader(2, 0, "node-2"), 120)).preemptions.len(), 1);
    assert_eq!(admission_cycle(&world(reader(2, 600, "gone"), 120)).preemptions.len(), 1);

    // Its tenant's quota is lent out but node 2 has room: reclaiming quota serves it there.
    let mut roomy = world(reader(2, 600, "node-2"), 120);
    roomy.nodes[1].gpus = 16;
    assert_eq!(admission_cycle(&roomy).preemptions.len(), 1);

    // A CPU-only reader waits too, though node 1 has room; after its wait it goes there.
    let mut cpu_world = world(reader(0, 600, "node-2"), 120);
    cpu_world.nodes[1].cpu_millis = 0;
    let result = admission_cycle(&cpu_world);
    assert!(matches!(reason_of(&result, "reader"), PendingReason::WaitingForCache { nodes: 1, .. }), "{result:?}");
    cpu_world.now += 600;
    assert_eq!(admission_cycle(&cpu_world).admissions[0].nodes, ["node-1"]);
}

/// A gang prefers the warm nodes only when they hold every replica; otherwise the usual
/// placement (fewest nodes, one rack), and a warm node the cluster does not know is ignored.
#[test]
fn a_gang_uses_warm_nodes_only_when_they_hold_all_of_it() {
    let nodes = || vec![node("n1", "r1", A100, 8), node("n2", "r1", A100, 8), node("n3", "r1", A100, 8)];
    let gang = |warm: &[&str]| {
        let mut job = pending("gang", "a", 0, 1, demand(2, 4, Some(A100)));
        job.warm_nodes = warm.iter().map(|n| n.to_string()).collect();
        job
    };
    let tenants = || vec![tenant("a", None, &[(A100, quota(64, None, None))])];
    let placed = |warm: &[&str]| {
        let snap = snapshot(nodes(), tenants(), vec![running("x", "a", 0, A100, &["n1"], 4, 0)], vec![gang(warm)]);
        let mut nodes = admission_cycle(&snap).admissions[0].nodes.clone();
        nodes.sort();
        nodes
    };
    assert_eq!(placed(&[]), ["n2"; 2], "without warm nodes: one whole node");
    assert_eq!(placed(&["n3"]), ["n3"; 2]);
    assert_eq!(placed(&["n1", "n3"]), ["n3"; 2], "among the warm ones, the fewest nodes");
    assert_eq!(placed(&["n1"]), ["n2"; 2], "n1 has room for one replica of two: the usual placement");
    assert_eq!(placed(&["gone"]), ["n2"; 2]);
}

#[test]
fn a_small_job_goes_where_it_keeps_whole_nodes_free() {
    let snap = snapshot(
        vec![node("empty", "r1", A100, 8), node("busy", "r1", A100, 8)],
        vec![tenant("a", None, &[(A100, quota(64, None, None))])],
        vec![running("x", "a", 0, A100, &["busy"], 6, 0)],
        vec![pending("small", "a", 0, 1, demand(1, 2, Some(A100)))],
    );
    assert_eq!(admission_cycle(&snap).admissions[0].nodes, ["busy"]);
}

#[test]
fn a_tenant_reclaims_its_nominal_quota_from_borrowers_lowest_priority_and_newest_first() {
    let snap = snapshot(
        vec![node("n1", "r1", A100, 8)],
        vec![
            tenant("a", Some("c"), &[(A100, quota(4, None, None))]),
            tenant("b", Some("c"), &[(A100, quota(4, None, None))]),
        ],
        vec![
            // b runs 8 (4 own, 4 borrowed from a).
            running("b-old", "b", 0, A100, &["n1"], 2, 10),
            running("b-new", "b", 0, A100, &["n1"], 2, 20),
            running("b-high", "b", 5, A100, &["n1"], 2, 30),
            running("b-mid", "b", 1, A100, &["n1"], 2, 40),
        ],
        vec![pending("a1", "a", 3, 1, demand(1, 2, Some(A100)))],
    );
    let result = admission_cycle(&snap);
    assert!(result.admissions.is_empty());
    let victims: Vec<String> = result.preemptions.iter().map(|p| name_of(p.victim)).collect();
    assert_eq!(victims, ["b-new"], "the smallest set: one job of priority 0, the newer one");
    assert_eq!(result.preemptions[0].kind, PreemptionKind::Reclaim);
    assert_eq!(reason_of(&result, "a1"), PendingReason::WaitingForPreemption { victims: 1 });
}

#[test]
fn jobs_already_being_stopped_count_as_room_so_no_one_is_preempted_twice() {
    let mut snap = snapshot(
        vec![node("n1", "r1", A100, 8)],
        vec![
            tenant("a", Some("c"), &[(A100, quota(4, None, None))]),
            tenant("b", Some("c"), &[(A100, quota(4, None, None))]),
        ],
        vec![
            running("b-old", "b", 0, A100, &["n1"], 2, 10),
            running("b-new", "b", 0, A100, &["n1"], 2, 20),
            running("b-newer", "b", 0, A100, &["n1"], 2, 30),
            running("b-newest", "b", 0, A100, &["n1"], 2, 40),
        ],
        vec![pending("a1", "a", 0, 1, demand(1, 4, Some(A100)))],
    );
    let first = admission_cycle(&snap);
    let victims: Vec<String> = first.preemptions.iter().map(|p| name_of(p.victim)).collect();
    assert_eq!(victims, ["b-newest", "b-newer"]);
    // Next cycle: the victims are still stopping. Nobody else is preempted.
    for r in snap.running.iter_mut().filter(|r| victims.contains(&name_of(r.id))) {
        r.stopping = true;
        r.stopping_for = Some(id("a1"));
    }
    let second = admission_cycle(&snap);
    assert!(second.preemptions.is_empty(), "{:?}", second.preemptions);
    assert_eq!(reason_of(&second, "a1"), PendingReason::WaitingForPreemption { victims: 0 });
}

#[test]
fn the_room_a_preemption_frees_is_its_preemptors_so_another_job_finds_victims_of_its_own() {
    // Two tenants of one cohort, each running eight one-GPU jobs of priority 0 on a full node,
    // each allowed to preempt its own lower-priority jobs.
    let tenants = || {
        ["a", "b"]
            .map(|name| {
                let mut t = tenant(name, Some("c"), &[(A100, quota(8, None, None))]);
                t.preempt_lower_priority = true;
                t
            })
            .to_vec()
    };
    let small = |tenant: &str, i: i64| running(&format!("{tenant}-s{i}"), tenant, 0, A100, &["n1"], 1, 10 + i);
    let running_jobs: Vec<_> = (0..8).flat_map(|i| [small("a", i), small("b", i)]).collect();
    // a's large job preempted a's small jobs in an earlier cycle; they are still stopping. b's
    // large job arrived since.
    let mut snap = snapshot(
        vec![node("n1", "r1", A100, 16)],
        tenants(),
        running_jobs,
        vec![
            pending("a-large", "a", 5, 1, demand(1, 8, Some(A100))),
            pending("b-large", "b", 5, 2, demand(1, 8, Some(A100))),
        ],
    );
    for r in snap.running.iter_mut().filter(|r| name_of(r.id).starts_with("a-")) {
        r.stopping = true;
        r.stopping_for = Some(id("a-large"));
    }
    let result = admission_cycle(&snap);
    assert_eq!(
        reason_of(&result, "a-large"),
        PendingReason::WaitingForPreemption { victims: 0 },
        "a waits for its own room"
    );
    let mut victims: Vec<String> = result.preemptions.iter().map(|p| name_of(p.victim)).collect();
    victims.sort();
    assert_eq!(victims, (0..8).map(|i| format!("b-s{i}")).collect::<Vec<_>>(), "b preempts for itself, at once");
    assert!(result.preemptions.iter().all(|p| p.for_job == id("b-large")));

    // Had a's jobs been stopped for no job (cancelled), their room would be anyone's: b counts on it.
    for r in snap.running.iter_mut() {
        r.stopping_for = None;
    }
    let result = admission_cycle(&snap);
    assert!(result.preemptions.is_empty(), "{:?}", result.preemptions);
}

#[test]
fn the_room_a_preemption_frees_is_not_handed_to_the_jobs_behind_its_preemptor_in_the_same_cycle() {
    // A regression test: victims keep their room until they have stopped (`smallest_sufficient`).
    let mut t = tenant("a", None, &[(A100, quota(8, None, None))]);
    t.preempt_lower_priority = true;
    let snap = snapshot(
        vec![node("n1", "r1", A100, 8)],
        vec![t],
        (0..4).map(|i| running(&format!("a-s{i}"), "a", 0, A100, &["n1"], 2, 10 + i)).collect(),
        vec![
            pending("a-large", "a", 5, 1, demand(1, 4, Some(A100))),
            pending("a-next", "a", 0, 2, demand(1, 2, Some(A100))),
        ],
    );
    let result = admission_cycle(&snap);
    let victims: Vec<String> = result.preemptions.iter().map(|p| name_of(p.victim)).collect();
    assert_eq!(victims, ["a-s3", "a-s2"]);
    // Had the victims' room been free for the rest of the cycle, a-next would have taken half of
    // it, and the next cycle would have preempted a-next for a-large.
    assert!(result.admissions.is_empty(), "{:?}", result.admissions);
}

#[test]
fn the_free_room_a_preemptor_needs_beside_its_victims_room_is_held_for_it_in_its_cycle() {
    // a-large needs the whole node: its victim's 2 GPUs and the 6 free beside them.
    let mut t = tenant("a", None, &[(A100, quota(8, None, None))]);
    t.preempt_lower_priority = true;
    let snap = snapshot(
        vec![node("n1", "r1", A100, 8)],
        vec![t],
        vec![running("a-s0", "a", 0, A100, &["n1"], 2, 10)],
        vec![
            pending("a-large", "a", 5, 1, demand(1, 8, Some(A100))),
            pending("a-next", "a", 0, 2, demand(1, 1, Some(A100))),
        ],
    );
    let result = admission_cycle(&snap);
    let victims: Vec<String> = result.preemptions.iter().map(|p| name_of(p.victim)).collect();
    assert_eq!(victims, ["a-s0"]);
    // Had a-next taken one of the free GPUs, a-large would find 7 when its victim has gone, and
    // preempt a-next.
    assert!(result.admissions.is_empty(), "{:?}", result.admissions);
}

#[test]
fn a_preemptor_whose_victims_room_suffices_holds_none_of_the_free_room() {
    // a-large needs 4 GPUs: its victim's 4 are enough, the 2 free beside them stay free.
    let mut t = tenant("a", None, &[(A100, quota(8, None, None))]);
    t.preempt_lower_priority = true;
    let snap = snapshot(
        vec![node("n1", "r1", A100, 8)],
        vec![t],
        vec![running("a-s0", "a", 0, A100, &["n1"], 4, 10), running("a-hi", "a", 9, A100, &["n1"], 2, 11)],
        vec![
            pending("a-large", "a", 5, 1, demand(1, 4, Some(A100))),
            pending("a-next", "a", 0, 2, demand(1, 2, Some(A100))),
        ],
    );
    let result = admission_cycle(&snap);
    let victims: Vec<String> = result.preemptions.iter().map(|p| name_of(p.victim)).collect();
    assert_eq!(victims, ["a-s0"]);
    let admitted: Vec<String> = result.admissions.iter().map(|a| name_of(a.job)).collect();
    assert_eq!(admitted, ["a-next"]);
}

#[test]
fn a_preemptor_whose_victims_just_ended_goes_first_ahead_of_the_fair_share_order() {
    // Four GPUs are free: the room a-large's victims left. Tenant a is at its share, b at none.
    let mut snap = snapshot(
        vec![node("n1", "r1", A100, 8)],
        vec![
            tenant("a", Some("c"), &[(A100, quota(4, None, None))]),
            tenant("b", Some("c"), &[(A100, quota(4, None, None))]),
        ],
        vec![running("a-r1", "a", 9, A100, &["n1"], 4, 10)],
        std::iter::once(pending("a-large", "a", 5, 1, demand(1, 4, Some(A100))))
            .chain((0..4).map(|i| pending(&format!("b-s{i}"), "b", 0, 2 + i, demand(1, 1, Some(A100)))))
            .collect(),
    );
    let admitted = |snap: &trainyard_scheduler::Snapshot| -> Vec<String> {
        admission_cycle(snap).admissions.iter().map(|a| name_of(a.job)).collect()
    };
    // In fair-share order b's jobs come first and take the room: a-large would preempt again.
    assert_eq!(admitted(&snap), ["b-s0", "b-s1", "b-s2", "b-s3"]);
    // Nominated (its victims just ended), a-large goes first.
    snap.nominated = vec![id("a-large")];
    assert_eq!(admitted(&snap), ["a-large"]);
}

#[test]
fn reclaim_never_evicts_a_higher_priority_or_a_tenant_within_its_own_quota() {
    let snap = snapshot(
        vec![node("n1", "r1", A100, 8)],
        vec![
            tenant("a", Some("c"), &[(A100, quota(4, None, None))]),
            tenant("b", Some("c"), &[(A100, quota(4, None, None))]),
        ],
        vec![running("b1", "b", 9, A100, &["n1"], 6, 10), running("b2", "b", 0, A100, &["n1"], 2, 20)],
        vec![pending("a1", "a", 3, 1, demand(1, 4, Some(A100)))],
    );
    let result = admission_cycle(&snap);
    // Freeing b2 (2 GPUs) is not enough; b1 has the higher priority: no preemption at all.
    assert!(result.preemptions.is_empty(), "{:?}", result.preemptions);
}

#[test]
fn within_a_tenant_higher_priority_preempts_lower_only_when_allowed() {
    let build = |allowed: bool| {
        let mut t = tenant("a", None, &[(A100, quota(8, None, None))]);
        t.preempt_lower_priority = allowed;
        snapshot(
            vec![node("n1", "r1", A100, 8)],
            vec![t],
            vec![running("low", "a", 0, A100, &["n1"], 8, 10)],
            vec![pending("high", "a", 5, 1, demand(1, 4, Some(A100)))],
        )
    };
    let result = admission_cycle(&build(true));
    assert_eq!(result.preemptions.iter().map(|p| name_of(p.victim)).collect::<Vec<_>>(), ["low"]);
    assert_eq!(result.preemptions[0].kind, PreemptionKind::LowerPriority);
    assert!(admission_cycle(&build(false)).preemptions.is_empty());
}

#[test]
fn a_job_that_waited_long_holds_nodes_so_small_jobs_stop_overtaking_it() {
    let mut snap = snapshot(
        vec![node("n1", "r1", A100, 8), node("n2", "r1", H100, 8)],
        vec![tenant("a", None, &[(A100, quota(64, None, None)), (H100, quota(64, None, None))])],
        vec![running("x", "a", 0, A100, &["n1"], 4, 0)],
        vec![
            pending("big", "a", 5, 1, demand(1, 8, Some(A100))),
            pending("small", "a", 0, 2, demand(1, 2, Some(A100))),
            pending("other", "a", 0, 3, demand(1, 2, Some(H100))),
        ],
    );
    // Not waited long yet: the small job backfills on the node the big one waits for.
    assert_eq!(admitted(&admission_cycle(&snap)), ["small", "other"]);
    snap.now += snap.settings.starvation_after_secs;
    let result = admission_cycle(&snap);
    assert_eq!(
        admitted(&result),
        ["other"],
        "the small job no longer overtakes; nodes the big one cannot use stay open"
    );
    assert_eq!(reason_of(&result, "small"), PendingReason::Reserved { for_job: id("big") });
}

#[test]
fn a_job_no_node_can_hold_says_it_will_never_fit() {
    let snap = snapshot(
        vec![node("n1", "r1", A100, 8)],
        vec![tenant("a", None, &[(A100, quota(64, None, None))])],
        vec![],
        vec![pending("huge", "a", 0, 1, demand(1, 16, Some(A100))), pending("h", "a", 0, 2, demand(1, 1, Some(H100)))],
    );
    let result = admission_cycle(&snap);
    assert!(reason_of(&result, "huge").to_string().starts_with("no node has 16 GPUs of nvidia-a100-40gb"));
    assert_eq!(reason_of(&result, "h"), PendingReason::NoQuota { flavor: H100.into() });
}

#[test]
fn waiting_jobs_know_how_many_higher_priority_jobs_are_ahead() {
    let snap = snapshot(
        vec![node("n1", "r1", A100, 1)],
        vec![tenant("a", None, &[(A100, quota(64, None, None))])],
        vec![running("x", "a", 0, A100, &["n1"], 1, 0)],
        vec![pending("p9", "a", 9, 1, demand(1, 1, Some(A100))), pending("p1", "a", 1, 2, demand(1, 1, Some(A100)))],
    );
    let result = admission_cycle(&snap);
    let p1 = result.pending.iter().find(|p| p.job == id("p1")).unwrap();
    assert_eq!((p1.tenant_position, p1.behind_higher_priority), (2, 1));
}

#[test]
fn estimates_follow_the_expected_ends_of_running_jobs() {
    let snap = snapshot(
        vec![node("n1", "r1", A100, 8)],
        vec![tenant("a", None, &[(A100, quota(64, None, None))])],
        vec![running("x", "a", 0, A100, &["n1"], 8, 1_000_000)], // ends at 1_000_600
        vec![
            pending("next", "a", 0, 1, demand(1, 8, Some(A100))),
            pending("after", "a", 0, 2, demand(1, 8, Some(A100))),
        ],
    );
    let starts = estimate_starts(&snap);
    assert_eq!(starts[&id("next")], Some(1_000_600));
    assert_eq!(starts[&id("after")], Some(1_001_200), "after next's 600 s");

    let answer = what_if(&snap, pending("probe", "a", 0, 3, demand(1, 4, Some(A100))));
    assert!(!answer.admitted_now);
    assert_eq!(answer.pending.as_ref().unwrap().tenant_position, 3);
    assert_eq!(answer.estimated_start, Some(1_001_800));
    let answer = what_if(&snap, pending("probe", "a", 99, 3, demand(1, 4, Some(A100))));
    assert_eq!(answer.estimated_start, Some(1_000_600), "a higher priority goes first");
}
