"""Micro-batching in a real server: a client that disconnects is dropped; under load batches grow."""

from __future__ import annotations

import base64
import json
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import httpx
import pytest

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


def test_under_load_the_tag_models_run_batches_of_several(imagenet_dir: Path, cat_jpeg: bytes, tmp_path: Path) -> None:
    body = {"data": base64.b64encode(cat_jpeg).decode()}
    with run_server(["serve", str(imagenet_dir)], tmp_path=tmp_path) as server:

        def ask(_: int) -> int:
            return httpx.post(f"{server.url}/predict/tag?k=2", json=body, timeout=60).status_code

        with ThreadPoolExecutor(16) as pool:
            assert set(pool.map(ask, range(64))) == {200}
        metrics = httpx.get(f"{server.url}/metrics", timeout=5).text
    for model in ("embedding", "head"):
        count = _sample(metrics, f'pipeserve_batch_size_count{{model="{model}",pipeline="imagenet"}}')
        rows = _sample(metrics, f'pipeserve_batch_size_sum{{model="{model}",pipeline="imagenet"}}')
        assert rows / count > 1.0, f"{model}: mean batch size {rows / count:.2f}"
