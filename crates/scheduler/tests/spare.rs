//! Jobs on spare room (an experiment's trials by default): they take only what every other job
//! left, count in no quota, preempt nothing, and are the first to make way for a job within its
//! quota, the one that would lose least first.

mod common;

use common::*;
use trainyard_scheduler::{PendingReason, PreemptionKind, admission_cycle};

fn spare(mut job: trainyard_scheduler::PendingJob) -> trainyard_scheduler::PendingJob {
    job.spare = true;
    job
}

fn spare_running(
    name: &str,
    tenant: &str,
    gpus: u32,
    started: i64,
    saved: Option<i64>,
) -> trainyard_scheduler::RunningJob {
    let mut job = running(name, tenant, 100, A100, &["n1"], gpus, started);
    job.spare = true;
    job.saved_at = saved;
    job
}

#[test]
fn spare_jobs_come_after_every_other_job_and_count_in_no_quota() {
    // One node of 8; team-a may use 2 GPUs alone. Its 6-GPU job on spare room was submitted
    // first, yet b's job goes before it; it then takes the room left, beyond a's quota.
    let nodes = vec![node("n1", "r1", A100, 8)];
    let tenants =
        vec![tenant("a", None, &[(A100, quota(2, None, None))]), tenant("b", None, &[(A100, quota(2, None, None))])];
    let pending = vec![
        spare(pending("a-trial", "a", 100, 1, demand(1, 6, None))),
        pending("b-job", "b", 0, 2, demand(1, 2, Some(A100))),
        pending("a-job", "a", 0, 3, demand(1, 2, Some(A100))),
    ];
    let result = admission_cycle(&snapshot(nodes.clone(), tenants.clone(), vec![], pending.clone()));
    let admitted: Vec<String> = result.admissions.iter().map(|a| name_of(a.job)).collect();
    assert_eq!(admitted, ["b-job", "a-job"], "the spare job waits for what the others leave");
    let waiting = &result.pending[0];
    assert_eq!(name_of(waiting.job), "a-trial");
    assert!(
        matches!(waiting.reason, PendingReason::NoSpareRoom { free_gpus: 4, .. }),
        "it says it runs on spare room: {}",
        waiting.reason
    );
    assert!(result.preemptions.is_empty(), "a spare job preempts nothing");

    // With a 4-GPU trial, all three run: a holds 2 GPUs of its quota and 4 spare ones.
    let mut smaller = pending;
    smaller[0] = spare(common::pending("a-trial", "a", 100, 1, demand(1, 4, None)));
    let result = admission_cycle(&snapshot(nodes, tenants, vec![], smaller));
    assert_eq!(result.admissions.len(), 3, "{result:?}");
    assert_eq!(result.admissions.iter().find(|a| name_of(a.job) == "a-trial").unwrap().flavor.as_deref(), Some(A100));
}

#[test]
fn a_job_within_its_quota_stops_the_spare_job_that_saved_last_whatever_its_priority() {
    // Two 4-GPU trials of b fill the node; a's 4-GPU job is within its quota. The trial that
    // checkpointed most recently loses least: it is the one stopped, though it started last
    // and ranks higher in priority than a's job.
    let nodes = vec![node("n1", "r1", A100, 8)];
    let tenants = vec![tenant("a", None, &[(A100, quota(8, None, None))]), tenant("b", None, &[])];
    let cases = [
        (Some(1_000_090), Some(1_000_050), "t1"),
        (Some(1_000_040), Some(1_000_095), "t2"),
        // Nothing saved: the work lost is since each started (t2 started later).
        (None, None, "t2"),
    ];
    for (saved_1, saved_2, victim) in cases {
        let running =
            vec![spare_running("t1", "b", 4, 1_000_000, saved_1), spare_running("t2", "b", 4, 1_000_010, saved_2)];
        let pending = vec![pending("a-job", "a", 0, 1, demand(1, 4, Some(A100)))];
        let result = admission_cycle(&snapshot(nodes.clone(), tenants.clone(), running, pending));
        assert!(result.admissions.is_empty());
        let stopped: Vec<(String, PreemptionKind)> =
            result.preemptions.iter().map(|p| (name_of(p.victim), p.kind)).collect();
        assert_eq!(stopped, [(victim.to_string(), PreemptionKind::Spare)], "saved {saved_1:?} / {saved_2:?}");
        assert_eq!(result.pending[0].reason, PendingReason::WaitingForPreemption { victims: 1 });
    }
}

