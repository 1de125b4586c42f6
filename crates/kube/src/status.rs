//! From what Kubernetes reports about pods to what Trainyard calls a replica's phase and, when
//! it failed, why. Pure: the caller passes the pod, the clock and what it knows of nodes.
//!
//! | pod | replica |
//! |---|---|
//! | no pod yet, Job exists | pending |
//! | Pending, waiting for a node less than `unschedulable_timeout` | pending |
//! | Pending, `PodScheduled=False/Unschedulable` for longer | failed: Unschedulable |
//! | Pending, image pull failing for longer than `image_pull_timeout` (at once for `InvalidImageName`) | failed: ImagePullBackOff |
//! | Running with its container running | running |
//! | Succeeded | succeeded, exit 0 |
//! | Failed, container `OOMKilled` | failed: OOMKilled, its exit code (137) |
//! | Failed, `Evicted` or a `DisruptionTarget` by eviction | failed: Evicted |
//! | `Unknown`, on a node that vanished, or removed by the taint manager or pod GC | failed: NodeLost |
//! | Failed with a non-zero exit code | failed: Error, that code |
//! | `StartError` (exit 128): the command is not in the image, or not executable | failed: Error, 127 or 126 as a shell says it |
//! | `CreateContainerConfigError` (its Secret or ConfigMap missing) for longer than `image_pull_timeout` | failed: Lost |

use std::time::Duration;

use k8s_openapi::api::core::v1::{ContainerState, Pod, PodCondition};
use k8s_openapi::jiff::Timestamp;
use trainyard_executor::{FailureReason, ReplicaDetail, ReplicaPhase};

/// How long a replica may wait before waiting counts as failing.
#[derive(Debug, Clone, Copy)]
pub struct Patience {
    pub unschedulable: Duration,
    pub image_pull: Duration,
}

/// What the caller knows beyond the pod itself.
#[derive(Clone, Copy)]
pub struct Context<'a> {
    pub now: Timestamp,
    pub patience: Patience,
    /// Whether the node named by the pod is known to the node watcher; `None` when the
    /// watcher has not listed nodes (then no pod is declared lost for its node).
    pub node_exists: Option<&'a dyn Fn(&str) -> bool>,
}

/// The replica a pod runs, as Trainyard sees it.
pub fn replica_from_pod(rank: u32, pod: &Pod, ctx: &Context<'_>) -> ReplicaDetail {
    let status = pod.status.as_ref();
    let node = pod.spec.as_ref().and_then(|s| s.node_name.clone()).filter(|n| !n.is_empty());
    let container = status.and_then(|s| s.container_statuses.as_ref()).and_then(|c| c.first());
    let image_digest =
        container.map(|c| c.image_id.trim_start_matches("docker-pullable://").to_string()).filter(|d| !d.is_empty());
    let state = container.and_then(|c| c.state.as_ref());
    let phase = status.and_then(|s| s.phase.as_deref()).unwrap_or("Pending");
    let conditions: &[PodCondition] = status.and_then(|s| s.conditions.as_deref()).unwrap_or_default();
    let mut detail = ReplicaDetail {
        rank,
        phase: ReplicaPhase::Pending,
        exit_code: None,
        reason: None,
        message: None,
        image_digest,
        node: node.clone(),
    };

    if let Some(reason) = disruption(status.and_then(|s| s.reason.as_deref()), conditions) {
        return failed(detail, reason, terminated_code(state), status.and_then(|s| s.message.clone()));
    }
    let node_vanished = match (&node, ctx.node_exists) {
        (Some(node), Some(exists)) => !exists(node),
        _ => false,
    };
    if phase == "Unknown" || (node_vanished && matches!(phase, "Pending" | "Running")) {
        let message = node.map(|n| format!("node {n} stopped answering or was removed"));
        return failed(detail, FailureReason::NodeLost, None, message);
    }
    match (phase, state) {
        ("Succeeded", _) => {
            detail.phase = ReplicaPhase::Succeeded;
            detail.exit_code = Some(0);
            detail
        }
        (_, Some(ContainerState { terminated: Some(end), .. })) => {
            if end.exit_code == 0 {
                detail.phase = ReplicaPhase::Succeeded;
                detail.exit_code = Some(0);
                return detail;
            }
            let reason = if end.reason.as_deref() == Some("OOMKilled") {
                FailureReason::OomKilled
            } else {
                FailureReason::Error
            };
            let code = match end.reason.as_deref() {
                Some("StartError" | "ContainerCannotRun") => start_error_code(end.message.as_deref()),
                _ => None,
            };
            failed(detail, reason, Some(code.unwrap_or(end.exit_code)), end.message.clone())
        }
        ("Failed", _) => failed(detail, FailureReason::Lost, None, status.and_then(|s| s.message.clone())),
        (_, Some(ContainerState { running: Some(_), .. })) => {
            detail.phase = ReplicaPhase::Running;
            detail
        }
        (_, Some(ContainerState { waiting: Some(waiting), .. })) => {
            let reason = waiting.reason.as_deref().unwrap_or_default();
            let pulling_since = pod.metadata.creation_timestamp.as_ref().map(|t| t.0);
            let pull_failing = matches!(reason, "ImagePullBackOff" | "ErrImagePull");
            if reason == "InvalidImageName"
                || (pull_failing && waited_longer(pulling_since, ctx.now, ctx.patience.image_pull))
            {
                return failed(detail, FailureReason::ImagePullBackOff, None, waiting.message.clone());
            }
            // The attempt's Secret or ConfigMap is missing (a launch cut short): brief while a
            // launch is under way, a failure when it lasts.
            let config_missing = reason == "CreateContainerConfigError";
            if config_missing && waited_longer(pulling_since, ctx.now, ctx.patience.image_pull) {
                return failed(detail, FailureReason::Lost, None, waiting.message.clone());
            }
            detail.message = waiting.message.clone().or_else(|| (!reason.is_empty()).then(|| reason.to_string()));
            detail
        }
        _ => unscheduled(detail, conditions, ctx),
    }
}

