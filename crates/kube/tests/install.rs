//! Installing Trainyard on a cluster: the kustomize base `deploy/kubernetes` and its overlays under
//! `deploy/overlays/`, rendered by the real tool (`kubectl kustomize`, from the kubectl named by
//! `TRAINYARD_TEST_KUBECTL`, else the one on PATH; tests/run installs Debian's), every object
//! parsed into its k8s-openapi type and checked for what an operator would notice; and the Grafana
//! dashboard `deploy/grafana/trainyard.json` against the metrics the server exports.

mod support;

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::OnceLock;

use k8s_openapi::api::admissionregistration::v1::{ValidatingAdmissionPolicy, ValidatingAdmissionPolicyBinding};
use k8s_openapi::api::apps::v1::{DaemonSet, Deployment};
use k8s_openapi::api::core::v1::{ConfigMap, Namespace, PodSpec, Service, ServiceAccount};
use k8s_openapi::api::networking::v1::NetworkPolicy;
use k8s_openapi::api::policy::v1::PodDisruptionBudget;
use k8s_openapi::api::rbac::v1::{ClusterRole, ClusterRoleBinding, Role, RoleBinding};
use k8s_openapi::apimachinery::pkg::util::intstr::IntOrString;
use serde::de::DeserializeOwned;
use serde::{Deserialize, Serialize};
use serde_json::Value;
use support::examples::workspace_root;

/// The base, relative to the workspace root.
const BASE: &str = "deploy/kubernetes";
/// Where the overlays live (kustomize refuses a base folder that holds its own overlay).
const OVERLAYS: &str = "deploy/overlays";
/// Every overlay, and whether it has Prometheus scrape the server (a ServiceMonitor, which needs
/// the Prometheus Operator's CRDs: never in the base).
const OVERLAYS_WITH_SERVICE_MONITOR: &[(&str, bool)] = &[("production", true)];

/// Secrets the operator creates before installing (deploy/kubernetes/README.md, "Install"): the
/// install never holds a secret value. The database URL and the signing key are required; the
/// object store's credentials and the metrics token are optional.
const OPERATOR_SECRETS: &[&str] =
    &["trainyard-database", "trainyard-signing-key", "trainyard-object-store", "trainyard-metrics-token"];

/// The environment the server reads: the `env = "..."` of its settings (crates/server/src:
/// main.rs, cmd/cluster.rs, storage.rs, oidc.rs; `TRAINYARD_METRICS_TOKEN_FILE` for /metrics), the log filter,
/// and the S3 credentials the object store client takes from the environment (docs/storage.md).
/// A name outside this list in the ConfigMap or the Deployment is a typo the server ignores.
const SERVER_ENVIRONMENT: &[&str] = &[
    "TRAINYARD_DATABASE_URL",
    "TRAINYARD_OBJECT_STORE",
    "TRAINYARD_OBJECT_STORE_ENDPOINT",
    "TRAINYARD_SIGNING_KEY_FILE",
    "TRAINYARD_METRICS_TOKEN_FILE",
    "TRAINYARD_OIDC_ISSUER",
    "TRAINYARD_OIDC_CLIENT_ID",
    "TRAINYARD_OIDC_CLIENT_SECRET_FILE",
    "TRAINYARD_OIDC_REDIRECT_URL",
    "TRAINYARD_KUBE_CACHE_AGENT_URL",
    "RUST_LOG",
    "AWS_ACCESS_KEY_ID",
    "AWS_SECRET_ACCESS_KEY",
    "AWS_SESSION_TOKEN",
    "AWS_REGION",
];

/// The metrics the server exports on /metrics: the contract the dashboard is built on (and
/// alerting rules, elsewhere). docs/operations.md documents each, with its labels.
const METRICS: &[(&str, MetricType)] = &[
    ("trainyard_http_requests_total", MetricType::Counter),
    ("trainyard_http_request_duration_seconds", MetricType::Histogram),
    ("trainyard_jobs", MetricType::Gauge),
    ("trainyard_jobs_finished_total", MetricType::Counter),
    ("trainyard_pending_jobs", MetricType::Gauge),
    ("trainyard_admission_wait_time_seconds", MetricType::Histogram),
    ("trainyard_launch_time_seconds", MetricType::Histogram),
    ("trainyard_admission_cycle_duration_seconds", MetricType::Histogram),
    ("trainyard_admission_attempts_total", MetricType::Counter),
    ("trainyard_preempted_jobs_total", MetricType::Counter),
    ("trainyard_reconciler_pass_duration_seconds", MetricType::Histogram),
    ("trainyard_reconciler_last_success_timestamp_seconds", MetricType::Gauge),
    ("trainyard_leader", MetricType::Gauge),
    ("trainyard_quota_nominal_gpus", MetricType::Gauge),
    ("trainyard_quota_used_gpus", MetricType::Gauge),
    ("trainyard_quota_borrowed_gpus", MetricType::Gauge),
    ("trainyard_quota_lent_gpus", MetricType::Gauge),
    ("trainyard_executor_errors_total", MetricType::Counter),
    ("trainyard_log_archive_backlog", MetricType::Gauge),
    ("trainyard_input_stall_share", MetricType::Histogram),
    ("trainyard_gpu_hours_total", MetricType::Counter),
];

