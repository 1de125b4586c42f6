//! Manifest validation (each rule broken once), parameter checks, rendering, digests.

use std::collections::BTreeMap;

use proptest::prelude::*;
use serde_json::{Value, json};

use crate::{Bundle, Params, Template};

const GOOD: &str = r#"
name: train
version: 1.2.0
description: Train a model.
parameters:
  lr: {type: float, default: 0.001, min: 0.0, max: 1.0, help: learning rate}
  epochs: {type: int, default: 3, min: 1, max: 100}
  run_name: {type: string, default: "run", pattern: "[a-z0-9-]+"}
  optimizer: {type: enum, choices: [adam, sgd], default: adam}
  compile: {type: bool, default: false}
  budget: {type: duration, default: 1h, max: 86400}
  data: {type: path, required: true}
  extra: {type: list, default: []}
  nodes: {type: int, default: 1, min: 1, max: 8}
  gpus: {type: int, default: 0, min: 0, max: 8}
resources:
  cpu: 2
  memory: 8Gi
  gpus: {param: gpus}
replicas: {param: nodes}
command: [python, template/engine/train.py, "--lr={{ lr }}", --data, "{{ data }}", {expand: extra}]
env:
  RUN_NAME: "{{ run_name }}-{{ optimizer }}"
files: [engine/]
outputs:
  checkpoints: {path: checkpoints, description: one file per epoch}
expected_runtime: 45m
"#;

fn bundle(manifest: &str) -> Bundle {
    let mut files = BTreeMap::new();
    files.insert("engine/train.py".to_string(), b"print('hi')\n".to_vec());
    files.insert("README.md".to_string(), b"not delivered\n".to_vec());
    Bundle { manifest: manifest.to_string(), files }
}

fn load(manifest: &str) -> Result<Template, crate::LoadError> {
    Template::load(&bundle(manifest))
}

fn params(value: Value) -> Params {
    value.as_object().unwrap().clone()
}

#[test]
fn a_good_manifest_loads_and_delivers_only_its_files() {
    let t = load(GOOD).unwrap();
    assert_eq!(t.to_string(), "train@1.2.0");
    assert_eq!(t.files.keys().collect::<Vec<_>>(), ["engine/train.py"]);
    assert!(t.digest.starts_with("sha256:") && t.digest.len() == 71);
    assert_eq!(t.manifest.expected_runtime_seconds(), Some(45 * 60));
}

#[test]
fn each_broken_rule_names_its_field() {
    let cases: Vec<(&str, &str, &str)> = vec![
        ("name: train", "name: Train_Model", "name"),
        ("version: 1.2.0", "version: one", "version"),
        ("description: Train a model.", "description: ''", "description"),
        ("  lr: {type: float,", "  lr: {type: complex,", "parameters.lr.type"),
        ("min: 0.0, max: 1.0", "min: 2.0, max: 1.0", "parameters.lr.min"),
        ("default: 0.001, min", "default: 5.0, min", "parameters.lr.default"),
        ("help: learning rate}", "help: learning rate, colour: red}", "parameters.lr.colour"),
        ("pattern: \"[a-z0-9-]+\"", "pattern: \"[a-z\"", "parameters.run_name.pattern"),
        ("choices: [adam, sgd], default: adam", "default: adam", "parameters.optimizer.choices"),
        ("choices: [adam, sgd], default: adam", "choices: [adam, sgd], default: lion", "parameters.optimizer.default"),
        (
            "data: {type: path, required: true}",
            "data: {type: path, required: true, default: x}",
            "parameters.data.default",
        ),
        (
            "compile: {type: bool, default: false}",
            "compile: {type: bool, default: false, min: 1}",
            "parameters.compile.min",
        ),
        ("  Epochs", "  Epochs", "-"),
        ("  epochs: {type: int", "  Epochs: {type: int", "parameters.Epochs"),
        ("memory: 8Gi", "memory: 8 gigs", "resources.memory"),
        ("cpu: 2", "cpu: -2", "resources.cpu"),
        ("gpus: {param: gpus}", "gpus: {param: gpu_count}", "resources.gpus"),
        ("replicas: {param: nodes}", "replicas: {param: run_name}", "replicas"),
        ("replicas: {param: nodes}", "replicas: 0", "replicas"),
        ("\"--lr={{ lr }}\"", "\"--lr={{ learning_rate }}\"", "command[2]"),
        ("\"--lr={{ lr }}\"", "\"--lr={{ lr \"", "command[2]"),
        ("{expand: extra}", "{expand: data}", "command[5]"),
        ("RUN_NAME:", "RANK:", "env.RANK"),
        ("files: [engine/]", "files: [engine/missing.py]", "files[0]"),
        ("path: checkpoints,", "path: ../../etc,", "outputs.checkpoints.path"),
        ("expected_runtime: 45m", "expected_runtime: soon", "expected_runtime"),
        (
            "data: {type: path, required: true}",
            "data: {type: path, required: true, create_size: 20Gi}",
            "parameters.data.create_size",
        ),
        (
            "  gpus: {type: int, default: 0, min: 0, max: 8}",
            "  gpus: {type: int, default: 0, min: 0, max: 8}\n  ckpt: {type: volume, default: ckpt, create_size: lots}",
            "parameters.ckpt.create_size",
        ),
        ("expected_runtime: 45m", "expected_runtime: 45m\nsurprise: 1", "surprise"),
    ];
    for (from, to, field) in cases {
        if from == "  Epochs" {
            continue;
        }
        assert!(GOOD.contains(from), "the test's anchor {from:?} is in the good manifest");
        let broken = GOOD.replacen(from, to, 1);
        let err = load(&broken).expect_err(&format!("{to} must be refused"));
        assert_eq!(err.field, field, "{to}: {err}");
        assert_eq!(err.file, "template.yaml");
        assert!(err.to_string().starts_with(&format!("template.yaml: {field}: ")), "{err}");
    }
    let err = load("command: [").unwrap_err();
    assert_eq!(err.file, "template.yaml");
}

