"""The web-single REST API on the real iris model, through the ASGI interface."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from starlette.testclient import TestClient

SAMPLE = {"data": [[5.1, 3.5, 1.4, 0.2]]}


def test_seed_endpoints_keep_the_seed_shapes(iris_client: TestClient, iris_dir: Path) -> None:
    assert iris_client.get("/health").json() == {"health": "ok"}
    golden = json.loads((iris_dir / "golden.json").read_text())

    prediction = iris_client.post("/predict", json=SAMPLE).json()["prediction"]
    assert len(prediction) == 3
    np.testing.assert_allclose(prediction, golden, atol=1e-4)
    assert iris_client.post("/predict/label", json=SAMPLE).json() == {"prediction": "setosa"}
    assert iris_client.get("/predict/test").json()["prediction"] == pytest.approx(prediction)
    assert iris_client.get("/predict/test/label").json() == {"prediction": "setosa"}
    assert iris_client.get("/label").json() == {"0": "setosa", "1": "versicolor", "2": "virginica"}

    metadata = iris_client.get("/metadata").json()
    assert metadata["data_type"] == "float32"
    assert metadata["data_structure"] == "(-1,4)"
    assert metadata["data_sample"] == SAMPLE["data"]
    assert metadata["prediction_structure"] == "(1,3)"
    assert metadata["prediction_sample"] == pytest.approx(golden)
    assert len(metadata["fingerprint"]) == 16


@pytest.mark.parametrize(
    ("features", "label"),
    [([5.1, 3.5, 1.4, 0.2], "setosa"), ([6.4, 3.2, 4.5, 1.5], "versicolor"), ([6.3, 3.3, 6.0, 2.5], "virginica")],
)
def test_each_species(iris_client: TestClient, features: list[float], label: str) -> None:
    assert iris_client.post("/predict/label", json={"data": [features]}).json()["prediction"] == label
    # A single row without the batch dimension is accepted too.
    assert iris_client.post("/predict/label", json={"data": features}).json()["prediction"] == label


def test_several_rows_answer_one_result_per_row(iris_client: TestClient) -> None:
    rows = [[5.1, 3.5, 1.4, 0.2], [6.3, 3.3, 6.0, 2.5]]
    assert iris_client.post("/predict/label", json={"data": rows}).json() == {"prediction": ["setosa", "virginica"]}
    assert np.asarray(iris_client.post("/predict", json={"data": rows}).json()["prediction"]).shape == (2, 3)


def test_health_live_and_ready(iris_client: TestClient) -> None:
    assert iris_client.get("/health/live").json() == {"live": True}
    ready = iris_client.get("/health/ready")
    assert ready.status_code == 200
    assert ready.json()["ready"] is True


def test_request_id_is_honoured_or_made(iris_client: TestClient) -> None:
    given = iris_client.post("/predict/label", json=SAMPLE, headers={"X-Request-ID": "job-42"})
    assert given.headers["x-request-id"] == "job-42"
    made = iris_client.post("/predict/label", json=SAMPLE)
    assert len(made.headers["x-request-id"]) == 16
    other = iris_client.get("/metadata", headers={"X-Request-ID": "meta-1"})
    assert other.headers["x-request-id"] == "meta-1"
    weird = iris_client.get("/health", headers={"X-Request-ID": "bad id with spaces"})
    assert weird.headers["x-request-id"] != "bad id with spaces"


BAD_INPUTS: list[tuple[str, Any, int, str]] = [
    ("malformed json", b'{"data": [[5.1, 3.5', 400, "not valid JSON"),
    ("empty body", b"", 400, "empty"),
    ("not an object", b"[1, 2, 3]", 400, "not an object"),
    ("missing data", b'{"features": [[5.1, 3.5, 1.4, 0.2]]}', 400, "no 'data'"),
    ("null data", b'{"data": null}', 400, "missing or null"),
    ("wrong shape", b'{"data": [[5.1, 3.5, 1.4]]}', 400, "shape"),
    ("ragged rows", b'{"data": [[5.1, 3.5, 1.4, 0.2], [1.0]]}', 400, "rectangular"),
    ("strings", b'{"data": [["a", "b", "c", "d"]]}', 400, "not numbers"),
    ("a string", b'{"data": "5.1, 3.5, 1.4, 0.2"}', 400, "text"),
    ("booleans", b'{"data": [[true, false, true, false]]}', 400, "booleans"),
    ("nan literal", b'{"data": [[NaN, 3.5, 1.4, 0.2]]}', 400, "NaN"),
    ("overflow", b'{"data": [[1e39, 3.5, 1.4, 0.2]]}', 400, "infinity"),
    ("no rows", b'{"data": []}', 400, "shape"),
]


@pytest.mark.parametrize(("case", "body", "status", "needle"), BAD_INPUTS, ids=[c[0] for c in BAD_INPUTS])
def test_bad_input_gets_a_clear_4xx_and_the_server_keeps_serving(
    iris_client: TestClient, case: str, body: bytes, status: int, needle: str
) -> None:
    response = iris_client.post("/predict/label", content=body, headers={"Content-Type": "application/json"})
    assert response.status_code == status, response.text
    error = response.json()
    assert needle in error["error"], error
    assert error["expected"], "every 4xx says what is expected"
    assert error["request_id"] == response.headers["x-request-id"]
    assert iris_client.post("/predict/label", json=SAMPLE).json() == {"prediction": "setosa"}


def test_body_over_the_limit_is_refused(client_factory: Any, iris_dir: Path) -> None:
    client = client_factory(iris_dir, max_body_bytes=2048)
    big = {"data": [[5.1, 3.5, 1.4, 0.2]] * 200}
    response = client.post("/predict", json=big)
    assert response.status_code == 413
    assert "at most 2048 bytes" in response.json()["expected"]
    assert client.post("/predict/label", json=SAMPLE).status_code == 200


def test_wrong_method_and_path(iris_client: TestClient) -> None:
    wrong_method = iris_client.get("/predict")
    assert wrong_method.status_code == 405
    assert wrong_method.json()["expected"] == "POST"
    assert wrong_method.headers["allow"] == "POST"
    assert iris_client.post("/metadata").status_code == 405
    missing = iris_client.get("/nope")
    assert missing.status_code == 404
    assert "no route GET /nope" in missing.json()["error"]


def test_too_many_rows(iris_client: TestClient) -> None:
    response = iris_client.post("/predict", json={"data": [[5.1, 3.5, 1.4, 0.2]] * 65})
    assert response.status_code == 400
    assert "at most 64 rows" in response.json()["expected"]


def test_metrics_count_requests_and_node_latency(iris_client: TestClient) -> None:
    for _ in range(3):
        iris_client.post("/predict/label", json=SAMPLE)
    iris_client.post("/predict/label", content=b"{")
    text = iris_client.get("/metrics").text
    assert 'pipeserve_requests_total{method="POST",route="/predict/label",status="200"} 3.0' in text
    assert 'pipeserve_requests_total{method="POST",route="/predict/label",status="400"} 1.0' in text
    assert 'pipeserve_node_latency_seconds_count{node="classifier",pipeline="iris"}' in text
    assert 'pipeserve_ready{pipeline="iris"} 1.0' in text


def test_openapi_documents_every_route(iris_client: TestClient) -> None:
    paths = iris_client.get("/openapi.json").json()["paths"]
    for path in (
        "/predict",
        "/predict/label",
        "/health",
        "/health/live",
        "/health/ready",
        "/metadata",
        "/label",
        "/predict/test",
        "/predict/test/label",
        "/metrics",
    ):
        assert path in paths, path
    assert "requestBody" in paths["/predict"]["post"]
    assert iris_client.get("/docs").status_code == 200
