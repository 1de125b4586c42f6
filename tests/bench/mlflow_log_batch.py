"""One arm of tests/bench/mlflow.sh: CLIENTS processes each send BATCHES `runs/log-batch` calls of
1,000 metric points (MLflow's per-request limit) to a tracking server speaking MLflow's REST API,
each into a run of its own, over one kept-alive connection per client, as fast as the server
answers. Every point is new (its step grows), so that a store keyed on the point (MLflow's SQL
store) takes each. Prints one JSON line: points per second over the wall time from the first
request to the last answer, and the latency of a batch (p50, p99).

The body is MLflow's own JSON for LogBatch, as `MlflowClient().log_batch` sends it; the client
library itself is not in the loop (its conversion costs the load generator, not the server)."""
import argparse
import http.client
import json
import multiprocessing
import time
import urllib.parse

POINTS_PER_BATCH = 1000


def call(conn, headers, method, path, body=None):
    conn.request(method, path, body=None if body is None else json.dumps(body), headers=headers)
    response = conn.getresponse()
    data = response.read()
    if response.status != 200:
        raise SystemExit(f"{method} {path}: {response.status} {data[:300]!r}")
    return json.loads(data or b"{}")


def connect(url):
    parsed = urllib.parse.urlparse(url)
    return http.client.HTTPConnection(parsed.hostname, parsed.port, timeout=120)


def worker(url, headers, run_id, batches, start, results):
    conn = connect(url)
    # A first batch outside the measurement: the connection and the server's caches warm.
    bodies = []
    for b in range(batches + 1):
        ts = 1_700_000_000_000 + b
        metrics = [
            {"key": f"m{i % 10}", "value": i * 0.001 + b, "timestamp": ts, "step": b * 100 + i // 10}
            for i in range(POINTS_PER_BATCH)
        ]
        bodies.append(json.dumps({"run_id": run_id, "metrics": metrics}))
    path = "/api/2.0/mlflow/runs/log-batch"

    def send(body):
        conn.request("POST", path, body=body, headers=headers)
        response = conn.getresponse()
        data = response.read()
        if response.status != 200:
            raise SystemExit(f"log-batch: {response.status} {data[:300]!r}")

    send(bodies[0])
    start.wait()
    latencies = []
    for body in bodies[1:]:
        t0 = time.perf_counter()
        send(body)
        latencies.append(time.perf_counter() - t0)
    results.put((time.perf_counter(), latencies))


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--url", required=True)
    parser.add_argument("--token", default="")
    parser.add_argument("--label", required=True)
    parser.add_argument("--clients", type=int, default=16)
    parser.add_argument("--batches", type=int, default=20, help="per client")
    args = parser.parse_args()
    headers = {"Content-Type": "application/json"}
    if args.token:
        headers["Authorization"] = f"Bearer {args.token}"
    conn = connect(args.url)
    name = f"bench-{time.time_ns()}"
    experiment = call(conn, headers, "POST", "/api/2.0/mlflow/experiments/create", {"name": name})["experiment_id"]
    runs = [
        call(conn, headers, "POST", "/api/2.0/mlflow/runs/create",
             {"experiment_id": experiment, "start_time": int(time.time() * 1000)})["run"]["info"]["run_id"]
        for _ in range(args.clients)
    ]
    start = multiprocessing.Barrier(args.clients + 1)
    results = multiprocessing.Queue()
    procs = [
        multiprocessing.Process(target=worker, args=(args.url, headers, run, args.batches, start, results))
        for run in runs
    ]
    for p in procs:
        p.start()
    start.wait()
    began = time.perf_counter()
    ends, latencies = [], []
    for _ in procs:
        end, lat = results.get()
        ends.append(end)
        latencies.extend(lat)
    for p in procs:
        p.join()
        if p.exitcode != 0:
            raise SystemExit(f"a client failed (exit {p.exitcode})")
    wall = max(ends) - began
    points = args.clients * args.batches * POINTS_PER_BATCH
    # Every point landed: one series of one run, read back through the same API (on a new
    # connection: the first one sat idle, and a server may have closed it).
    conn = connect(args.url)
    history = call(conn, headers, "GET", f"/api/2.0/mlflow/metrics/get-history?run_id={runs[0]}&metric_key=m0")
    expected = (args.batches + 1) * POINTS_PER_BATCH // 10
    if len(history.get("metrics", [])) != expected:
        raise SystemExit(f"run {runs[0]}: {len(history.get('metrics', []))} points of m0, expected {expected}")
    latencies.sort()
    print(json.dumps({
        "server": args.label,
        "clients": args.clients,
        "points": points,
        "seconds": round(wall, 3),
        "points_per_second": round(points / wall),
        "batch_p50_ms": round(latencies[len(latencies) // 2] * 1000, 1),
        "batch_p99_ms": round(latencies[min(len(latencies) - 1, int(len(latencies) * 0.99))] * 1000, 1),
    }))


if __name__ == "__main__":
    main()
