"""Starts the engine on one replica, torchrun style: one process per GPU of this replica (one on
CPU), each with RANK, WORLD_SIZE and LOCAL_RANK for the whole job, rendezvous at Trainyard's
MASTER_ADDR:MASTER_PORT. Usage: launch.py GPUS_PER_REPLICA train.py ARGS...

Trainyard gives each replica RANK (the replica's) and WORLD_SIZE (replicas); processes get
RANK = replica * G + local and WORLD_SIZE = replicas * G. SIGTERM is passed on; the first process
to fail stops the others, and its exit code is the replica's.
"""
import os
import signal
import subprocess
import sys
import time

per_replica = max(1, int(sys.argv[1]))
command = [sys.executable] + sys.argv[2:]
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
