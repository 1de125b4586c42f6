"""Starts the engine on one replica, torchrun style: one process per GPU of this replica (one on
CPU), each with RANK, WORLD_SIZE and LOCAL_RANK for the whole job, rendezvous at Trainyard's
MASTER_ADDR:MASTER_PORT. Usage: launch.py GPUS_PER_REPLICA train.py ARGS...

Trainyard gives each replica RANK (the replica's) and WORLD_SIZE (replicas); processes get
RANK = replica * G + local and WORLD_SIZE = replicas * G. SIGTERM is passed on; the first process
to fail stops the others, and its exit code is the replica's.
"""
import json
import os
import signal
import subprocess
import sys
import time
import urllib.request


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


per_replica = max(1, int(sys.argv[1]))
command = [sys.executable] + fetch_user_code(sys.argv[2:])
replica, replicas = int(os.environ.get("RANK", "0")), int(os.environ.get("WORLD_SIZE", "1"))
visible = [d for d in os.environ.get("CUDA_VISIBLE_DEVICES", "").split(",") if d]

if per_replica == 1:
    env = dict(os.environ, LOCAL_RANK="0", LOCAL_WORLD_SIZE="1")
    os.execve(sys.executable, command, env)

children = []
for local in range(per_replica):
    env = dict(os.environ)
    env.update(RANK=str(replica * per_replica + local), WORLD_SIZE=str(replicas * per_replica),
               LOCAL_RANK=str(local), LOCAL_WORLD_SIZE=str(per_replica))
    if visible:
        env["CUDA_VISIBLE_DEVICES"] = visible[local % len(visible)]
    children.append(subprocess.Popen(command, env=env))


def forward(signum, _frame):
    for child in children:
        if child.poll() is None:
            child.send_signal(signum)


signal.signal(signal.SIGTERM, forward)
signal.signal(signal.SIGINT, forward)
code = 0
while any(child.poll() is None for child in children):
    failed = [child.returncode for child in children if child.returncode not in (None, 0)]
    if failed and code == 0:
        code = failed[0]
        forward(signal.SIGTERM, None)
    time.sleep(0.2)
codes = [child.returncode for child in children]
code = code or next((c for c in codes if c), 0)
sys.exit(128 - code if code < 0 else code)  # a signal -N exits as 128 + N, as shells report