#[test]
fn bundle_paths_cannot_escape() {
    for path in ["../x", "/etc/passwd", "a/../../b", "a//b"] {
        let mut b = bundle(GOOD);
        b.files.insert(path.to_string(), vec![]);
        let err = Template::load(&b).expect_err(path);
        assert_eq!(err.file, path);
    }
}

#[test]
fn parameters_are_checked_and_defaults_filled() {
    let t = load(GOOD).unwrap();
    let values =
        t.check_params(&params(json!({"data": "/shared/imagenet", "epochs": "7", "compile": "true"}))).unwrap();
    assert_eq!(values["epochs"], json!(7), "strings from --set become numbers");
    assert_eq!(values["compile"], json!(true));
    assert_eq!(values["lr"], json!(0.001));
    let cases = [
        (json!({}), "params.data", "is required"),
        (json!({"data": "d", "lr": 2}), "params.lr", "at most 1"),
        (json!({"data": "d", "epochs": 1.5}), "params.epochs", "whole number"),
        (json!({"data": "d", "epochs": "many"}), "params.epochs", "whole number"),
        (json!({"data": "d", "optimizer": "lion"}), "params.optimizer", "one of adam, sgd"),
        (json!({"data": "d", "run_name": "Bad Name"}), "params.run_name", "pattern"),
        (json!({"data": "d", "budget": "3 days"}), "params.budget", "at most 86400 seconds"),
        (json!({"data": "d", "budget": "soonish"}), "params.budget", "duration"),
        (json!({"data": "../../etc"}), "params.data", "'..'"),
        (json!({"data": "d", "extra": "--fast"}), "params.extra", "list of strings"),
        (json!({"data": "d", "compile": "yes"}), "params.compile", "true or false"),
        (json!({"data": "d", "learning_rate": 1}), "params.learning_rate", "no parameter learning_rate"),
        (json!({"data": "d\u{0}"}), "params.data", "NUL"),
    ];
    for (given, field, rule) in cases {
        match t.check_params(&params(given.clone())) {
            Err(trainyard_core::Error::InvalidInput { field: f, message }) => {
                assert_eq!(f, field, "{given}");
                assert!(message.contains(rule), "{given}: {message}");
            }
            other => panic!("{given} must be refused, got {other:?}"),
        }
    }
}

#[test]
fn every_bad_parameter_is_named_at_once() {
    let t = load(GOOD).unwrap();
    let given = json!({"optimizer": "lion", "budget": "soonish", "learning_rate": 1});
    let err = t.check_params(&params(given)).unwrap_err();
    let mut fields: Vec<String> = err.field_problems().into_iter().map(|p| p.field).collect();
    fields.sort();
    assert_eq!(fields, ["params.budget", "params.data", "params.learning_rate", "params.optimizer"], "{err}");
}

#[test]
fn rendering_is_argv_out_and_deterministic() {
    let t = load(GOOD).unwrap();
    let values = t
        .check_params(&params(
            json!({"data": "/d", "extra": ["--seed", "7"], "nodes": 2, "gpus": 1, "optimizer": "sgd"}),
        ))
        .unwrap();
    let spec = t.render(&values).unwrap();
    assert_eq!(spec.argv(), ["python", "template/engine/train.py", "--lr=0.001", "--data", "/d", "--seed", "7"]);
    assert_eq!(spec.env["RUN_NAME"], "run-sgd");
    assert_eq!((spec.replicas, spec.resources.gpus, spec.resources.cpu.millis()), (2, 1, 2000));
    assert_eq!(spec.template.as_ref().unwrap().digest, t.digest);
    let again = t.render(&values).unwrap();
    assert_eq!(serde_json::to_vec(&spec).unwrap(), serde_json::to_vec(&again).unwrap(), "byte for byte");
}