/// The exit code a shell (and the local executor) gives a command that could not start, from
/// the runtime's words: 127 for a program that is not there, 126 for one that cannot be run.
/// The runtime itself says 128 for both, which would read as "killed by signal 0" and be
/// restarted; 127 and 126 are not (the same rule and hint as for a local replica).
fn start_error_code(message: Option<&str>) -> Option<i32> {
    let message = message?;
    if message.contains("executable file not found") || message.contains("no such file or directory") {
        Some(127)
    } else if message.contains("permission denied") {
        Some(126)
    } else {
        None
    }
}

/// A pod not placed yet: pending while the scheduler may still find room, failed after that.
fn unscheduled(mut detail: ReplicaDetail, conditions: &[PodCondition], ctx: &Context<'_>) -> ReplicaDetail {
    let Some(blocked) = conditions
        .iter()
        .find(|c| c.type_ == "PodScheduled" && c.status == "False" && c.reason.as_deref() == Some("Unschedulable"))
    else {
        return detail;
    };
    let since = blocked.last_transition_time.as_ref().map(|t| t.0);
    if waited_longer(since, ctx.now, ctx.patience.unschedulable) {
        return failed(detail, FailureReason::Unschedulable, None, blocked.message.clone());
    }
    detail.message = blocked.message.clone();
    detail
}

/// Eviction and node loss, as the pod's reason or its `DisruptionTarget` condition tells.
fn disruption(pod_reason: Option<&str>, conditions: &[PodCondition]) -> Option<FailureReason> {
    match pod_reason {
        Some("Evicted") => return Some(FailureReason::Evicted),
        Some("NodeLost") => return Some(FailureReason::NodeLost),
        _ => {}
    }
    let target = conditions.iter().find(|c| c.type_ == "DisruptionTarget" && c.status == "True")?;
    match target.reason.as_deref() {
        Some("DeletionByTaintManager" | "DeletionByPodGC") => Some(FailureReason::NodeLost),
        Some("EvictionByEvictionAPI" | "TerminationByKubelet") => Some(FailureReason::Evicted),
        // Preemption by a higher-priority pod is an eviction too, as far as the job can tell.
        Some("PreemptionByScheduler") => Some(FailureReason::Evicted),
        _ => None,
    }
}

fn terminated_code(state: Option<&ContainerState>) -> Option<i32> {
    state.and_then(|s| s.terminated.as_ref()).map(|t| t.exit_code)
}

fn waited_longer(since: Option<Timestamp>, now: Timestamp, patience: Duration) -> bool {
    let Some(since) = since else { return false };
    now.duration_since(since).unsigned_abs() > patience && now > since
}

fn failed(
    mut detail: ReplicaDetail,
    reason: FailureReason,
    exit_code: Option<i32>,
    message: Option<String>,
) -> ReplicaDetail {
    detail.phase = ReplicaPhase::Failed;
    detail.reason = Some(reason);
    detail.exit_code = exit_code;
    detail.message = message.or_else(|| Some(default_message(reason).to_string()));
    detail
}

