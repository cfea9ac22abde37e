"""The imagenet example: the real EfficientNet-Lite0 weights behind the built-in image steps."""

from __future__ import annotations

import base64
import io
import json
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from PIL import Image
from starlette.testclient import TestClient

CAT_LABELS = {"tiger cat", "tabby", "Egyptian cat"}


@pytest.fixture(scope="module")
def imagenet_client(imagenet_dir: Path) -> Any:
    from pipeserve.app import build_rest_app
    from pipeserve.config import ServerSettings

    with TestClient(build_rest_app(ServerSettings(spec_dir=imagenet_dir, access_log=False))) as client:
        yield client


def test_the_cat_photo_is_a_cat(imagenet_client: TestClient, cat_jpeg: bytes) -> None:
    body = {"data": base64.b64encode(cat_jpeg).decode()}
    assert imagenet_client.post("/predict/label", json=body).json()["prediction"] in CAT_LABELS
    probabilities = np.asarray(imagenet_client.post("/predict", json=body).json()["prediction"])
    assert probabilities.shape == (1000,)
    assert probabilities.sum() == pytest.approx(1.0, abs=1e-4)


def test_prediction_matches_the_pytorch_reference(imagenet_client: TestClient, imagenet_dir: Path) -> None:
    golden = json.loads((imagenet_dir / "golden.json").read_text())
    np.testing.assert_allclose(imagenet_client.get("/predict/test").json()["prediction"], golden, atol=1e-4)
    assert imagenet_client.get("/predict/test/label").json() == {"prediction": "tiger cat"}


def test_other_real_photos_and_formats(imagenet_client: TestClient) -> None:
    import skimage.data

    buffer = io.BytesIO()
    Image.fromarray(skimage.data.coffee()).save(buffer, format="PNG")
    body = {"data": base64.b64encode(buffer.getvalue()).decode()}
    label = imagenet_client.post("/predict/label", json=body).json()["prediction"]
    assert label in {"espresso", "cup", "coffee mug", "eggnog", "consomme"}, label


@pytest.mark.parametrize(
    ("data", "needle"),
    [
        ("this is not base64!", "not valid base64"),
        (base64.b64encode(b"hello, not an image").decode(), "not a decodable image"),
        ("", "'data'"),
        ([1, 2, 3], "a list"),
    ],
)
def test_bad_images_get_a_clear_400(imagenet_client: TestClient, data: Any, needle: str) -> None:
    response = imagenet_client.post("/predict/label", json={"data": data})
    assert response.status_code == 400, response.text
    assert needle in response.json()["error"]
    assert "image" in response.json()["expected"]


def test_truncated_jpeg_is_refused(imagenet_client: TestClient, cat_jpeg: bytes) -> None:
    body = {"data": base64.b64encode(cat_jpeg[: len(cat_jpeg) // 3]).decode()}
    response = imagenet_client.post("/predict/label", json=body)
    assert response.status_code == 400
    assert "image" in response.json()["error"]


def test_metadata_describes_the_image_pipeline(imagenet_client: TestClient) -> None:
    metadata = imagenet_client.get("/metadata").json()
    assert metadata["data_type"].startswith("str")
    assert metadata["prediction_structure"] == "(1,1000)"
    assert [node["name"] for node in metadata["nodes"]] == [
        "decode",
        "resize",
        "crop",
        "pixels",
        "classifier",
        "softmax",
        "embedding",
        "head",
        "tag_softmax",
        "top_k",
        "animal",
    ]
    model = metadata["nodes"][4]
    assert model["inputs"][0]["shape"] == [-1, 3, 224, 224]
    assert model["inputs"][0]["datatype"] == "uint8"  # pixels: the model normalizes them itself
    assert model["execution"] == "worker thread"
    assert imagenet_client.get("/label").json()["281"] == "tabby"
