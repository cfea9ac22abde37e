"""A webhook receiver for tests: a real HTTP server in a thread that records what it is sent."""

from __future__ import annotations

import json
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any


class HookReceiver:
    """A webhook receiver: answers 503 to the first ``failures`` posts, then 200; records what it got."""

    def __init__(self, failures: int) -> None:
        self.failures = failures
        self.received: list[tuple[str, dict[str, Any]]] = []
        self.attempts = 0
        self.lock = threading.Lock()
        hooks = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                body = self.rfile.read(int(self.headers["content-length"]))
                with hooks.lock:
                    hooks.attempts += 1
                    fail = hooks.attempts <= hooks.failures
                    if not fail:
                        hooks.received.append((self.headers["x-pipeserve-job-id"], json.loads(body)))
                self.send_response(503 if fail else 200)
                self.send_header("content-length", "0")
                self.end_headers()

            def log_message(self, *args: Any) -> None:
                return None

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}/hook"
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self.thread.start()

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()
