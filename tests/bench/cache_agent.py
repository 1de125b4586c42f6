"""One arm of tests/bench/cache_agent.sh: the engine's own reader (`engine/remote.py`, what a
replica does before its first step) makes its view of a dataset pushed to the object store, and
the time it took and the shard bytes the server sent meanwhile are printed as one JSON line.

Arms: `server` (no agent: every shard from the server, into the view's private cache, as a pod
without the agent), `agent` (through the node's cache agent: TRAINYARD_DATASET_URL), `local`
(the local executor's machine cache, TRAINYARD_CACHE_DIR, already warm: no copy at all)."""
import argparse
import json
import os
import sys
import time
import urllib.request

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, os.path.join(ROOT, "templates", "pytorch-ddp", "engine"))
import remote  # noqa: E402


def shard_bytes_served(url, token):
    """The server's count of shard bytes sent, every tenant."""
    request = urllib.request.Request(f"{url}/metrics", headers={"Authorization": f"Bearer {token}"})
    with urllib.request.urlopen(request, timeout=30) as response:
        text = response.read().decode()
    total = 0.0
    for line in text.splitlines():
        if line.startswith("trainyard_dataset_bytes_served_total{") and 'kind="shard"' in line:
            total += float(line.rsplit(" ", 1)[1])
    return int(total)


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--arm", choices=["server", "agent", "local"], required=True)
    parser.add_argument("--label", required=True)
    parser.add_argument("--url", required=True)
    parser.add_argument("--agent-url")
    parser.add_argument("--cache-dir")
    parser.add_argument("--dataset", required=True)
    args = parser.parse_args()
    token = os.environ["TRAINYARD_TOKEN"]
    environ = {"TRAINYARD_URL": args.url, "TRAINYARD_TOKEN": token}
    if args.arm == "agent":
        environ["TRAINYARD_DATASET_URL"] = args.agent_url
    if args.arm == "local":
        environ.update(TRAINYARD_CACHE_DIR=args.cache_dir, TRAINYARD_CACHE_NAMESPACE="bench", TRAINYARD_CACHE_PRIVATE="1")
    name, version = args.dataset.split("@")
    before = shard_bytes_served(args.url, token)
    start = time.monotonic()
    view = remote.dataset_view(remote.DatasetRef(name, version), environ=environ)
    seconds = time.monotonic() - start
    shard_bytes = view.shard_bytes
    view.close()
    served = shard_bytes_served(args.url, token) - before
    print(json.dumps({"arm": args.label, "seconds": round(seconds, 3), "shard_bytes": shard_bytes,
                      "mb_per_s": round(shard_bytes / 1e6 / seconds, 1), "from_server": served}), flush=True)


if __name__ == "__main__":
    main()
