"""Our preprocessing server against software we did not write: a real MLServer serving the iris model over v2."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import httpx
import numpy as np
import pytest

from tests.e2e.conftest import run_server
from tests.interop.conftest import MLServerPeer

pytestmark = [pytest.mark.slow, pytest.mark.integration, pytest.mark.timeout(600)]

IRIS_ROWS = [[5.1, 3.5, 1.4, 0.2], [6.7, 3.0, 5.2, 2.3]]


def _spec_for_mlserver(iris_dir: Path, tmp_path: Path) -> Path:
    """The iris example, its model node pointed at MLServer's names: model classifier v1, output predict_proba."""
    spec = tmp_path / "iris-mlserver"
    shutil.copytree(iris_dir, spec)
    text = (spec / "pipeline.yaml").read_text()
    text = text.replace(
        "      outputs: [probabilities]\n",
        "      outputs: [probabilities]\n      remote: {model: classifier, version: v1, outputs: [predict_proba]}\n",
    )
    assert "remote:" in text
    (spec / "pipeline.yaml").write_text(text)
    return spec


@pytest.mark.parametrize("transport", ["grpc", "http"])
def test_prep_server_calls_mlserver_and_passes_the_golden_check(
    mlserver_iris: MLServerPeer, iris_dir: Path, tmp_path: Path, transport: str
) -> None:
    spec = _spec_for_mlserver(iris_dir, tmp_path)
    endpoint = f"grpc://{mlserver_iris.grpc_target}" if transport == "grpc" else mlserver_iris.http_url
    # MLServer reports no release fingerprint: the golden check across the split at warm-up is the guard.
    args = ["serve", str(spec), "--infer", endpoint, "--release-check", "golden"]
    with run_server(args, tmp_path=tmp_path) as prep:
        ready = httpx.get(f"{prep.url}/health/ready").json()
        predicted = httpx.post(f"{prep.url}/predict", json={"data": IRIS_ROWS}, timeout=10)
        labels = httpx.post(f"{prep.url}/predict/label", json={"data": IRIS_ROWS}, timeout=10)
        metadata = httpx.get(f"{prep.url}/metadata").json()
    assert ready["ready"] is True
    assert metadata["golden_check"].startswith("prediction matches"), metadata["golden_check"]
    assert metadata["inference"]["endpoints"][0]["up"] is True
    assert predicted.status_code == 200, predicted.text
    probabilities = np.asarray(predicted.json()["prediction"])
    assert probabilities.shape == (2, 3)
    golden = json.loads((iris_dir / "golden.json").read_text())
    np.testing.assert_allclose(probabilities[0], golden, atol=1e-4)
    assert labels.json()["prediction"] == ["setosa", "virginica"]


def test_prep_server_refuses_mlserver_under_the_fingerprint_check(
    mlserver_iris: MLServerPeer, iris_dir: Path, tmp_path: Path
) -> None:
    """Without --release-check golden, a server that cannot prove its release is never used."""
    spec = _spec_for_mlserver(iris_dir, tmp_path)
    args = ["serve", str(spec), "--infer", f"grpc://{mlserver_iris.grpc_target}"]
    env = {"PIPESERVE_INFER_START_TIMEOUT_S": "2"}
    with (
        pytest.raises(RuntimeError, match="not ready") as failed,
        run_server(args, tmp_path=tmp_path, env=env, ready_timeout_s=8),
    ):
        pass
    assert "release" in str(failed.value)
