"""Launch rate of the Kubernetes executor through the whole control plane, against a real API server.

Driven by tests/bench/kube_launch.sh. Submits N one-replica jobs to a running Trainyard (its
executor pointed at the API server), watches Jobs appear on the API server, plays the kubelet
(each pod marked Running as it appears), and reports Jobs created per second, submit -> Job
latency, and pod running -> job running as Trainyard's API shows it. The peer (the same applies from a minimal client)
is crates/kube/examples/launch_peer.rs.

Usage: kube_launch.py trainyard API_URL TOKEN ADMIN_KUBECONFIG JOBS CLIENTS [fake]  (see kube_launch.sh;
`fake`: against crates/kube/examples/fake_apiserver.rs, which places and runs pods itself)
"""

import json
import ssl
import sys
import threading
import time
import urllib.request
from concurrent.futures import ThreadPoolExecutor

import yaml

CTX = ssl._create_unverified_context()
# One pod in this many is marked Running by the stand-in kubelet.
SAMPLE = 5


def kubeconfig(path):
    """The server URL and bearer token of a token kubeconfig."""
    config = yaml.safe_load(open(path))
    server = config["clusters"][0]["cluster"]["server"]
    token = config["users"][0]["user"]["token"]
    return server, token


def call(method, url, token, body=None, content_type="application/json"):
    data = None if body is None else json.dumps(body).encode()
    request = urllib.request.Request(url, data=data, method=method)
    request.add_header("Authorization", f"Bearer {token}")
    if data is not None:
        request.add_header("Content-Type", content_type)
    with urllib.request.urlopen(request, context=CTX, timeout=60) as response:
        return json.loads(response.read() or b"null")


def nodes(server, token, count):
    """Stand-in nodes (no kubelet): enough CPU and memory for every job."""
    for i in range(count):
        name = f"bench-node-{i}"
        node = {"apiVersion": "v1", "kind": "Node", "metadata": {"name": name}}
        try:
            call("POST", f"{server}/api/v1/nodes", token, node)
        except urllib.error.HTTPError as err:
            if err.code != 409:
                raise
        status = {"status": {"capacity": {"cpu": "512", "memory": "2048Gi", "pods": "1000"},
                             "allocatable": {"cpu": "512", "memory": "2048Gi", "pods": "1000"},
                             "conditions": [{"type": "Ready", "status": "True", "reason": "Bench",
                                             "lastHeartbeatTime": "2026-01-01T00:00:00Z",
                                             "lastTransitionTime": "2026-01-01T00:00:00Z"}]}}
        call("PATCH", f"{server}/api/v1/nodes/{name}/status", token, status, "application/merge-patch+json")
        # The API server taints a new node not-ready until a node controller sees its kubelet;
        # none runs here.
        call("PATCH", f"{server}/api/v1/nodes/{name}", token, {"spec": {"taints": None}}, "application/merge-patch+json")


def watch(server, token, path):
    """The events of a watch on the API server, as they come (one hour at most)."""
    url = f"{server}{path}?watch=true&labelSelector=app.kubernetes.io%2Fmanaged-by%3Dtrainyard&allowWatchBookmarks=false"
    request = urllib.request.Request(url)
    request.add_header("Authorization", f"Bearer {token}")
    with urllib.request.urlopen(request, context=CTX, timeout=3600) as response:
        for line in response:
            yield json.loads(line)


class JobWatch(threading.Thread):
    """Records when each Trainyard Job is first seen on the API server, by its job label."""

    def __init__(self, server, token):
        super().__init__(daemon=True)
        self.server, self.token = server, token
        self.seen = {}

    def run(self):
        for event in watch(self.server, self.token, "/apis/batch/v1/jobs"):
            if event["type"] == "ADDED":
                job = event["object"]["metadata"]["labels"].get("trainyard.dev/job")
                self.seen.setdefault(job, time.monotonic())


class Kubelet(threading.Thread):
    """Plays the kubelet: one in SAMPLE of the Trainyard pods the Job controller creates is marked
    Running at once (status subresource, as a kubelet would), and the moment is recorded by job. Against the
    in-memory API server (`patch=False`), which makes its pods Running itself, it only records
    when each appeared."""

    def __init__(self, server, token, patch=True):
        super().__init__(daemon=True)
        self.server, self.token, self.patch = server, token, patch
        self.running = {}
        self.pods = 0

    def run(self):
        for event in watch(self.server, self.token, "/api/v1/pods"):
            meta = event["object"]["metadata"]
            job = meta["labels"].get("trainyard.dev/job")
            if event["type"] != "ADDED" or job in self.running or meta.get("deletionTimestamp"):
                continue
            self.pods += 1
            if not self.patch:
                if event["object"].get("status", {}).get("phase") == "Running":
                    self.running[job] = time.monotonic()
                continue
            # One pod in SAMPLE: marking every pod would double the API server's load while it
            # is the bottleneck of the launches being measured.
            if self.pods % SAMPLE:
                continue
            status = {"status": {"phase": "Running", "containerStatuses": [{
                "name": "replica", "image": "registry.example/runtime:1", "ready": True, "restartCount": 0,
                "imageID": "registry.example/runtime@sha256:" + "3" * 64,
                "state": {"running": {"startedAt": "2026-01-01T00:00:00Z"}}}]}}
            try:
                call("PATCH", f"{self.server}/api/v1/namespaces/{meta['namespace']}/pods/{meta['name']}/status",
                     self.token, status, "application/merge-patch+json")
                self.running[job] = time.monotonic()
            except urllib.error.HTTPError:
                pass


