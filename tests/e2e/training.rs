//! The pytorch-ddp template with real PyTorch on CPU (gloo): pack a generated dataset with
//! data-pack, train the built-in example on 2 replicas, survive a killed replica by resuming from
//! the last checkpoint, checkpoint on cancel, and fail clearly on bad user code.

use std::path::{Path, PathBuf};
use std::time::Duration;

use serde_json::Value;
use trainyard_tests::{TestEnv, stderr, stdout};

/// 8x8 images of 4 classes (class k lights quadrant k), 1,200 samples, then packed by data-pack.
async fn packed_dataset(env: &TestEnv) -> PathBuf {
    packed_dataset_by(env).await.0
}

/// [`packed_dataset`], and the id of the data-pack job that packed it.
pub(crate) async fn packed_dataset_by(env: &TestEnv) -> (PathBuf, String) {
    let source = env.dir.path().join("images");
    write_images(&source, 12345, 1200);
    let dest = env.dir.path().join("shards");
    let packed = env.data_pack(&source, &dest, &["shard_size=32Ki", "threads=1"]);
    assert_eq!(packed["state"], "succeeded");
    (dest, packed["id"].as_str().unwrap().to_string())
}

/// `count` 8x8 images of 4 classes (a lit quadrant and noise from `seed`) as `c<class>/img<i>.bin`
/// and `.cls` files in `source`: what the pytorch-ddp example trains on.
pub(crate) fn write_images(source: &std::path::Path, seed: u32, count: u32) {
    let mut noise: u32 = seed;
    for i in 0..count {
        let class = i % 4;
        let dir = source.join(format!("c{class}"));
        std::fs::create_dir_all(&dir).unwrap();
        let mut bytes = Vec::with_capacity(256);
        for r in 0..8 {
            for c in 0..8 {
                noise = noise.wrapping_mul(1_103_515_245).wrapping_add(12345);
                let jitter = ((noise >> 16) % 1000) as f32 / 1000.0 * 0.6 - 0.3;
                let lit = u32::from(r >= 4) * 2 + u32::from(c >= 4) == class;
                bytes.extend_from_slice(&(f32::from(u8::from(lit)) + jitter).to_le_bytes());
            }
        }
        std::fs::write(dir.join(format!("img{i:05}.bin")), bytes).unwrap();
        std::fs::write(dir.join(format!("img{i:05}.cls")), class.to_string()).unwrap();
    }
}

fn train_args<'a>(data: &'a str, extra: &[&'a str]) -> Vec<String> {
    let mut args: Vec<String> = ["run", "pytorch-ddp", "--set"].iter().map(|s| s.to_string()).collect();
    args.push(format!("data={data}"));
    // The Python with torch, named as a user names theirs (tests/run's virtualenv).
    let python = std::env::var("TRAINYARD_TEST_PYTHON").expect("TRAINYARD_TEST_PYTHON: run through tests/run");
    args.extend(["--set".to_string(), format!("python={python}")]);
    for set in ["replicas=2", "cpu=0.5", "memory=1Gi", "batch_size=32", "workers=1", "precision=bf16"] {
        args.push("--set".into());
        args.push(set.into());
    }
    args.extend(extra.iter().map(|s| s.to_string()));
    args
}

/// The job's checkpoint folder: in the tenant's `checkpoints` volume (the template's default),
/// which the first run made, under `jobs/<job id>/checkpoints`.
fn checkpoint_folder(env: &TestEnv, job: &str) -> PathBuf {
    let volumes = env.data_dir().join("volumes");
    let tenants: Vec<PathBuf> =
        std::fs::read_dir(&volumes).map(|dir| dir.flatten().map(|e| e.path()).collect()).unwrap_or_default();
    let found: Vec<PathBuf> = tenants
        .into_iter()
        .map(|tenant| tenant.join("checkpoints/jobs").join(job).join("checkpoints"))
        .filter(|folder| folder.is_dir())
        .collect();
    found.into_iter().next().unwrap_or_else(|| volumes.join("(no checkpoint folder yet)"))
}

