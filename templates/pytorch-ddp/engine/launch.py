"""Starts the engine on one replica, torchrun style: one process per GPU of this replica (one on
CPU), each with RANK, WORLD_SIZE and LOCAL_RANK for the whole job, rendezvous at Trainyard's
MASTER_ADDR:MASTER_PORT. Usage: launch.py GPUS_PER_REPLICA train.py ARGS...

Trainyard gives each replica RANK (the replica's) and WORLD_SIZE (replicas); processes get
RANK = replica * G + local and WORLD_SIZE = replicas * G; each process sees the replica's GPUs and
uses the one at LOCAL_RANK (placement.py). SIGTERM and SIGINT are passed on. When a process fails
(outside a requested stop), its siblings and their decode workers are killed at once (a job whose
process is gone cannot take another step, and NCCL peers would otherwise wait in a collective
until its timeout), and the replica exits with the failure's code.
"""
import json
import os
import signal
import subprocess
import sys
import threading
import time
import urllib.request

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import placement  # noqa: E402


def option(args, name):
    prefix = f"--{name}="
    return next((a[len(prefix):] for a in args if a.startswith(prefix)), "")


def fetch_user_code(args):
    """With --user-repo and --user-commit, checks the repository out at exactly that commit into
    user-code/ (argv only, never a shell), points --user-module into it, and records repository
    and commit as the job's `code` output. Returns the arguments to run with."""
    repo, commit = option(args, "user-repo"), option(args, "user-commit")
    if not repo:
        return args
    if not commit:
        sys.exit("trainyard: --user-repo needs --user-commit (a commit id), so the run can be repeated")
    if not os.path.isdir("user-code/.git"):
        # A repository on this machine belongs to whoever made it, not to the user replicas run
        # as (their tenant's): git refuses it unless trusted in the user's own (global) config,
        # which lives in the replica's home, its working directory. Trust that one repository.
        local = repo[len("file://"):] if repo.startswith("file://") else repo if repo.startswith("/") else None
        if local:
            for path in (local.rstrip("/"), local.rstrip("/") + "/.git"):
                subprocess.run(["git", "config", "--global", "--add", "safe.directory", path], check=True)
        subprocess.run(["git", "clone", "--quiet", "--no-checkout", "--", repo, "user-code"], check=True)
    subprocess.run(["git", "-C", "user-code", "checkout", "--quiet", "--detach", commit, "--"], check=True)
    head = subprocess.run(["git", "-C", "user-code", "rev-parse", "HEAD"], check=True, capture_output=True, text=True)
    resolved = head.stdout.strip()
    if os.environ.get("RANK", "0") == "0":
        record_output("code", {"repository": repo, "commit": resolved})
    module = option(args, "user-module")
    return [a for a in args if not a.startswith("--user-module=")] + [f"--user-module=user-code/{module}"]


def record_output(name, value):
    url, token, job = (os.environ.get(k) for k in ("TRAINYARD_URL", "TRAINYARD_TOKEN", "TRAINYARD_JOB_ID"))
    if not (url and token and job):
        return
    request = urllib.request.Request(
        f"{url}/api/v1/jobs/{job}/outputs",
        data=json.dumps({"name": name, "value": value}).encode(),
        headers={"Authorization": f"Bearer {token}", "Content-Type": "application/json"},
    )
    urllib.request.urlopen(request, timeout=10).read()


def descendants(pid):
    """Every process below `pid` (its decode workers and theirs), from /proc."""
    children = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat") as f:
                stat = f.read()
        except OSError:  # gone meanwhile
            continue
        ppid = int(stat[stat.rindex(")") + 2:].split()[1])
        children.setdefault(ppid, []).append(int(entry))
    found, todo = [], [pid]
    while todo:
        for child in children.get(todo.pop(), []):
            found.append(child)
            todo.append(child)
    return found


def kill_tree(process):
    """SIGKILL a process and everything below it (the process first, so it starts no new one)."""
    below = descendants(process.pid)
    for pid in [process.pid] + below:
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass


class Relay:
    """Copies a local process's output (stdout and stderr) to the replica's, line by line,
    keeping its last line: when the replica fails, that of the process that failed first is
    repeated last, since Trainyard takes a failed replica's reason from its log's last line
    (otherwise it could be a sibling's "connection closed" printed after it)."""

    def __init__(self, process):
        self.process, self.last = process, ""
        self.thread = threading.Thread(target=self._copy, daemon=True)
        self.thread.start()

    def _copy(self):
        for line in self.process.stdout:
            sys.stdout.buffer.write(line)
            sys.stdout.buffer.flush()
            if line.strip():
                self.last = line.decode(errors="replace").strip()


def supervise(children, ranks):
    """Waits for the local processes (`ranks` their RANKs); returns the replica's exit code."""
    stopping = {"requested": False}

    def forward(signum, _frame):
        stopping["requested"] = True
        for child in children:
            if child.poll() is None:
                child.send_signal(signum)

    signal.signal(signal.SIGTERM, forward)
    signal.signal(signal.SIGINT, forward)
    relays = [Relay(child) for child in children]
    codes, failures, running = [], [], list(range(len(children)))
    while running:
        time.sleep(0.1)
        for local in [i for i in running if children[i].poll() is not None]:
            running.remove(local)
            code = placement.exit_code(children[local].returncode)
            codes.append(code)
            # On a requested stop the processes end one by one after the final checkpoint.
            if code != 0 and not stopping["requested"]:
                failures.append((code >= 128, local, code))
                for sibling in running:
                    kill_tree(children[sibling])
    for relay in relays:
        relay.thread.join(timeout=5)
    code = placement.replica_exit_code(codes)
    if failures:
        # The first failure of the program's own, else the first: as the exit code.
        _, local, failed = next((f for f in failures if not f[0]), failures[0])
        print(f"trainyard: rank {ranks[local]} exited with code {failed}: {relays[local].last}", flush=True)
    return code


def main():
    per_replica = max(1, int(sys.argv[1]))
    command = [sys.executable] + fetch_user_code(sys.argv[2:])
    replica, replicas = int(os.environ.get("RANK", "0")), int(os.environ.get("WORLD_SIZE", "1"))
    if per_replica == 1:
        os.execve(sys.executable, command, placement.process_env(os.environ, replica, replicas, 1, 0))
    envs = [placement.process_env(os.environ, replica, replicas, per_replica, local) for local in range(per_replica)]
    children = [subprocess.Popen(command, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT) for env in envs]
    sys.exit(supervise(children, [env["RANK"] for env in envs]))


if __name__ == "__main__":
    main()
