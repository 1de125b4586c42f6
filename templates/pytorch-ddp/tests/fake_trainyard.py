"""A stand-in for Trainyard's API as the engine uses it: it takes the metric points
(`POST /api/v1/jobs/{id}/metrics`) and the engine's part of the run record (`.../record`) and
keeps them, so a test can read what the engine reported. Start it, give a job its `env()`."""
import http.server
import json
import threading


class FakeTrainyard:
    def __init__(self, job="job-1", token="job-token"):
        self.job, self.token = job, token
        self.metrics, self.records = [], []
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
                else:
                    self.send_response(404)
                self.send_header("Content-Length", "0")
                self.end_headers()

            def log_message(self, *_):
                pass

        self.server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

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