fn checkpoint_step(env: &TestEnv, job: &str) -> Option<u64> {
    let latest = checkpoint_folder(env, job).join("latest.json");
    let text = std::fs::read_to_string(latest).ok()?;
    serde_json::from_str::<Value>(&text).ok()?["step"].as_u64()
}

async fn wait_for_checkpoint(env: &TestEnv, job: &str, at_least: u64) {
    let deadline = std::time::Instant::now() + Duration::from_secs(180);
    while checkpoint_step(env, job).is_none_or(|s| s < at_least) {
        let (_, state) = env.get(&format!("/api/v1/jobs/{job}"), &env.admin_token).await;
        assert!(
            std::time::Instant::now() < deadline && state["finished_at"].is_null(),
            "no checkpoint {at_least}: {state}"
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

fn log_of(env: &TestEnv, job: &str, attempt: u32, replica: u32) -> String {
    let path = env.data_dir().join("jobs").join(job).join(format!("attempt-{attempt}/replica-{replica}.log"));
    std::fs::read_to_string(path).unwrap_or_default()
}

fn submit(env: &TestEnv, args: &[String]) -> String {
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    let out = env.yard(&env.admin_token, &args);
    assert!(out.status.success(), "{} {}", stdout(&out), stderr(&out));
    stdout(&out).trim().lines().last().unwrap().to_string()
}

#[tokio::test(flavor = "multi_thread")]
async fn the_example_trains_on_two_replicas_and_its_loss_falls() {
    let env = TestEnv::start().await;
    let data = packed_dataset(&env).await;
    let args = train_args(
        data.to_str().unwrap(),
        &["--set", "epochs=4", "--set", "checkpoint_every=20", "--wait", "-o", "json"],
    );
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    let trained = env.yard(&env.admin_token, &args);
    assert!(trained.status.success(), "{} {}", stdout(&trained), stderr(&trained));
    let job: Value = serde_json::from_slice(&trained.stdout).unwrap();
    let id = job["id"].as_str().unwrap();
    assert_eq!(job["state"], "succeeded");

    let (_, metrics) = env.get(&format!("/api/v1/jobs/{id}/metrics"), &env.admin_token).await;
    let series =
        |name: &str| -> Vec<f64> {
            metrics["series"].as_array().unwrap().iter().find(|s| s["name"] == name).map_or_else(Vec::new, |s| {
                s["values"].as_array().unwrap().iter().map(|v| v.as_f64().unwrap()).collect()
            })
        };
    let loss = series("loss");
    assert!(loss.len() >= 3, "{metrics}");
    assert!(loss.last().unwrap() < &(loss[0] * 0.5), "the loss falls by a clear margin: {loss:?}");
    assert!(!series("samples_per_second").is_empty() && !series("input_stall_seconds").is_empty());
    let shares = series("input_stall_share");
    assert!(!shares.is_empty() && shares.iter().all(|v| (0.0..=1.0).contains(v)), "input_stall_share: {shares:?}");
    assert!(checkpoint_step(&env, id).is_some_and(|s| s > 0), "a checkpoint exists");

    // Beside it, a script that logs with MLflow (issue 42): the compare page charts the engine's
    // loss and the MLflow-logged one on one chart.
    let script = "import mlflow\nwith mlflow.start_run():\n    for step in range(5):\n        mlflow.log_metric('loss', 2.0 / (step + 1), step=step)\n";
    let logged = env.submit(serde_json::json!({"name": "mlflow-beside", "command": ["python3", "-c", script]})).await;
    env.wait_state(&logged, "succeeded", Duration::from_secs(120)).await;
    let web = trainyard_tests::web::WebClient::signed_in(&env.server.url, &env.admin_token).await;
    let (status, page) = web.get(&format!("/compare?jobs={id},{logged}&metric=loss")).await;
    assert_eq!(status, trainyard_tests::StatusCode::OK);
    let chart = trainyard_tests::web::compare_chart_of(&page).unwrap_or_else(|| panic!("no chart: {page}"));
    assert!(trainyard_tests::web::chart_points_of(&chart, id) > 0, "the engine's loss: {chart}");
    assert_eq!(trainyard_tests::web::chart_points_of(&chart, &logged), 5, "the 5 logged through MLflow: {chart}");
}

#[tokio::test(flavor = "multi_thread")]
async fn a_killed_replica_restarts_the_job_from_its_last_checkpoint() {
    let env = TestEnv::start().await;
    let data = packed_dataset(&env).await;
    let args = train_args(
        data.to_str().unwrap(),
        &["--set", "epochs=1000", "--set", "max_steps=300", "--set", "checkpoint_every=10", "--max-restarts", "2"],
    );
    let id = submit(&env, &args);
    wait_for_checkpoint(&env, &id, 20).await;
    let pids = env.replica_pids(&id, 1).await;
    nix::sys::signal::killpg(nix::unistd::Pid::from_raw(pids[1] as i32), nix::sys::signal::Signal::SIGKILL).unwrap();

    let job = env.wait_job(&id, Duration::from_secs(240), |j| j["finished_at"].is_string()).await;
    assert_eq!(job["state"], "succeeded", "{job}");
    assert!(job["restart_count"].as_u64().unwrap() >= 1);
    let resumed = log_of(&env, &id, 2, 0);
    let from: u64 = resumed
        .lines()
        .find_map(|l| l.strip_prefix("resuming from step ")?.split(' ').next()?.parse().ok())
        .unwrap_or_else(|| panic!("attempt 2 did not resume from a checkpoint:\n{resumed}"));
    assert!(from >= 20, "resumed from step {from}");
    assert!(!resumed.contains("step 10 loss"), "the step counter continues; it does not restart at 0");
    assert_eq!(checkpoint_step(&env, &id), Some(300));
    // The checkpoints are in the tenant's volume, made by the first run (20Gi, every replica
    // may write), not in a working folder.
    let (_, volumes) = env.get("/api/v1/volumes", &env.admin_token).await;
    let volume = volumes.as_array().unwrap().iter().find(|v| v["name"] == "checkpoints").expect("a checkpoints volume");
    assert_eq!(volume["size_bytes"], 20u64 << 30, "{volume}");
    assert_eq!(volume["access_mode"], "ReadWriteMany", "{volume}");
    assert!(!env.data_dir().join("jobs").join(&id).join("work-2/replica-0/checkpoints").exists());
    // Retention (keep_checkpoints, 3 by default): only the newest three of the 30 written stay.
    let folder = checkpoint_folder(&env, &id);
    let mut kept: Vec<String> = std::fs::read_dir(&folder)
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .filter(|name| name.starts_with("ckpt-"))
        .collect();
    kept.sort();
    assert_eq!(kept, ["ckpt-00000280.pt", "ckpt-00000290.pt", "ckpt-00000300.pt"]);
}

#[tokio::test(flavor = "multi_thread")]
async fn cancelling_training_writes_a_final_checkpoint_within_the_grace_period() {
    let env = TestEnv::start().await;
    let data = packed_dataset(&env).await;
    let args = train_args(data.to_str().unwrap(), &["--set", "epochs=1000", "--set", "checkpoint_every=1000"]);
    let id = submit(&env, &args);
    // Training is under way once it reports a loss (every 10 steps).
    env.wait_job(&id, Duration::from_secs(120), |j| j["state"] == "running").await;
    let deadline = std::time::Instant::now() + Duration::from_secs(120);
    while !log_of(&env, &id, 1, 0).contains("step 10 loss") {
        assert!(std::time::Instant::now() < deadline, "no training progress:\n{}", log_of(&env, &id, 1, 0));
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    assert_eq!(checkpoint_step(&env, &id), None, "no checkpoint yet (every 1000 steps)");
    let cancelled = env.yard(&env.admin_token, &["cancel", &id]);
    assert!(cancelled.status.success());
    env.wait_state(&id, "cancelled", Duration::from_secs(30)).await;
    let log = log_of(&env, &id, 1, 0);
    assert!(log.contains("stopping on SIGTERM after a final checkpoint"), "{log}");
    assert!(
        checkpoint_step(&env, &id).is_some_and(|s| s >= 10),
        "the final checkpoint was written within the 2 s grace period"
    );
}

#[tokio::test(flavor = "multi_thread")]
async fn bad_user_code_fails_the_job_with_the_python_error() {
    let env = TestEnv::start().await;
    let data = packed_dataset(&env).await;
    let module = env.dir.path().join("broken.py");
    std::fs::write(&module, "import numpy_but_misspelled_xyz\n").unwrap();
    let user = format!("user_module={}", module.display());
    let args = train_args(data.to_str().unwrap(), &["--set", &user]);
    let id = submit(&env, &args);
    let job = env.wait_job(&id, Duration::from_secs(120), |j| j["finished_at"].is_string()).await;
    assert_eq!(job["state"], "failed");
    let reason = job["reason"].as_str().unwrap();
    assert!(reason.contains("ModuleNotFoundError: No module named 'numpy_but_misspelled_xyz'"), "{reason}");
    assert!(log_of(&env, &id, 1, 0).contains("Traceback"));
}

/// The template's engine folder in the source tree.
fn engine_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../templates/pytorch-ddp/engine")
}

#[tokio::test(flavor = "multi_thread")]
async fn user_code_from_a_git_commit_runs_and_is_recorded() {
    let env = TestEnv::start().await;
    let data = packed_dataset(&env).await;
    // A team's repository: the example model, committed; then a later, broken commit.
    let repo = env.dir.path().join("team-repo");
    std::fs::create_dir_all(repo.join("models")).unwrap();
    let git = |args: &[&str]| {
        let out = std::process::Command::new("git").current_dir(&repo).args(args).output().unwrap();
        assert!(out.status.success(), "git {args:?}: {}", String::from_utf8_lossy(&out.stderr));
        String::from_utf8(out.stdout).unwrap().trim().to_string()
    };
    git(&["init", "--quiet"]);
    std::fs::copy(engine_dir().join("example.py"), repo.join("models/net.py")).unwrap();
    git(&["add", "."]);
    git(&["-c", "user.name=t", "-c", "user.email=t@t", "commit", "--quiet", "-m", "model"]);
    let good = git(&["rev-parse", "HEAD"]);
    std::fs::write(repo.join("models/net.py"), "raise RuntimeError('the newest commit is broken')\n").unwrap();
    git(&["-c", "user.name=t", "-c", "user.email=t@t", "commit", "--quiet", "-am", "broken"]);

    let args = train_args(
        data.to_str().unwrap(),
        &[
            "--set",
            &format!("user_repo=file://{}", repo.display()),
            "--set",
            &format!("user_commit={good}"),
            "--set",
            "user_module=models/net.py",
            "--set",
            "replicas=1",
            "--set",
            "epochs=1",
            "--wait",
            "-o",
            "json",
        ],
    );
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    let ran = env.yard(&env.admin_token, &args);
    assert!(
        ran.status.success(),
        "the pinned commit runs, not the broken newest one: {} {}",
        stdout(&ran),
        stderr(&ran)
    );
    let job: Value = serde_json::from_slice(&ran.stdout).unwrap();
    let (_, outputs) =
        env.get(&format!("/api/v1/jobs/{}/outputs", job["id"].as_str().unwrap()), &env.admin_token).await;
    assert_eq!(outputs["code"]["commit"], good.as_str(), "the job records the exact commit it ran");
}
