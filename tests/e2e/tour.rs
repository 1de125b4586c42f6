//! The README's quick tour, run as written: its ```sh block, read from README.md by its heading
//! (so the two cannot drift), runs step by step in one bash against `trainyard dev` (what
//! `deploy/dev` runs) on 2 CPUs and no GPU, the machine the README targets. Every step must exit
//! 0 within its time; a failure names the step's README line, its exit code and its output.
//!
//! Two lines run differently from what a reader pastes, and only these two:
//! - `export PATH=$PWD/target/release:$PATH`: the test puts the binaries it was built with
//!   (target/debug) first on PATH instead; it does not build a release.
//! - `yard login ...`: replaced by the `yard login` line `trainyard dev` printed, with its real
//!   port and token.

use std::io::{BufRead, BufReader, Write};
use std::os::unix::fs::PermissionsExt;
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Child, ChildStdin, Command, Stdio};
use std::time::{Duration, Instant};

use trainyard_tests::{bin, job_process_groups};

const TOUR_HEADING: &str = "## A quick tour";
/// The tour's first command, which the test replaces by its own binaries on PATH.
const PATH_LINE: &str = "export PATH=$PWD/target/release:$PATH";
/// The tour's login command as the README shows it, which the test replaces by the one the
/// server printed.
const LOGIN_LINE: &str = "yard login --url http://127.0.0.1:8080 --token tyd_...";

/// One step of the tour: a command line with its continuation lines.
struct Step {
    /// Its first line's number in README.md.
    line: usize,
    text: String,
}

impl Step {
    /// The step without its trailing comment (for a one-line step).
    fn command(&self) -> &str {
        self.text.split(" #").next().unwrap_or_default().trim()
    }
}

/// The lines of the first ```sh block under the tour's heading, with their README line numbers.
fn tour_block(readme: &str) -> Vec<(usize, &str)> {
    let lines: Vec<(usize, &str)> = readme.lines().enumerate().map(|(i, l)| (i + 1, l)).collect();
    let heading = lines.iter().position(|(_, l)| l.trim_end() == TOUR_HEADING).expect("README.md has a quick tour");
    let section = &lines[heading + 1..];
    let section = &section[..section.iter().position(|(_, l)| l.starts_with("## ")).unwrap_or(section.len())];
    let open = section.iter().position(|(_, l)| l.trim_end() == "```sh").expect("the tour has a ```sh block");
    let block = &section[open + 1..];
    let close = block.iter().position(|(_, l)| l.trim_end() == "```").expect("the tour's block is closed");
    block[..close].to_vec()
}

/// Whether bash would read `text` as complete commands (no open quote, parenthesis, heredoc).
fn complete_for_bash(text: &str) -> bool {
    let checked = Command::new("bash").args(["-n", "-c", text]).stderr(Stdio::null()).status().expect("run bash -n");
    checked.success()
}

/// Splits the block into steps: blank and comment lines are skipped; a line ending in `\`, or
/// one that leaves a quote or parenthesis open, continues into the next.
fn steps(block: &[(usize, &str)]) -> Vec<Step> {
    let mut steps = Vec::new();
    let mut current: Option<Step> = None;
    for &(number, line) in block {
        let step = match current.take() {
            Some(mut step) => {
                step.text.push('\n');
                step.text.push_str(line);
                step
            }
            None if line.trim().is_empty() || line.trim_start().starts_with('#') => continue,
            None => Step { line: number, text: line.to_string() },
        };
        if step.text.ends_with('\\') || !complete_for_bash(&step.text) {
            current = Some(step);
        } else {
            steps.push(step);
        }
    }
    if let Some(step) = current {
        panic!("README.md:{}: the tour ends inside a step bash cannot parse:\n{}", step.line, step.text);
    }
    steps
}

/// The most a step may take on the 2-core machine the README targets, also while the rest of
/// the test suite runs beside it: a step slower than this no longer belongs in a tour.
fn step_limit(step: &str) -> Duration {
    let seconds = if step.contains("pytorch-ddp") || step.contains("yard rerun") {
        // PyTorch starting on 2 replicas and training (about 8 s on an idle machine).
        120
    } else if step.contains("wait") {
        60
    } else {
        20
    };
    Duration::from_secs(seconds)
}

/// `trainyard dev` on a fresh data directory; stopped with Ctrl-C (and its jobs killed) on drop.
struct DevServer {
    child: Child,
    data_dir: PathBuf,
    log: PathBuf,
    /// The `yard login ...` line it printed.
    login: String,
}

