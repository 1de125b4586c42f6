"""Stands in for JupyterLab as a session's program (tests/e2e/sessions.rs): serves on
127.0.0.1:$MASTER_PORT, refuses any request without the session's upstream secret, answers
each HTTP request with the headers it got (as JSON), and echoes one WebSocket message. Its
page `attack.html` is what a hostile notebook would serve: a script that tries to read each
`t` URL of its query with the browser's credentials, and says what it could read."""

import base64
import hashlib
import json
import os
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

SECRET = os.environ.get("TRAINYARD_SESSION_SECRET", "")
JOB = os.environ["TRAINYARD_JOB_ID"]
PORT = int(os.environ["MASTER_PORT"])
WS_GUID = "258EAFA5-E914-47DA-95CA-C5AB0DC85B11"
ATTACK = """<!doctype html><title>attack</title><div id="result">running</div><script>
(async () => {
  const out = [];
  for (const target of new URLSearchParams(location.search).getAll("t")) {
    try {
      const answer = await fetch(target, {credentials: "include"});
      out.push("read " + answer.status + " " + (await answer.text()).slice(0, 200).replace(/\\s+/g, " "));
    } catch (e) {
      out.push("refused");
    }
  }
  document.getElementById("result").textContent = out.join(" | ");
})();
</script>"""


class Recorder(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    # Headers and body go in separate writes: without this, Nagle's algorithm holds the body
    # back until the client's delayed ACK (40 ms a request on keep-alive connections).
    disable_nagle_algorithm = True

    def do_GET(self):
        self.answer()

    def do_POST(self):
        self.answer()

    def answer(self):
        if not SECRET or self.headers.get("Authorization") != "token " + SECRET:
            self.reply(403, b"not the session's upstream secret")
            return
        if self.path.split("?")[0].endswith("/bytes"):
            self.stream_bytes(1 << 30)
            return
        if self.path.split("?")[0].endswith("/attack.html"):
            self.reply(200, ATTACK.encode(), "text/html")
            return
        if self.headers.get("Upgrade", "").lower() == "websocket":
            self.websocket_echo()
            return
        length = int(self.headers.get("Content-Length") or 0)
        got = self.rfile.read(length) if length else b""
        body = json.dumps({
            "method": self.command,
            "path": self.path,
            "headers": [[k.lower(), v] for k, v in self.headers.items()],
            "body": got.decode(),
        }).encode()
        self.reply(200, body, "application/json")

    def reply(self, status, body, kind="text/plain"):
        self.send_response(status)
        self.send_header("Content-Type", kind)
        self.send_header("Content-Length", str(len(body)))
        # A lax policy of the program's own, which the proxy must replace.
        self.send_header("Content-Security-Policy", "default-src *")
        self.end_headers()
        self.wfile.write(body)

    def websocket_echo(self):
        key = self.headers["Sec-WebSocket-Key"]
        accept = base64.b64encode(hashlib.sha1((key + WS_GUID).encode()).digest()).decode()
        self.send_response(101)
        self.send_header("Upgrade", "websocket")
        self.send_header("Connection", "Upgrade")
        self.send_header("Sec-WebSocket-Accept", accept)
        self.end_headers()
        self.wfile.flush()
        # Echoes text messages (under 120 bytes) until the client goes.
        while len(head := self.rfile.read(2)) == 2:
            length = head[1] & 0x7F
            if length == 126:
                length = int.from_bytes(self.rfile.read(2), "big")
            mask = self.rfile.read(4) if head[1] & 0x80 else b"\0\0\0\0"
            data = bytes(byte ^ mask[i % 4] for i, byte in enumerate(self.rfile.read(length)))
            reply = b"echo:" + data
            self.wfile.write(bytes([0x81, len(reply)]) + reply)
            self.wfile.flush()
        self.close_connection = True

    def stream_bytes(self, total):
        """1 GiB of zeros, for the download benchmark (tests/bench/sessions.sh)."""
        self.send_response(200)
        self.send_header("Content-Type", "application/octet-stream")
        self.send_header("Content-Length", str(total))
        self.end_headers()
        chunk = bytes(1 << 20)
        for _ in range(total // len(chunk)):
            self.wfile.write(chunk)

    def log_message(self, *args):
        pass


ThreadingHTTPServer(("127.0.0.1", PORT), Recorder).serve_forever()