fn default_message(reason: FailureReason) -> &'static str {
    match reason {
        FailureReason::OomKilled => "killed for using more memory than its limit",
        FailureReason::Evicted => "evicted from its node",
        FailureReason::ImagePullBackOff => "its image could not be pulled",
        FailureReason::Unschedulable => "no node could take it",
        FailureReason::NodeLost => "its node was lost",
        FailureReason::Error => "exited with an error",
        FailureReason::Lost => "vanished",
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;
    use trainyard_executor::ReplicaStatus;

    fn ctx(node_exists: Option<&dyn Fn(&str) -> bool>) -> Context<'_> {
        Context {
            now: Timestamp::now(),
            patience: Patience { unschedulable: Duration::from_secs(600), image_pull: Duration::from_secs(300) },
            node_exists,
        }
    }

    fn pod(status: serde_json::Value) -> Pod {
        serde_json::from_value(json!({
            "metadata": { "name": "p", "creationTimestamp": Timestamp::now().to_string() },
            "spec": { "nodeName": "gpu-1", "containers": [] },
            "status": status,
        }))
        .unwrap()
    }

    fn waiting(reason: &str) -> serde_json::Value {
        json!({ "phase": "Pending", "containerStatuses": [{ "name": "replica", "image": "i", "imageID": "", "ready": false,
            "restartCount": 0, "state": { "waiting": { "reason": reason } } }] })
    }

    #[test]
    fn a_pod_without_status_is_pending() {
        let detail = replica_from_pod(0, &pod(json!({})), &ctx(None));
        assert_eq!(detail.phase, ReplicaPhase::Pending);
        assert_eq!(detail.status(), ReplicaStatus::Running, "pending has not ended");
    }

    #[test]
    fn removal_by_the_taint_manager_or_pod_gc_is_node_loss() {
        for reason in ["DeletionByTaintManager", "DeletionByPodGC"] {
            let status = json!({ "phase": "Failed", "conditions": [{ "type": "DisruptionTarget", "status": "True", "reason": reason }] });
            let detail = replica_from_pod(1, &pod(status), &ctx(None));
            assert_eq!(detail.reason, Some(FailureReason::NodeLost), "{reason}");
            assert_eq!(detail.status(), ReplicaStatus::Lost);
        }
    }

    #[test]
    fn an_unknown_phase_or_a_vanished_node_is_node_loss() {
        assert_eq!(
            replica_from_pod(0, &pod(json!({ "phase": "Unknown" })), &ctx(None)).reason,
            Some(FailureReason::NodeLost)
        );
        let none = |_: &str| false;
        let detail = replica_from_pod(0, &pod(json!({ "phase": "Running" })), &ctx(Some(&none)));
        assert_eq!(detail.reason, Some(FailureReason::NodeLost));
        assert!(detail.message.unwrap().contains("gpu-1"));
    }

    #[test]
    fn an_invalid_image_name_fails_at_once_but_a_fresh_pull_backoff_waits() {
        assert_eq!(
            replica_from_pod(0, &pod(waiting("InvalidImageName")), &ctx(None)).reason,
            Some(FailureReason::ImagePullBackOff)
        );
        assert_eq!(replica_from_pod(0, &pod(waiting("ImagePullBackOff")), &ctx(None)).phase, ReplicaPhase::Pending);
        // Waiting for a Secret that is not there yet (the Job is applied before its Secret) is normal.
        assert_eq!(
            replica_from_pod(0, &pod(waiting("CreateContainerConfigError")), &ctx(None)).phase,
            ReplicaPhase::Pending
        );
    }

    #[test]
    fn a_missing_secret_that_lasts_fails_the_replica() {
        let mut stuck = pod(waiting("CreateContainerConfigError"));
        let long_ago = Timestamp::now() - k8s_openapi::jiff::SignedDuration::from_secs(3600);
        stuck.metadata.creation_timestamp = Some(k8s_openapi::apimachinery::pkg::apis::meta::v1::Time(long_ago));
        let detail = replica_from_pod(0, &stuck, &ctx(None));
        assert_eq!((detail.phase, detail.reason), (ReplicaPhase::Failed, Some(FailureReason::Lost)));
    }

    #[test]
    fn the_failure_sentence_names_replica_reason_code_and_message() {
        let detail = ReplicaDetail {
            rank: 1,
            phase: ReplicaPhase::Failed,
            exit_code: Some(137),
            reason: Some(FailureReason::OomKilled),
            message: Some("killed for using more memory than its limit".into()),
            image_digest: None,
            node: None,
        };
        assert_eq!(
            detail.failure_sentence().unwrap(),
            "replica 1 OOMKilled (exit 137): killed for using more memory than its limit"
        );
    }
}
