"""Micro-batching in a real server: a client that disconnects is dropped; under load batches grow."""

from __future__ import annotations

import base64
import json
import shutil
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import httpx
import pytest
import yaml

from tests.e2e.conftest import run_server

pytestmark = pytest.mark.timeout(180)


def _sample(metrics: str, name: str) -> float:
    line = next((line for line in metrics.splitlines() if line.startswith(name)), None)
    return float(line.rsplit(" ", 1)[1]) if line else 0.0


def test_a_client_that_disconnects_while_queued_is_dropped_before_its_batch(tmp_path: Path) -> None:
    spec = tmp_path / "spec"
    spec.mkdir()
    (spec / "weights.bin").write_bytes(b"\0")
    (spec / "pipeline.yaml").write_text("""
pipeline:
  name: slow
  input: {kind: tensor, shape: [-1, 2]}
  nodes:
  - name: model
    model_load_meta:
      runtime: tests.fakes:SlowRuntime
      artifact: weights.bin
      options: {delay_s: 0.6}
    batching: {max_batch_size: 1}
""")
    with run_server(["serve", str(spec)], tmp_path=tmp_path) as server:
        url = f"{server.url}/predict"
        first = threading.Thread(target=lambda: httpx.post(url, json={"data": [[1, 1]]}, timeout=10))
        first.start()
        time.sleep(0.15)
        with pytest.raises(httpx.ReadTimeout):  # queued behind the first; gives up while waiting
            httpx.post(url, json={"data": [[2, 2]]}, headers={"X-Request-ID": "gone"}, timeout=0.2)
        first.join()
        assert httpx.post(url, json={"data": [[3, 3]]}, timeout=10).json() == {"prediction": [3.0, 3.0]}
        metrics = httpx.get(f"{server.url}/metrics", timeout=5).text
        assert _sample(metrics, 'pipeserve_batch_size_count{model="model",pipeline="slow"}') == 2.0, (
            "the disconnected request never ran"
        )
    lines = [json.loads(line) for line in server.log().splitlines() if '"request_id":"gone"' in line]
    assert lines
    assert lines[0]["status"] == 499


def test_under_load_the_classifier_runs_batches_of_several(imagenet_dir: Path, cat_jpeg: bytes, tmp_path: Path) -> None:
    """The imagenet classifier batched in fixed mode (waiting up to 20 ms for company): under load /metrics shows
    batches of several requests, and every answer is still the cat. (Adaptive mode waits only when waiting pays,
    which depends on the load and on what the machine measured: tests/unit/batching covers its decisions.)"""
    spec = tmp_path / "imagenet"
    shutil.copytree(imagenet_dir, spec)
    pipeline = yaml.safe_load((spec / "pipeline.yaml").read_text())
    for node in pipeline["pipeline"]["nodes"]:
        if node["name"] == "classifier":
            node["batching"] = {"max_batch_size": 8, "max_latency_ms": 20, "mode": "fixed"}
    (spec / "pipeline.yaml").write_text(yaml.safe_dump(pipeline, sort_keys=False))
    body = {"data": base64.b64encode(cat_jpeg).decode()}
    with run_server(["serve", str(spec)], tmp_path=tmp_path) as server:

        def ask(_: int) -> str:
            response = httpx.post(f"{server.url}/predict/label", json=body, timeout=60)
            assert response.status_code == 200, response.text
            return str(response.json()["prediction"])

        with ThreadPoolExecutor(16) as pool:
            labels = set(pool.map(ask, range(96)))
        metrics = httpx.get(f"{server.url}/metrics", timeout=5).text
    assert labels <= {"tiger cat", "Egyptian cat", "tabby"}
    count = _sample(metrics, 'pipeserve_batch_size_count{model="classifier",pipeline="imagenet"}')
    rows = _sample(metrics, 'pipeserve_batch_size_sum{model="classifier",pipeline="imagenet"}')
    assert rows / count > 1.5, f"classifier: mean batch size {rows / count:.2f}"