#[derive(Debug, Clone, Copy, PartialEq)]
enum MetricType {
    Counter,
    Gauge,
    Histogram,
}

// ---------------------------------------------------------------------------------------------
// Rendering

/// One rendering of the base or an overlay: its name ("base" or the overlay's folder) and objects.
struct Render {
    name: String,
    objects: Vec<Value>,
}

/// The base and every overlay, each rendered once for all the tests.
fn renders() -> &'static [Render] {
    static RENDERS: OnceLock<Vec<Render>> = OnceLock::new();
    RENDERS.get_or_init(|| {
        let mut renders = vec![Render { name: "base".into(), objects: kustomize(&workspace_root().join(BASE)) }];
        for (overlay, _) in OVERLAYS_WITH_SERVICE_MONITOR {
            let folder = workspace_root().join(OVERLAYS).join(overlay);
            renders.push(Render { name: (*overlay).into(), objects: kustomize(&folder) });
        }
        renders
    })
}

/// `kubectl kustomize <folder>`, split into its objects. Today's kustomize warns about the
/// deprecated fields kept for kubectl 1.20 on stderr; only stdout is the rendering.
fn kustomize(folder: &Path) -> Vec<Value> {
    let kubectl = std::env::var_os("TRAINYARD_TEST_KUBECTL").unwrap_or_else(|| "kubectl".into());
    let output = match Command::new(&kubectl).arg("kustomize").arg(folder).output() {
        Ok(output) => output,
        Err(err) => panic!(
            "cannot run {kubectl:?} ({err}): these tests render deploy/ with `kubectl kustomize`; \
             tests/run installs kubectl (tests/ensure-kubectl, Debian's kubernetes-client), or set \
             TRAINYARD_TEST_KUBECTL to a kubectl binary"
        ),
    };
    assert!(
        output.status.success(),
        "kubectl kustomize {} failed ({}):\n{}",
        folder.display(),
        output.status,
        String::from_utf8_lossy(&output.stderr)
    );
    yaml_documents(&String::from_utf8(output.stdout).expect("kustomize writes UTF-8"))
}

fn yaml_documents(text: &str) -> Vec<Value> {
    serde_yaml_ng::Deserializer::from_str(text)
        .map(|document| Value::deserialize(document).expect("valid YAML"))
        .filter(|document| !document.is_null())
        .collect()
}

fn read_yaml(path: &Path) -> Vec<Value> {
    let text = std::fs::read_to_string(path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    yaml_documents(&text)
}

/// "Kind namespace/name", as an operator would look an object up.
fn describe(object: &Value) -> String {
    let kind = object["kind"].as_str().unwrap_or("<no kind>");
    let name = object["metadata"]["name"].as_str().unwrap_or("<no name>");
    match object["metadata"]["namespace"].as_str() {
        Some(namespace) => format!("{kind} {namespace}/{name}"),
        None => format!("{kind} {name}"),
    }
}

// ---------------------------------------------------------------------------------------------
// Typed parsing

/// Parses `object` as `T` and checks that serializing it again gives the object back: k8s-openapi
/// ignores fields it does not know, so a misspelt or misplaced field shows up as one lost here.
fn parse_as<T: DeserializeOwned + Serialize>(object: &Value) -> Result<T, String> {
    let typed: T = serde_json::from_value(object.clone()).map_err(|e| e.to_string())?;
    let back = serde_json::to_value(&typed).map_err(|e| e.to_string())?;
    match first_difference(object, &back, "") {
        None => Ok(typed),
        Some(Difference::Gone(field)) => Err(format!("`{field}` is not a field of its type (misspelt or misplaced)")),
        Some(difference) => Err(format!("{difference} in the round trip through its type")),
    }
}

/// Where two documents first differ.
enum Difference {
    /// A field of the first that the second lacks.
    Gone(String),
    /// A field of the second that the first lacks.
    Added(String),
    /// A value that is not the same.
    Changed { path: String, from: Value, to: Value },
}

impl std::fmt::Display for Difference {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Difference::Gone(field) => write!(f, "`{field}` was lost"),
            Difference::Added(field) => write!(f, "`{field}` was added"),
            Difference::Changed { path, from, to } => write!(f, "`{path}` changed from {from} to {to}"),
        }
    }
}

/// Where `first` and `second` first differ, by field path; a null is the same as a field left out.
fn first_difference(first: &Value, second: &Value, path: &str) -> Option<Difference> {
    let field = |key: &str| if path.is_empty() { key.to_string() } else { format!("{path}.{key}") };
    match (first, second) {
        (Value::Object(first), Value::Object(second)) => {
            for (key, value) in first {
                match second.get(key) {
                    None if value.is_null() => {}
                    None => return Some(Difference::Gone(field(key))),
                    Some(other) => {
                        if let Some(difference) = first_difference(value, other, &field(key)) {
                            return Some(difference);
                        }
                    }
                }
            }
            let added = second.iter().find(|(key, value)| !first.contains_key(*key) && !value.is_null());
            added.map(|(key, _)| Difference::Added(field(key)))
        }
        (Value::Array(first), Value::Array(second)) if first.len() == second.len() => {
            first.iter().zip(second).enumerate().find_map(|(i, (a, b))| first_difference(a, b, &format!("{path}[{i}]")))
        }
        _ if first == second => None,
        _ => Some(Difference::Changed { path: path.to_string(), from: first.clone(), to: second.clone() }),
    }
}