#[test]
fn the_digest_follows_content_not_formatting() {
    let a = load(GOOD).unwrap();
    let b = load(&GOOD.replace("description: Train a model.", "# a comment\ndescription:   Train a model.")).unwrap();
    assert_eq!(a.digest, b.digest, "comments and spacing do not change the digest");
    let c = load(&GOOD.replace("default: 3,", "default: 4,")).unwrap();
    assert_ne!(a.digest, c.digest);
    let mut changed = bundle(GOOD);
    changed.files.insert("engine/train.py".into(), b"print('bye')\n".to_vec());
    assert_ne!(a.digest, Template::load(&changed).unwrap().digest, "a delivered file changes the digest");
    let mut unrelated = bundle(GOOD);
    unrelated.files.insert("README.md".into(), b"edited\n".to_vec());
    assert_eq!(a.digest, Template::load(&unrelated).unwrap().digest, "files the job does not receive do not count");
}

#[test]
fn templates_cannot_read_files_or_the_environment() {
    for text in [
        "{% include '/etc/passwd' %}",
        "{% import 'x' as y %}",
        "{{ env.HOME }}",
        "{% for i in range(100000000) %}{{ i }}{% endfor %}",
    ] {
        let manifest = GOOD.replace("\"--lr={{ lr }}\"", &format!("{text:?}"));
        let result = load(&manifest).and_then(|t| {
            let values = t.check_params(&params(json!({"data": "/d"}))).unwrap();
            t.render(&values).map_err(|e| crate::LoadError::manifest("render", e.to_string()))
        });
        assert!(result.is_err(), "{text} must not render");
    }
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(200))]

    #[test]
    fn a_parameter_value_never_changes_the_number_of_argv_elements(value in any_value()) {
        let t = load(GOOD).unwrap();
        let plain = t.render(&t.check_params(&params(json!({"data": "plain", "run_name": "plain"}))).unwrap()).unwrap();
        let values = t.check_params(&params(json!({"data": value}))).unwrap();
        let hostile = t.render(&values).unwrap();
        prop_assert_eq!(hostile.argv().len(), plain.argv().len());
        prop_assert_eq!(&hostile.argv()[4], &value);
    }
}

/// Strings of the kinds that break naive renderers: quotes, `;`, `$()`, newlines, template
/// syntax, long runs; NUL is refused by the checks and tested there.
fn any_value() -> impl Strategy<Value = String> {
    prop_oneof![
        "[^\\x00]{1,64}",
        Just("'; rm -rf / #".to_string()),
        Just("$(touch /tmp/pwned)".to_string()),
        Just("a\nb\nc".to_string()),
        Just("{{ lr }} {% raw %}".to_string()),
        Just("\" --evil=1 \"".to_string()),
        Just("x".repeat(60 * 1024)),
    ]
    .prop_filter("paths have no '..' parts", |s| !s.split('/').any(|p| p == "..") && !s.is_empty())
}

#[test]
fn a_checkpoint_parameter_takes_job_or_job_and_step() {
    let manifest = GOOD.replace(
        "  gpus: {type: int, default: 0, min: 0, max: 8}\n",
        "  gpus: {type: int, default: 0, min: 0, max: 8}\n  init_from: {type: checkpoint, default: \"\"}\n",
    );
    let t = load(&manifest).unwrap();
    for good in ["", "01a20b11", "01a20b11:40", "my-run.2:0", "0191e5c2-7b3a-7c00-8000-000000000000:1200"] {
        let values = t.check_params(&params(json!({"data": "d", "init_from": good}))).unwrap();
        assert_eq!(values["init_from"], json!(good));
    }
    assert_eq!(
        crate::CheckpointRef::parse("run-7:40").unwrap(),
        crate::CheckpointRef { job: "run-7".into(), step: Some(40) }
    );
    assert_eq!(crate::CheckpointRef::parse("run-7").unwrap().step, None);
    for (bad, rule) in [
        ("run:latest", "the step a whole number"),
        ("run:-1", "the step a whole number"),
        (":40", "a job's id, short id or name"),
        ("../etc:4", "a job's id, short id or name"),
        ("a:1:2", "the step a whole number"),
    ] {
        match t.check_params(&params(json!({"data": "d", "init_from": bad}))) {
            Err(trainyard_core::Error::InvalidInput { field, message }) => {
                assert_eq!(field, "params.init_from", "{bad}");
                assert!(message.contains(rule), "{bad}: {message}");
            }
            other => panic!("{bad} must be refused, got {other:?}"),
        }
    }
}
