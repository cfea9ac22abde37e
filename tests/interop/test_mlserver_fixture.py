"""The `mlserver_iris` fixture serves the right model: tritonclient (gRPC and HTTP) gets iris.joblib's probabilities."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import joblib
import numpy as np
import pytest
import tritonclient.grpc as grpcclient  # type: ignore[import-untyped]
import tritonclient.http as httpclient  # type: ignore[import-untyped]
from numpy.typing import NDArray

from tests.conftest import EXAMPLES
from tests.interop.conftest import MLServerPeer

pytestmark = [pytest.mark.slow, pytest.mark.integration, pytest.mark.timeout(600)]

SAMPLE = np.asarray([[5.1, 3.5, 1.4, 0.2]], dtype=np.float32)
OUTPUT = "predict_proba"


def _reference() -> NDArray[np.float64]:
    model: Any = joblib.load(EXAMPLES / "iris" / "models" / "iris.joblib")
    return np.asarray(model.predict_proba(SAMPLE), dtype=np.float64)


def _check(probabilities: NDArray[Any] | None) -> None:
    assert probabilities is not None
    assert probabilities.shape == (1, 3)
    np.testing.assert_allclose(probabilities, _reference(), rtol=0, atol=1e-6)
    golden = json.loads(Path(EXAMPLES / "iris" / "golden.json").read_text())
    np.testing.assert_allclose(probabilities[0], golden, rtol=0, atol=1e-4)


def test_grpc_infer_returns_the_joblib_models_probabilities(mlserver_iris: MLServerPeer) -> None:
    client = grpcclient.InferenceServerClient(url=mlserver_iris.grpc_target)
    try:
        assert client.is_model_ready(mlserver_iris.model, mlserver_iris.version)
        infer_input = grpcclient.InferInput("input-0", list(SAMPLE.shape), "FP32")
        infer_input.set_data_from_numpy(SAMPLE)
        result = client.infer(
            mlserver_iris.model,
            [infer_input],
            model_version=mlserver_iris.version,
            outputs=[grpcclient.InferRequestedOutput(OUTPUT)],
        )
        _check(result.as_numpy(OUTPUT))
    finally:
        client.close()


def test_http_infer_returns_the_joblib_models_probabilities(mlserver_iris: MLServerPeer) -> None:
    client = httpclient.InferenceServerClient(url=mlserver_iris.http_url.removeprefix("http://"))
    try:
        assert client.is_model_ready(mlserver_iris.model, mlserver_iris.version)
        infer_input = httpclient.InferInput("input-0", list(SAMPLE.shape), "FP32")
        infer_input.set_data_from_numpy(SAMPLE, binary_data=False)  # MLServer answers binary tensor data with 422
        result = client.infer(
            mlserver_iris.model,
            [infer_input],
            model_version=mlserver_iris.version,
            outputs=[httpclient.InferRequestedOutput(OUTPUT, binary_data=False)],
        )
        _check(result.as_numpy(OUTPUT))
    finally:
        client.close()