/// Checks one rendered object: its kind's type, or for the ServiceMonitor (no k8s-openapi type)
/// its fields one by one.
fn check_object(object: &Value) -> Result<(), String> {
    fn typed<T: DeserializeOwned + Serialize>(object: &Value) -> Result<(), String> {
        parse_as::<T>(object).map(drop)
    }
    match object["kind"].as_str().unwrap_or_default() {
        "Namespace" => typed::<Namespace>(object),
        "ServiceAccount" => typed::<ServiceAccount>(object),
        "ClusterRole" => typed::<ClusterRole>(object),
        "ClusterRoleBinding" => typed::<ClusterRoleBinding>(object),
        "Role" => typed::<Role>(object),
        "RoleBinding" => typed::<RoleBinding>(object),
        "Deployment" => typed::<Deployment>(object),
        "DaemonSet" => typed::<DaemonSet>(object),
        "NetworkPolicy" => typed::<NetworkPolicy>(object),
        "Service" => typed::<Service>(object),
        "ConfigMap" => typed::<ConfigMap>(object),
        "PodDisruptionBudget" => typed::<PodDisruptionBudget>(object),
        "ValidatingAdmissionPolicy" => typed::<ValidatingAdmissionPolicy>(object),
        "ValidatingAdmissionPolicyBinding" => typed::<ValidatingAdmissionPolicyBinding>(object),
        "ServiceMonitor" => check_service_monitor_fields(object),
        "Secret" => Err("a Secret: secret values are the operator's to create (README.md), never in deploy/".into()),
        other => Err(format!("unexpected kind {other:?}: add its k8s-openapi type to this test")),
    }
}

/// The ServiceMonitor's fields that this install uses, each where the Prometheus Operator's CRD
/// (monitoring.coreos.com/v1) has it; anything else is a typo the operator would silently ignore.
fn check_service_monitor_fields(object: &Value) -> Result<(), String> {
    let allowed = |value: &Value, path: &str, fields: &[&str]| -> Result<(), String> {
        let map = value.as_object().ok_or(format!("`{path}` is not an object"))?;
        match map.keys().find(|key| !fields.contains(&key.as_str())) {
            Some(key) => Err(format!("`{path}.{key}` is not a ServiceMonitor field this install expects")),
            None => Ok(()),
        }
    };
    if object["apiVersion"] != "monitoring.coreos.com/v1" {
        return Err(format!("apiVersion {} (expected monitoring.coreos.com/v1)", object["apiVersion"]));
    }
    allowed(object, "", &["apiVersion", "kind", "metadata", "spec"])?;
    allowed(&object["metadata"], "metadata", &["name", "namespace", "labels", "annotations"])?;
    let spec = &object["spec"];
    allowed(spec, "spec", &["selector", "namespaceSelector", "endpoints", "jobLabel"])?;
    allowed(&spec["selector"], "spec.selector", &["matchLabels"])?;
    allowed(&spec["namespaceSelector"], "spec.namespaceSelector", &["matchNames"])?;
    let endpoints = spec["endpoints"].as_array().ok_or("`spec.endpoints` is not a list")?;
    for (i, endpoint) in endpoints.iter().enumerate() {
        let path = format!("spec.endpoints[{i}]");
        allowed(endpoint, &path, &["port", "path", "interval", "scrapeTimeout", "scheme", "authorization"])?;
        allowed(&endpoint["authorization"], &format!("{path}.authorization"), &["type", "credentials"])?;
        allowed(
            &endpoint["authorization"]["credentials"],
            &format!("{path}.authorization.credentials"),
            &["name", "key"],
        )?;
    }
    Ok(())
}

/// The one object of `kind` (there must be exactly one), parsed.
fn the_one<T: DeserializeOwned + Serialize>(render: &Render, kind: &str) -> T {
    let mut found = render.objects.iter().filter(|object| object["kind"] == kind);
    let object = found.next().unwrap_or_else(|| panic!("{}: no {kind} rendered", render.name));
    assert!(found.next().is_none(), "{}: more than one {kind}", render.name);
    parse_as(object).unwrap_or_else(|e| panic!("{}: {}: {e}", render.name, describe(object)))
}

fn named<'a>(render: &'a Render, kind: &str, name: &str) -> Option<&'a Value> {
    render.objects.iter().find(|object| object["kind"] == kind && object["metadata"]["name"] == name)
}

fn pod_spec(deployment: &Deployment) -> &PodSpec {
    deployment.spec.as_ref().and_then(|spec| spec.template.spec.as_ref()).expect("a pod template")
}

// ---------------------------------------------------------------------------------------------
// The install

