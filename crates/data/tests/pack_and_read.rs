//! The packer and reader on generated trees: round trips, bad input, workers, crashes.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::Command;

use trainyard_data::check::{SampleRef, get, verify};
use trainyard_data::manifest::{DatasetManifest, MANIFEST_FILE};
use trainyard_data::pack::{PackOptions, Progress, merge, pack};
use trainyard_data::plan::ShardLimits;
use trainyard_data::reader::{Reader, ReaderOptions};
use trainyard_data::source::{discover_dir, discover_list};

/// A tree of samples with one to three files each, nested folders, a multi-dot extension,
/// sizes from 0 bytes to 70 KiB; returns key -> ext -> bytes.
fn generate(root: &Path, samples: usize) -> BTreeMap<String, BTreeMap<String, Vec<u8>>> {
    let mut expected = BTreeMap::new();
    for i in 0..samples {
        let dir = root.join(format!("part{}/sub{}", i % 3, i % 5));
        std::fs::create_dir_all(&dir).unwrap();
        let key = format!("part{}/sub{}/sample{i:05}", i % 3, i % 5);
        let mut fields = BTreeMap::new();
        let exts: &[&str] = match i % 3 {
            0 => &["jpg"],
            1 => &["jpg", "cls"],
            _ => &["seg.png", "json", "txt"],
        };
        for (j, ext) in exts.iter().enumerate() {
            let size = (i * 7919 + j * 104_729) % (70 * 1024);
            let bytes: Vec<u8> = (0..size).map(|b| ((b * 31 + i * 17 + j) % 251) as u8).collect();
            std::fs::write(root.join(format!("{key}.{ext}")), &bytes).unwrap();
            fields.insert(ext.to_string(), bytes);
        }
        expected.insert(key, fields);
    }
    expected
}

fn options(workers: usize, worker: usize) -> PackOptions {
    PackOptions {
        prefix: "train".into(),
        limits: ShardLimits { max_bytes: 1 << 20, max_samples: 50 },
        worker,
        workers,
        overwrite: false,
        threads: Some(2),
    }
}

fn as_map(sample: &trainyard_data::reader::Sample) -> BTreeMap<String, Vec<u8>> {
    sample.fields.iter().cloned().collect()
}

#[test]
fn every_sample_comes_back_byte_for_byte_through_the_index_and_the_reader() {
    let dir = tempfile::tempdir().unwrap();
    let (source, dest) = (dir.path().join("src"), dir.path().join("out"));
    let expected = generate(&source, 400);
    let found = discover_dir(&source).unwrap();
    assert_eq!(found.samples.len(), 400);
    let packed = pack(&found.samples, &dest, &options(1, 0), &Progress::default()).unwrap();
    let manifest = packed.manifest.expect("one worker writes the manifest");
    assert_eq!(manifest, DatasetManifest::read(&dest).unwrap());
    assert_eq!(manifest.samples, 400);
    assert!(manifest.shards.len() > 5, "the 1 MiB and 50-sample limits cut several shards");
    assert_eq!(manifest.shards.iter().map(|s| s.samples).sum::<u64>(), 400);
    assert!(verify(&dest).unwrap().is_empty());

    for (position, (key, fields)) in expected.iter().enumerate() {
        let by_position = get(&dest, &SampleRef::Position(position as u64)).unwrap();
        assert_eq!(&by_position.key, key, "dataset order is key order");
        assert_eq!(&as_map(&by_position), fields);
        assert_eq!(as_map(&get(&dest, &SampleRef::Key(key.clone())).unwrap()), *fields);
    }
    assert!(get(&dest, &SampleRef::Position(400)).is_err());

    let read: BTreeMap<String, BTreeMap<String, Vec<u8>>> =
        Reader::open(&dest, &ReaderOptions { readers: 3, shuffle_buffer: 64, seed: 9, ..Default::default() })
            .unwrap()
            .map(|s| s.unwrap())
            .map(|s| (s.key.clone(), as_map(&s)))
            .collect();
    assert_eq!(read, expected, "the reader yields every sample once, intact");
}

