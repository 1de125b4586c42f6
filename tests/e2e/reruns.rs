//! Exact reruns (issue #20): `yard rerun` runs what a job ran — the template by its digest (a
//! built-in from before an upgrade included), its parameters, dataset versions and code — and
//! links the new job to the original; `--set` changes exactly the parameters named. What it
//! cannot pin (a file or folder on the machine that a `path` parameter names, unless it holds a
//! registered dataset version) is named and refused unless accepted with `--accept-unpinned`,
//! and an accepted rerun says so.

use std::path::Path;
use std::time::Duration;

use serde_json::{Value, json};
use trainyard_tests::web::{WebClient, csrf_of};
use trainyard_tests::{ServerProcess, StatusCode, TestEnv, stderr, stdout};

use crate::records::{python, registered_dataset};

/// Submits a deterministic pytorch-ddp run on 2 CPU replicas (36 steps: a loss every 10).
fn train(env: &TestEnv, data: &Path) -> String {
    let mut args: Vec<String> = ["run", "pytorch-ddp"].iter().map(|s| s.to_string()).collect();
    let sets = [
        format!("data={}", data.display()),
        format!("python={}", python()),
        "seed=7".into(),
        "deterministic=true".into(),
        "replicas=2".into(),
        "cpu=0.5".into(),
        "memory=1Gi".into(),
        "batch_size=32".into(),
        "workers=0".into(),
        "epochs=2".into(),
        "max_steps=30".into(),
    ];
    for set in sets {
        args.extend(["--set".to_string(), set]);
    }
    yard_id(env, &args.iter().map(String::as_str).collect::<Vec<_>>())
}

/// Runs `yard` and returns the job id it printed.
fn yard_id(env: &TestEnv, args: &[&str]) -> String {
    let out = env.yard(&env.admin_token, args);
    assert!(out.status.success(), "yard {args:?}: {} {}", stdout(&out), stderr(&out));
    stdout(&out).trim().lines().last().unwrap().to_string()
}

async fn loss(env: &TestEnv, id: &str) -> Vec<f64> {
    let (status, metrics) = env.get(&format!("/api/v1/jobs/{id}/metrics?name=loss"), &env.admin_token).await;
    assert_eq!(status, StatusCode::OK, "{metrics}");
    metrics["series"][0]["values"].as_array().unwrap().iter().map(|v| v.as_f64().unwrap()).collect()
}

/// `yard diff A B -o json`: the differing fields.
fn differences(env: &TestEnv, a: &str, b: &str) -> Vec<(String, Value, Value)> {
    let out = env.yard(&env.admin_token, &["diff", a, b, "-o", "json"]);
    assert!(out.status.success(), "{}", stderr(&out));
    let comparison: Value = serde_json::from_str(&stdout(&out)).unwrap();
    comparison["sections"]
        .as_array()
        .unwrap()
        .iter()
        .flat_map(|s| s["fields"].as_array().unwrap())
        .map(|d| (d["field"].as_str().unwrap().to_string(), d["values"][0].clone(), d["values"][1].clone()))
        .collect()
}

/// Metrics that measure time (throughput, waiting), which no rerun repeats.
fn is_timing(field: &str) -> bool {
    ["samples_per_second", "input_stall"].iter().any(|t| field.contains(t))
}