#[test]
fn every_rendered_object_is_the_kubernetes_type_its_kind_claims() {
    for render in renders() {
        assert!(!render.objects.is_empty(), "{}: nothing rendered", render.name);
        for object in &render.objects {
            if let Err(err) = check_object(object) {
                panic!("{}: {}: {err}", render.name, describe(object));
            }
        }
    }
}

#[test]
fn a_misspelt_field_fails_naming_kind_object_and_field() {
    let base = &renders()[0];
    let mut object = named(base, "Deployment", "trainyard").expect("the Deployment").clone();
    let probe = &mut object["spec"]["template"]["spec"]["containers"][0]["readinessProbe"]["httpGet"];
    let path = probe.as_object_mut().unwrap().remove("path").unwrap();
    probe["pth"] = path;
    let err = check_object(&object).expect_err("a misspelt field is caught");
    assert!(err.contains("spec.template.spec.containers[0].readinessProbe.httpGet.pth"), "{err}");
    assert_eq!(describe(&object), "Deployment trainyard-system/trainyard");
}

/// `kubectl apply -k deploy/kubernetes` installs exactly what `kubectl apply -f` of its files
/// does: the base adds nothing, loses nothing, and every manifest in the folder is in it.
#[test]
fn the_base_renders_exactly_the_objects_of_its_files() {
    let folder = workspace_root().join(BASE);
    let kustomization: Value = read_yaml(&folder.join("kustomization.yaml")).remove(0);
    let resources: Vec<&str> =
        kustomization["resources"].as_array().expect("resources").iter().map(|r| r.as_str().unwrap()).collect();
    let mut on_disk: Vec<String> = std::fs::read_dir(&folder)
        .unwrap()
        .map(|entry| entry.unwrap().file_name().into_string().unwrap())
        .filter(|name| name.ends_with(".yaml") && name != "kustomization.yaml")
        .collect();
    on_disk.sort();
    let mut listed: Vec<String> = resources.iter().map(|r| r.to_string()).collect();
    listed.sort();
    assert_eq!(listed, on_disk, "the base's resources are the manifests in {BASE}");

    let key = |object: &Value| describe(object);
    let from_files: BTreeMap<String, Value> =
        resources.iter().flat_map(|file| read_yaml(&folder.join(file))).map(|o| (key(&o), o)).collect();
    let rendered: BTreeMap<String, Value> = renders()[0].objects.iter().map(|o| (key(o), o.clone())).collect();
    assert_eq!(
        rendered.keys().collect::<Vec<_>>(),
        from_files.keys().collect::<Vec<_>>(),
        "the base renders the files' objects"
    );
    for (name, object) in &from_files {
        if let Some(difference) = first_difference(object, &rendered[name], "") {
            panic!("{name}: {difference} by kustomize");
        }
    }
}

#[test]
fn the_server_runs_two_ready_non_root_replicas_under_its_service_account() {
    for render in renders() {
        let deployment: Deployment = the_one(render, "Deployment");
        let spec = deployment.spec.as_ref().unwrap();
        assert_eq!(spec.replicas, Some(2), "{}: two replicas", render.name);
        let rolling = spec.strategy.as_ref().and_then(|s| s.rolling_update.as_ref()).expect("a rolling update");
        assert_eq!(rolling.max_unavailable, Some(IntOrString::Int(0)), "{}: an update never drops one", render.name);

        let pod = pod_spec(&deployment);
        let security = pod.security_context.as_ref().expect("a pod security context");
        assert_eq!(security.run_as_non_root, Some(true), "{}: runs as non-root", render.name);
        assert_ne!(security.run_as_user, Some(0), "{}: not as root", render.name);
        let container = pod.containers.iter().find(|c| c.name == "trainyard").expect("the trainyard container");
        let ports: Vec<_> = container.ports.iter().flatten().filter_map(|p| p.name.as_deref()).collect();
        assert!(ports.contains(&"http"), "{}: a container port named http: {ports:?}", render.name);
        let ready = container.readiness_probe.as_ref().and_then(|p| p.http_get.as_ref()).expect("readiness probe");
        assert_eq!(ready.path.as_deref(), Some("/readyz"), "{}: readiness on /readyz", render.name);
        assert_eq!(ready.port, IntOrString::String("http".into()), "{}: readiness on port http", render.name);

        // The service account it runs as is rendered, bound to the ClusterRole, and the one the
        // admission policy confines.
        let account = pod.service_account_name.as_deref().expect("a service account");
        let namespace = deployment.metadata.namespace.as_deref().expect("a namespace");
        let sa = named(render, "ServiceAccount", account).unwrap_or_else(|| panic!("no ServiceAccount {account}"));
        assert_eq!(sa["metadata"]["namespace"], namespace, "{}: the service account's namespace", render.name);
        let binding: ClusterRoleBinding = the_one(render, "ClusterRoleBinding");
        assert!(
            binding
                .subjects
                .iter()
                .flatten()
                .any(|s| s.kind == "ServiceAccount" && s.name == account && s.namespace.as_deref() == Some(namespace)),
            "{}: the ClusterRoleBinding grants {namespace}/{account}",
            render.name
        );
        let policy = named(render, "ValidatingAdmissionPolicy", "trainyard-managed-namespaces-only").expect("policy");
        let username = format!("system:serviceaccount:{namespace}:{account}");
        assert!(policy.to_string().contains(&username), "{}: the policy confines {username}", render.name);

        // The Service and the disruption budget select these pods; a drain can still proceed.
        let labels = deployment.spec.as_ref().unwrap().template.metadata.as_ref().unwrap().labels.clone().unwrap();
        let service: Service = parse_as(named(render, "Service", "trainyard").expect("the server's Service")).unwrap();
        let service_spec = service.spec.as_ref().unwrap();
        let selector = service_spec.selector.as_ref().expect("a selector");
        assert!(
            selector.iter().all(|(k, v)| labels.get(k) == Some(v)),
            "{}: the Service selects the pods",
            render.name
        );
        let http = service_spec.ports.iter().flatten().find(|p| p.name.as_deref() == Some("http")).expect("port http");
        assert_eq!(
            (http.port, http.target_port.clone()),
            (8080, Some(IntOrString::String("http".into()))),
            "{}: the Service's port http is 8080, to the container's port http",
            render.name
        );
        let budget: PodDisruptionBudget = the_one(render, "PodDisruptionBudget");
        let budget = budget.spec.unwrap();
        let budget_selector = budget.selector.and_then(|s| s.match_labels).expect("the budget selects by labels");
        assert!(budget_selector.iter().all(|(k, v)| labels.get(k) == Some(v)), "{}: the budget's pods", render.name);
        assert_eq!(budget.min_available, Some(IntOrString::Int(1)), "{}: one stays through a drain", render.name);
    }
}