#[test]
fn spare_jobs_make_way_before_any_borrower_is_reclaimed() {
    // a and b share a cohort; b borrows 4 of a's nominal 8 with a regular job; a spare trial of c
    // holds the other 4. a's 4-GPU job fits its quota once the spare trial has gone: the
    // borrower keeps running.
    let nodes = vec![node("n1", "r1", A100, 8)];
    let tenants = vec![
        tenant("a", Some("lab"), &[(A100, quota(8, None, None))]),
        tenant("b", Some("lab"), &[(A100, quota(0, None, None))]),
        tenant("c", None, &[]),
    ];
    let running =
        vec![running("borrower", "b", 0, A100, &["n1"], 4, 1_000_000), spare_running("trial", "c", 4, 1_000_050, None)];
    let pending = vec![pending("a-job", "a", 0, 1, demand(1, 4, Some(A100)))];
    let result = admission_cycle(&snapshot(nodes, tenants, running, pending));
    let stopped: Vec<(String, PreemptionKind)> =
        result.preemptions.iter().map(|p| (name_of(p.victim), p.kind)).collect();
    assert_eq!(stopped, [("trial".to_string(), PreemptionKind::Spare)]);
}

#[test]
fn room_freed_for_a_preemptor_is_not_taken_by_a_spare_job() {
    // a's 8-GPU job stops the 4-GPU trial; the 4 free GPUs beside it are held for a's job, so
    // the other trial waiting on spare room does not take them meanwhile.
    let nodes = vec![node("n1", "r1", A100, 8)];
    let tenants = vec![tenant("a", None, &[(A100, quota(8, None, None))]), tenant("b", None, &[])];
    let running = vec![spare_running("t1", "b", 4, 1_000_000, None)];
    let pending = vec![
        pending("a-job", "a", 0, 1, demand(1, 8, Some(A100))),
        spare(pending("t2", "b", 0, 2, demand(1, 4, None))),
    ];
    let mut snap = snapshot(nodes, tenants, running, pending);
    let result = admission_cycle(&snap);
    assert!(result.admissions.is_empty(), "{:?}", result.admissions);
    assert_eq!(result.preemptions.len(), 1);

    // Once the trial has gone, a's job goes first; the trials wait for spare room.
    snap.apply(&result, 10);
    snap.running.clear();
    snap.nominated = vec![id("a-job")];
    let result = admission_cycle(&snap);
    let admitted: Vec<String> = result.admissions.iter().map(|a| name_of(a.job)).collect();
    assert_eq!(admitted, ["a-job"]);
    assert!(
        result.pending.iter().all(|p| matches!(p.reason, PendingReason::NoSpareRoom { .. })),
        "{:?}",
        result.pending
    );
}

#[test]
fn a_spare_job_reserves_nothing_however_long_it_waits() {
    // A trial that has waited a day does not hold the node against smaller jobs.
    let nodes = vec![node("n1", "r1", A100, 8)];
    let tenants = vec![tenant("a", None, &[(A100, quota(8, None, None))])];
    let running = vec![running("r", "a", 0, A100, &["n1"], 6, 1_000_000)];
    let mut trial = spare(pending("trial", "a", 0, 1, demand(1, 8, None)));
    trial.submitted_at = 1_000_100 - 86_400;
    let pending = vec![trial, pending("small", "a", 0, 2, demand(1, 2, Some(A100)))];
    let result = admission_cycle(&snapshot(nodes, tenants, running, pending));
    let admitted: Vec<String> = result.admissions.iter().map(|a| name_of(a.job)).collect();
    assert_eq!(admitted, ["small"]);
    assert!(result.preemptions.is_empty());
}
