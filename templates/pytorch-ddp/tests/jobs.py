"""Runs the engine as Trainyard's local executor does: one `launch.py` per replica, each in its
own process group and working directory (`replica-<r>/`), with RANK, WORLD_SIZE, LOCAL_RANK,
MASTER_ADDR and MASTER_PORT, and no Trainyard server (metrics are not reported)."""
import json
import os
import signal
import socket
import subprocess
import sys
import time

ENGINE = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "engine")
USER_MODULE = os.path.join(os.path.dirname(os.path.abspath(__file__)), "user_noisy.py")


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Job:
    def __init__(self, folder, data, replicas=2, per_replica=0, env=None, **options):
        """`options` become train.py's --options (underscores as dashes); `env` is added to every
        replica's environment. The sample log (TRAINYARD_TEST_SAMPLE_LOG) is `folder/samples`."""
        self.folder, self.replicas, self.per_replica = str(folder), replicas, per_replica
        self.samples = os.path.join(self.folder, "samples")
        settings = {"data": data, "user_module": USER_MODULE, "epochs": 2, "batch_size": 8, "workers": 2,
                    "precision": "fp32", "checkpoint_every": 10, "log_every": 5, "warmup_steps": 5}
        settings.update(options)
        self.args = [f"--{k.replace('_', '-')}={v}" for k, v in settings.items()]
        self.env = dict(env or {})
        self.processes = []

    def replica_dir(self, replica):
        return os.path.join(self.folder, f"replica-{replica}")

    def start(self):
        os.makedirs(self.samples, exist_ok=True)
        port = free_port()
        for replica in range(self.replicas):
            os.makedirs(self.replica_dir(replica), exist_ok=True)
            env = {k: v for k, v in os.environ.items() if not k.startswith("TRAINYARD_")}
            env.update(RANK=str(replica), WORLD_SIZE=str(self.replicas), LOCAL_RANK=str(replica),
                       LOCAL_WORLD_SIZE=str(self.replicas), MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port),
                       CUDA_VISIBLE_DEVICES="", PYTHONUNBUFFERED="1", PYTHONDONTWRITEBYTECODE="1",
                       TRAINYARD_TEST_SAMPLE_LOG=self.samples)
            env.update(self.env)
            log = open(os.path.join(self.replica_dir(replica), "log"), "ab")
            command = [sys.executable, os.path.join(ENGINE, "launch.py"), str(self.per_replica),
                       os.path.join(ENGINE, "train.py"), *self.args]
            self.processes.append(subprocess.Popen(command, cwd=self.replica_dir(replica), env=env, stdout=log,
                                                   stderr=subprocess.STDOUT, start_new_session=True))
            log.close()
        self.started = time.monotonic()
        return self

    def wait(self, timeout):
        """Exit codes of the replicas; fails the test (after killing them) if they run `timeout`
        seconds more."""
        deadline = time.monotonic() + timeout
        for process in self.processes:
            try:
                process.wait(timeout=max(0.1, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                self.kill()
                raise AssertionError(f"the job did not end within {timeout} s:\n{self.logs()}") from None
        self.ended = time.monotonic()
        return [p.returncode for p in self.processes]

    def kill(self, signum=signal.SIGKILL):
        """Sends `signum` to every process of every replica (each replica's process group)."""
        for process in self.processes:
            try:
                os.killpg(process.pid, signum)
            except ProcessLookupError:
                pass

    def processes_left(self):
        """Processes still in the replicas' process groups (decode workers included)."""
        groups, left = {p.pid for p in self.processes}, []
        for entry in filter(str.isdigit, os.listdir("/proc")):
            try:
                with open(f"/proc/{entry}/stat") as f:
                    stat = f.read()
            except OSError:
                continue
            fields = stat[stat.rindex(")") + 2:].split()
            if int(fields[2]) in groups and fields[0] != "Z":
                left.append(int(entry))
        return left

    def log(self, replica):
        with open(os.path.join(self.replica_dir(replica), "log"), errors="replace") as f:
            return f.read()

    def logs(self):
        return "\n".join(f"--- replica {r} ---\n{self.log(r)[-3000:]}" for r in range(self.replicas))

    def last_line(self, replica):
        return next(line for line in reversed(self.log(replica).splitlines()) if line.strip())

    def steps(self, rank):
        """The sample log of `rank`: one {"epoch", "step", "keys", "loss"} per optimizer step."""
        path = os.path.join(self.samples, f"rank-{rank}.jsonl")
        if not os.path.exists(path):
            return []
        with open(path) as f:
            return [json.loads(line) for line in f if line.endswith("\n")]

    def latest_step(self):
        path = os.path.join(self.replica_dir(0), "checkpoints", "latest.json")
        with open(path) as f:
            return json.load(f)["step"]