#[test]
fn every_setting_and_secret_the_server_reads_is_installed_or_created_by_the_operator() {
    let readme = std::fs::read_to_string(workspace_root().join(BASE).join("README.md")).unwrap();
    for secret in OPERATOR_SECRETS {
        assert!(
            readme.contains(&format!("create secret generic {secret}")),
            "README.md tells the operator how to create the Secret {secret}"
        );
    }
    for render in renders() {
        let deployment: Deployment = the_one(render, "Deployment");
        let pod = pod_spec(&deployment);
        let container = &pod.containers[0];
        let config_map = |name: &str| -> ConfigMap {
            let object = named(render, "ConfigMap", name)
                .unwrap_or_else(|| panic!("{}: the ConfigMap {name} is not rendered", render.name));
            parse_as(object).unwrap()
        };
        let operator_secret = |name: &str| {
            assert!(
                OPERATOR_SECRETS.contains(&name),
                "{}: the Secret {name} is neither rendered nor one the operator creates (README.md)",
                render.name
            )
        };
        let mut environment: Vec<String> = Vec::new();
        for source in container.env_from.iter().flatten() {
            if let Some(reference) = &source.config_map_ref {
                let data = config_map(&reference.name).data.unwrap_or_default();
                environment.extend(data.keys().cloned());
            }
            if let Some(reference) = &source.secret_ref {
                operator_secret(&reference.name);
            }
        }
        for variable in container.env.iter().flatten() {
            environment.push(variable.name.clone());
            let Some(from) = &variable.value_from else { continue };
            if let Some(reference) = &from.config_map_key_ref {
                let data = config_map(&reference.name).data.unwrap_or_default();
                assert!(
                    data.contains_key(&reference.key),
                    "{}: {} has no key {}",
                    render.name,
                    reference.name,
                    reference.key
                );
            }
            if let Some(reference) = &from.secret_key_ref {
                operator_secret(&reference.name);
            }
        }
        for volume in pod.volumes.iter().flatten() {
            if let Some(secret) = &volume.secret {
                operator_secret(secret.secret_name.as_deref().unwrap_or_default());
            }
            if let Some(reference) = &volume.config_map {
                config_map(&reference.name);
            }
        }
        for name in &environment {
            assert!(
                SERVER_ENVIRONMENT.contains(&name.as_str()),
                "{}: the server reads no environment variable {name}",
                render.name
            );
        }
        // A setting that names a file names one inside a mounted volume.
        let mounts: Vec<&str> =
            container.volume_mounts.iter().flatten().map(|mount| mount.mount_path.as_str()).collect();
        for variable in container.env.iter().flatten().filter(|v| v.name.ends_with("_FILE")) {
            let path = variable.value.as_deref().expect("a file path");
            assert!(
                mounts.iter().any(|mount| path.starts_with(&format!("{mount}/"))),
                "{}: {} = {path} is in none of the mounts {mounts:?}",
                render.name,
                variable.name
            );
        }
        assert!(
            environment.iter().any(|name| name == "TRAINYARD_METRICS_TOKEN_FILE"),
            "{}: the metrics token",
            render.name
        );
    }
}