#[tokio::test(flavor = "multi_thread")]
async fn a_rerun_repeats_the_loss_value_for_value_and_a_changed_parameter_is_the_only_input_that_differs() {
    let env = TestEnv::start().await;
    let (data, _) = registered_dataset(&env).await;
    let original = train(&env, &data);
    env.wait_state(&original, "succeeded", Duration::from_secs(240)).await;

    // The data is a folder on the machine, but the folder of a registered dataset version
    // (digits@1) whose content the engine read: as pinned as `name@version`, so nothing needs
    // accepting. A short id names it (more than a timestamp: the data-pack job was submitted
    // moments before).
    let again = yard_id(&env, &["rerun", &original[..18]]);
    let changed = yard_id(&env, &["rerun", &original, "--set", "lr=0.01"]);
    for id in [&again, &changed] {
        env.wait_state(id, "succeeded", Duration::from_secs(240)).await;
    }

    // The same inputs train the same model: the loss, value for value.
    let (first, second) = (loss(&env, &original).await, loss(&env, &again).await);
    assert!(first.len() >= 3, "{first:?}");
    assert_eq!(first, second, "an exact rerun repeats the loss series");
    // Nothing differs but ids, times and the link.
    for (field, a, b) in differences(&env, &original, &again) {
        let (a_text, b_text) = (a.to_string(), b.to_string());
        let only_ids = a_text.replace(&original, &again) == b_text;
        assert!(field.starts_with("rerun.") || is_timing(&field) || only_ids, "{field}: {a} vs {b}");
    }
    let (_, job) = env.get(&format!("/api/v1/jobs/{again}"), &env.admin_token).await;
    assert_eq!(job["rerun_of"], original.as_str(), "{job}");
    assert!(job.get("rerun_overrides").is_none(), "an exact rerun: {job}");
    assert!(job.get("rerun_unpinned").is_none(), "nothing unpinned to accept: {job}");

    // --set lr=0.01: of the inputs, the parameter and the argument it renders to differ.
    let inputs: Vec<String> = differences(&env, &original, &changed)
        .into_iter()
        .filter(|(field, ..)| ["params.", "spec.", "datasets.", "template."].iter().any(|p| field.starts_with(p)))
        .map(|(field, a, b)| {
            if field == "params.lr" {
                // The original left lr at its default; the rerun set it (as typed: text).
                let set = b.as_f64().or_else(|| b.as_str().and_then(|s| s.parse().ok()));
                assert_eq!((a, set), (Value::Null, Some(0.01)), "{field}");
            }
            field
        })
        .collect();
    assert_eq!(inputs, ["params.lr", "spec.args"], "only lr and what it renders to");
    assert_ne!(loss(&env, &changed).await, first, "another learning rate trains differently");

    // Shown both ways.
    let out = env.yard(&env.admin_token, &["jobs", "show", &original]);
    let text = stdout(&out);
    assert!(text.contains(&again) && text.contains(&changed), "the original lists its reruns: {text}");
    let out = env.yard(&env.admin_token, &["jobs", "show", &changed]);
    assert!(stdout(&out).contains(&format!("rerun of:  {original} with lr=0.01")), "{}", stdout(&out));
}

/// A folder of built-in templates: this checkout's, with `shell` at `version` shipping a file
/// that says `note`.
fn builtins(root: &Path, version: &str, note: &str) -> std::path::PathBuf {
    let source = Path::new(env!("CARGO_MANIFEST_DIR")).join("../templates");
    let dir = root.join(format!("builtins-{version}"));
    let copy = std::process::Command::new("cp").arg("-r").arg(&source).arg(&dir).status().unwrap();
    assert!(copy.success());
    let manifest = std::fs::read_to_string(dir.join("shell/template.yaml")).unwrap();
    let manifest = manifest.replace("version: 1.0.0", &format!("version: {version}")) + "files: [note.txt]\n";
    std::fs::write(dir.join("shell/template.yaml"), manifest).unwrap();
    std::fs::write(dir.join("shell/note.txt"), note).unwrap();
    dir
}

