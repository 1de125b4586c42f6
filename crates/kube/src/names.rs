//! Deterministic names and the labels that tie every object back to its tenant, job and
//! attempt. The same job and attempt always give the same names, so that a repeated launch
//! applies to the objects that exist instead of creating new ones.

use std::collections::BTreeMap;

use uuid::Uuid;

/// On everything Trainyard creates; the watchers select on it.
pub const MANAGED_BY: (&str, &str) = ("app.kubernetes.io/managed-by", "trainyard");
pub const LABEL_TENANT: &str = "trainyard.dev/tenant";
pub const LABEL_JOB: &str = "trainyard.dev/job";
pub const LABEL_ATTEMPT: &str = "trainyard.dev/attempt";
pub const LABEL_VOLUME: &str = "trainyard.dev/volume";
/// The installation (its database's id) that made an attempt's objects.
pub const LABEL_INSTALLATION: &str = "trainyard.dev/installation";
/// The annotation (and, since Kubernetes 1.28, label) an Indexed Job puts on each pod.
pub const COMPLETION_INDEX: &str = "batch.kubernetes.io/job-completion-index";
/// The label selector of every watcher.
pub const MANAGED_SELECTOR: &str = "app.kubernetes.io/managed-by=trainyard";
/// The service account every replica runs as, one per tenant namespace.
pub const JOB_SERVICE_ACCOUNT: &str = "trainyard-job";
pub const GPU_RESOURCE: &str = "nvidia.com/gpu";

/// A tenant as its namespace needs it: the id for labels, the slug (its name) for the name.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TenantRef {
    pub id: Uuid,
    pub slug: String,
}

/// The longest name a namespace may have (a DNS label).
const MAX_NAMESPACE: usize = 63;

/// The tenant's namespace: `<prefix><tenant slug>`, e.g. `trainyard-vision-team`. Tenant names
/// are DNS labels already; when prefix and slug together are too long, the slug is cut and the
/// start of the tenant id keeps the name unique: `<prefix><cut slug>-<8 hex digits>`.
pub fn namespace(prefix: &str, slug: &str, tenant_id: Uuid) -> String {
    let name = format!("{prefix}{slug}");
    if name.len() <= MAX_NAMESPACE {
        return name;
    }
    let suffix = &tenant_id.simple().to_string()[..8];
    let room = MAX_NAMESPACE.saturating_sub(prefix.len() + 1 + suffix.len());
    let cut = slug[..room.min(slug.len())].trim_end_matches('-');
    format!("{prefix}{cut}-{suffix}")
}

/// The name of the Job, and of its Service, ConfigMap and Secret: `ty-<job id>-<attempt>`.
/// Starts with a letter (a Service name must) and stays under 63 characters with the
/// `-<index>` Kubernetes adds for each pod's hostname.
pub fn attempt_object(job_id: Uuid, attempt: i32) -> String {
    format!("ty-{job_id}-{attempt}")
}

/// Where replicas find a tenant's volume.
pub const VOLUMES_DIR: &str = "/volumes";

/// The PersistentVolumeClaim behind a tenant's volume: `vol-<name>`.
pub fn volume_claim(volume: &str) -> String {
    format!("vol-{volume}")
}

/// Replica 0's stable DNS name, the rendezvous address every replica is given.
pub fn master_addr(job_id: Uuid, attempt: i32, namespace: &str) -> String {
    let name = attempt_object(job_id, attempt);
    format!("{name}-0.{name}.{namespace}.svc")
}

/// Labels of the tenant's own objects (namespace, quota, policies).
pub fn tenant_labels(tenant_id: Uuid) -> BTreeMap<String, String> {
    BTreeMap::from([
        (MANAGED_BY.0.to_string(), MANAGED_BY.1.to_string()),
        (LABEL_TENANT.to_string(), tenant_id.to_string()),
    ])
}

/// Labels of everything that belongs to one attempt, pods included.
pub fn attempt_labels(tenant_id: Uuid, job_id: Uuid, attempt: i32) -> BTreeMap<String, String> {
    let mut labels = tenant_labels(tenant_id);
    labels.insert(LABEL_JOB.to_string(), job_id.to_string());
    labels.insert(LABEL_ATTEMPT.to_string(), attempt.to_string());
    labels
}

/// Whether an object is this installation's to delete: it carries `installation` as its label
/// (an installation without an id owns what carries none). An object made before
/// installations were labelled is no one's: finished, Kubernetes removes it after
/// `job_ttl_after_finished`.
pub fn made_by(labels: &BTreeMap<String, String>, installation: Option<&str>) -> bool {
    labels.get(LABEL_INSTALLATION).map(String::as_str) == installation
}

/// The job and attempt an object belongs to, read back from its labels (adoption).
pub fn attempt_of(labels: &BTreeMap<String, String>) -> Option<(Uuid, i32)> {
    let job = labels.get(LABEL_JOB)?.parse().ok()?;
    let attempt = labels.get(LABEL_ATTEMPT)?.parse().ok()?;
    Some((job, attempt))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_fit_dns_labels_even_for_large_attempts_and_ranks() {
        let job = Uuid::max();
        let pod_hostname = format!("{}-1023", attempt_object(job, 9999));
        assert!(pod_hostname.len() <= 63, "{pod_hostname}");
        let long_slug = "a".repeat(63);
        let ns = namespace("trainyard-", &long_slug, job);
        assert!(ns.len() <= 63 && ns.starts_with("trainyard-aaa") && ns.ends_with("-ffffffff"), "{ns}");
        assert_eq!(namespace("trainyard-", "vision-team", job), "trainyard-vision-team");
    }

    #[test]
    fn labels_round_trip_to_the_attempt() {
        let (tenant, job) = (Uuid::new_v4(), Uuid::new_v4());
        assert_eq!(attempt_of(&attempt_labels(tenant, job, 3)), Some((job, 3)));
        assert_eq!(attempt_of(&tenant_labels(tenant)), None);
    }
}