#[test]
fn the_reader_is_deterministic_and_splits_ranks_disjointly() {
    let dir = tempfile::tempdir().unwrap();
    let (source, dest) = (dir.path().join("src"), dir.path().join("out"));
    generate(&source, 300);
    pack(&discover_dir(&source).unwrap().samples, &dest, &options(1, 0), &Progress::default()).unwrap();
    let keys = |rank, world, epoch| -> Vec<String> {
        let opts =
            ReaderOptions { rank, world_size: world, epoch, seed: 42, readers: 4, prefetch: 2, shuffle_buffer: 100 };
        Reader::open(&dest, &opts).unwrap().map(|s| s.unwrap().key).collect()
    };
    assert_eq!(keys(0, 1, 0), keys(0, 1, 0), "same seed and epoch, same order, whatever the threads do");
    assert_ne!(keys(0, 1, 0), keys(0, 1, 1), "another epoch, another order");
    let mut union: Vec<String> = (0..3).flat_map(|rank| keys(rank, 3, 5)).collect();
    union.sort();
    let mut all = keys(0, 1, 0);
    all.sort();
    assert_eq!(union, all, "three ranks together read every sample exactly once");
}

#[test]
fn four_workers_and_a_merge_give_the_same_dataset_as_one() {
    let dir = tempfile::tempdir().unwrap();
    let source = dir.path().join("src");
    generate(&source, 250);
    let samples = discover_dir(&source).unwrap().samples;
    let one = pack(&samples, &dir.path().join("one"), &options(1, 0), &Progress::default()).unwrap().manifest.unwrap();
    let four = dir.path().join("four");
    for worker in [2, 0, 3, 1] {
        let packed = pack(&samples, &four, &options(4, worker), &Progress::default()).unwrap();
        assert!(packed.manifest.is_none());
        assert!(!four.join(MANIFEST_FILE).exists(), "no manifest before the merge");
    }
    let merged = merge(&four, "train", 4, None).unwrap();
    assert_eq!(merged.content_hash, one.content_hash);
    assert_eq!(merged.shards, one.shards);
    assert!(verify(&four).unwrap().is_empty());
}

#[test]
fn a_merge_with_a_missing_worker_says_which() {
    let dir = tempfile::tempdir().unwrap();
    let source = dir.path().join("src");
    generate(&source, 60);
    let samples = discover_dir(&source).unwrap().samples;
    let dest = dir.path().join("out");
    pack(&samples, &dest, &options(3, 0), &Progress::default()).unwrap();
    pack(&samples, &dest, &options(3, 2), &Progress::default()).unwrap();
    let err = merge(&dest, "train", 3, None).unwrap_err().to_string();
    assert!(err.contains("parts present: [0, 2]"), "{err}");
}

fn pack_err(source: &Path, dest: &Path, limits: ShardLimits) -> String {
    let found = match discover_dir(source) {
        Ok(found) => found,
        Err(err) => return err.to_string(),
    };
    let opts = PackOptions { limits, ..options(1, 0) };
    pack(&found.samples, dest, &opts, &Progress::default()).unwrap_err().to_string()
}

