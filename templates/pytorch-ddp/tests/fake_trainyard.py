"""A stand-in for Trainyard's API as the engine uses it: it takes the metric points
(`POST /api/v1/jobs/{id}/metrics`), the engine's part of the run record (`.../record`) and its
node cache reports (`.../cached-datasets`) and keeps them, so a test can read what the engine reported; and it serves the files of the packed
dataset folders given to `serve_dataset` (`GET /api/v1/datasets/{name}/{version}/files/{file}`),
counting the shard bytes it sent. Start it, give a job its `env()`."""
import collections
import http.server
import json
import os
import re
import threading
import urllib.parse

DATASET_FILE = re.compile(r"/api/v1/datasets/([^/]+)/([^/]+)/files/([^/]+)")


class FakeTrainyard:
    def __init__(self, job="job-1", token="job-token"):
        self.job, self.token = job, token
        self.metrics, self.records, self.cache_reports = [], [], []
        # (name, version) -> folder; what was sent of shard files; files answered with changed
        # bytes; file -> how many more requests get 503.
        self.datasets = {}
        self.shard_bytes_served = 0
        # file name -> times served (200).
        self.files_served = collections.Counter()
        self.tampered = set()
        self.unavailable = collections.Counter()
        self.lock = threading.Lock()
        owner = self

        class Handler(http.server.BaseHTTPRequestHandler):
            def do_POST(self):
                body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
                if self.headers.get("Authorization") != f"Bearer {owner.token}":
                    self.send_response(401)
                elif self.path == f"/api/v1/jobs/{owner.job}/metrics":
                    owner.metrics += body["points"]
                    self.send_response(200)
                elif self.path == f"/api/v1/jobs/{owner.job}/record":
                    owner.records.append(body)
                    self.send_response(200 if len(owner.records) == 1 else 409)
                elif self.path == f"/api/v1/jobs/{owner.job}/cached-datasets":
                    owner.cache_reports.append(body)
                    self.send_response(204)
                else:
                    self.send_response(404)
                self.send_header("Content-Length", "0")
                self.end_headers()

            def do_GET(self):
                status, body = owner.dataset_file(self.path, self.headers.get("Authorization"))
                self.send_response(status)
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, *_):
                pass

        self.server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def serve_dataset(self, name, version, folder):
        """Serves the packed dataset `folder` (holding dataset.json) as `name@version`."""
        self.datasets[(name, version)] = str(folder)

    def dataset_file(self, path, authorization):
        """(status, body) of a GET of `path`: a file of a served dataset that its manifest names
        (dataset.json, a shard, an index) and its folder holds, with this server's job token."""
        if authorization != f"Bearer {self.token}":
            return 401, b""
        match = DATASET_FILE.fullmatch(path)
        if match is None:
            return 404, b""
        name, version, file = (urllib.parse.unquote(part) for part in match.groups())
        folder = self.datasets.get((name, version))
        if folder is None:
            return 404, b""
        with open(os.path.join(folder, "dataset.json")) as f:
            manifest = json.load(f)["shards"]
        shards = {s["name"] for s in manifest}
        named = shards | {s.get("index") for s in manifest} | {"dataset.json"}
        if file not in named or not os.path.isfile(os.path.join(folder, file)):
            return 404, b""
        with self.lock:
            if self.unavailable[file] > 0:
                self.unavailable[file] -= 1
                return 503, b""
        with open(os.path.join(folder, file), "rb") as f:
            body = f.read()
        if file in self.tampered:
            body = bytes([body[0] ^ 0xFF]) + body[1:]
        with self.lock:
            self.files_served[file] += 1
            if file in shards:
                self.shard_bytes_served += len(body)
        return 200, body

    def env(self):
        """What a replica needs to report here."""
        return {"TRAINYARD_URL": f"http://127.0.0.1:{self.server.server_address[1]}",
                "TRAINYARD_TOKEN": self.token, "TRAINYARD_JOB_ID": self.job}

    def series(self, name):
        """(step, value) of every point of metric `name`, in the order they came."""
        return [(p["step"], p["value"]) for p in self.metrics if p["name"] == name]

    def close(self):
        self.server.shutdown()
        self.server.server_close()
