"""DAG pipelines: fan-out and fan-in, independent branches running at the same time (measured), failures."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import pytest

HANDLERS = """
import asyncio
import time


class Split:
    def predict(self, data):
        return data


class SlowAsync:
    async def predict(self, data):
        await asyncio.sleep(0.3)
        return {"async": data}


class SlowSync:
    def predict(self, data):
        time.sleep(0.3)  # releases the GIL, as engines and image code do
        return {"sync": data}


class Join:
    def predict(self, parts):
        return {"left": parts["left"], "right": parts["right"], "order": sorted(parts)}


class Boom:
    async def predict(self, data):
        await asyncio.sleep(0.05)
        raise ValueError("branch failed")
"""


def diamond(tmp_path: Path, left: str, right: str) -> Path:
    (tmp_path / "steps.py").write_text(HANDLERS)
    (tmp_path / "pipeline.yaml").write_text(
        "pipeline:\n  name: diamond\n  output: join\n  nodes:\n"
        "  - name: split\n    model_load_meta: {handler_module: 'steps:Split'}\n"
        f"  - name: left\n    inputs: [split]\n    model_load_meta: {{handler_module: 'steps:{left}'}}\n"
        f"  - name: right\n    inputs: [split]\n    model_load_meta: {{handler_module: 'steps:{right}'}}\n"
        "  - name: join\n    inputs: {left: left, right: right}\n    model_load_meta: {handler_module: 'steps:Join'}\n"
    )
    return tmp_path


@pytest.mark.parametrize(
    ("left", "right"), [("SlowAsync", "SlowAsync"), ("SlowSync", "SlowSync"), ("SlowAsync", "SlowSync")]
)
def test_diamond_branches_run_concurrently(client_factory: Any, tmp_path: Path, left: str, right: str) -> None:
    """Two 0.3 s branches: one after the other would take 0.6 s; at the same time, about 0.3 s."""
    # two sync branches need two threads (the default is one per core, and CI may give us one)
    client = client_factory(diamond(tmp_path, left, right), worker_threads=2)
    client.post("/predict", json={"data": 0})  # first call: nothing cold left in the timing
    started = time.perf_counter()
    response = client.post("/predict", json={"data": 5})
    elapsed = time.perf_counter() - started
    assert response.status_code == 200, response.text
    body = response.json()["prediction"]
    assert body["order"] == ["left", "right"]
    assert set(body["left"].values()) == {5}
    assert set(body["right"].values()) == {5}
    assert elapsed < 0.5, f"branches ran one after the other ({elapsed:.2f}s)"


def test_a_failing_branch_fails_the_request_naming_its_node_and_the_server_goes_on(
    client_factory: Any, tmp_path: Path
) -> None:
    client = client_factory(diamond(tmp_path, "Boom", "SlowAsync"))
    started = time.perf_counter()
    response = client.post("/predict", json={"data": 1})
    assert response.status_code == 500
    assert response.json()["node"] == "left"
    assert time.perf_counter() - started < 0.25  # the slow sibling was cancelled, not waited for
    assert client.get("/health").json() == {"health": "ok"}
