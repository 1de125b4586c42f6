//! `trainyard dev`, the README's first command: private Postgres, token printed once, Ctrl-C
//! stops everything cleanly, and the next start finds the same data.

use std::io::{BufRead, BufReader};
use std::os::unix::fs::PermissionsExt;
use std::process::{Command, Stdio};
use std::time::Duration;

use trainyard_tests::{bin, stderr, stdout};

/// Starts `trainyard dev` and returns it with every line it printed up to the `stop:` line.
fn start_dev(data_dir: &std::path::Path, listen: &str) -> (std::process::Child, Vec<String>) {
    let mut child = Command::new(bin("trainyard"))
        .args(["dev", "--data-dir"])
        .arg(data_dir)
        .args(["--listen", listen])
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let mut lines = BufReader::new(child.stdout.take().unwrap()).lines();
    let mut printed = Vec::new();
    for line in lines.by_ref() {
        let line = line.unwrap();
        let done = line.trim_start().starts_with("stop:");
        printed.push(line);
        if done {
            break;
        }
    }
    std::thread::spawn(move || lines.for_each(drop));
    (child, printed)
}

fn interrupt_and_wait(child: &mut std::process::Child) -> std::process::ExitStatus {
    nix::sys::signal::kill(nix::unistd::Pid::from_raw(child.id() as i32), nix::sys::signal::Signal::SIGINT).unwrap();
    for _ in 0..300 {
        if let Some(status) = child.try_wait().unwrap() {
            return status;
        }
        std::thread::sleep(Duration::from_millis(100));
    }
    let _ = child.kill();
    panic!("trainyard dev did not stop within 30 s of Ctrl-C");
}

#[test]
fn dev_prints_a_working_login_stops_cleanly_and_keeps_its_data() {
    let home = tempfile::Builder::new().prefix("trainyard-dev-").tempdir().unwrap();
    // When the tests run as root, Postgres runs as `postgres` and must reach the data directory.
    std::fs::set_permissions(home.path(), std::fs::Permissions::from_mode(0o755)).unwrap();
    let data_dir = home.path().join(".trainyard");
    let port = std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port();
    let listen = format!("127.0.0.1:{port}");

    let (mut dev, printed) = start_dev(&data_dir, &listen);
    let login =
        printed.iter().find_map(|l| l.trim().strip_prefix("sign in:")).expect("a sign-in line").trim().to_string();
    assert!(printed.iter().any(|l| l.contains(&format!("http://{listen}/"))), "the dashboard URL: {printed:?}");
    let args: Vec<&str> = login.split_whitespace().collect();
    assert_eq!(&args[..4], ["yard", "login", "--url", &format!("http://{listen}")]);

    let yard = |args: &[&str]| {
        Command::new(bin("yard"))
            .args(args)
            .env("HOME", home.path())
            .env_remove("XDG_CONFIG_HOME")
            .env_remove("TRAINYARD_URL")
            .env_remove("TRAINYARD_TOKEN")
            .output()
            .unwrap()
    };
    let logged_in = yard(&args[1..]);
    assert!(logged_in.status.success(), "{}", stderr(&logged_in));
    assert!(printed.iter().any(|l| l.trim().starts_with("it expires:")), "the admin token's expiry: {printed:?}");
    // The same login with the token on standard input: out of the process list and the history.
    assert_eq!(args[4], "--token");
    let mut piped = Command::new(bin("yard"))
        .args(["login", "--url", args[3]])
        .env("HOME", home.path())
        .env_remove("XDG_CONFIG_HOME")
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    std::io::Write::write_all(&mut piped.stdin.take().unwrap(), format!("{}\n", args[5]).as_bytes()).unwrap();
    let from_stdin = piped.wait_with_output().unwrap();
    assert!(from_stdin.status.success() && stderr(&from_stdin).contains("Signed in"), "{}", stderr(&from_stdin));
    let config = home.path().join(".config/trainyard/config.json");
    assert_eq!(std::fs::metadata(&config).unwrap().permissions().mode() & 0o777, 0o600, "the token file is private");
    let submitted = yard(&["submit", "--name", "hello", "--", "echo", "hello"]);
    assert!(submitted.status.success(), "{}", stderr(&submitted));
    let id = stdout(&submitted).trim().to_string();
    let waited = yard(&["wait", &id, "--timeout", "60"]);
    assert!(waited.status.success(), "{}", stdout(&waited));

    let status = interrupt_and_wait(&mut dev);
    assert!(status.success(), "Ctrl-C ends trainyard dev cleanly: {status:?}");
    assert!(!data_dir.join("postgres/pgdata/postmaster.pid").exists(), "Postgres was stopped");
    // Postgres's log holds rows of every tenant in its error details: no other user reads it.
    let log_mode = std::fs::metadata(data_dir.join("postgres/postgres.log")).unwrap().permissions().mode();
    assert_eq!(log_mode & 0o077, 0, "postgres.log is {log_mode:o}");

    // Second start: same data, no new token, the saved login still works.
    let (mut dev, printed) = start_dev(&data_dir, &listen);
    assert!(!printed.iter().any(|l| l.contains("tyd_")), "the token is printed only once: {printed:?}");
    let listed = yard(&["jobs", "ls", "-o", "json"]);
    assert!(listed.status.success(), "{}", stderr(&listed));
    let page: serde_json::Value = serde_json::from_slice(&listed.stdout).unwrap();
    assert_eq!(page["items"][0]["id"], id.as_str());
    assert_eq!(page["items"][0]["state"], "succeeded");
    assert!(interrupt_and_wait(&mut dev).success());
}
