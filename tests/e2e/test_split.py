"""The preprocessing-inference split, end to end: real processes, real gRPC, tritonclient against our server."""

from __future__ import annotations

import base64
import os
import shutil
import signal
import subprocess
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import httpx
import numpy as np
import pytest
import tritonclient.grpc as grpcclient  # type: ignore[import-untyped]
import tritonclient.http as httpclient  # type: ignore[import-untyped]
from tritonclient.utils import InferenceServerException  # type: ignore[import-untyped]

from pipeserve.pipeline.loader import load_spec
from pipeserve.pipeline.release import fingerprint
from tests.e2e.conftest import PIPESERVE, free_port, run_server, run_up, stop

pytestmark = pytest.mark.e2e

IRIS_ROW = [[5.1, 3.5, 1.4, 0.2]]


class InferServer:
    def __init__(self, process: subprocess.Popen[bytes], http_port: int, grpc_port: int, log_path: Path) -> None:
        self.process, self.http_port, self.grpc_port, self.log_path = process, http_port, grpc_port, log_path

    @property
    def http(self) -> str:
        return f"127.0.0.1:{self.http_port}"

    @property
    def grpc(self) -> str:
        return f"127.0.0.1:{self.grpc_port}"

    def log(self) -> str:
        return self.log_path.read_text(errors="replace")