/// The volume mounted where `TRAINYARD_METRICS_TOKEN_FILE` points: its Secret's name and the key
/// (the file's name in it).
fn metrics_token_secret(deployment: &Deployment) -> (String, String) {
    let pod = pod_spec(deployment);
    let container = &pod.containers[0];
    let variable = container.env.iter().flatten().find(|v| v.name == "TRAINYARD_METRICS_TOKEN_FILE").unwrap();
    let path = Path::new(variable.value.as_deref().unwrap());
    let mount = container.volume_mounts.iter().flatten().find(|m| path.parent() == Some(Path::new(&m.mount_path)));
    let mount = mount.expect("the token's folder is a mount");
    let volume = pod.volumes.iter().flatten().find(|v| v.name == mount.name).expect("the mount's volume");
    let secret = volume.secret.as_ref().expect("a Secret volume");
    assert_eq!(secret.optional, Some(true), "the metrics token is optional: without it, no scraping");
    let key = path.file_name().unwrap().to_str().unwrap().to_string();
    (secret.secret_name.clone().unwrap(), key)
}

#[test]
fn only_the_overlays_meant_to_have_prometheus_scrape_metrics_with_the_token() {
    let mut overlays: Vec<String> = std::fs::read_dir(workspace_root().join(OVERLAYS))
        .unwrap()
        .map(|entry| entry.unwrap().file_name().into_string().unwrap())
        .collect();
    overlays.sort();
    let known: Vec<&str> = OVERLAYS_WITH_SERVICE_MONITOR.iter().map(|(name, _)| *name).collect();
    assert_eq!(overlays, known, "every overlay is rendered by this test (OVERLAYS_WITH_SERVICE_MONITOR)");

    for render in renders() {
        let monitors: Vec<&Value> = render.objects.iter().filter(|o| o["kind"] == "ServiceMonitor").collect();
        let wanted = OVERLAYS_WITH_SERVICE_MONITOR.iter().any(|(name, with)| *with && render.name == *name);
        if !wanted {
            assert!(monitors.is_empty(), "{}: a ServiceMonitor needs the Prometheus Operator: not here", render.name);
            continue;
        }
        assert_eq!(monitors.len(), 1, "{}: one ServiceMonitor", render.name);
        let monitor = monitors[0];
        let service: Service = parse_as(named(render, "Service", "trainyard").expect("the server's Service")).unwrap();
        let service_labels = service.metadata.labels.clone().unwrap_or_default();
        let selector = monitor["spec"]["selector"]["matchLabels"].as_object().expect("matchLabels");
        assert!(
            selector.iter().all(|(k, v)| service_labels.get(k).map(String::as_str) == v.as_str()),
            "{}: the ServiceMonitor selects the Service by its labels",
            render.name
        );
        let namespace = service.metadata.namespace.clone().unwrap();
        assert_eq!(monitor["metadata"]["namespace"], namespace, "{}: next to the Service", render.name);
        assert_eq!(monitor["spec"]["namespaceSelector"]["matchNames"], serde_json::json!([namespace]));

        let endpoints = monitor["spec"]["endpoints"].as_array().unwrap();
        assert_eq!(endpoints.len(), 1, "{}: one endpoint", render.name);
        let endpoint = &endpoints[0];
        let port_names: Vec<_> =
            service.spec.as_ref().unwrap().ports.iter().flatten().filter_map(|p| p.name.clone()).collect();
        let port = endpoint["port"].as_str().expect("a named port");
        assert!(port_names.iter().any(|p| p == port), "{}: port {port} is on the Service: {port_names:?}", render.name);
        assert_eq!(endpoint["path"], "/metrics");
        assert_eq!(endpoint["interval"], "30s");
        assert_eq!(endpoint["authorization"]["type"], "Bearer");
        // Prometheus presents the very token the server reads.
        let (secret, key) = metrics_token_secret(&the_one(render, "Deployment"));
        assert_eq!(endpoint["authorization"]["credentials"], serde_json::json!({ "name": secret, "key": key }));
        assert_eq!((secret.as_str(), key.as_str()), ("trainyard-metrics-token", "token"));
    }
}

/// What an overlay's kustomization says it changes is what renders, with either kustomize.
#[test]
fn each_overlay_pins_its_images_and_its_patches_take() {
    for render in renders().iter().skip(1) {
        let folder = workspace_root().join(OVERLAYS).join(&render.name);
        let kustomization = read_yaml(&folder.join("kustomization.yaml")).remove(0);
        let deployment: Deployment = the_one(render, "Deployment");
        let images: Vec<String> =
            pod_spec(&deployment).containers.iter().map(|c| c.image.clone().unwrap_or_default()).collect();
        for pin in kustomization["images"].as_array().into_iter().flatten() {
            let name = pin["name"].as_str().unwrap();
            let expected = match (pin["digest"].as_str(), pin["newTag"].as_str()) {
                (Some(digest), _) => format!("{name}@{digest}"),
                (None, Some(tag)) => format!("{name}:{tag}"),
                (None, None) => panic!("{}: image {name} pinned to nothing", render.name),
            };
            assert!(images.contains(&expected), "{}: runs {expected}: {images:?}", render.name);
        }
        let patches = kustomization["patchesStrategicMerge"].as_array().cloned().unwrap_or_default();
        for patch in patches.iter().flat_map(|file| read_yaml(&folder.join(file.as_str().unwrap()))) {
            if patch["kind"] != "ConfigMap" {
                continue;
            }
            let name = patch["metadata"]["name"].as_str().unwrap();
            let rendered = named(render, "ConfigMap", name).expect("the patched ConfigMap");
            for (key, value) in patch["data"].as_object().into_iter().flatten() {
                assert_eq!(&rendered["data"][key], value, "{}: {name} {key} as the patch says", render.name);
            }
        }
    }
}

