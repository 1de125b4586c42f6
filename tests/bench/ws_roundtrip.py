"""WebSocket round trips for tests/bench/sessions.sh: connects to 127.0.0.1:PORT with the given
Host and extra header (the session's cookie, or its upstream secret), sends N small text
messages one after another, each after the last echo, and prints the median and p99 in ms."""

import base64
import os
import socket
import statistics
import sys
import time

port, host, header, count = int(sys.argv[1]), sys.argv[2], sys.argv[3], int(sys.argv[4])
path = sys.argv[5]
s = socket.create_connection(("127.0.0.1", port))
s.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
key = base64.b64encode(os.urandom(16)).decode()
s.sendall((f"GET {path} HTTP/1.1\r\nHost: {host}\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n"
           f"Sec-WebSocket-Key: {key}\r\nSec-WebSocket-Version: 13\r\n{header}\r\n\r\n").encode())
head = b""
while not head.endswith(b"\r\n\r\n"):
    head += s.recv(1)
assert b" 101 " in head.split(b"\r\n")[0], head
mask = b"\x01\x02\x03\x04"
message = b"ping-0123456789"
frame = bytes([0x81, 0x80 | len(message)]) + mask + bytes(b ^ mask[i % 4] for i, b in enumerate(message))
times = []
for _ in range(count):
    started = time.perf_counter()
    s.sendall(frame)
    got = b""
    while len(got) < 2 + 5 + len(message):
        got += s.recv(4096)
    times.append((time.perf_counter() - started) * 1000)
times.sort()
print(f"median {statistics.median(times):.3f} ms, p99 {times[int(len(times) * 0.99)]:.3f} ms over {count}")
