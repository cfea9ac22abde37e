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
        await asyncio.sleep(0.5)
        return {"async": data}


class SlowSync:
    def predict(self, data):
        time.sleep(0.5)  # releases the GIL, as engines and image code do
        return {"sync": data}


class Join:
    def predict(self, parts):
        return {"left": parts["left"], "right": parts["right"], "order": sorted(parts)}


class Boom:
    async def predict(self, data):
        await asyncio.sleep(0.05)
        raise ValueError("branch failed")
"""


def diamond(tmp_path: Path, left: str, right: str, *, left_optional: bool = False) -> Path:
    (tmp_path / "steps.py").write_text(HANDLERS)
    (tmp_path / "pipeline.yaml").write_text(
        "pipeline:\n  name: diamond\n  output: join\n  nodes:\n"
        "  - name: split\n    model_load_meta: {handler_module: 'steps:Split'}\n"
        f"  - name: left\n    inputs: [split]\n    optional: {str(left_optional).lower()}\n"
        f"    model_load_meta: {{handler_module: 'steps:{left}'}}\n"
        f"  - name: right\n    inputs: [split]\n    model_load_meta: {{handler_module: 'steps:{right}'}}\n"
        "  - name: join\n    inputs: {left: left, right: right}\n    model_load_meta: {handler_module: 'steps:Join'}\n"
    )
    return tmp_path


@pytest.mark.parametrize(
    ("left", "right"), [("SlowAsync", "SlowAsync"), ("SlowSync", "SlowSync"), ("SlowAsync", "SlowSync")]
)
def test_diamond_branches_run_concurrently(client_factory: Any, tmp_path: Path, left: str, right: str) -> None:
    """Two 0.5 s branches: one after the other would take 1.0 s; at the same time, about 0.5 s."""
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
    assert elapsed < 0.8, f"branches ran one after the other ({elapsed:.2f}s)"


def test_a_failing_branch_fails_the_request_naming_its_node_and_the_server_goes_on(
    client_factory: Any, tmp_path: Path
) -> None:
    client = client_factory(diamond(tmp_path, "Boom", "SlowAsync"))
    started = time.perf_counter()
    response = client.post("/predict", json={"data": 1})
    assert response.status_code == 500
    assert response.json()["node"] == "left"
    assert time.perf_counter() - started < 0.4  # the slow sibling (0.5 s) was cancelled, not waited for
    assert client.get("/health").json() == {"health": "ok"}


def test_the_iris_ensemble_averages_two_models_run_on_the_same_input(
    client_factory: Any, iris_ensemble_dir: Path
) -> None:
    import numpy as np

    client = client_factory(iris_ensemble_dir)
    assert client.get("/health/ready").status_code == 200  # the averaged golden output was reproduced
    rows = {"data": [[5.1, 3.5, 1.4, 0.2], [6.7, 3.0, 5.2, 2.3], [5.9, 3.0, 4.2, 1.5]]}
    svc = np.asarray(client.post("/predict/svc", json=rows).json()["prediction"])
    logreg = np.asarray(client.post("/predict/logreg", json=rows).json()["prediction"])
    ensemble = np.asarray(client.post("/predict", json=rows).json()["prediction"])
    assert ensemble.shape == (3, 3)
    np.testing.assert_allclose(ensemble, (svc + logreg) / 2, rtol=1e-6)
    assert not np.allclose(svc, logreg, atol=1e-3)  # two different models, or the test proves nothing
    labels = client.post("/predict/label", json=rows).json()["prediction"]
    assert labels == ["setosa", "virginica", "versicolor"]
    nodes = {n["name"]: n for n in client.get("/metadata").json()["nodes"]}
    assert set(nodes) == {"svc", "logreg", "average"}


def test_the_imagenet_chain_ends_in_a_business_rule(client_factory: Any, imagenet_dir: Path, cat_jpeg: bytes) -> None:
    """embedding -> classifier head -> softmax -> top-k, and a rule joining the probabilities and the top-k."""
    client = client_factory(imagenet_dir)
    response = client.post("/predict/animal", files={"image": ("cat.jpg", cat_jpeg, "image/jpeg")})
    assert response.status_code == 200, response.text
    verdict = response.json()["prediction"]
    assert verdict["animal"] is True
    assert verdict["animal_prob"] > 0.9
    assert verdict["best"] in {"tiger cat", "Egyptian cat", "tabby"}


def test_models_whose_tensors_do_not_fit_fail_at_load_naming_both_nodes(iris_dir: Path, tmp_path: Path) -> None:
    """iris's probabilities [-1, 3] cannot feed iris's input [-1, 4]: caught when the signatures are known."""
    import asyncio
    import shutil

    from pipeserve.app import check_pipeline
    from pipeserve.errors import SpecError

    shutil.copy(iris_dir / "models" / "iris.onnx", tmp_path / "iris.onnx")
    (tmp_path / "pipeline.yaml").write_text(
        "pipeline:\n  name: misfit\n  nodes:\n"
        "  - name: first\n    model_load_meta: {runtime: onnx, artifact: iris.onnx, outputs: [probabilities]}\n"
        "  - name: second\n    model_load_meta: {runtime: onnx, artifact: iris.onnx}\n"
    )
    with pytest.raises(SpecError) as failed:
        asyncio.run(check_pipeline(tmp_path))
    message = str(failed.value)
    assert "node 'second'" in message
    assert "'first'" in message
    assert "probabilities: float32[-1, 3]" in message
    assert "dimension 1 is 3 where 4 is expected" in message


def test_an_optional_node_that_fails_is_skipped_and_the_response_says_so(client_factory: Any, tmp_path: Path) -> None:
    client = client_factory(diamond(tmp_path, "Boom", "SlowAsync", left_optional=True))
    response = client.post("/predict", json={"data": 4})
    assert response.status_code == 200, response.text
    body = response.json()
    assert body["prediction"]["left"] is None  # the join got None for the node that failed
    assert body["prediction"]["right"] == {"async": 4}
    assert [item["node"] for item in body["skipped"]] == ["left"]
    assert "left" in body["skipped"][0]["error"]
    (tmp_path / "ok").mkdir()
    healthy = client_factory(diamond(tmp_path / "ok", "SlowAsync", "SlowAsync", left_optional=True))
    assert "skipped" not in healthy.post("/predict", json={"data": 1}).json()
