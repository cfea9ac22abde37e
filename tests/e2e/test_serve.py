"""`pipeserve serve` as users run it: a subprocess, real HTTP, real models, several workers."""

from __future__ import annotations

import base64
import json
import signal
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import httpx
import pytest

from tests.e2e.conftest import PIPESERVE, free_port, run_server, stop

CAT_LABELS = {"tiger cat", "tabby", "Egyptian cat"}
pytestmark = pytest.mark.timeout(180)


def test_imagenet_with_two_gunicorn_workers(imagenet_dir: Path, cat_jpeg: bytes, tmp_path: Path) -> None:
    body = json.dumps({"data": base64.b64encode(cat_jpeg).decode()})
    with run_server(["serve", str(imagenet_dir), "--workers", "2"], tmp_path=tmp_path) as server:

        def ask(i: int) -> httpx.Response:
            return httpx.post(
                f"{server.url}/predict/label", content=body, headers={"X-Request-ID": f"cat-{i}"}, timeout=30
            )

        with ThreadPoolExecutor(8) as pool:
            responses = list(pool.map(ask, range(16)))
        assert all(r.status_code == 200 for r in responses)
        assert {r.json()["prediction"] for r in responses} <= CAT_LABELS
        assert [r.headers["x-request-id"] for r in responses] == [f"cat-{i}" for i in range(16)]
        bad = httpx.post(f"{server.url}/predict/label", json={"data": "not an image"}, timeout=10)
        assert bad.status_code == 400
        assert httpx.get(f"{server.url}/health", timeout=5).json() == {"health": "ok"}
        # Whichever worker answers /metrics, it reports the requests of both.
        for _ in range(4):
            metrics = httpx.get(f"{server.url}/metrics", timeout=5).text
            assert 'pipeserve_requests_total{method="POST",route="/predict/label",status="200"} 16.0' in metrics
        # pipeserve_ready is the minimum over live workers: 1.0 once the slower worker has finished its warm-up too
        # (/health/ready answered from whichever worker was ready first).
        deadline = time.monotonic() + 60
        while 'pipeserve_ready{pipeline="imagenet"} 1.0' not in metrics:
            assert time.monotonic() < deadline, metrics
            time.sleep(0.5)
            metrics = httpx.get(f"{server.url}/metrics", timeout=5).text
        process = server.process
    assert stop(process) == 0
    log = server.log()
    assert "Booting worker" in log or "worker" in log.lower()
    lines = [json.loads(line) for line in log.splitlines() if line.startswith("{") and '"pipeserve.access"' in line]
    cat_lines = [line for line in lines if line["request_id"].startswith("cat-")]
    assert len(cat_lines) == 16
    assert all(line["status"] == 200 and line["latency_ms"] > 0 for line in cat_lines)
    pids = {line.get("pid") for line in lines}
    assert pids  # one log line per request, from whichever worker served it


def test_seed_environment_variables_are_honoured(iris_dir: Path, tmp_path: Path) -> None:
    port = free_port()
    env = {
        "HOST": "127.0.0.1",
        "PORT": str(port),
        "WORKERS": "1",
        "LOGLEVEL": "WARNING",
        "GRACEFUL_TIMEOUT": "3",
        "BACKLOG": "128",
        "LIMIT_MAX_REQUESTS": "100000",
        "MAX_REQUESTS_JITTER": "10",
    }
    with run_server(["serve", str(iris_dir)], tmp_path=tmp_path, env=env, port=port) as server:
        response = httpx.post(f"{server.url}/predict/label", json={"data": [[6.3, 3.3, 6.0, 2.5]]}, timeout=10)
        assert response.json() == {"prediction": "virginica"}
        assert httpx.get(f"{server.url}/metrics", timeout=5).status_code == 200
    log = server.log()
    assert '"pipeserve.access"' not in log, "LOGLEVEL=WARNING silences the info-level access lines"
    assert '"level":"info"' not in log


def test_sigterm_stops_cleanly_and_in_flight_requests_finish(iris_dir: Path, tmp_path: Path) -> None:
    with run_server(["serve", str(iris_dir)], tmp_path=tmp_path) as server:
        with httpx.Client(timeout=10) as client:
            assert client.post(f"{server.url}/predict", json={"data": [5.1, 3.5, 1.4, 0.2]}).status_code == 200
        server.process.send_signal(signal.SIGTERM)
        # uvicorn re-raises the signal after its graceful shutdown, so the exit status reports SIGTERM.
        assert server.process.wait(timeout=15) in (0, -signal.SIGTERM)
    log = server.log()
    assert "Application shutdown complete" in log
    assert "Traceback" not in log


def test_a_bad_spec_fails_before_serving_with_a_clear_message(tmp_path: Path) -> None:
    (tmp_path / "pipeline.yaml").write_text("pipeline:\n  name: broken\n  nodes:\n  - name: a\n    nxt: b\n")
    result = subprocess.run(
        [*PIPESERVE, "serve", str(tmp_path), "--port", str(free_port())],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert result.returncode == 2
    assert "node 'a'" in result.stderr
    assert "nxt" in result.stderr
    assert "Traceback" not in result.stderr


def test_version_and_help() -> None:
    result = subprocess.run(
        [sys.executable, "-m", "pipeserve.cli.main", "--help"], capture_output=True, text=True, check=True
    )
    assert "serve" in result.stdout
    assert "check" in result.stdout
