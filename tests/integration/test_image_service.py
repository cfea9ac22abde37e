"""The image service: embedding and top-k tags from two micro-batched TorchScript models, uploads, /tags."""

from __future__ import annotations

import base64
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from starlette.testclient import TestClient

CAT_LABELS = {"tiger cat", "tabby", "Egyptian cat"}


@pytest.fixture(scope="module")
def client(imagenet_dir: Path) -> Any:
    from pipeserve.app import build_rest_app
    from pipeserve.config import ServerSettings

    with TestClient(build_rest_app(ServerSettings(spec_dir=imagenet_dir, access_log=False))) as test_client:
        yield test_client


@pytest.fixture(scope="module")
def cat_body(cat_jpeg: bytes) -> dict[str, str]:
    return {"data": base64.b64encode(cat_jpeg).decode()}


def test_embedding_is_1280_pooled_features(client: TestClient, cat_body: dict[str, str]) -> None:
    embedding = np.asarray(client.post("/predict/embedding", json=cat_body).json()["prediction"])
    assert embedding.shape == (1280,)
    assert np.isfinite(embedding).all()
    assert embedding.min() >= 0, "pooled ReLU6 features are non-negative"


def test_tags_are_the_top_k_cat_classes(client: TestClient, cat_body: dict[str, str]) -> None:
    tags = client.post("/predict/tag?k=3", json=cat_body).json()["prediction"]
    assert len(tags) == 3
    assert tags[0]["name"] in CAT_LABELS
    probs = [tag["prob"] for tag in tags]
    assert probs == sorted(probs, reverse=True)
    assert len(client.post("/predict/tag", json=cat_body).json()["prediction"]) == 5, "k defaults to 5"


def test_the_torchscript_branch_agrees_with_the_onnx_model(client: TestClient, cat_body: dict[str, str]) -> None:
    onnx = np.asarray(client.post("/predict", json=cat_body).json()["prediction"])
    tags = client.post("/predict/tag?k=1000", json=cat_body).json()["prediction"]
    assert len(tags) == 1000
    torchscript = np.asarray([tag["prob"] for tag in tags])  # best first
    np.testing.assert_allclose(torchscript, np.sort(onnx)[::-1], atol=1e-4)
    labels = client.get("/tags").json()
    assert [tag["name"] for tag in tags[:3]] == [labels[i] for i in np.argsort(-onnx)[:3]]


@pytest.mark.parametrize("k", ["0", "1001", "-3", "five", "2.5"])
def test_k_out_of_range_is_a_400(client: TestClient, cat_body: dict[str, str], k: str) -> None:
    response = client.post(f"/predict/tag?k={k}", json=cat_body)
    assert response.status_code == 400
    assert response.json()["expected"] == "1 <= k <= 1000"


def test_multipart_uploads(client: TestClient, cat_jpeg: bytes) -> None:
    files = {"image": ("cat.jpg", cat_jpeg, "image/jpeg")}
    assert client.post("/predict/label", files=files).json()["prediction"] in CAT_LABELS
    assert client.post("/predict/tag?k=2", files=files).json()["prediction"][0]["name"] in CAT_LABELS
    other_field = client.post("/predict/label", files={"photo": ("cat.jpg", cat_jpeg, "image/jpeg")})
    assert other_field.status_code == 200, "the first file is taken when there is no 'image' field"


def test_uploads_that_are_not_images_are_refused_by_name(client: TestClient) -> None:
    response = client.post("/predict/tag", files={"image": ("notes.txt", b"not a picture", "text/plain")})
    assert response.status_code == 400
    assert "not a decodable image" in response.json()["error"]
    no_file = client.post("/predict/tag", data={"caption": "a cat"}, files={"x": ("", b"", "text/plain")})
    assert no_file.status_code == 400


def test_tags_lists_the_class_names(client: TestClient) -> None:
    names = client.get("/tags").json()
    assert len(names) == 1000
    assert names[282] == "tiger cat"


def test_concurrent_tag_requests_get_their_answers_and_the_models_their_measured_sizes(
    client: TestClient, cat_body: dict[str, str]
) -> None:
    """Both tag models batch adaptively, each at the size its warm-up measured cheapest per row (the TorchScript
    network on a CPU is often cheapest alone; tests/e2e/test_batching_e2e.py shows batches forming under load)."""
    with ThreadPoolExecutor(12) as pool:
        answers = list(pool.map(lambda _: client.post("/predict/tag?k=1", json=cat_body).json(), range(24)))
    assert all(answer["prediction"][0]["name"] in CAT_LABELS for answer in answers)
    nodes = {node["name"]: node for node in client.get("/metadata").json()["nodes"]}
    for model in ("embedding", "head"):
        learned = nodes[model]["batching"]
        assert len(learned["learned_ms_per_row"]) >= 2, f"{model}: warm-up timed several sizes: {learned}"
        assert learned["best_size"] in {int(size) for size in learned["learned_ms_per_row"]}


def test_metadata_lists_endpoints_and_replicas(client: TestClient) -> None:
    metadata = client.get("/metadata").json()
    assert metadata["endpoints"] == {"predict": "softmax", "embedding": "embedding", "tag": "top_k", "animal": "animal"}
    head = next(node for node in metadata["nodes"] if node["name"] == "head")
    assert head["batching"]["mode"] == "adaptive"
    assert head["replicas"] == [{"device": "cpu"}]
    assert set(metadata["execution"]) == {"predict", "embedding", "tag", "animal"}
    paths = client.get("/openapi.json").json()["paths"]
    assert "/predict/tag" in paths
    assert "/predict/embedding" in paths


def _sample(metrics: str, name: str) -> float:
    line = next(line for line in metrics.splitlines() if line.startswith(name))
    return float(line.rsplit(" ", 1)[1])