class RunningWatch(threading.Thread):
    """Polls Trainyard for running jobs and records when each is first seen running."""

    def __init__(self, api, token):
        super().__init__(daemon=True)
        self.api, self.token = api, token
        self.seen = {}
        self.stop = False

    def run(self):
        while not self.stop:
            cursor = ""
            while True:
                page = call("GET", f"{self.api}/api/v1/jobs?state=running&limit=500{cursor}", self.token)
                now = time.monotonic()
                for job in page["items"]:
                    self.seen.setdefault(job["id"], now)
                if not page.get("next_cursor"):
                    break
                cursor = f"&cursor={page['next_cursor']}"
            time.sleep(0.1)


def percentile(values, p):
    values = sorted(values)
    return values[min(len(values) - 1, int(p / 100 * len(values)))]


def clear(server, token):
    """Deletes every Trainyard Job left by an earlier run, and their pods at once (with no kubelet
    a pod marked Running would stay Terminating for ever)."""
    selector = "labelSelector=app.kubernetes.io%2Fmanaged-by%3Dtrainyard"
    for plural, prefix in (("jobs", "/apis/batch/v1"), ("pods", "/api/v1")):
        for item in call("GET", f"{server}{prefix}/{plural}?{selector}", token)["items"]:
            meta = item["metadata"]
            try:
                call("DELETE", f"{server}{prefix}/namespaces/{meta['namespace']}/{plural}/{meta['name']}"
                     "?propagationPolicy=Background&gracePeriodSeconds=0", token)
            except urllib.error.HTTPError:
                pass


def trainyard(api, token, admin_kubeconfig, jobs, clients, fake=False):
    server, admin = kubeconfig(admin_kubeconfig)
    clear(server, admin)
    if not fake:
        nodes(server, admin, 3)
    watch = JobWatch(server, admin)
    watch.start()
    kubelet = Kubelet(server, admin, patch=not fake)
    kubelet.start()
    running = RunningWatch(api, token)
    running.start()
    time.sleep(1)
    body = {"command": ["true"], "resources": {"cpu": 1, "memory": "1Gi"}}
    submitted = {}

    def submit(i):
        start = time.monotonic()
        job = call("POST", f"{api}/api/v1/jobs", token, {**body, "name": f"bench-{i}"})
        submitted[job["id"]] = start

    began = time.monotonic()
    with ThreadPoolExecutor(clients) as pool:
        list(pool.map(submit, range(jobs)))
    submit_seconds = time.monotonic() - began
    deadline = time.monotonic() + 600
    while len(watch.seen) < jobs and time.monotonic() < deadline:
        time.sleep(0.2)
    created = [watch.seen[j] for j in submitted if j in watch.seen]
    latencies = [watch.seen[j] - submitted[j] for j in submitted if j in watch.seen]
    span = max(created) - min(created)
    # Then until every job whose pod runs is seen running by Trainyard (or 60 s).
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline and any(j not in running.seen for j in kubelet.running if j in submitted):
        time.sleep(0.2)
    running.stop = True
    lags = [running.seen[j] - kubelet.running[j] for j in submitted if j in kubelet.running and j in running.seen]
    print(json.dumps({
        "jobs": jobs, "submitted_in_s": round(submit_seconds, 2), "jobs_created": len(created),
        "jobs_per_s": round(len(created) / span, 1) if span else None,
        "submit_to_job_p50_s": round(percentile(latencies, 50), 2),
        "submit_to_job_p99_s": round(percentile(latencies, 99), 2),
        "first_to_last_s": round(span, 2),
        # Pod marked Running (by the stand-in kubelet) -> the job seen `running` through the API
        # (polled every 100 ms, so up to 0.1 s of this is the poll).
        "pods_running": len(kubelet.running), "seen_running": len(lags),
        "pod_running_to_job_running_p50_s": round(percentile(lags, 50), 2) if lags else None,
        "pod_running_to_job_running_p99_s": round(percentile(lags, 99), 2) if lags else None,
    }))


if __name__ == "__main__":
    _, _, api, token, admin_kubeconfig, jobs, clients, *rest = sys.argv
    trainyard(api, token, admin_kubeconfig, int(jobs), int(clients), fake=rest == ["fake"])
