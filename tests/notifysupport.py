"""A real webhook receiver on 127.0.0.1 for the notification tests: answers from a script, records what it got."""
from __future__ import annotations

import json
import socket
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Optional


class Receiver:
    """An HTTP server in a thread. `answers` is the status of each request in turn ("hang": accept, never answer);
    the last one repeats. Every request is kept in `.got` as {path, headers, body, at}."""

    def __init__(self, answers: list = (200,)) -> None:
        self.answers = list(answers) or [200]
        self.got: list[dict] = []
        self.lock = threading.Lock()
        self.release = threading.Event()       # set at close: hung handlers return
        receiver = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args) -> None:
                pass

            def do_POST(self) -> None:
                length = int(self.headers.get("Content-Length") or 0)
                data = self.rfile.read(length)
                with receiver.lock:
                    n = len(receiver.got)
                    receiver.got.append({"path": self.path, "headers": {k.lower(): v for k, v in self.headers.items()},
                                         "body": data, "at": time.monotonic()})
                    answer = receiver.answers[min(n, len(receiver.answers) - 1)]
                if answer == "hang":
                    receiver.release.wait(120)
                    return
                self.send_response(int(answer))
                self.send_header("Content-Length", "2")
                self.end_headers()
                self.wfile.write(b"ok")

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.server.daemon_threads = True
        self.port = self.server.server_address[1]
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self.thread.start()

    def url(self, path: str = "/hook/T0K3N-s3cr3t?key=also-secret") -> str:
        return f"http://127.0.0.1:{self.port}{path}"

    def requests(self) -> list[dict]:
        with self.lock:
            return list(self.got)

    def json_bodies(self) -> list[dict]:
        return [json.loads(r["body"]) for r in self.requests()]

    def close(self) -> None:
        self.release.set()
        self.server.shutdown()
        self.server.server_close()


def free_closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def target(url: str, fmt: str = "json", on: Optional[list] = None, timeout_s: float = 5.0, retries: int = 3,
           name: str = "hook") -> dict:
    return {"name": name, "url": url, "format": fmt, "on": on or [], "timeout_s": timeout_s, "retries": retries,
            "source": "test"}