#[tokio::test(flavor = "multi_thread")]
async fn a_job_of_an_earlier_built_in_version_reruns_with_its_files_after_an_upgrade() {
    let scratch = tempfile::tempdir().unwrap();
    let old = builtins(scratch.path(), "1.0.0", "the files of 1.0.0");
    let new = builtins(scratch.path(), "1.1.0", "the files of 1.1.0");
    let old_dir = old.to_str().unwrap();
    let mut env = TestEnv::start_with(&["--builtin-templates-dir", old_dir]).await;
    let run = |env: &TestEnv| yard_id(env, &["run", "shell", "--set", r#"command=["cat", "template/note.txt"]"#]);
    let first = run(&env);
    env.wait_state(&first, "succeeded", Duration::from_secs(30)).await;
    let (_, job) = env.get(&format!("/api/v1/jobs/{first}"), &env.admin_token).await;
    let digest = job["spec"]["template"]["digest"].as_str().unwrap().to_string();

    // The upgrade: the same database, a server whose shell is 1.1.0 with other files.
    env.server.kill_hard();
    let new_dir = new.to_str().unwrap();
    let args = ["--builtin-templates-dir", new_dir, "--cluster-grows", "--restart-backoff-seconds", "0.5"];
    env.server = ServerProcess::start_with(&env.db.url, &env.data_dir(), &args);
    let fresh = run(&env);
    let rerun = yard_id(&env, &["rerun", &first]);
    for id in [&fresh, &rerun] {
        env.wait_state(id, "succeeded", Duration::from_secs(30)).await;
    }
    let template = |id: String| {
        let env = &env;
        async move { env.get(&format!("/api/v1/jobs/{id}"), &env.admin_token).await.1["spec"]["template"].clone() }
    };
    let (fresh_template, rerun_template) = (template(fresh.clone()).await, template(rerun.clone()).await);
    assert_eq!(fresh_template["version"], "1.1.0");
    assert_eq!(
        (rerun_template["version"].as_str(), rerun_template["digest"].as_str()),
        (Some("1.0.0"), Some(digest.as_str()))
    );
    let log = |id: String| {
        let env = &env;
        async move {
            env.get(&format!("/api/v1/jobs/{id}/logs"), &env.admin_token)
                .await
                .1
                .as_str()
                .unwrap_or_default()
                .to_string()
        }
    };
    assert!(log(rerun.clone()).await.contains("the files of 1.0.0"), "the rerun ran the old files");
    assert!(log(fresh.clone()).await.contains("the files of 1.1.0"));
}

/// `sha256:<hex>` of some bytes, as the engine records a file.
fn sha256_of(bytes: &[u8]) -> String {
    use sha2::Digest;
    let digest = sha2::Sha256::digest(bytes);
    format!("sha256:{}", digest.iter().map(|b| format!("{b:02x}")).collect::<String>())
}

/// The acceptance of issue #20: a job whose user code is a file on the machine; the file
/// changes; `yard rerun` refuses and names it with the hash it had, the API answers 409, the
/// job's page offers the explicit choice; `--accept-unpinned` runs it, and the new job, its run
/// record, `yard jobs show` and `yard diff` say what was accepted.
#[tokio::test(flavor = "multi_thread")]
async fn a_rerun_of_user_code_from_a_changed_file_is_refused_naming_it_and_runs_when_accepted() {
    let env = TestEnv::start().await;
    let (data, _) = crate::training::packed_dataset_by(&env).await;
    // The user's model: the built-in example's functions, in a file of the user's own.
    let module = env.dir.path().join("my_model.py");
    let example = Path::new(env!("CARGO_MANIFEST_DIR")).join("../templates/pytorch-ddp/engine/example.py");
    let code = std::fs::read(example).unwrap();
    std::fs::write(&module, &code).unwrap();
    let sets = [
        format!("data={}", data.display()),
        format!("user_module={}", module.display()),
        format!("python={}", python()),
        "replicas=1".into(),
        "cpu=0.5".into(),
        "memory=1Gi".into(),
        "batch_size=32".into(),
        "workers=0".into(),
        "epochs=1".into(),
        "max_steps=2".into(),
    ];
    let mut args = vec!["run".to_string(), "pytorch-ddp".to_string()];
    for set in sets {
        args.extend(["--set".to_string(), set]);
    }
    let original = yard_id(&env, &args.iter().map(String::as_str).collect::<Vec<_>>());
    env.wait_state(&original, "succeeded", Duration::from_secs(240)).await;
    let (ran, changed) = (sha256_of(&code), sha256_of(&[code.as_slice(), b"\n# tuned since\n"].concat()));
    let (_, record) = env.get(&format!("/api/v1/jobs/{original}/record"), &env.admin_token).await;
    assert_eq!(record["attempts"][0]["record"]["user_code"]["module_sha256"], ran.as_str(), "{record}");

    // The file changes after the run.
    std::fs::write(&module, [code.as_slice(), b"\n# tuned since\n"].concat()).unwrap();

    // Refused, naming the file and the hash it had when the job ran (and the data folder).
    let refused = env.yard(&env.admin_token, &["rerun", &original]);
    let said = stderr(&refused);
    assert!(!refused.status.success(), "{said}");
    let named = format!(
        "params.user_module: {} is a file on the machine, not shipped with the job; it was {ran} when the job ran and may have changed",
        module.display()
    );
    assert!(said.contains(&named), "{said}");
    assert!(said.contains(&format!("params.data: {} is a folder", data.display())), "{said}");
    assert!(said.contains("--accept-unpinned"), "{said}");
    let (status, body) = env.post(&format!("/api/v1/jobs/{original}/rerun"), &env.admin_token, &json!({})).await;
    assert_eq!(status, StatusCode::CONFLICT, "{body}");
    assert!(body["error"]["message"].as_str().unwrap().contains(&named), "{body}");
    let (_, reruns) = env.get(&format!("/api/v1/jobs?rerun_of={original}"), &env.admin_token).await;
    assert_eq!(reruns["items"].as_array().map(Vec::len), Some(0), "a refused rerun makes no job: {reruns}");
    // The job's page lists them before anyone clicks, with the explicit choice.
    let web = WebClient::signed_in(&env.server.url, &env.admin_token).await;
    let (status, page) = web.get(&format!("/jobs/{original}")).await;
    assert_eq!(status, StatusCode::OK);
    assert!(page.contains("id=\"accept-unpinned\"") && page.contains(&ran), "{page}");
    // Its "Run again" without the box ticked is refused, naming them; ticked, it runs.
    let csrf = csrf_of(&page);
    let (status, refusal) = web.post_form(&format!("/jobs/{original}/rerun"), &[("csrf", &csrf)]).await;
    assert_eq!(status, StatusCode::CONFLICT, "{refusal}");
    assert!(refusal.contains(&named), "{refusal}");
    let form = [("csrf", csrf.as_str()), ("accept_unpinned", "true")];
    let (status, location) = web.post_form_location(&format!("/jobs/{original}/rerun"), &form).await;
    assert_eq!(status, StatusCode::SEE_OTHER);
    let from_page = location.unwrap().trim_start_matches("/jobs/").to_string();
    let (_, job) = env.get(&format!("/api/v1/jobs/{from_page}"), &env.admin_token).await;
    assert_eq!(job["rerun_unpinned"][0]["input"], "params.data", "{job}");
    env.post(&format!("/api/v1/jobs/{from_page}/cancel"), &env.admin_token, &json!({})).await;

    // Accepted: it runs the file as it is now, and says so.
    let again = yard_id(&env, &["rerun", &original, "--accept-unpinned"]);
    env.wait_state(&again, "succeeded", Duration::from_secs(240)).await;
    let (_, job) = env.get(&format!("/api/v1/jobs/{again}"), &env.admin_token).await;
    let accepted: Vec<String> = job["rerun_unpinned"]
        .as_array()
        .expect("the rerun lists what it accepted")
        .iter()
        .map(|u| format!("{}: {}", u["input"].as_str().unwrap(), u["message"].as_str().unwrap()))
        .collect();
    assert!(accepted.contains(&named), "{job}");
    let (_, record) = env.get(&format!("/api/v1/jobs/{again}/record"), &env.admin_token).await;
    let r = &record["attempts"][0]["record"];
    assert_eq!(r["accepted_unpinned"], job["rerun_unpinned"], "its run record says so: {r}");
    assert_eq!(r["user_code"]["module_sha256"], changed.as_str(), "it ran the file as it is now");
    let shown = stdout(&env.yard(&env.admin_token, &["jobs", "show", &again]));
    assert!(shown.contains(&format!("unpinned:  {named} (accepted)")), "{shown}");
    let diff = differences(&env, &original, &again);
    let field = |name: &str| diff.iter().find(|(f, ..)| f == name).map(|(_, a, b)| (a.clone(), b.clone()));
    assert_eq!(field("code.user.module_sha256"), Some((Value::from(ran.as_str()), Value::from(changed.as_str()))));
    let unpinned = field("rerun.unpinned.params.user_module").expect("yard diff shows what was accepted");
    assert!(unpinned.0.is_null() && unpinned.1.as_str().is_some_and(|m| named.ends_with(m)), "{unpinned:?}");
    let (_, page) = web.get(&format!("/jobs/{again}")).await;
    assert!(page.contains("id=\"rerun-unpinned\"") && page.contains(&changed), "{page}");
}

/// On Kubernetes a job's image is a tag, which may move; its replicas report the digest they
/// ran (the pod's imageID), and a rerun runs that digest: the tag is no unpinned input, the new
/// job's spec and run record name the digest, and the Job applied runs it.
#[tokio::test(flavor = "multi_thread")]
async fn a_rerun_on_kubernetes_runs_the_digest_its_original_ran_not_the_tag() {
    let scratch = tempfile::tempdir().unwrap();
    // The fake also places and runs the pods, reporting the image digest they run.
    let fake = trainyard_tests::FakeApiServer::start(scratch.path(), &["2"]);
    let kubeconfig = &fake.kubeconfig;
    let tag = "registry.example/runtime:1";
    let env = TestEnv::start_with_env(
        &["--executor", "kubernetes", "--kube-image", tag],
        &[("KUBECONFIG".to_string(), kubeconfig.display().to_string())],
    )
    .await;
    let token = env.admin_token.clone();
    let original = env.submit(json!({"name": "pinned", "command": ["python3", "-c", "print(1)"]})).await;
    // The fake runs the pods at once; the reconciler records the digest they report.
    let digest = format!("registry.example/runtime@sha256:{}", "3".repeat(64));
    let deadline = std::time::Instant::now() + Duration::from_secs(30);
    loop {
        let (_, record) = env.get(&format!("/api/v1/jobs/{original}/record"), &token).await;
        if record["attempts"][0]["record"]["image_digests"] == json!([digest]) {
            assert_eq!(record["attempts"][0]["record"]["image"], tag, "the original ran the tag: {record}");
            break;
        }
        assert!(std::time::Instant::now() < deadline, "no digest recorded: {record}");
        tokio::time::sleep(Duration::from_millis(200)).await;
    }

    // Nothing to accept: the image is pinned by its digest.
    let out = env.yard(&token, &["rerun", &original]);
    assert!(out.status.success(), "{}", stderr(&out));
    let rerun = stdout(&out).trim().to_string();
    let (_, job) = env.get(&format!("/api/v1/jobs/{rerun}"), &token).await;
    assert_eq!(job["spec"]["image"], digest.as_str(), "{job}");
    assert!(job.get("rerun_unpinned").is_none_or(|u| u == &json!([])), "nothing accepted: {job}");
    let deadline = std::time::Instant::now() + Duration::from_secs(30);
    loop {
        let (_, record) = env.get(&format!("/api/v1/jobs/{rerun}/record"), &token).await;
        if record["attempts"][0]["record"]["image_digests"] == json!([digest]) {
            assert_eq!(record["attempts"][0]["record"]["image"], digest.as_str(), "the rerun ran the digest: {record}");
            break;
        }
        assert!(std::time::Instant::now() < deadline, "the rerun never ran: {record}");
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    // `yard diff` names the pin as the one input that differs.
    let diff = env.yard(&token, &["diff", &original, &rerun, "-o", "json"]);
    let diff: Value = serde_json::from_slice(&diff.stdout).unwrap();
    let fields: Vec<&str> = diff["sections"]
        .as_array()
        .unwrap()
        .iter()
        .flat_map(|s| s["fields"].as_array().unwrap().iter().map(|f| f["field"].as_str().unwrap()))
        .collect();
    assert!(fields.contains(&"spec.image"), "{diff}");
}