impl DevServer {
    fn start(dir: &Path) -> DevServer {
        let data_dir = dir.join("data");
        let log = dir.join("server.log");
        let port = std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port();
        // 2 CPUs wherever the test runs: the tour must fit the smallest machine the README targets.
        let mut child = Command::new(bin("trainyard"))
            .args(["dev", "--cpus", "2", "--listen", &format!("127.0.0.1:{port}"), "--data-dir"])
            .arg(&data_dir)
            .env_remove("TRAINYARD_DATABASE_URL")
            .stdout(Stdio::piped())
            .stderr(std::fs::File::create(&log).unwrap())
            .spawn()
            .expect("start trainyard dev");
        let mut lines = BufReader::new(child.stdout.take().unwrap()).lines();
        let mut login = None;
        for line in lines.by_ref() {
            let line = line.unwrap();
            if let Some(command) = line.trim().strip_prefix("sign in:") {
                login = Some(command.trim().to_string());
            }
            if line.trim_start().starts_with("stop:") {
                break;
            }
        }
        // Keep reading so that the server never writes into a closed pipe.
        std::thread::spawn(move || lines.for_each(drop));
        let mut server = DevServer { child, data_dir, log, login: String::new() };
        match login {
            Some(login) => server.login = login,
            None => panic!("trainyard dev printed no sign-in line; {}", server.log_tail()),
        }
        server
    }

    fn log_tail(&self) -> String {
        let log = std::fs::read_to_string(&self.log).unwrap_or_default();
        format!("the server's log ends:\n{}", tail(&log, 3000))
    }
}

impl Drop for DevServer {
    fn drop(&mut self) {
        let pid = nix::unistd::Pid::from_raw(self.child.id() as i32);
        let _ = nix::sys::signal::kill(pid, nix::sys::signal::Signal::SIGINT);
        let deadline = Instant::now() + Duration::from_secs(30);
        while self.child.try_wait().ok().flatten().is_none() && Instant::now() < deadline {
            std::thread::sleep(Duration::from_millis(100));
        }
        let _ = self.child.kill();
        let _ = self.child.wait();
        // Jobs outlive `trainyard dev` by design; the tour's must not outlive the test.
        for pgid in job_process_groups(&self.data_dir) {
            if let Ok(raw) = i32::try_from(pgid) {
                let _ = nix::sys::signal::killpg(nix::unistd::Pid::from_raw(raw), nix::sys::signal::Signal::SIGKILL);
            }
        }
    }
}

/// One bash that every step runs in, in turn, so that a step sees the variables and the folder
/// the steps before it left, as in a reader's terminal.
struct Shell {
    child: Child,
    stdin: ChildStdin,
    /// Where each step's output and exit code are written.
    dir: PathBuf,
}

/// How a step ended, when not with exit code 0 in time.
enum StepFailure {
    Exit(i32),
    TimedOut,
    /// The shell itself ended (bash exits on an unset variable under `set -u`), with this status.
    ShellGone(Option<i32>),
}

impl Shell {
    fn start(cwd: &Path, home: &Path, tmp: &Path, dir: &Path) -> Shell {
        let mut child = Command::new("bash")
            .args(["--noprofile", "--norc"])
            .current_dir(cwd)
            .env("HOME", home)
            .env("TMPDIR", tmp)
            .env_remove("BASH_ENV")
            .env_remove("XDG_CONFIG_HOME")
            .env_remove("TRAINYARD_URL")
            .env_remove("TRAINYARD_TOKEN")
            .stdin(Stdio::piped())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            // Its own process group, so that a step that overruns is stopped with all it started.
            .process_group(0)
            .spawn()
            .expect("start bash");
        let stdin = child.stdin.take().unwrap();
        let mut shell = Shell { child, stdin, dir: dir.to_path_buf() };
        // Stricter than a terminal: a variable the tour never set, or a failing pipe, fails the step.
        shell.send("set -u -o pipefail\n");
        shell
    }

    fn send(&mut self, text: &str) {
        self.stdin.write_all(text.as_bytes()).and_then(|()| self.stdin.flush()).expect("write to bash");
    }

    fn output_of(&self, n: usize) -> String {
        std::fs::read_to_string(self.dir.join(format!("step-{n}.out"))).unwrap_or_default()
    }