#[test]
fn bad_input_is_refused_with_a_reason() {
    let dir = tempfile::tempdir().unwrap();
    let limits = ShardLimits { max_bytes: 1 << 20, max_samples: 100 };
    let case = |name: &str, files: &[(&str, usize)]| -> PathBuf {
        let root = dir.path().join(name);
        for (path, size) in files {
            let path = root.join(path);
            std::fs::create_dir_all(path.parent().unwrap()).unwrap();
            std::fs::write(path, vec![7u8; *size]).unwrap();
        }
        root
    };
    let dup = case("dup", &[("x.jpg", 10), ("x.JPG", 10)]);
    assert!(pack_err(&dup, &dir.path().join("o1"), limits).contains("two files for key x and extension jpg"));
    let big = case("big", &[("huge.bin", 2 << 20)]);
    assert!(pack_err(&big, &dir.path().join("o2"), limits).contains("more than the shard size"));
    let long = case("long", &[(&format!("{}.txt", "n".repeat(120)), 1)]);
    assert!(pack_err(&long, &dir.path().join("o3"), limits).contains("at most 99"));
    let bare = case("bare", &[("README", 1)]);
    assert!(pack_err(&bare, &dir.path().join("o4"), limits).contains("no extension"));
    let empty = case("empty", &[(".hidden", 1)]);
    assert!(pack_err(&empty, &dir.path().join("o5"), limits).contains("no samples"));

    // A listed file that cannot be read is named.
    let list = dir.path().join("list.txt");
    std::fs::write(&list, "a.jpg\nmissing.jpg\n").unwrap();
    let listed = case("listed", &[("a.jpg", 3)]);
    let err = discover_list(&list, &listed).unwrap_err().to_string();
    assert!(err.contains("missing.jpg"), "{err}");
    std::fs::write(&list, "../escape.jpg\n").unwrap();
    assert!(discover_list(&list, &listed).unwrap_err().to_string().contains("stay inside"));

    // A destination with a dataset is refused unless told to overwrite.
    let good = case("good", &[("a.jpg", 3), ("b.jpg", 4)]);
    let dest = dir.path().join("dest");
    let samples = discover_dir(&good).unwrap().samples;
    pack(&samples, &dest, &options(1, 0), &Progress::default()).unwrap();
    let err = pack(&samples, &dest, &options(1, 0), &Progress::default()).unwrap_err().to_string();
    assert!(err.contains("already holds a dataset") && err.contains("--overwrite"), "{err}");
    let again = PackOptions { overwrite: true, ..options(1, 0) };
    assert!(pack(&samples, &dest, &again, &Progress::default()).is_ok());
}

#[test]
fn a_killed_pack_leaves_nothing_that_looks_complete_and_a_rerun_finishes() {
    let dir = tempfile::tempdir().unwrap();
    let (source, dest) = (dir.path().join("src"), dir.path().join("out"));
    for i in 0..3000 {
        let sub = source.join(format!("d{}", i % 10));
        std::fs::create_dir_all(&sub).unwrap();
        std::fs::write(sub.join(format!("s{i:05}.bin")), vec![(i % 251) as u8; 48 * 1024]).unwrap();
    }
    let bin = env!("CARGO_BIN_EXE_yard-data");
    let mut child = Command::new(bin)
        .args(["pack", "--shard-size", "1Mi", "--threads", "1"])
        .arg(&source)
        .arg(&dest)
        .stderr(std::process::Stdio::null())
        .spawn()
        .unwrap();
    // Kill it once it has finished a few shards but not all of them.
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(60);
    loop {
        let done = std::fs::read_dir(&dest)
            .map(|d| d.flatten().filter(|e| e.path().extension().is_some_and(|x| x == "tar")).count())
            .unwrap_or(0);
        if done >= 3 {
            break;
        }
        assert!(std::time::Instant::now() < deadline, "pack made no progress");
        std::thread::sleep(std::time::Duration::from_millis(5));
    }
    child.kill().unwrap();
    child.wait().unwrap();
    assert!(!dest.join(MANIFEST_FILE).exists(), "no manifest after a crash");
    let names: Vec<String> =
        std::fs::read_dir(&dest).unwrap().flatten().map(|e| e.file_name().to_string_lossy().into_owned()).collect();
    assert!(names.iter().any(|n| n.ends_with(".tar")), "{names:?}");
    for name in names.iter().filter(|n| n.ends_with(".tar")) {
        // Whatever carries a final name is whole: its index is there and lists full samples.
        let index = dest.join(name.replace(".tar", ".idx.json"));
        assert!(index.exists(), "{name} has its index");
        let mut archive = tar::Archive::new(std::fs::File::open(dest.join(name)).unwrap());
        let members = archive.entries().unwrap().map(|e| e.unwrap().size()).collect::<Vec<_>>();
        assert!(members.iter().all(|size| *size == 48 * 1024), "{name} is a complete tar");
    }
    let rerun = Command::new(bin).args(["pack", "--shard-size", "1Mi"]).arg(&source).arg(&dest).output().unwrap();
    assert!(rerun.status.success(), "{}", String::from_utf8_lossy(&rerun.stderr));
    assert!(verify(&dest).unwrap().is_empty());
    assert_eq!(DatasetManifest::read(&dest).unwrap().samples, 3000);
}
