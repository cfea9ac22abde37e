from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import httpx

PIPESERVE = [sys.executable, "-m", "pipeserve.cli.main"]


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


@dataclass
class Server:
    url: str
    process: subprocess.Popen[bytes]
    log_path: Path

    def log(self) -> str:
        return self.log_path.read_text(errors="replace")


@contextmanager
def run_server(
    args: list[str],
    *,
    tmp_path: Path,
    env: dict[str, str] | None = None,
    port: int | None = None,
    ready_timeout_s: float = 60.0,
) -> Iterator[Server]:
    """`pipeserve serve ...` in a subprocess; waits for /health/ready; always stops it (SIGTERM, then SIGKILL)."""
    port = port or free_port()
    log_path = tmp_path / f"server-{port}.log"
    full_env = {**os.environ, **(env or {})}
    command = [*PIPESERVE, *args]
    if "PORT" not in (env or {}):
        command += ["--port", str(port)]
    with log_path.open("wb") as log:
        process = subprocess.Popen(command, stdout=log, stderr=subprocess.STDOUT, env=full_env, start_new_session=True)
    server = Server(f"http://127.0.0.1:{port}", process, log_path)
    try:
        deadline = time.monotonic() + ready_timeout_s
        while True:
            if process.poll() is not None:
                raise RuntimeError(f"server exited with {process.returncode}:\n{server.log()}")
            try:
                if httpx.get(f"{server.url}/health/ready", timeout=1).status_code == 200:
                    break
            except httpx.TransportError:
                pass
            if time.monotonic() > deadline:
                raise RuntimeError(f"server not ready after {ready_timeout_s}s:\n{server.log()}")
            time.sleep(0.2)
        yield server
    finally:
        stop(process)


def stop(process: subprocess.Popen[bytes], timeout_s: float = 20.0) -> int:
    if process.poll() is None:
        os.killpg(process.pid, signal.SIGTERM)
        try:
            process.wait(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            os.killpg(process.pid, signal.SIGKILL)
            process.wait()
    return process.returncode


@contextmanager
def run_up(args: list[str], *, log_path: Path, env: dict[str, str] | None = None) -> Iterator[subprocess.Popen[bytes]]:
    """`pipeserve up ...` in a subprocess; waits until it says all is ready; Ctrl-C (SIGINT) at the end, which
    must stop every process it started and exit 0."""
    with log_path.open("wb") as log:
        process = subprocess.Popen(
            [*PIPESERVE, "up", *args],
            stdout=log,
            stderr=subprocess.STDOUT,
            env={**os.environ, **(env or {})},
            start_new_session=True,
        )
    try:
        deadline = time.monotonic() + 120
        while b"all ready" not in log_path.read_bytes():
            if process.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(f"pipeserve up did not become ready:\n{log_path.read_text()}")
            time.sleep(0.3)
        yield process
    finally:
        if process.poll() is None:
            os.killpg(process.pid, signal.SIGINT)
        code = process.wait(timeout=30)
    if code != 0:
        raise RuntimeError(f"pipeserve up exited with {code}:\n{log_path.read_text()}")
