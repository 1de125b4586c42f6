//! Compatibility with what PyTorch users read today: the real `webdataset` library (PyPI,
//! installed by tests/run into its own virtualenv) iterates our shards and yields the same
//! samples, byte for byte.

use std::collections::BTreeMap;
use std::process::Command;

use sha2::{Digest, Sha256};
use trainyard_data::pack::{PackOptions, Progress, pack};
use trainyard_data::plan::ShardLimits;
use trainyard_data::source::discover_dir;

/// Reads every shard with `webdataset.WebDataset` and prints `key<TAB>ext:sha256...` per sample.
const ITERATE: &str = r#"
import hashlib, json, sys
import webdataset as wds
manifest = json.load(open(sys.argv[1] + "/dataset.json"))
urls = [sys.argv[1] + "/" + shard["name"] for shard in manifest["shards"]]
for sample in wds.WebDataset(urls, shardshuffle=False, empty_check=False):
    fields = sorted((k, hashlib.sha256(v).hexdigest()) for k, v in sample.items() if not k.startswith("__"))
    print(sample["__key__"] + "\t" + "\t".join(f"{k}:{h}" for k, h in fields))
"#;

#[test]
fn the_webdataset_library_reads_our_shards_as_they_are() {
    let python = std::env::var("TRAINYARD_TEST_PYTHON").expect(
        "TRAINYARD_TEST_PYTHON is not set: run the tests through tests/run, which installs webdataset into a virtualenv",
    );
    let dir = tempfile::tempdir().unwrap();
    let (source, dest) = (dir.path().join("src"), dir.path().join("out"));
    let mut expected = BTreeMap::new();
    for i in 0..300 {
        let sub = source.join(format!("class{}", i % 4));
        std::fs::create_dir_all(&sub).unwrap();
        let mut fields = Vec::new();
        for (ext, size) in [("jpg", 100 + i * 37), ("cls", 1 + i % 3), ("seg.png", (i * 13) % 900)] {
            let bytes: Vec<u8> = (0..size).map(|b| ((b * 7 + i) % 256) as u8).collect();
            std::fs::write(sub.join(format!("img{i:04}.{ext}")), &bytes).unwrap();
            fields.push(format!("{ext}:{}", hex::encode(Sha256::digest(&bytes))));
        }
        fields.sort();
        expected.insert(format!("class{}/img{i:04}", i % 4), fields.join("\t"));
    }
    let options = PackOptions {
        prefix: "compat".into(),
        limits: ShardLimits { max_bytes: 64 * 1024, max_samples: 40 },
        worker: 0,
        workers: 1,
        overwrite: false,
        threads: None,
    };
    let manifest =
        pack(&discover_dir(&source).unwrap().samples, &dest, &options, &Progress::default()).unwrap().manifest.unwrap();
    assert!(manifest.shards.len() > 3);

    let output = Command::new(&python).args(["-c", ITERATE]).arg(&dest).output().expect("run python");
    assert!(output.status.success(), "webdataset failed: {}", String::from_utf8_lossy(&output.stderr));
    let seen: BTreeMap<String, String> = String::from_utf8(output.stdout)
        .unwrap()
        .lines()
        .map(|line| {
            let (key, fields) = line.split_once('\t').unwrap();
            (key.to_string(), fields.to_string())
        })
        .collect();
    assert_eq!(seen.len(), 300, "webdataset yields every sample once");
    assert_eq!(seen, expected, "same keys, same extensions, same bytes");
}

#[test]
fn the_training_engine_assigns_shards_to_ranks_as_the_data_pipeline_does() {
    let python = std::env::var("TRAINYARD_TEST_PYTHON").expect("run the tests through tests/run");
    let engine = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../../templates/pytorch-ddp/engine");
    let script = "import json, sys\nsys.path.insert(0, sys.argv[1])\nfrom shards import assign_shards\n\
        print(json.dumps([[assign_shards(n, r, w, s, e) for r in range(w)] for n, w, s, e in json.loads(sys.argv[2])]))";
    let cases: Vec<(usize, usize, u64, u64)> =
        vec![(1, 1, 0, 0), (13, 2, 0, 0), (13, 2, 0, 1), (100, 8, 42, 3), (7, 16, 9, 2), (64, 3, 123_456, 0)];
    let output = Command::new(&python)
        .args(["-c", script])
        .arg(&engine)
        .arg(serde_json::to_string(&cases).unwrap())
        .output()
        .unwrap();
    assert!(output.status.success(), "{}", String::from_utf8_lossy(&output.stderr));
    let python_says: Vec<Vec<Vec<usize>>> = serde_json::from_slice(&output.stdout).unwrap();
    for ((n, w, s, e), ranks) in cases.into_iter().zip(python_says) {
        for (rank, shards) in ranks.into_iter().enumerate() {
            assert_eq!(
                shards,
                trainyard_data::reader::assign_shards(n, rank, w, s, e),
                "n={n} w={w} seed={s} epoch={e} rank={rank}"
            );
        }
    }
}
