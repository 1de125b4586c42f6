//! What the server's part of a run record costs, side by side in one run with the in-process
//! work of a submit: a pytorch-ddp job's record built from its real template files (each file
//! hashed, the spec hashed) and encoded as the JSON stored at launch, and its hash (what `yard
//! jobs show --record` and the compare page read), against a submit's own checks (validating a
//! submission and hashing the request, as `App::job_submit` does before its insert). The
//! database statement that stores the record is measured with the launches
//! (`tests/bench/kube_launch.sh`, docs/PERFORMANCE.md).
//!
//! Run: `cargo bench -p trainyard-core --bench record`

use std::collections::BTreeMap;
use std::hint::black_box;
use std::path::Path;

use criterion::{Criterion, criterion_group, criterion_main};
use sha2::{Digest, Sha256};
use trainyard_core::job::{JobSubmission, TemplateRef};
use trainyard_core::record::{RunRecord, ServerRecord, record_hash};

/// A pytorch-ddp submission as the template renders it: 2 replicas of 8 GPUs, its argv.
const SUBMIT: &str = r#"{"name":"resnet-sweep-17","command":["python3","template/engine/launch.py"],
"args":["--data=/data/shards/photos","--epochs=90","--batch-size=256","--lr=0.1","--warmup-steps=500",
"--precision=bf16","--seed=7","--workers=auto","--prefetch=auto","--checkpoint-every=1000","--keep-checkpoints=3",
"--cpu=32","--memory=256Gi"],
"replicas":2,"resources":{"gpus":8,"cpu":32,"memory":"256Gi"},"env":{"WANDB_MODE":"offline","NCCL_DEBUG":"WARN"},
"priority":0,"max_restarts":3}"#;

/// The pytorch-ddp template's files as a launch delivers them (the real ones, from this checkout).
fn template_files() -> BTreeMap<String, Vec<u8>> {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../templates/pytorch-ddp");
    let mut files = BTreeMap::new();
    let mut folders = vec![root.join("engine")];
    while let Some(folder) = folders.pop() {
        for entry in std::fs::read_dir(&folder).expect("the template's engine folder") {
            let path = entry.expect("an entry").path();
            if path.is_dir() {
                folders.push(path);
            } else if path.extension().is_some_and(|e| e == "py") {
                let relative = path.strip_prefix(&root).expect("under the template").display().to_string();
                files.insert(relative, std::fs::read(&path).expect("a file"));
            }
        }
    }
    files.insert("template.yaml".into(), std::fs::read(root.join("template.yaml")).expect("the manifest"));
    files
}

fn bench(c: &mut Criterion) {
    let files = template_files();
    let bytes: usize = files.values().map(Vec::len).sum();
    eprintln!("pytorch-ddp: {} files, {bytes} bytes", files.len());
    let submission: JobSubmission = serde_json::from_str(SUBMIT).expect("a valid submission");
    let mut spec = submission.clone().validate().expect("valid").spec;
    spec.template = Some(TemplateRef {
        name: "pytorch-ddp".into(),
        version: "1.5.0".into(),
        digest: format!("sha256:{}", "ab".repeat(32)),
    });

    let mut group = c.benchmark_group("per job");
    group.bench_function("submit: validate and hash the request", |b| {
        b.iter(|| {
            let request_hash = Sha256::digest(serde_json::to_vec(black_box(&submission)).expect("encodes"));
            let valid = black_box(&submission).clone().validate().expect("valid");
            black_box((request_hash, valid));
        })
    });
    group.bench_function("run record: build and encode (at launch)", |b| {
        b.iter(|| {
            let record =
                ServerRecord::new(black_box(&spec), black_box(&files), "kubernetes", Some("ghcr.io/x/runtime:1"));
            black_box(serde_json::to_value(&record).expect("encodes"));
        })
    });
    let record = RunRecord::merge(ServerRecord::new(&spec, &files, "kubernetes", None), Vec::new(), None);
    group.bench_function("run record: hash (when read)", |b| b.iter(|| black_box(record_hash(black_box(&record)))));
    group.finish();
}

criterion_group!(benches, bench);
criterion_main!(benches);
