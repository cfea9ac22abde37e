"""The CUDA path: models on GPU devices. Deselected by default (`gpu` marker) and skipped without CUDA;
run with `pytest -m gpu` on a machine that has one."""

from __future__ import annotations

import base64
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import yaml

pytestmark = pytest.mark.gpu


@pytest.fixture(scope="module")
def cuda() -> None:
    torch = pytest.importorskip("torch")
    if not torch.cuda.is_available():
        pytest.skip("no CUDA device here")


@pytest.mark.usefixtures("cuda")
def test_torchscript_replicas_run_on_the_gpus(
    imagenet_dir: Path, copy_example: Any, client_factory: Any, cat_jpeg: bytes
) -> None:
    import torch

    spec_dir = copy_example(imagenet_dir)
    spec = yaml.safe_load((spec_dir / "pipeline.yaml").read_text())
    devices = [f"cuda:{i}" for i in range(torch.cuda.device_count())]
    for node in spec["pipeline"]["nodes"]:
        if node["name"] in ("embedding", "head"):
            node["model_load_meta"].update(replicas=2 * len(devices), devices=devices)
    (spec_dir / "pipeline.yaml").write_text(yaml.safe_dump(spec))
    client = client_factory(spec_dir)
    body = {"data": base64.b64encode(cat_jpeg).decode()}
    tags = client.post("/predict/tag?k=1000", json=body).json()["prediction"]
    onnx = np.asarray(client.post("/predict", json=body).json()["prediction"])
    np.testing.assert_allclose([tag["prob"] for tag in tags], np.sort(onnx)[::-1], atol=1e-3)
    head = next(node for node in client.get("/metadata").json()["nodes"] if node["name"] == "head")
    assert [replica["device"] for replica in head["replicas"]] == (devices * 2)[: 2 * len(devices)]
