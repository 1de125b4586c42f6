//! Launch requests for the built-in templates, rendered by hand as the server would render them
//! with typical parameters (rendering itself needs the server's template store).

#![allow(dead_code)]

use std::collections::BTreeMap;
use std::path::PathBuf;

use trainyard_core::job::{JobSpec, TemplateRef, VolumeMount};
use trainyard_core::resources::{Cpu, Memory, Resources};
use trainyard_executor::{LaunchRequest, QuotaCeiling};
use trainyard_kube::KubeConfig;
use uuid::Uuid;

pub const TENANT: Uuid = Uuid::from_u128(0x0199_0000_0000_7000_8000_0000_0000_00aa);
pub const JOB: Uuid = Uuid::from_u128(0x0199_0000_0000_7000_8000_0000_0000_0b01);
/// Stands for the uid the API server gives the Job, in the owner references of golden files.
pub const JOB_UID: &str = "<uid of the Job>";

pub fn config() -> KubeConfig {
    let mut config =
        KubeConfig::new("ghcr.io/trainyard/runtime:1.0.0", std::env::temp_dir().join("trainyard-kube-logs"));
    config.image_pull_policy = "IfNotPresent".into();
    config
}

pub fn ceiling() -> QuotaCeiling {
    QuotaCeiling { gpus: Some(32), cpu_millis: Some(256_000), memory_bytes: Some(2 << 40) }
}

pub fn workspace_root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../..")
}

fn secrets() -> BTreeMap<String, String> {
    BTreeMap::from([
        ("TRAINYARD_TOKEN".to_string(), "tyj_example-job-token".to_string()),
        ("TRAINYARD_URL".to_string(), "http://trainyard.trainyard-system.svc:8080".to_string()),
    ])
}

fn template(name: &str) -> Option<TemplateRef> {
    Some(TemplateRef { name: name.into(), version: "1.0.0".into(), digest: format!("sha256:{}", "0".repeat(64)) })
}

fn request(spec: JobSpec, files: BTreeMap<String, Vec<u8>>) -> LaunchRequest {
    LaunchRequest {
        job_id: JOB,
        tenant_id: TENANT,
        tenant: "vision-team".into(),
        attempt: 1,
        spec,
        files,
        env: secrets(),
        env_by_rank: Vec::new(),
        code: Vec::new(),
        nodes: Vec::new(),
    }
}

/// `templates/shell`: one CPU replica running a command of the user's.
pub fn shell() -> LaunchRequest {
    request(
        JobSpec {
            command: vec![
                "python3".into(),
                "-c".into(),
                "print('hello from rank', __import__('os').environ['RANK'])".into(),
            ],
            args: vec![],
            env: BTreeMap::from([("GREETING".to_string(), "hello".to_string())]),
            resources: Resources { cpu: Cpu(1000), memory: Memory(1 << 30), gpus: 0, gpu_type: None },
            replicas: 1,
            volumes: Vec::new(),
            code: None,
            time_limit_seconds: None,
            cache_wait_seconds: None,
            spare: false,
            template: template("shell"),
            image: None,
        },
        BTreeMap::new(),
    )
}

/// `templates/data-pack`: four CPU workers packing shards.
pub fn data_pack() -> LaunchRequest {
    let argv = [
        "yard-data",
        "pack",
        "/data/raw/imagenet",
        "/data/shards/imagenet",
        "--prefix",
        "data",
        "--shard-size",
        "256Mi",
        "--shard-samples",
        "100000",
        "--threads",
        "4",
        "--overwrite=false",
        "--workers-from-env",
        "--report",
    ];
    request(
        JobSpec {
            command: argv.iter().map(|s| s.to_string()).collect(),
            args: vec![],
            env: BTreeMap::new(),
            resources: Resources { cpu: Cpu(4000), memory: Memory(2 << 30), gpus: 0, gpu_type: None },
            replicas: 4,
            volumes: Vec::new(),
            code: None,
            time_limit_seconds: None,
            cache_wait_seconds: None,
            spare: false,
            template: template("data-pack"),
            image: None,
        },
        BTreeMap::new(),
    )
}