def start_infer(
    args: list[str], tmp_path: Path, *, http_port: int | None = None, grpc_port: int | None = None
) -> InferServer:
    http_port, grpc_port = http_port or free_port(), grpc_port or free_port()
    log_path = tmp_path / f"infer-{http_port}.log"
    command = [*PIPESERVE, "serve-infer", *args, "--http-port", str(http_port), "--grpc-port", str(grpc_port)]
    with log_path.open("ab") as log:
        process = subprocess.Popen(command, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
    server = InferServer(process, http_port, grpc_port, log_path)
    deadline = time.monotonic() + 60
    while True:
        if process.poll() is not None:
            raise RuntimeError(f"inference server exited with {process.returncode}:\n{server.log()}")
        try:
            if httpx.get(f"http://{server.http}/v2/health/ready", timeout=1).status_code == 200:
                return server
        except httpx.TransportError:
            pass
        if time.monotonic() > deadline:
            stop(process)
            raise RuntimeError(f"inference server not ready:\n{server.log()}")
        time.sleep(0.2)


@contextmanager
def infer_server(args: list[str], tmp_path: Path, **ports: int) -> Iterator[InferServer]:
    server = start_infer(args, tmp_path, **ports)
    try:
        yield server
    finally:
        stop(server.process)


@pytest.fixture(scope="module")
def iris_infer(iris_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[InferServer]:
    with infer_server([str(iris_dir)], tmp_path_factory.mktemp("iris-infer")) as server:
        yield server


# -- tritonclient against our inference server ---------------------------------------------------------------------


@pytest.mark.parametrize("client_module", [httpclient, grpcclient], ids=["http", "grpc"])
def test_tritonclient_health_and_metadata(iris_infer: InferServer, iris_dir: Path, client_module: object) -> None:
    module: object = client_module
    url = iris_infer.http if module is httpclient else iris_infer.grpc
    client = module.InferenceServerClient(url=url)  # type: ignore[attr-defined]
    assert client.is_server_live()
    assert client.is_server_ready()
    assert client.is_model_ready("classifier")
    server = client.get_server_metadata()
    name = server["name"] if module is httpclient else server.name
    assert name == "pipeserve"
    model = (
        client.get_model_metadata("classifier")
        if module is httpclient
        else client.get_model_metadata("classifier", as_json=True)
    )
    assert model["name"] == "classifier"
    assert model["versions"] == ["1"]
    inputs = {i["name"]: i for i in model["inputs"]}
    assert inputs["input"]["datatype"] == "FP32"
    assert [int(d) for d in inputs["input"]["shape"]] == [-1, 4]
    if module is httpclient:  # gRPC parameters are field 6 (MLServer's), which tritonclient's messages skip
        assert model["parameters"]["pipeserve_release"] == fingerprint(load_spec(iris_dir))


@pytest.mark.parametrize("client_module", [httpclient, grpcclient], ids=["http", "grpc"])
def test_tritonclient_fp32_infer_with_default_binary_settings(
    iris_infer: InferServer, iris_dir: Path, client_module: object
) -> None:
    module: object = client_module
    client = module.InferenceServerClient(url=iris_infer.http if module is httpclient else iris_infer.grpc)  # type: ignore[attr-defined]
    rows = np.array(IRIS_ROW * 3, dtype=np.float32)
    tensor = module.InferInput("input", list(rows.shape), "FP32")  # type: ignore[attr-defined]
    tensor.set_data_from_numpy(rows)  # HTTP: binary_data=True by default, as tritonclient users call it
    result = client.infer("classifier", [tensor])
    probabilities = result.as_numpy("probabilities")
    golden = _golden(iris_dir)
    assert probabilities.shape == (3, 3)
    np.testing.assert_allclose(probabilities, np.repeat(golden[None, :], 3, axis=0), atol=1e-4)
    assert result.as_numpy("label").tolist() == [0, 0, 0]


def _golden(iris_dir: Path) -> np.ndarray:
    import json

    return np.asarray(json.loads((iris_dir / "golden.json").read_text()), dtype=np.float32)


@pytest.fixture(scope="module")
def repository_infer(iris_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[InferServer]:
    """A NAME/VERSION repository: iris versions 1 and 2 (2 = the same model), and a BYTES model."""
    root = tmp_path_factory.mktemp("repo")
    for version in ("1", "2"):
        (root / "iris" / version).mkdir(parents=True)
        shutil.copy(iris_dir / "models" / "iris.onnx", root / "iris" / version / "model.onnx")
    (root / "echo" / "1").mkdir(parents=True)
    (root / "echo" / "config.yaml").write_text(
        "runtime: python\noptions:\n  class: 'model:Upper'\n"
        "  inputs: [{name: TEXT, dtype: object}]\n"
        "  outputs: [{name: UPPER, dtype: object}, {name: LENGTH, dtype: int64}]\n"
    )
    (root / "echo" / "1" / "model.py").write_text(
        "import numpy as np\n\n\nclass Upper:\n"
        "    def predict(self, inputs):\n"
        "        text = inputs['TEXT']\n"
        "        upper = np.array([t.upper() for t in text.reshape(-1)], dtype=object).reshape(text.shape)\n"
        "        length = np.array([len(t) for t in text.reshape(-1)], dtype=np.int64).reshape(text.shape)\n"
        "        return {'UPPER': upper, 'LENGTH': length}\n"
    )
    with infer_server(["--repository", str(root)], tmp_path_factory.mktemp("repo-infer")) as server:
        yield server


@pytest.mark.parametrize("client_module", [httpclient, grpcclient], ids=["http", "grpc"])
def test_tritonclient_versioned_model_and_bytes(repository_infer: InferServer, client_module: object) -> None:
    module: object = client_module
    client = module.InferenceServerClient(url=repository_infer.http if module is httpclient else repository_infer.grpc)  # type: ignore[attr-defined]
    rows = np.array(IRIS_ROW, dtype=np.float32)
    for version in ("1", "2", ""):
        tensor = module.InferInput("input", [1, 4], "FP32")  # type: ignore[attr-defined]
        tensor.set_data_from_numpy(rows)
        result = client.infer("iris", [tensor], model_version=version)
        assert result.as_numpy("label").tolist() == [0]
    assert client.is_model_ready("iris", "2")
    tensor = module.InferInput("input", [1, 4], "FP32")  # type: ignore[attr-defined]
    tensor.set_data_from_numpy(rows)
    with pytest.raises(InferenceServerException, match="no version '3'"):
        client.infer("iris", [tensor], model_version="3")
    text = np.array([[b"tiger cat"], [b"\xc3\xa9t\xc3\xa9"]], dtype=object)
    tensor = module.InferInput("TEXT", [2, 1], "BYTES")  # type: ignore[attr-defined]
    tensor.set_data_from_numpy(text)
    result = client.infer("echo", [tensor])
    assert result.as_numpy("UPPER").reshape(-1).tolist() == [
        b"TIGER CAT",
        "été".encode().upper(),
    ]  # bytes.upper: ASCII only
    assert result.as_numpy("LENGTH").reshape(-1).tolist() == [9, 5]
    index = client.get_model_repository_index()
    names = sorted(m["name"] for m in index) if module is httpclient else sorted(m.name for m in index.models)
    assert names == ["echo", "iris", "iris"]


def test_malformed_v2_requests_get_400_with_error_and_server_keeps_serving(iris_infer: InferServer) -> None:
    url = f"http://{iris_infer.http}/v2/models/classifier/infer"
    bad_bodies = {
        b"{not json": "not valid JSON",
        b'{"inputs": []}': "no 'inputs'",
        b'{"inputs": [{"name": "input", "shape": [1, 4], "datatype": "FP64", "data": [1, 2, 3, 4]}]}': "FP64",
        b'{"inputs": [{"name": "input", "shape": [1, 4], "datatype": "FP32", "data": [1, 2, 3]}]}': "3 elements",
        b'{"inputs": [{"name": "nope", "shape": [1, 4], "datatype": "FP32", "data": [1, 2, 3, 4]}]}': "unknown",
        b'{"inputs": [{"name": "input", "shape": [1, 4], "datatype": "FLOAT", "data": [1, 2, 3, 4]}]}': "datatype",
    }
    for body, words in bad_bodies.items():
        response = httpx.post(url, content=body)
        assert response.status_code == 400, (body, response.text)
        assert words in response.json()["error"], (body, response.json())
    good = {"inputs": [{"name": "input", "shape": [1, 4], "datatype": "FP32", "data": IRIS_ROW}]}
    assert httpx.post(url, json=good).status_code == 200
    assert httpx.post(f"http://{iris_infer.http}/v2/models/nope/infer", json=good).status_code == 404
    assert httpx.get(url).status_code == 405


# -- the preprocessing server over gRPC ----------------------------------------------------------------------------


def _cat_body(cat_jpeg: bytes) -> dict[str, str]:
    return {"data": base64.b64encode(cat_jpeg).decode()}


def test_up_prep_pred_serves_the_seed_flow_and_stops_cleanly(
    imagenet_dir: Path, cat_jpeg: bytes, tmp_path: Path
) -> None:
    """`pipeserve up --pattern prep-pred`: base64 cat -> prep /predict/label -> gRPC -> inference server -> a cat."""
    prep, http, grpc = free_port(), free_port(), free_port()
    args = [
        str(imagenet_dir), "--pattern", "prep-pred", "--infer-replicas", "1", "--prep-workers", "1",
        "--prep-port", str(prep), "--infer-http-port", str(http), "--infer-grpc-port", str(grpc),
    ]  # fmt: skip
    with run_up(args, log_path=tmp_path / "up.log"):
        response = httpx.post(f"http://127.0.0.1:{prep}/predict/label", json=_cat_body(cat_jpeg), timeout=30)
        assert response.status_code == 200, response.text
        assert response.json()["prediction"] in {"tiger cat", "Egyptian Mau", "tabby"}
        metadata = httpx.get(f"http://127.0.0.1:{prep}/metadata").json()
        assert metadata["inference"]["endpoints"] == [{"url": f"grpc://127.0.0.1:{grpc}", "up": True, "reason": None}]
        assert metadata["golden_check"].startswith("prediction matches")  # the golden check ran across the split
    for port in (prep, http, grpc):  # every process is gone: the ports are free again
        with pytest.raises(httpx.TransportError):
            httpx.get(f"http://127.0.0.1:{port}/", timeout=1)


def test_inference_server_killed_under_load_gives_503_then_recovers(iris_dir: Path, tmp_path: Path) -> None:
    http, grpc = free_port(), free_port()
    infer = start_infer([str(iris_dir)], tmp_path, http_port=http, grpc_port=grpc)
    try:
        with run_server(["serve", str(iris_dir), "--infer", f"grpc://127.0.0.1:{grpc}"], tmp_path=tmp_path) as prep:
            url = f"{prep.url}/predict/label"
            statuses: list[tuple[float, int]] = []
            stop_load = threading.Event()

            def load() -> None:
                with httpx.Client(timeout=10) as client:
                    while not stop_load.is_set():
                        started = time.monotonic()
                        code = client.post(
                            url, json={"data": IRIS_ROW}, headers={"X-Request-Timeout-Ms": "2000"}
                        ).status_code
                        statuses.append((time.monotonic() - started, code))

            workers = [threading.Thread(target=load) for _ in range(4)]
            for worker in workers:
                worker.start()
            time.sleep(1.0)
            os.killpg(infer.process.pid, signal.SIGKILL)
            infer.process.wait()
            time.sleep(1.5)
            down = httpx.post(url, json={"data": IRIS_ROW})
            ready = httpx.get(f"{prep.url}/health/ready")
            restarted_at = time.monotonic()
            infer = start_infer([str(iris_dir)], tmp_path, http_port=http, grpc_port=grpc)
            recovered_after = None
            while time.monotonic() - restarted_at < 30:
                if httpx.post(url, json={"data": IRIS_ROW}).status_code == 200:
                    recovered_after = time.monotonic() - restarted_at
                    break
                time.sleep(0.1)
            stop_load.set()
            for worker in workers:
                worker.join(timeout=15)
    finally:
        stop(infer.process)
    assert down.status_code == 503, down.text
    assert "no inference endpoint is available" in down.json()["error"]
    assert down.headers.get("retry-after")
    assert ready.status_code == 503
    codes = {code for _, code in statuses}
    assert codes <= {200, 503}, codes  # nothing else: no 500, no hang (a hang would have been a client timeout)
    assert 200 in codes
    assert 503 in codes
    assert max(seconds for seconds, _ in statuses) < 3.0  # every answer within the 2 s deadline, plus slack
    assert recovered_after is not None
    assert recovered_after < 15  # includes the inference server's own start


def test_release_mismatch_turns_prep_unready_naming_both_fingerprints(iris_dir: Path, tmp_path: Path) -> None:
    """The model is redeployed from another release: the prep server refuses to answer with it."""
    other = tmp_path / "iris-other"
    shutil.copytree(iris_dir, other)
    with (other / "pipeline.yaml").open("a") as fh:
        fh.write("# another release: same model bytes, different spec\n")
    ours, theirs = fingerprint(load_spec(iris_dir)), fingerprint(load_spec(other))
    assert ours != theirs
    http, grpc = free_port(), free_port()
    infer = start_infer([str(iris_dir)], tmp_path, http_port=http, grpc_port=grpc)
    try:
        with run_server(["serve", str(iris_dir), "--infer", f"grpc://127.0.0.1:{grpc}"], tmp_path=tmp_path) as prep:
            assert httpx.post(f"{prep.url}/predict", json={"data": IRIS_ROW}).status_code == 200
            stop(infer.process)
            infer = start_infer([str(other)], tmp_path, http_port=http, grpc_port=grpc)
            deadline = time.monotonic() + 10
            while True:
                response = httpx.post(f"{prep.url}/predict", json={"data": IRIS_ROW})
                if response.status_code == 503 and "release mismatch" in response.text:
                    break
                assert response.status_code in (200, 503), response.text
                assert time.monotonic() < deadline, response.text
                time.sleep(0.1)
            ready = httpx.get(f"{prep.url}/health/ready")
    finally:
        stop(infer.process)
    error = response.json()["error"]
    assert ours in error, error
    assert theirs in error, error
    assert ready.status_code == 503
    assert ours in ready.json()["reason"]


def test_a_prep_server_started_before_its_inference_server_waits_and_then_serves(
    iris_dir: Path, tmp_path: Path
) -> None:
    """Orchestrators start things in any order: the prep server stays up, not ready and saying why, until an
    inference server of its release answers; then it warms up, checks the golden output and serves."""
    http, grpc = free_port(), free_port()
    env = {"PIPESERVE_INFER_START_TIMEOUT_S": "1"}
    port = free_port()
    log_path = tmp_path / "prep.log"
    command = [*PIPESERVE, "serve", str(iris_dir), "--infer", f"grpc://127.0.0.1:{grpc}", "--port", str(port)]
    with log_path.open("wb") as log:
        prep = subprocess.Popen(
            command, stdout=log, stderr=subprocess.STDOUT, env={**os.environ, **env}, start_new_session=True
        )
    infer = None
    try:
        url = f"http://127.0.0.1:{port}"
        deadline = time.monotonic() + 30
        while True:
            try:
                waiting = httpx.get(f"{url}/health/ready", timeout=2)
                break
            except httpx.TransportError:
                assert time.monotonic() < deadline, log_path.read_text()
                time.sleep(0.2)
        assert waiting.status_code == 503
        assert "waiting for an inference endpoint" in waiting.json()["reason"]
        refused = httpx.post(f"{url}/predict", json={"data": IRIS_ROW})
        assert refused.status_code == 503
        infer = start_infer([str(iris_dir)], tmp_path, http_port=http, grpc_port=grpc)
        deadline = time.monotonic() + 20
        while httpx.get(f"{url}/health/ready", timeout=2).status_code != 200:
            assert time.monotonic() < deadline, log_path.read_text()
            time.sleep(0.2)
        assert httpx.post(f"{url}/predict/label", json={"data": IRIS_ROW}).json() == {"prediction": "setosa"}
    finally:
        stop(prep)
        if infer is not None:
            stop(infer.process)
