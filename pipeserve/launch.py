"""``pipeserve up``: start a serving topology as local processes, wait for health, stop all on Ctrl-C.

The ``prep-pred`` pattern is the seed's docker compose: N inference servers (v2 HTTP on 8012, 8013, ...; gRPC
on 50051, 50052, ...) and one preprocessing server on 8011 calling them over gRPC. Every process is a plain
``pipeserve`` command, printed as it starts, so the same topology can be run by hand or by an orchestrator.
"""

from __future__ import annotations

import logging
import os
import signal
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Literal

logger = logging.getLogger(__name__)

Pattern = Literal["prep-pred", "microservices"]


@dataclass(frozen=True)
class Topology:
    """What ``pipeserve up`` starts."""

    spec_dir: Path
    pattern: Pattern = "prep-pred"
    host: str = "127.0.0.1"
    prep_port: int = 8011
    prep_workers: int = 1
    infer_replicas: int = 1
    infer_http_port: int = 8012
    infer_grpc_port: int = 50051
    protocol: Literal["grpc", "http"] = "grpc"
    ready_timeout_s: float = 180.0
    extra_env: dict[str, str] = field(default_factory=dict)

    def commands(self) -> list[tuple[str, list[str], str]]:
        """(name, argv, readiness URL) per process, inference servers first."""
        if self.pattern == "microservices":
            return self._microservices()
        base = [sys.executable, "-m", "pipeserve.cli.main"]
        spec = str(self.spec_dir)
        processes = []
        endpoints = []
        for i in range(self.infer_replicas):
            http, grpc = self.infer_http_port + i, self.infer_grpc_port + i
            argv = [*base, "serve-infer", spec, "--host", self.host, "--http-port", str(http), "--grpc-port", str(grpc)]
            processes.append((f"infer-{i + 1}", argv, f"http://{self.host}:{http}/v2/health/ready"))
            endpoints.append(f"grpc://{self.host}:{grpc}" if self.protocol == "grpc" else f"http://{self.host}:{http}")
        prep = [*base, "serve", spec, "--host", self.host, "--port", str(self.prep_port)]
        prep += ["--workers", str(self.prep_workers), "--infer", ",".join(endpoints)]
        processes.append(("prep", prep, f"http://{self.host}:{self.prep_port}/health/ready"))
        return processes

    def _microservices(self) -> list[tuple[str, list[str], str]]:
        """One inference server per URL of every node the spec marks remote (serving just that node), then the
        gateway on ``prep_port`` calling them. The URLs in the spec say where each service listens."""
        from pipeserve.pipeline.loader import load_spec

        base = [sys.executable, "-m", "pipeserve.cli.main"]
        spec = str(self.spec_dir)
        processes = []
        for node in load_spec(self.spec_dir).spec.nodes:
            meta = node.model_load_meta
            if meta is None or not meta.remote.url:
                continue
            for i, url in enumerate(meta.remote.url):
                scheme, _, address = url.partition("://")
                host, _, port = address.rpartition(":")
                grpc_port, http_port = (port, str(_free_port())) if scheme == "grpc" else (str(_free_port()), port)
                argv = [*base, "serve-infer", spec, "--models", node.name, "--host", host,
                        "--http-port", http_port, "--grpc-port", grpc_port]  # fmt: skip
                processes.append((f"{node.name}-{i + 1}", argv, f"http://{host}:{http_port}/v2/health/ready"))
        gateway = [*base, "serve", spec, "--pattern", "gateway", "--host", self.host, "--port", str(self.prep_port)]
        gateway += ["--workers", str(self.prep_workers)]
        processes.append(("gateway", gateway, f"http://{self.host}:{self.prep_port}/health/ready"))
        return processes


def _free_port() -> int:
    import socket

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


class TopologyFailed(RuntimeError):
    """A process of the topology exited or did not become ready."""


def run_topology(topology: Topology, *, echo: bool = True) -> int:
    """Start every process, wait for each to be ready, then wait; on SIGINT/SIGTERM or a crash, stop them all.

    Returns the exit code: 0 after Ctrl-C/SIGTERM, 1 when a process failed.
    """
    running: list[tuple[str, subprocess.Popen[bytes]]] = []
    stopping = False

    def request_stop(signum: int, frame: object) -> None:
        nonlocal stopping
        stopping = True

    previous = {sig: signal.signal(sig, request_stop) for sig in (signal.SIGINT, signal.SIGTERM)}
    try:
        _start_all(topology, running, lambda: stopping, echo=echo)
        while not stopping:
            for name, process in running:
                if process.poll() is not None:
                    raise TopologyFailed(f"{name} exited with status {process.returncode}")
            time.sleep(0.2)
        return 0
    except TopologyFailed as exc:
        if stopping:
            return 0
        print(f"[up] {exc}; stopping the others", file=sys.stderr, flush=True)
        return 1
    finally:
        _stop_all(running, echo=echo)
        for sig, handler in previous.items():
            signal.signal(sig, handler)


def _start_all(
    topology: Topology,
    running: list[tuple[str, subprocess.Popen[bytes]]],
    stopping: Callable[[], bool],
    *,
    echo: bool,
) -> None:
    for name, argv, ready_url in topology.commands():
        if echo:
            print(f"[up] starting {name}: {' '.join(argv[2:])}", flush=True)
        process = subprocess.Popen(argv, env={**os.environ, **topology.extra_env}, start_new_session=True)
        running.append((name, process))
        _wait_ready(name, process, ready_url, topology.ready_timeout_s, stopping)
        if echo:
            print(f"[up] {name} is ready ({ready_url})", flush=True)
    if echo:
        print(f"[up] all ready: POST http://{topology.host}:{topology.prep_port}/predict  (Ctrl-C stops)")


def _wait_ready(
    name: str, process: subprocess.Popen[bytes], url: str, timeout_s: float, stopping: Callable[[], bool]
) -> None:
    deadline = time.monotonic() + timeout_s
    while True:
        if stopping():
            raise TopologyFailed("stopped while starting")
        if process.poll() is not None:
            raise TopologyFailed(f"{name} exited with status {process.returncode} before it was ready")
        try:
            with urllib.request.urlopen(url, timeout=2) as response:
                if response.status == 200:
                    return
        except (urllib.error.URLError, OSError):
            pass
        if time.monotonic() > deadline:
            raise TopologyFailed(f"{name} was not ready after {timeout_s:.0f}s ({url})")
        time.sleep(0.25)


def _stop_all(running: Sequence[tuple[str, subprocess.Popen[bytes]]], *, echo: bool, grace_s: float = 15.0) -> None:
    """SIGTERM every process group (the front first, so no request reaches a stopped server), then SIGKILL."""
    for name, process in reversed(running):
        if process.poll() is None:
            if echo:
                print(f"[up] stopping {name}", flush=True)
            os.killpg(process.pid, signal.SIGTERM)
    deadline = time.monotonic() + grace_s
    for _, process in running:
        try:
            process.wait(timeout=max(0.1, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            os.killpg(process.pid, signal.SIGKILL)
            process.wait()