/// `templates/pytorch-ddp`: 2 replicas x 8 H100s, with the engine's files (their contents
/// elided here so that an engine change does not change the example), and the tenant's
/// `checkpoints` volume (the template's default) mounted for checkpoints that outlive the pods.
pub fn pytorch_ddp() -> LaunchRequest {
    let args = [
        "--data=/data/shards/imagenet",
        "--user-module=template/engine/example.py",
        "--user-repo=",
        "--user-commit=",
        "--epochs=3",
        "--max-steps=0",
        "--batch-size=64",
        "--lr=0.001",
        "--warmup-steps=20",
        "--precision=bf16",
        "--compile=false",
        "--grad-accum=1",
        "--seed=0",
        "--deterministic=false",
        "--checkpoint-every=50",
        "--output=checkpoints",
        "--checkpoint-volume=/volumes/checkpoints",
        "--keep-checkpoints=3",
        "--workers=2",
        "--prefetch=4",
    ];
    let files = ["engine/example.py", "engine/launch.py", "engine/shards.py", "engine/train.py"]
        .iter()
        .map(|path| {
            (path.to_string(), format!("# {path} of templates/pytorch-ddp (elided in this example)\n").into_bytes())
        })
        .collect();
    request(
        JobSpec {
            command: vec![
                "python3".into(),
                "template/engine/launch.py".into(),
                "8".into(),
                "template/engine/train.py".into(),
            ],
            args: args.iter().map(|s| s.to_string()).collect(),
            env: BTreeMap::new(),
            resources: Resources {
                cpu: Cpu(32_000),
                memory: Memory(256 << 30),
                gpus: 8,
                gpu_type: Some("nvidia-h100-80gb-hbm3".into()),
            },
            replicas: 2,
            volumes: vec![VolumeMount { name: "checkpoints".into(), path: "/volumes/checkpoints".into() }],
            code: None,
            time_limit_seconds: None,
            cache_wait_seconds: None,
            spare: false,
            template: template("pytorch-ddp"),
            image: None,
        },
        files,
    )
}

/// Every built-in template's example, by template name.
pub fn all() -> Vec<(&'static str, LaunchRequest)> {
    vec![("shell", shell()), ("data-pack", data_pack()), ("pytorch-ddp", pytorch_ddp())]
}

/// The documents a launch of `request` applies, in the order they are sent, as YAML values.
pub fn documents(config: &KubeConfig, request: &LaunchRequest, gpu_label: Option<&str>) -> Vec<serde_json::Value> {
    let tenant_ref = trainyard_kube::names::TenantRef { id: request.tenant_id, slug: request.tenant.clone() };
    let tenant = trainyard_kube::manifests::tenant_objects(config, &tenant_ref, Some(&ceiling()));
    let mut attempt = trainyard_kube::manifests::attempt_objects(config, request, gpu_label).expect("example builds");
    trainyard_kube::manifests::attempt_owned_by(&mut attempt, JOB_UID);
    let value = |v: serde_json::Result<serde_json::Value>| v.expect("serialises");
    vec![
        value(serde_json::to_value(&tenant.namespace)),
        value(serde_json::to_value(tenant.quota.as_ref().expect("ceiling given"))),
        value(serde_json::to_value(&tenant.limit_range)),
        value(serde_json::to_value(&tenant.network_policy)),
        value(serde_json::to_value(&tenant.service_account)),
        value(serde_json::to_value(&attempt.job)),
        value(serde_json::to_value(&attempt.service)),
        value(serde_json::to_value(&attempt.config_map)),
        value(serde_json::to_value(&attempt.secret)),
    ]
}

/// Multi-document YAML, as committed under docs/examples/.
pub fn to_yaml(header: &str, documents: &[serde_json::Value]) -> String {
    let mut out = String::from(header);
    for document in documents {
        out.push_str("---\n");
        out.push_str(&serde_yaml_ng::to_string(document).expect("yaml"));
    }
    out
}
