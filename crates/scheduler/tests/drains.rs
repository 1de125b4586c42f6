//! Drained nodes (an admin's `yard admin node drain`): no new placements there, what runs there
//! stays, and a job that only a drained node could hold says so.

mod common;

use common::*;
use trainyard_scheduler::{Node, PendingReason, admission_cycle};

fn drained(mut node: Node, reason: &str) -> Node {
    node.drained = Some(reason.into());
    node
}

#[test]
fn a_drained_node_takes_no_new_job_and_keeps_what_runs_there() {
    let tenants = vec![tenant("a", None, &[(A100, quota(64, None, None))])];
    let nodes = vec![drained(node("n1", "r1", A100, 8), "new cooling"), node("n2", "r1", A100, 8)];
    // n1 is emptier (best fit would choose it for a gang of two 2-GPU replicas too).
    let running = vec![running("r", "a", 0, A100, &["n2"], 4, 0), running("old", "a", 0, A100, &["n1"], 2, 0)];
    let pending =
        vec![pending("j", "a", 0, 1, demand(1, 4, Some(A100))), pending("k", "a", 0, 2, demand(1, 4, Some(A100)))];
    let result = admission_cycle(&snapshot(nodes, tenants, running, pending));
    let j = result.admissions.iter().find(|a| a.job == id("j")).expect("j fits on n2");
    assert_eq!(j.nodes, vec!["n2".to_string()]);
    assert!(result.preemptions.is_empty(), "a drain preempts nothing by itself: {result:?}");
    // k would fit on n1 (6 GPUs free there), and only there: it waits for the drain, and says so.
    let k = result.pending.iter().find(|p| p.job == id("k")).expect("k waits");
    assert_eq!(k.reason, PendingReason::Drained { nodes: vec!["n1".into()], reason: "new cooling".into() });
    assert_eq!(k.reason.to_string(), "node n1 is drained: new cooling; no other node has room for the job now");
}

#[test]
fn a_job_that_fits_nowhere_even_undrained_is_told_there_is_no_room() {
    let tenants = vec![tenant("a", None, &[(A100, quota(64, None, None))])];
    let nodes = vec![drained(node("n1", "r1", A100, 8), ""), node("n2", "r1", A100, 8)];
    let running = vec![running("x", "a", 0, A100, &["n1"], 8, 0), running("y", "a", 0, A100, &["n2"], 8, 0)];
    let result =
        admission_cycle(&snapshot(nodes, tenants, running, vec![pending("j", "a", 0, 1, demand(1, 4, Some(A100)))]));
    assert!(matches!(result.pending[0].reason, PendingReason::NoRoom { .. }), "{:?}", result.pending[0].reason);
}

#[test]
fn undrained_it_takes_jobs_again_and_cpu_jobs_avoid_it_too() {
    let tenants = vec![tenant("a", None, &[(A100, quota(64, None, None))])];
    let job = || vec![pending("j", "a", 0, 1, demand(1, 4, Some(A100))), pending("c", "a", 0, 2, demand(1, 0, None))];
    let result =
        admission_cycle(&snapshot(vec![drained(node("n1", "r1", A100, 8), "x")], tenants.clone(), vec![], job()));
    assert!(result.admissions.is_empty(), "{result:?}");
    let reasons: Vec<String> = result.pending.iter().map(|p| p.reason.to_string()).collect();
    assert!(reasons.iter().all(|r| r.starts_with("node n1 is drained: x")), "{reasons:?}");
    let result = admission_cycle(&snapshot(vec![node("n1", "r1", A100, 8)], tenants, vec![], job()));
    assert_eq!(result.admissions.len(), 2, "{result:?}");
}