    /// Runs step `n` in the shell (braces keep it in the shell itself, so `cd` and assignments
    /// last) and waits at most `limit` for its exit code.
    fn run(&mut self, n: usize, text: &str, limit: Duration) -> Result<(), StepFailure> {
        let (out, rc) = (self.dir.join(format!("step-{n}.out")), self.dir.join(format!("step-{n}.rc")));
        self.send(&format!(
            "{{\n{text}\n}} > '{out}' 2>&1 < /dev/null; echo $? > '{rc}.part' && mv '{rc}.part' '{rc}'\n",
            out = out.display(),
            rc = rc.display()
        ));
        let deadline = Instant::now() + limit;
        loop {
            if let Ok(code) = std::fs::read_to_string(&rc) {
                return match code.trim().parse::<i32>() {
                    Ok(0) => Ok(()),
                    Ok(code) => Err(StepFailure::Exit(code)),
                    Err(_) => Err(StepFailure::ShellGone(None)),
                };
            }
            if let Some(status) = self.child.try_wait().ok().flatten() {
                return Err(StepFailure::ShellGone(status.code()));
            }
            if Instant::now() >= deadline {
                return Err(StepFailure::TimedOut);
            }
            std::thread::sleep(Duration::from_millis(50));
        }
    }
}

impl Drop for Shell {
    fn drop(&mut self) {
        let group = nix::unistd::Pid::from_raw(self.child.id() as i32);
        let _ = nix::sys::signal::killpg(group, nix::sys::signal::Signal::SIGKILL);
        let _ = self.child.wait();
    }
}

fn tail(text: &str, bytes: usize) -> &str {
    let start = text.len().saturating_sub(bytes);
    let start = (start..text.len()).find(|&i| text.is_char_boundary(i)).unwrap_or(text.len());
    &text[start..]
}

fn indent(text: &str) -> String {
    if text.trim().is_empty() {
        return "    (nothing)\n".to_string();
    }
    text.lines().map(|l| format!("    {l}\n")).collect()
}

#[test]
fn the_readme_tour_runs_as_written_step_by_step() {
    let repo = Path::new(env!("CARGO_MANIFEST_DIR")).parent().expect("the workspace root").to_path_buf();
    let readme = std::fs::read_to_string(repo.join("README.md")).expect("README.md");
    let steps = steps(&tour_block(&readme));
    let python = repo.join("target/pyvenv/bin/python");
    assert!(python.is_file(), "{} is missing: tests/run makes it (the tour's pytorch-ddp uses it)", python.display());

    let scratch = tempfile::Builder::new().prefix("trainyard-tour-").tempdir().unwrap();
    // When the tests run as root, Postgres runs as `postgres` and the jobs as their tenant's
    // user: both must reach into this folder.
    std::fs::set_permissions(scratch.path(), std::fs::Permissions::from_mode(0o755)).unwrap();
    let (home, tmp, steps_dir) =
        (scratch.path().join("home"), scratch.path().join("tmp"), scratch.path().join("steps"));
    for dir in [&home, &tmp, &steps_dir] {
        std::fs::create_dir(dir).unwrap();
    }
    let server = DevServer::start(scratch.path());
    let binaries = bin("yard").parent().expect("the binaries' folder").to_path_buf();

    // What runs: every step as written, but for the two substitutions the module's doc names.
    let runs: Vec<String> = steps
        .iter()
        .map(|step| match step.command() {
            PATH_LINE => format!("export PATH='{}':$PATH", binaries.display()),
            LOGIN_LINE => server.login.clone(),
            _ => step.text.clone(),
        })
        .collect();
    for (substituted, what) in [(PATH_LINE, "its binaries on PATH"), (LOGIN_LINE, "the server's login line")] {
        assert!(
            steps.iter().any(|step| step.command() == substituted),
            "the tour has no line `{substituted}` any more, which the test replaces by {what}: update the test"
        );
    }

    // The reader stands in the repository (the tour names target/ from there); the tour's own
    // files go to the scratch folder it makes with mktemp, here inside the test's folder.
    let mut shell = Shell::start(&repo, &home, &tmp, &steps_dir);
    let tour_started = Instant::now();
    let mut timings = Vec::new();
    for (n, (step, text)) in steps.iter().zip(&runs).enumerate() {
        let limit = step_limit(&step.text);
        let started = Instant::now();
        let result = shell.run(n, text, limit);
        let took = started.elapsed();
        let how = match result {
            Ok(()) => {
                timings.push(format!("{:>6.1}s  README.md:{}  {}", took.as_secs_f64(), step.line, step.text));
                continue;
            }
            Err(StepFailure::Exit(code)) => format!("exited with {code} after {:.1} s", took.as_secs_f64()),
            Err(StepFailure::TimedOut) => format!("did not finish within {} s", limit.as_secs()),
            Err(StepFailure::ShellGone(status)) => format!("ended the shell (exit status {status:?})"),
        };
        panic!(
            "README.md:{}: tour step {} of {} {how}:\n{}its output:\n{}{}",
            step.line,
            n + 1,
            steps.len(),
            indent(text),
            indent(tail(&shell.output_of(n), 6000)),
            server.log_tail()
        );
    }
    eprintln!("the tour's steps ({:.1} s in all):\n{}", tour_started.elapsed().as_secs_f64(), timings.join("\n"));
}