/// The node cache agent (deploy/kubernetes/cache-agent), alone and in the overlays that install
/// it: on every node, its hostPath only in a namespace of its own that allows it (tenant
/// namespaces stay "restricted"), reached node-locally, pointed at the server as rendered, and
/// the server pointed at it.
#[test]
fn the_cache_agent_runs_on_every_node_in_its_own_namespace_and_the_server_and_agent_find_each_other() {
    let alone =
        Render { name: "cache-agent".into(), objects: kustomize(&workspace_root().join(BASE).join("cache-agent")) };
    let mut installed = 0;
    for render in std::iter::once(&alone).chain(renders()) {
        let Some(daemon_set) = named(render, "DaemonSet", "trainyard-cache-agent") else { continue };
        installed += 1;
        let daemon_set: DaemonSet = parse_as(daemon_set).unwrap();
        let namespace = daemon_set.metadata.namespace.clone().unwrap();
        let ns: Namespace = parse_as(named(render, "Namespace", &namespace).expect("its namespace")).unwrap();
        let labels = ns.metadata.labels.unwrap_or_default();
        assert_eq!(labels.get("pod-security.kubernetes.io/enforce").map(String::as_str), Some("privileged"));
        let pod = daemon_set.spec.as_ref().unwrap().template.spec.as_ref().unwrap();
        assert!(
            pod.tolerations.iter().flatten().any(|t| t.operator.as_deref() == Some("Exists") && t.key.is_none()),
            "{}: on GPU nodes too, whatever their taints",
            render.name
        );
        let host_paths: Vec<&str> =
            pod.volumes.iter().flatten().filter_map(|v| v.host_path.as_ref()).map(|h| h.path.as_str()).collect();
        assert_eq!(host_paths, ["/var/lib/trainyard/shard-cache"], "{}", render.name);
        let container = &pod.containers[0];
        let security = container.security_context.as_ref().unwrap();
        assert_eq!(security.allow_privilege_escalation, Some(false), "{}", render.name);
        assert_eq!(security.read_only_root_filesystem, Some(true), "{}", render.name);
        assert_eq!(security.capabilities.as_ref().unwrap().drop.as_deref(), Some(&["ALL".to_string()][..]));
        // Only the agent's namespace holds a hostPath: nothing else rendered asks for one.
        for object in &render.objects {
            if object["metadata"]["namespace"] != namespace.as_str() {
                assert!(!object.to_string().contains("hostPath"), "{}: {}", render.name, describe(object));
            }
        }
        let service: Service =
            parse_as(named(render, "Service", "trainyard-cache-agent").expect("its Service")).unwrap();
        let spec = service.spec.unwrap();
        assert_eq!(
            spec.internal_traffic_policy.as_deref(),
            Some("Local"),
            "{}: each pod its own node's agent",
            render.name
        );
        let port = spec.ports.unwrap()[0].port;
        let agent_url = format!("http://trainyard-cache-agent.{namespace}.svc:{port}");
        let server_url =
            container.env.iter().flatten().find(|v| v.name == "TRAINYARD_URL").and_then(|v| v.value.clone());
        if render.name == "cache-agent" {
            assert_eq!(server_url.as_deref(), Some("http://trainyard.trainyard-system.svc:8080"));
            continue;
        }
        // Installed with the server: each names the other as rendered.
        let server: Service = parse_as(named(render, "Service", "trainyard").expect("the server's Service")).unwrap();
        let server_port = server.spec.unwrap().ports.unwrap()[0].port;
        let server_namespace = server.metadata.namespace.unwrap();
        assert_eq!(
            server_url,
            Some(format!("http://trainyard.{server_namespace}.svc:{server_port}")),
            "{}",
            render.name
        );
        let settings: ConfigMap = parse_as(named(render, "ConfigMap", "trainyard-settings").unwrap()).unwrap();
        assert_eq!(
            settings.data.unwrap_or_default().get("TRAINYARD_KUBE_CACHE_AGENT_URL"),
            Some(&agent_url),
            "{}: the server gives pods the agent's URL",
            render.name
        );
        let deployment: Deployment = the_one(render, "Deployment");
        assert_eq!(container.image, pod_spec(&deployment).containers[0].image, "{}: the server's image", render.name);
    }
    assert!(installed >= 2, "the agent alone and in the production overlay: {installed}");
}

// ---------------------------------------------------------------------------------------------
// The Grafana dashboard

fn dashboard() -> Value {
    let path: PathBuf = workspace_root().join("deploy/grafana/trainyard.json");
    serde_json::from_str(&std::fs::read_to_string(&path).unwrap()).expect("the dashboard is JSON")
}

/// Every panel that shows data (not the rows), with those inside collapsed rows.
fn data_panels(dashboard: &Value) -> Vec<&Value> {
    let mut panels = Vec::new();
    for panel in dashboard["panels"].as_array().expect("panels") {
        if panel["type"] == "row" {
            panels.extend(panel["panels"].as_array().into_iter().flatten());
        } else {
            panels.push(panel);
        }
    }
    panels
}

