#!/usr/bin/env python3
"""An HTTP proxy in front of the test S3 server that fails on purpose.

    faulty_proxy.py UPSTREAM_PORT MODE COUNT [FILE]

Listens on a free port of 127.0.0.1 and prints it as its first line. Each connection
carries one request, forwarded to 127.0.0.1:UPSTREAM_PORT, and is then closed. The first
COUNT requests fail by MODE, the later ones pass:
  503       answered "503 SlowDown" without reaching the server
  cut       the connection is closed before any answer
  cut-upload  half of the request body is read, then the connection is closed
              (a server that stops mid-upload)
  cut-download  the answer's head and half its body are sent, then the connection
              is closed
  stop      the first COUNT requests pass, every later one is cut like cut-upload
            (a server gone for good after COUNT requests)
  delay     every request passes, COUNT milliseconds after it arrived (a server a
            region away)
  lose-answer  the first COUNT requests pass; the next one reaches the server, whose
              answer is dropped and the connection closed; every later one passes
  silent-while  (COUNT unused) while FILE exists, a request is read and never answered:
              its connection stays open for a minute (a server or network gone silent)
Every request is logged to stderr as "<n> <method> <path> <fate>".
"""
import os
import socket
import socketserver
import sys
import threading
import time

upstream_port = int(sys.argv[1])
mode = sys.argv[2]
count = int(sys.argv[3])
gate = sys.argv[4] if len(sys.argv) > 4 else None
seen = 0
lock = threading.Lock()

SLOWDOWN = (b"<?xml version=\"1.0\" encoding=\"UTF-8\"?><Error><Code>SlowDown</Code>"
            b"<Message>Please reduce your request rate.</Message></Error>")


def read_head(f):
    lines = []
    while True:
        line = f.readline(65536)
        if not line:
            return None
        if line in (b"\r\n", b"\n"):
            return lines
        lines.append(line)


class Handler(socketserver.StreamRequestHandler):
    def handle(self):
        global seen
        head = read_head(self.rfile)
        if not head:
            return
        with lock:
            seen += 1
            n = seen
        if mode == "stop":
            failing = n > count
        elif mode == "lose-answer":
            failing = n == count + 1
        elif mode == "silent-while":
            failing = os.path.exists(gate)
        else:
            failing = n <= count and mode != "delay"
        if mode == "delay":
            time.sleep(count / 1000)
        method, path = head[0].split()[:2]
        length = 0
        for h in head[1:]:
            name, _, value = h.partition(b":")
            if name.strip().lower() == b"content-length":
                length = int(value.strip())
        fate = mode if failing else "pass"
        sys.stderr.write(f"{n} {method.decode()} {path.decode()} {fate}\n")
        if failing and mode == "503":
            self.rfile.read(length)
            self.wfile.write(b"HTTP/1.1 503 Slow Down\r\nContent-Type: application/xml\r\nContent-Length: "
                             + str(len(SLOWDOWN)).encode() + b"\r\nConnection: close\r\n\r\n" + SLOWDOWN)
            return
        if failing and mode == "cut":
            return
        if failing and mode == "silent-while":
            time.sleep(60)
            return
        if failing and mode in ("cut-upload", "stop"):
            self.rfile.read(length // 2)
            self.connection.shutdown(socket.SHUT_RDWR)
            return
        body = self.rfile.read(length)
        up = socket.create_connection(("127.0.0.1", upstream_port))
        kept = [h for h in head[1:] if not h.lower().startswith(b"connection:")]
        up.sendall(b"".join([head[0]] + kept) + b"Connection: close\r\n\r\n" + body)
        if failing and mode == "lose-answer":
            while up.recv(1 << 20):
                pass
            up.close()
            self.connection.shutdown(socket.SHUT_RDWR)
            return
        if not (failing and mode == "cut-download"):
            # Streamed as it comes: a large object costs no memory and no copies here.
            while True:
                chunk = up.recv(1 << 20)
                if not chunk:
                    break
                self.wfile.write(chunk)
            up.close()
            return
        parts = []
        while True:
            chunk = up.recv(1 << 20)
            if not chunk:
                break
            parts.append(chunk)
        up.close()
        answer = b"".join(parts)
        split = answer.find(b"\r\n\r\n") + 4
        self.wfile.write(answer[: split + (len(answer) - split) // 2])
        self.wfile.flush()
        self.connection.shutdown(socket.SHUT_RDWR)


class Server(socketserver.ThreadingTCPServer):
    daemon_threads = True
    allow_reuse_address = True
    # socketserver's default backlog of 5 drops the SYNs of a burst of connections (a
    # client's parallel requests), which the kernel sends again only a second later.
    request_queue_size = 128


server = Server(("127.0.0.1", 0), Handler)
print(server.server_address[1], flush=True)
server.serve_forever()