/// The `trainyard_*` series an expression reads, each with the text before it.
fn series_in(expr: &str) -> Vec<(&str, &str)> {
    let mut found = Vec::new();
    let mut from = 0;
    while let Some(at) = expr[from..].find("trainyard_").map(|i| i + from) {
        let end = expr[at..].find(|c: char| !(c.is_ascii_lowercase() || c == '_')).map_or(expr.len(), |i| i + at);
        let whole_word = !expr[..at].ends_with(|c: char| c.is_ascii_alphanumeric() || c == '_');
        if whole_word {
            found.push((&expr[at..end], &expr[..at]));
        }
        from = end;
    }
    found
}

#[test]
fn the_dashboard_reads_only_the_metrics_the_server_exports_and_each_the_right_way() {
    let dashboard = dashboard();
    let contract: BTreeMap<&str, MetricType> = METRICS.iter().copied().collect();
    let mut used = BTreeSet::new();
    for panel in data_panels(&dashboard) {
        let title = panel["title"].as_str().unwrap_or_default();
        for target in panel["targets"].as_array().into_iter().flatten() {
            let expr = target["expr"].as_str().unwrap_or_default();
            for (series, before) in series_in(expr) {
                let (metric, part) = ["_bucket", "_sum", "_count"]
                    .iter()
                    .find_map(|suffix| {
                        series.strip_suffix(suffix).filter(|m| contract.contains_key(m)).map(|m| (m, *suffix))
                    })
                    .unwrap_or((series, ""));
                let Some(kind) = contract.get(metric) else {
                    panic!("panel {title:?}: {series} is not a metric the server exports (METRICS)");
                };
                used.insert(metric);
                let through_rate = before.ends_with("rate(") || before.ends_with("increase(");
                match kind {
                    MetricType::Histogram => {
                        assert!(
                            !part.is_empty(),
                            "panel {title:?}: {metric} is a histogram: read _bucket, _sum or _count"
                        );
                        assert!(through_rate, "panel {title:?}: {series} through rate() or increase(): {expr}");
                        if part == "_bucket" {
                            assert!(
                                expr.contains("histogram_quantile(") && expr.contains("by (le"),
                                "panel {title:?}: a quantile sums the buckets by le: {expr}"
                            );
                        }
                    }
                    MetricType::Counter => {
                        assert!(
                            through_rate,
                            "panel {title:?}: the counter {metric} through rate() or increase(): {expr}"
                        )
                    }
                    MetricType::Gauge => {
                        assert!(!through_rate, "panel {title:?}: {metric} is a gauge, not a counter: {expr}")
                    }
                }
            }
        }
    }
    let unused: Vec<_> = contract.keys().filter(|metric| !used.contains(*metric)).collect();
    assert!(unused.is_empty(), "metrics on no panel of the dashboard: {unused:?}");
}

#[test]
fn every_dashboard_panel_queries_the_chosen_prometheus_and_tenants() {
    let dashboard = dashboard();
    assert!(dashboard["schemaVersion"].as_u64().unwrap_or(0) >= 36, "a current Grafana schema");
    let variables = dashboard["templating"]["list"].as_array().expect("template variables");
    let variable = |name: &str| variables.iter().find(|v| v["name"] == name).unwrap_or_else(|| panic!("no ${name}"));
    assert_eq!(variable("DS_PROMETHEUS")["type"], "datasource");
    assert_eq!(variable("DS_PROMETHEUS")["query"], "prometheus");
    assert_eq!(variable("tenant")["query"]["query"], "label_values(trainyard_jobs, tenant)");
    let datasource = serde_json::json!({ "type": "prometheus", "uid": "${DS_PROMETHEUS}" });

    let panels = data_panels(&dashboard);
    assert!(panels.len() >= 15, "a panel for each part of the control plane: {}", panels.len());
    let mut ids = BTreeSet::new();
    for panel in panels {
        let title = panel["title"].as_str().unwrap_or_default();
        assert!(!title.is_empty(), "every panel has a title");
        assert!(ids.insert(panel["id"].as_u64().expect("an id")), "panel ids are unique: {title:?}");
        assert_eq!(panel["datasource"], datasource, "panel {title:?}: the chosen Prometheus");
        let targets = panel["targets"].as_array().filter(|t| !t.is_empty());
        for target in targets.unwrap_or_else(|| panic!("panel {title:?} has no query")) {
            let expr = target["expr"].as_str().unwrap_or_default();
            assert!(!expr.trim().is_empty(), "panel {title:?}: an empty query");
            assert_eq!(target["datasource"], datasource, "panel {title:?}: the chosen Prometheus");
            let balanced = expr.chars().fold(0i32, |depth, c| match c {
                '(' => depth + 1,
                ')' => depth - 1,
                _ => depth,
            });
            assert_eq!(balanced, 0, "panel {title:?}: unbalanced parentheses: {expr}");
            if expr.contains("tenant") && !expr.contains("tenant=~\"$tenant\"") {
                panic!("panel {title:?}: shows tenants but ignores the $tenant choice: {expr}");
            }
        }
    }
}
