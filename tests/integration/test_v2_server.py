"""The v2 inference server in process: V2HttpApp over ASGI and GrpcInferenceServicer over a real loopback gRPC server.

Two repositories: the iris pipeline spec (its model node, reporting the spec's release fingerprint), and a Triton
style folder with iris versions 1 and 2, a BYTES model (``echo``: upper-cases) and a slow Python model (``slow``:
sleeps ``DELAY`` seconds, for deadlines and overload).
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import shutil
import socket
from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path
from typing import Any

import grpc
import httpx
import numpy as np
import orjson
import pytest

from pipeserve.config import GrpcEngine
from pipeserve.errors import DeadlineExceeded, InvalidInput, Overloaded
from pipeserve.observability.metrics import Metrics
from pipeserve.pipeline.loader import load_spec
from pipeserve.pipeline.release import fingerprint
from pipeserve.remote.clients import EndpointDown, GrpcClient, HttpClient
from pipeserve.server.v2 import V2HttpApp, start_grpc_server
from pipeserve.service.models import ModelRepository, ModelService
from pipeserve.v2 import grpc_codec
from pipeserve.v2._proto import inference_pb2 as pb
from pipeserve.v2.grpc_service import Stub
from pipeserve.v2.rest_codec import decode_infer_response, encode_infer_request
from tests.v2_messages import build_request

IRIS_ROW = [[5.1, 3.5, 1.4, 0.2]]
HEADER_LENGTH = "inference-header-content-length"

ECHO_MODEL = """
import numpy as np


class Upper:
    def predict(self, inputs):
        text = inputs["TEXT"]
        out = np.empty(text.shape, dtype=object)
        out.reshape(-1)[:] = [bytes(item).upper() for item in text.reshape(-1)]
        return {"UPPER": out}
"""
ECHO_CONFIG = """
runtime: python
options: {class: "model:Upper", inputs: [{name: TEXT, dtype: object}], outputs: [{name: UPPER, dtype: object}]}
"""
SLOW_MODEL = """
import time


class Slow:
    def predict(self, inputs):
        time.sleep(float(inputs["DELAY"].max()))
        return {"OUT": inputs["DELAY"].copy()}
"""
SLOW_CONFIG = """
runtime: python
execution: thread
options: {class: "model:Slow", inputs: [{name: DELAY, dtype: float32}], outputs: [{name: OUT, dtype: float32}]}
"""

ServiceFactory = Callable[..., Awaitable[ModelService]]


def iris_json(**extra: Any) -> dict[str, Any]:
    return {"inputs": [{"name": "input", "shape": [1, 4], "datatype": "FP32", "data": IRIS_ROW}], **extra}


def bytes_tensor(*items: bytes) -> np.ndarray[Any, Any]:
    array = np.empty(len(items), dtype=object)
    array[:] = list(items)
    return array


async def until_in_flight(service: ModelService, count: int) -> None:
    """Wait until ``count`` requests are inside the service (past its in-flight check)."""
    for _ in range(500):
        if service.in_flight >= count:
            return
        await asyncio.sleep(0.01)
    raise AssertionError(f"{count} requests never got in flight")


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


@pytest.fixture
def repo_dir(tmp_path: Path, iris_dir: Path) -> Path:
    root = tmp_path / "repo"
    for version in ("1", "2"):
        (root / "iris" / version).mkdir(parents=True)
        shutil.copy(iris_dir / "models" / "iris.onnx", root / "iris" / version / "model.onnx")
    for name, model, config in (("echo", ECHO_MODEL, ECHO_CONFIG), ("slow", SLOW_MODEL, SLOW_CONFIG)):
        (root / name / "1").mkdir(parents=True)
        (root / name / "1" / "model.py").write_text(model)
        (root / name / "config.yaml").write_text(config)
    return root


@pytest.fixture
async def make_service() -> AsyncIterator[ServiceFactory]:
    """Start a ModelService over a repository; every one is stopped at the end."""
    started: list[ModelService] = []

    async def make(repository: ModelRepository, **options: Any) -> ModelService:
        service = ModelService(repository, warmup_runs=1, worker_threads=2, **options)
        await service.start()
        started.append(service)
        return service

    yield make
    for service in started:
        await service.stop(grace_s=2.0)


@pytest.fixture
async def spec_service(make_service: ServiceFactory, iris_dir: Path) -> ModelService:
    return await make_service(ModelRepository.from_spec(load_spec(iris_dir)))


@pytest.fixture
async def repo_service(make_service: ServiceFactory, repo_dir: Path) -> ModelService:
    return await make_service(ModelRepository.from_directory(repo_dir))


def http_client(service: ModelService, **options: Any) -> httpx.AsyncClient:
    return httpx.AsyncClient(transport=httpx.ASGITransport(app=V2HttpApp(service, **options)), base_url="http://v2")


@pytest.fixture
async def spec_http(spec_service: ModelService) -> AsyncIterator[httpx.AsyncClient]:
    async with http_client(spec_service) as client:
        yield client


@pytest.fixture
async def repo_http(repo_service: ModelService) -> AsyncIterator[httpx.AsyncClient]:
    async with http_client(repo_service) as client:
        yield client


async def serve_grpc(service: ModelService, engine: GrpcEngine) -> AsyncIterator[str]:
    address = f"127.0.0.1:{free_port()}"
    server = await start_grpc_server(service, "127.0.0.1", int(address.rsplit(":", 1)[1]), engine=engine)
    try:
        yield address
    finally:
        await server.stop(None)


#: Every gRPC test runs against both servers: ours on the event loop (the default) and grpc.aio's.
@pytest.fixture(params=["native", "grpcio"])
def engine(request: pytest.FixtureRequest) -> GrpcEngine:
    return request.param  # type: ignore[no-any-return]


@pytest.fixture
async def spec_grpc(spec_service: ModelService, engine: GrpcEngine) -> AsyncIterator[str]:
    async for address in serve_grpc(spec_service, engine):
        yield address


@pytest.fixture
async def repo_grpc(repo_service: ModelService, engine: GrpcEngine) -> AsyncIterator[str]:
    async for address in serve_grpc(repo_service, engine):
        yield address


@pytest.fixture
async def stub_for() -> AsyncIterator[Callable[[str], Stub]]:
    channels: list[grpc.aio.Channel] = []

    def make(address: str) -> Stub:
        channel = grpc.aio.insecure_channel(address)
        channels.append(channel)
        return Stub(channel)

    yield make
    for channel in channels:
        await channel.close(None)


@pytest.fixture(params=["native", "grpcio"])
async def grpc_client_for(request: pytest.FixtureRequest) -> AsyncIterator[Callable[[str], GrpcClient]]:
    """Our v2 gRPC client, on either engine (each against either server: every combination is tested)."""
    clients: list[GrpcClient] = []

    def make(address: str) -> GrpcClient:
        client = GrpcClient(f"grpc://{address}", request.param)
        clients.append(client)
        return client

    yield make
    for client in clients:
        await client.close()


def error_of(response: httpx.Response) -> str:
    assert response.headers["content-type"] == "application/json"
    body = response.json()
    assert set(body) >= {"error"}, body
    message: str = body["error"]
    return message


async def infer_status(client: httpx.AsyncClient, path: str, doc: dict[str, Any], **headers: str) -> httpx.Response:
    return await client.post(path, content=orjson.dumps(doc), headers=headers)


# --- health and metadata (HTTP) ------------------------------------------------------------------------------------


async def test_health_answers_carry_json_bodies(spec_http: httpx.AsyncClient) -> None:
    for path, body in [
        ("/v2/health/live", {"live": True}),
        ("/v2/health/ready", {"ready": True}),
        ("/v2/models/classifier/ready", {"name": "classifier", "ready": True}),
        ("/v2/models/classifier/versions/1/ready", {"name": "classifier", "ready": True}),
        ("/health/live", {"live": True}),
        ("/health/ready", {"ready": True}),
    ]:
        response = await spec_http.get(path)
        assert response.status_code == 200, path
        assert response.headers["content-type"] == "application/json"
        assert response.json() == body, path


async def test_server_metadata_names_the_server_and_its_extensions(spec_http: httpx.AsyncClient) -> None:
    doc = (await spec_http.get("/v2")).json()
    assert doc["name"] == "pipeserve"
    assert {"binary_tensor_data", "model_repository"} <= set(doc["extensions"])
    assert (await spec_http.get("/v2/models")).json() == {"models": ["classifier"]}


async def test_model_metadata_reports_the_signature_and_the_specs_release_fingerprint(
    spec_http: httpx.AsyncClient, iris_dir: Path
) -> None:
    doc = (await spec_http.get("/v2/models/classifier")).json()

    assert doc["name"] == "classifier"
    assert doc["versions"] == ["1"]
    assert doc["platform"] == "onnx"
    assert doc["inputs"] == [{"name": "input", "datatype": "FP32", "shape": [-1, 4]}]
    assert {"name": "probabilities", "datatype": "FP32", "shape": [-1, 3]} in doc["outputs"]
    assert doc["parameters"]["pipeserve_release"] == fingerprint(load_spec(iris_dir))
    assert doc["parameters"]["max_batch_size"] == 64


async def test_a_repository_models_fingerprint_is_the_digest_of_its_version_folder(
    repo_http: httpx.AsyncClient, repo_dir: Path
) -> None:
    one = (await repo_http.get("/v2/models/iris/versions/1")).json()["parameters"]["pipeserve_release"]
    echo = (await repo_http.get("/v2/models/echo")).json()["parameters"]["pipeserve_release"]
    model = (repo_dir / "iris" / "1" / "model.onnx").read_bytes()
    assert one == hashlib.sha256(b"model.onnx" + model).hexdigest()[:16]
    assert one != echo


# --- versions ------------------------------------------------------------------------------------------------------


async def test_the_latest_version_is_the_highest_and_each_version_is_addressable(repo_http: httpx.AsyncClient) -> None:
    meta = (await repo_http.get("/v2/models/iris")).json()
    assert meta["versions"] == ["1", "2"]

    for path, version in [
        ("/v2/models/iris/infer", "2"),
        ("/v2/models/iris/versions/1/infer", "1"),
        ("/v2/models/iris/versions/2/infer", "2"),
    ]:
        response = await infer_status(repo_http, path, iris_json())
        assert response.status_code == 200, response.text
        assert response.json()["model_version"] == version, path


async def test_the_latest_version_is_the_highest_number_not_the_last_string(
    make_service: ServiceFactory, tmp_path: Path, iris_dir: Path
) -> None:
    for version in ("9", "10"):
        (tmp_path / "iris" / version).mkdir(parents=True)
        shutil.copy(iris_dir / "models" / "iris.onnx", tmp_path / "iris" / version / "model.onnx")
    service = await make_service(ModelRepository.from_directory(tmp_path))
    async with http_client(service) as client:
        response = await infer_status(client, "/v2/models/iris/infer", iris_json())
        assert response.json()["model_version"] == "10"
        assert (await client.get("/v2/models/iris")).json()["versions"] == ["9", "10"]


@pytest.mark.parametrize(
    ("method", "path"),
    [
        ("GET", "/v2/models/iris/versions/3"),
        ("GET", "/v2/models/iris/versions/3/ready"),
        ("POST", "/v2/models/iris/versions/3/infer"),
        ("GET", "/v2/models/iris/versions/v1"),
    ],
)
async def test_an_unknown_version_is_404_naming_the_versions_there_are(
    repo_http: httpx.AsyncClient, method: str, path: str
) -> None:
    response = await repo_http.request(method, path, content=orjson.dumps(iris_json()))
    assert response.status_code == 404
    message = error_of(response)
    assert "model 'iris' has no version" in message
    assert "(it has: 1, 2)" in message


# --- inference (HTTP) ----------------------------------------------------------------------------------------------


async def test_a_json_request_gets_a_json_answer_with_the_models_outputs(
    spec_http: httpx.AsyncClient, iris_dir: Path
) -> None:
    response = await infer_status(spec_http, "/v2/models/classifier/infer", iris_json(id="req-1"))

    assert response.status_code == 200, response.text
    assert response.headers["content-type"] == "application/json"
    assert HEADER_LENGTH not in response.headers
    doc = response.json()
    assert doc["model_name"] == "classifier"
    assert doc["model_version"] == "1"
    assert doc["id"] == "req-1"
    assert doc["parameters"]["pipeserve_release"] == fingerprint(load_spec(iris_dir))
    outputs = {out["name"]: out for out in doc["outputs"]}
    assert outputs["label"] == {"name": "label", "datatype": "INT64", "shape": [1], "data": [0]}
    golden = json.loads((iris_dir / "golden.json").read_text())
    np.testing.assert_allclose(outputs["probabilities"]["data"], golden, atol=1e-4)


async def test_a_binary_request_gets_binary_outputs_after_the_json_header(spec_http: httpx.AsyncClient) -> None:
    body, json_size = encode_infer_request({"input": np.array(IRIS_ROW * 2, dtype=np.float32)})
    assert json_size is not None

    response = await spec_http.post(
        "/v2/models/classifier/infer", content=body, headers={HEADER_LENGTH: str(json_size)}
    )  # no Content-Type, as tritonclient's sync client sends

    assert response.status_code == 200, response.text
    assert response.headers["content-type"] == "application/octet-stream"
    header_length = response.headers[HEADER_LENGTH]
    doc, tensors = decode_infer_response(response.content, header_length)
    assert all("data" not in out for out in doc["outputs"])
    assert tensors["label"].tolist() == [0, 0]
    assert tensors["probabilities"].shape == (2, 3)
    assert tensors["probabilities"].dtype == np.float32


async def test_a_per_output_binary_flag_picks_the_outputs_and_their_encoding(spec_http: httpx.AsyncClient) -> None:
    doc = iris_json(
        parameters={"binary_data_output": True}, outputs=[{"name": "label", "parameters": {"binary_data": False}}]
    )
    response = await infer_status(spec_http, "/v2/models/classifier/infer", doc)
    assert response.status_code == 200
    assert response.json()["outputs"] == [{"name": "label", "datatype": "INT64", "shape": [1], "data": [0]}]


async def test_bytes_round_trip_through_the_echo_model_binary_and_json(repo_http: httpx.AsyncClient) -> None:
    text = bytes_tensor(b"abc", b"", b"\xffz\x00")
    body, json_size = encode_infer_request({"TEXT": text})
    response = await repo_http.post("/v2/models/echo/infer", content=body, headers={HEADER_LENGTH: str(json_size)})
    assert response.status_code == 200, response.text
    _, tensors = decode_infer_response(response.content, response.headers[HEADER_LENGTH])
    assert tensors["UPPER"].tolist() == [b"ABC", b"", b"\xffZ\x00"]

    doc = {"inputs": [{"name": "TEXT", "shape": [2], "datatype": "BYTES", "data": ["héllo", ""]}]}
    response = await infer_status(repo_http, "/v2/models/echo/infer", doc)
    assert response.status_code == 200, response.text
    assert response.json()["outputs"] == [
        {"name": "UPPER", "datatype": "BYTES", "shape": [2], "data": ["HéLLO", ""]}
    ]  # bytes.upper() leaves the UTF-8 of é alone


SHORT_BINARY = orjson.dumps(
    {"inputs": [{"name": "input", "shape": [1, 4], "datatype": "FP32", "parameters": {"binary_data_size": 16}}]}
)
MALFORMED: list[tuple[str, bytes, dict[str, str], list[str]]] = [
    ("bad JSON", b'{"inputs": [', {}, ["not valid JSON"]),
    ("no inputs", b'{"id": "x"}', {}, ["no 'inputs' list"]),
    (
        "FP64 for an FP32 input",
        orjson.dumps({"inputs": [{"name": "input", "shape": [1, 4], "datatype": "FP64", "data": IRIS_ROW}]}),
        {},
        ["input 'input'", "datatype FP64", "expected datatype FP32"],
    ),
    (
        "data count not the shape's",
        orjson.dumps({"inputs": [{"name": "input", "shape": [1, 4], "datatype": "FP32", "data": [1.0, 2.0, 3.0]}]}),
        {},
        ["input 'input' has 3 elements", "4 for shape [1, 4]"],
    ),
    (
        "an unknown input name",
        orjson.dumps({"inputs": [{"name": "features", "shape": [1, 4], "datatype": "FP32", "data": IRIS_ROW}]}),
        {},
        ["unknown: ['features']", "expected inputs ['input']"],
    ),
    (
        "a shape the model does not take",
        orjson.dumps({"inputs": [{"name": "input", "shape": [1, 3], "datatype": "FP32", "data": [1, 2, 3]}]}),
        {},
        ["input 'input'", "shape [1, 3]", "[-1, 4]"],
    ),
    (
        "an unknown datatype",
        orjson.dumps({"inputs": [{"name": "input", "shape": [1, 4], "datatype": "FLOAT", "data": IRIS_ROW}]}),
        {},
        ["unknown datatype 'FLOAT'"],
    ),
    (
        "a header length beyond the body",
        orjson.dumps(iris_json()),
        {HEADER_LENGTH: "100000"},
        [HEADER_LENGTH, "is 100000 for a"],
    ),
    ("a header length that is no number", orjson.dumps(iris_json()), {HEADER_LENGTH: "twelve"}, ["'twelve'"]),
    (
        "a header length shorter than the JSON",
        orjson.dumps(iris_json()),
        {HEADER_LENGTH: "20"},
        ["not valid JSON"],
    ),
    (
        "a binary size beyond the body",
        SHORT_BINARY + b"\x00" * 8,
        {HEADER_LENGTH: str(len(SHORT_BINARY))},
        ["binary_data_size 16 but 8 bytes remain"],
    ),
    (
        "an unknown requested output",
        orjson.dumps(iris_json(outputs=[{"name": "score"}])),
        {},
        ["unknown outputs ['score']"],
    ),
    ("a timeout header that is no number", orjson.dumps(iris_json()), {"x-request-timeout-ms": "soon"}, ["'soon'"]),
]


@pytest.mark.parametrize(("case", "body", "headers", "says"), MALFORMED, ids=[m[0] for m in MALFORMED])
async def test_a_malformed_request_is_400_saying_what_is_wrong_and_the_next_request_is_answered(
    spec_http: httpx.AsyncClient, case: str, body: bytes, headers: dict[str, str], says: list[str]
) -> None:
    response = await spec_http.post("/v2/models/classifier/infer", content=body, headers=headers)

    assert response.status_code == 400, response.text
    message = error_of(response)
    for part in says:
        assert part in message, message
    good = await infer_status(spec_http, "/v2/models/classifier/infer", iris_json())
    assert good.status_code == 200, good.text


async def test_an_oversized_body_is_413(spec_service: ModelService) -> None:
    async with http_client(spec_service, max_body_bytes=64) as client:
        response = await infer_status(client, "/v2/models/classifier/infer", iris_json())
    assert response.status_code == 413
    assert "at most 64 bytes" in error_of(response)


@pytest.mark.parametrize(
    ("method", "path"),
    [
        ("POST", "/v2/models/nope/infer"),
        ("GET", "/v2/models/nope"),
        ("GET", "/v2/models/nope/ready"),
        ("POST", "/v2/repository/models/nope/load"),
    ],
)
async def test_an_unknown_model_is_404_naming_the_models_there_are(
    spec_http: httpx.AsyncClient, method: str, path: str
) -> None:
    response = await spec_http.request(method, path, content=orjson.dumps(iris_json()))
    assert response.status_code == 404
    assert error_of(response) == "unknown model 'nope' (this server has: classifier)"


async def test_an_unknown_path_is_404_not_found(spec_http: httpx.AsyncClient) -> None:
    for path in ("/v2/nope", "/v2/models/classifier/explain", "/v2/repository/models/x/delete", "/"):
        response = await spec_http.get(path)
        assert response.status_code == 404, path
        assert error_of(response) == "Not Found"


@pytest.mark.parametrize(
    ("method", "path", "allowed"),
    [
        ("GET", "/v2/models/classifier/infer", "POST"),
        ("POST", "/v2/models/classifier", "GET"),
        ("DELETE", "/v2/models/classifier/ready", "GET"),
        ("POST", "/v2/health/live", "GET"),
        ("PUT", "/v2/health/ready", "GET"),
        ("POST", "/v2", "GET"),
        ("GET", "/v2/repository/index", "POST"),
        ("GET", "/v2/repository/models/classifier/unload", "POST"),
    ],
)
async def test_a_wrong_method_is_405_naming_the_allowed_one(
    spec_http: httpx.AsyncClient, method: str, path: str, allowed: str
) -> None:
    response = await spec_http.request(method, path)
    assert response.status_code == 405
    assert response.headers["allow"] == allowed
    assert f"use {allowed}" in error_of(response)


# --- the repository extension (HTTP) -------------------------------------------------------------------------------


async def test_the_repository_index_lists_every_version_and_accepts_an_empty_body(
    repo_http: httpx.AsyncClient,
) -> None:
    response = await repo_http.post("/v2/repository/index")  # tritonclient sends no body at all

    assert response.status_code == 200
    assert response.json() == [
        {"name": "echo", "version": "1", "state": "READY"},
        {"name": "iris", "version": "1", "state": "READY"},
        {"name": "iris", "version": "2", "state": "READY"},
        {"name": "slow", "version": "1", "state": "READY"},
    ]
    assert (await repo_http.post("/v2/repository/index", json={})).json() == response.json()


async def test_unload_makes_the_model_unavailable_and_the_server_unready_and_load_restores_both(
    repo_http: httpx.AsyncClient,
) -> None:
    unload = await repo_http.post(
        "/v2/repository/models/iris/unload", json={"parameters": {"unload_dependents": False}}
    )
    assert unload.status_code == 200

    index = (await repo_http.post("/v2/repository/index")).json()
    assert {"name": "iris", "version": "2", "state": "UNAVAILABLE", "reason": "unloaded"} in index
    ready_only = (await repo_http.post("/v2/repository/index", json={"ready": True})).json()
    assert [row["name"] for row in ready_only] == ["echo", "slow"]

    model_ready = await repo_http.get("/v2/models/iris/ready")
    assert model_ready.status_code == 400
    assert "version 2 is not ready: unloaded" in error_of(model_ready)
    infer = await infer_status(repo_http, "/v2/models/iris/versions/1/infer", iris_json())
    assert infer.status_code == 503
    assert "model 'iris' version 1 is not ready: unloaded" in error_of(infer)
    server_ready = await repo_http.get("/v2/health/ready")
    assert server_ready.status_code == 503
    assert server_ready.json()["ready"] is False
    assert "iris/1: UNAVAILABLE" in server_ready.json()["error"]
    other = await infer_status(
        repo_http,
        "/v2/models/echo/infer",
        {"inputs": [{"name": "TEXT", "shape": [1], "datatype": "BYTES", "data": ["a"]}]},
    )
    assert other.status_code == 200  # the other models keep serving

    load = await repo_http.post("/v2/repository/models/iris/load", json={})
    assert load.status_code == 200
    assert all(row["state"] == "READY" for row in (await repo_http.post("/v2/repository/index")).json())
    assert (await repo_http.get("/v2/models/iris/ready")).json() == {"name": "iris", "ready": True}
    assert (await repo_http.get("/v2/health/ready")).json() == {"ready": True}
    again = await infer_status(repo_http, "/v2/models/iris/infer", iris_json())
    assert again.status_code == 200


# --- deadlines and overload (HTTP) ---------------------------------------------------------------------------------

SLOW = {"inputs": [{"name": "DELAY", "shape": [1], "datatype": "FP32", "data": [0.4]}]}


async def test_a_request_over_its_timeout_header_is_504(repo_http: httpx.AsyncClient) -> None:
    response = await infer_status(repo_http, "/v2/models/slow/infer", SLOW, **{"X-Request-Timeout-Ms": "30"})
    assert response.status_code == 504
    assert "deadline of 30 ms" in error_of(response)


async def test_a_request_over_tritons_timeout_parameter_is_504(repo_http: httpx.AsyncClient) -> None:
    doc = {**SLOW, "parameters": {"timeout": 30_000}}  # microseconds
    response = await infer_status(repo_http, "/v2/models/slow/infer", doc)
    assert response.status_code == 504
    assert "deadline of 30 ms" in error_of(response)


async def test_a_request_within_its_timeout_is_answered(repo_http: httpx.AsyncClient) -> None:
    doc = {"inputs": [{"name": "DELAY", "shape": [1], "datatype": "FP32", "data": [0.01]}]}
    response = await infer_status(repo_http, "/v2/models/slow/infer", doc, **{"X-Request-Timeout-Ms": "5000"})
    assert response.status_code == 200, response.text


async def test_beyond_max_in_flight_a_request_is_refused_503_with_retry_after(
    make_service: ServiceFactory, repo_dir: Path
) -> None:
    service = await make_service(ModelRepository.from_directory(repo_dir), max_in_flight=1)
    async with http_client(service) as client:
        first, second = await asyncio.gather(
            infer_status(client, "/v2/models/slow/infer", SLOW), infer_status(client, "/v2/models/slow/infer", SLOW)
        )
        statuses = sorted([first.status_code, second.status_code])
        assert statuses == [200, 503]
        refused = first if first.status_code == 503 else second
        assert refused.headers["retry-after"] == "1"
        assert "requests in flight" in error_of(refused)
        after = await infer_status(client, "/v2/models/iris/infer", iris_json())
        assert after.status_code == 200


# --- the pipeserve HTTP client against this server -----------------------------------------------------------------


@pytest.fixture
async def http_client_for() -> AsyncIterator[Callable[[ModelService], Awaitable[HttpClient]]]:
    clients: list[HttpClient] = []

    async def make(service: ModelService, **app_options: Any) -> HttpClient:
        client = HttpClient("http://v2:8000")
        await client._client.aclose()
        client._client = http_client(service, **app_options)
        clients.append(client)
        assert await client.ready(5.0)
        return client

    yield make
    for client in clients:
        await client.close()


async def test_the_http_client_infers_with_binary_tensors_and_gets_the_release(
    http_client_for: Any, spec_service: ModelService, iris_dir: Path
) -> None:
    client = await http_client_for(spec_service)
    tensors, parameters = await client.infer(
        "classifier", "", {"input": np.array(IRIS_ROW, np.float32)}, ["probabilities"], 5.0
    )
    assert client._binary is True
    assert list(tensors) == ["probabilities"]
    assert parameters["pipeserve_release"] == fingerprint(load_spec(iris_dir))


async def test_the_http_client_maps_errors_for_the_pool(http_client_for: Any, repo_service: ModelService) -> None:
    client = await http_client_for(repo_service, default_timeout_s=0.05)  # the server's deadline: a 504
    good = {"input": np.array(IRIS_ROW, np.float32)}

    with pytest.raises(InvalidInput, match="datatype FP64"):
        await client.infer("iris", "", {"input": np.array(IRIS_ROW, np.float64)}, None, 5.0)
    with pytest.raises(EndpointDown, match="HTTP 404"):
        await client.infer("nope", "", good, None, 5.0)
    with pytest.raises(DeadlineExceeded):
        await client.infer("slow", "", {"DELAY": np.array([0.4], np.float32)}, None, 0.05)


async def test_the_http_client_takes_a_model_that_is_not_ready_for_an_endpoint_down_not_overload(
    http_client_for: Any, repo_service: ModelService
) -> None:
    """A not-ready model must take the endpoint out of the pool (and the probe bring it back), as over gRPC."""
    client = await http_client_for(repo_service)
    await repo_service.unload("iris")

    with pytest.raises(EndpointDown, match="not ready"):
        await client.infer("iris", "", {"input": np.array(IRIS_ROW, np.float32)}, None, 5.0)


async def test_the_http_client_takes_a_full_server_for_overloaded(
    http_client_for: Any, make_service: ServiceFactory, repo_dir: Path
) -> None:
    service = await make_service(ModelRepository.from_directory(repo_dir), max_in_flight=1)
    client = await http_client_for(service)
    slow = asyncio.create_task(client.infer("slow", "", {"DELAY": np.array([0.3], np.float32)}, None, 5.0))
    await until_in_flight(service, 1)

    with pytest.raises(Overloaded):
        await client.infer("iris", "", {"input": np.array(IRIS_ROW, np.float32)}, None, 5.0)
    await slow


# --- gRPC ----------------------------------------------------------------------------------------------------------


async def test_grpc_health_and_server_metadata(spec_grpc: str, stub_for: Callable[[str], Stub]) -> None:
    stub = stub_for(spec_grpc)
    assert (await stub.ServerLive(pb.ServerLiveRequest())).live is True
    assert (await stub.ServerReady(pb.ServerReadyRequest())).ready is True
    assert (await stub.ModelReady(pb.ModelReadyRequest(name="classifier"))).ready is True
    assert (await stub.ModelReady(pb.ModelReadyRequest(name="classifier", version="1"))).ready is True
    meta = await stub.ServerMetadata(pb.ServerMetadataRequest())
    assert meta.name == "pipeserve"
    assert "binary_tensor_data" in meta.extensions


async def test_grpc_model_metadata_carries_the_release_fingerprint(
    spec_grpc: str, stub_for: Callable[[str], Stub], iris_dir: Path
) -> None:
    meta = await stub_for(spec_grpc).ModelMetadata(pb.ModelMetadataRequest(name="classifier"))

    assert (meta.name, list(meta.versions), meta.platform) == ("classifier", ["1"], "onnx")
    assert [(t.name, t.datatype, list(t.shape)) for t in meta.inputs] == [("input", "FP32", [-1, 4])]
    assert grpc_codec.get_parameters(meta.parameters) == {
        "pipeserve_release": fingerprint(load_spec(iris_dir)),
        "max_batch_size": 64,
    }


async def test_grpc_infer_with_raw_inputs_answers_raw_outputs(
    spec_grpc: str, grpc_client_for: Callable[[str], GrpcClient], iris_dir: Path
) -> None:
    client = grpc_client_for(spec_grpc)
    assert await client.ready(5.0)
    info = await client.model_info("classifier", "", 5.0)
    assert [s.name for s in info.signature.inputs] == ["input"]

    tensors, parameters = await client.infer("classifier", "", {"input": np.array(IRIS_ROW * 3, np.float32)}, None, 5.0)

    assert tensors["label"].tolist() == [0, 0, 0]
    golden = json.loads((iris_dir / "golden.json").read_text())
    np.testing.assert_allclose(tensors["probabilities"][0], golden, atol=1e-4)
    assert parameters["pipeserve_release"] == fingerprint(load_spec(iris_dir))


async def test_grpc_infer_with_typed_contents_still_answers_raw(
    spec_grpc: str, stub_for: Callable[[str], Stub]
) -> None:
    request = pb.ModelInferRequest(model_name="classifier", id="typed-1")
    tensor = request.inputs.add(name="input", datatype="FP32", shape=[1, 4])
    tensor.contents.fp32_contents.extend(IRIS_ROW[0])
    request.outputs.add(name="label")

    response = await stub_for(spec_grpc).ModelInfer(request)

    assert response.id == "typed-1"
    assert (response.model_name, response.model_version) == ("classifier", "1")
    assert [o.name for o in response.outputs] == ["label"]
    assert not response.outputs[0].HasField("contents")
    assert response.raw_output_contents[0] == np.array([0], "<i8").tobytes()


async def test_grpc_bytes_round_trip_through_the_echo_model(
    repo_grpc: str, grpc_client_for: Callable[[str], GrpcClient]
) -> None:
    text = bytes_tensor(b"abc", b"", b"\xffz\x00").reshape(3, 1)
    tensors, _ = await grpc_client_for(repo_grpc).infer("echo", "", {"TEXT": text}, None, 5.0)
    assert tensors["UPPER"].tolist() == [[b"ABC"], [b""], [b"\xffZ\x00"]]


async def test_grpc_versions_are_addressable(repo_grpc: str, stub_for: Callable[[str], Stub]) -> None:
    stub = stub_for(repo_grpc)
    inputs = {"input": np.array(IRIS_ROW, np.float32)}
    latest = await stub.ModelInfer(build_request("iris", "", inputs))
    first = await stub.ModelInfer(build_request("iris", "1", inputs))
    assert (latest.model_version, first.model_version) == ("2", "1")


async def _grpc_error(call: Awaitable[Any]) -> grpc.aio.AioRpcError:
    with pytest.raises(grpc.aio.AioRpcError) as info:
        await call
    return info.value


async def test_grpc_invalid_input_is_invalid_argument_saying_what_is_wrong(
    spec_grpc: str, stub_for: Callable[[str], Stub]
) -> None:
    stub = stub_for(spec_grpc)
    wrong_dtype = build_request("classifier", "", {"input": np.array(IRIS_ROW, np.float64)})
    error = await _grpc_error(stub.ModelInfer(wrong_dtype))
    assert error.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert "datatype FP64" in (error.details() or "")

    short = build_request("classifier", "", {"input": np.array(IRIS_ROW, np.float32)})
    short.raw_input_contents[0] = short.raw_input_contents[0][:12]
    error = await _grpc_error(stub.ModelInfer(short))
    assert error.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert "input 'input' has 12 bytes" in (error.details() or "")

    ok = await stub.ModelInfer(build_request("classifier", "", {"input": np.array(IRIS_ROW, np.float32)}))
    assert ok.model_name == "classifier"


async def test_grpc_answers_the_requested_outputs_and_names_an_unknown_one(
    spec_grpc: str, stub_for: Callable[[str], Stub]
) -> None:
    stub = stub_for(spec_grpc)
    inputs = {"input": np.array(IRIS_ROW, np.float32)}
    every = await stub.ModelInfer(build_request("classifier", "", inputs))
    names = [output.name for output in every.outputs]
    assert len(names) > 1, names
    chosen = names[::-1][:1]
    some = await stub.ModelInfer(build_request("classifier", "", inputs, chosen))
    assert [output.name for output in some.outputs] == chosen
    assert len(some.raw_output_contents) == 1

    error = await _grpc_error(stub.ModelInfer(build_request("classifier", "", inputs, ["score"])))
    assert error.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert "unknown outputs ['score']" in (error.details() or "")
    assert (await stub.ModelInfer(build_request("classifier", "", inputs))).model_name == "classifier"


async def test_grpc_an_unknown_model_or_version_is_not_found(spec_grpc: str, stub_for: Callable[[str], Stub]) -> None:
    stub = stub_for(spec_grpc)
    inputs = {"input": np.array(IRIS_ROW, np.float32)}
    for call in (
        stub.ModelInfer(build_request("nope", "", inputs)),
        stub.ModelMetadata(pb.ModelMetadataRequest(name="nope")),
        stub.ModelReady(pb.ModelReadyRequest(name="nope")),
    ):
        error = await _grpc_error(call)
        assert error.code() == grpc.StatusCode.NOT_FOUND
        assert "unknown model 'nope'" in (error.details() or "")
    error = await _grpc_error(stub.ModelInfer(build_request("classifier", "7", inputs)))
    assert error.code() == grpc.StatusCode.NOT_FOUND
    assert "(it has: 1)" in (error.details() or "")


async def test_grpc_unload_makes_the_model_unavailable_and_load_brings_it_back(
    repo_grpc: str, stub_for: Callable[[str], Stub]
) -> None:
    stub = stub_for(repo_grpc)
    inputs = {"input": np.array(IRIS_ROW, np.float32)}
    await stub.RepositoryModelUnload(pb.RepositoryModelUnloadRequest(model_name="iris"))

    error = await _grpc_error(stub.ModelInfer(build_request("iris", "", inputs)))
    assert error.code() == grpc.StatusCode.UNAVAILABLE
    assert "not ready: unloaded" in (error.details() or "")
    assert (await stub.ModelReady(pb.ModelReadyRequest(name="iris"))).ready is False
    assert (await stub.ServerReady(pb.ServerReadyRequest())).ready is False
    index = await stub.RepositoryIndex(pb.RepositoryIndexRequest())
    assert ("iris", "1", "UNAVAILABLE", "unloaded") in [(m.name, m.version, m.state, m.reason) for m in index.models]
    ready_only = await stub.RepositoryIndex(pb.RepositoryIndexRequest(ready=True))
    assert sorted({m.name for m in ready_only.models}) == ["echo", "slow"]

    await stub.RepositoryModelLoad(pb.RepositoryModelLoadRequest(model_name="iris"))

    assert (await stub.ServerReady(pb.ServerReadyRequest())).ready is True
    assert (await stub.ModelInfer(build_request("iris", "", inputs))).model_version == "2"


async def test_grpc_loading_an_unknown_model_is_not_found(repo_grpc: str, stub_for: Callable[[str], Stub]) -> None:
    error = await _grpc_error(stub_for(repo_grpc).RepositoryModelLoad(pb.RepositoryModelLoadRequest(model_name="x")))
    assert error.code() == grpc.StatusCode.NOT_FOUND


async def test_grpc_deadline_and_overload_have_their_own_codes(
    make_service: ServiceFactory, repo_dir: Path, stub_for: Callable[[str], Stub], engine: GrpcEngine
) -> None:
    service = await make_service(ModelRepository.from_directory(repo_dir), max_in_flight=1)
    async for address in serve_grpc(service, engine):
        stub = stub_for(address)
        slow = build_request("slow", "", {"DELAY": np.array([0.4], np.float32)})
        timed = build_request("slow", "", {"DELAY": np.array([0.4], np.float32)}, parameters={"timeout": 30_000})
        error = await _grpc_error(stub.ModelInfer(timed))
        assert error.code() == grpc.StatusCode.DEADLINE_EXCEEDED
        assert "deadline of 30 ms" in (error.details() or "")

        busy = asyncio.ensure_future(stub.ModelInfer(slow))
        await until_in_flight(service, 1)
        error = await _grpc_error(stub.ModelInfer(slow))
        assert error.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
        assert "in flight" in (error.details() or "")
        assert (await busy).model_name == "slow"


async def test_the_grpc_client_maps_errors_for_the_pool(
    repo_grpc: str, grpc_client_for: Callable[[str], GrpcClient], repo_service: ModelService
) -> None:
    client = grpc_client_for(repo_grpc)
    good = {"input": np.array(IRIS_ROW, np.float32)}
    with pytest.raises(InvalidInput, match="datatype FP64"):
        await client.infer("iris", "", {"input": np.array(IRIS_ROW, np.float64)}, None, 5.0)
    with pytest.raises(EndpointDown, match="NOT_FOUND"):
        await client.infer("nope", "", good, None, 5.0)
    with pytest.raises(DeadlineExceeded):
        await client.infer("slow", "", {"DELAY": np.array([0.4], np.float32)}, None, 0.05)
    await repo_service.unload("iris")
    with pytest.raises(EndpointDown, match="UNAVAILABLE"):
        await client.infer("iris", "", good, None, 5.0)


async def test_start_grpc_server_on_a_taken_port_raises_oserror(spec_service: ModelService, engine: GrpcEngine) -> None:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        with pytest.raises(OSError, match="cannot bind gRPC"):
            await start_grpc_server(spec_service, "127.0.0.1", taken.getsockname()[1], engine=engine)


async def test_an_unknown_grpc_engine_is_refused(spec_service: ModelService) -> None:
    with pytest.raises(ValueError, match="'native' or 'grpcio'"):
        await start_grpc_server(spec_service, "127.0.0.1", 0, engine="fast")  # type: ignore[arg-type]


async def test_the_inference_server_exports_what_its_batchers_learned(
    make_service: ServiceFactory, tmp_path: Path
) -> None:
    (tmp_path / "weights.bin").write_bytes(b"\0")
    (tmp_path / "pipeline.yaml").write_text("""
pipeline:
  name: summed
  input: {kind: tensor, shape: [-1, 3]}
  nodes:
  - name: model
    model_load_meta: {runtime: "tests.fakes:SumRuntime", artifact: weights.bin}
    batching: {max_batch_size: 4, max_latency_ms: 5, mode: adaptive}
""")
    metrics = Metrics()
    service = await make_service(ModelRepository.from_spec(load_spec(tmp_path)), metrics=metrics)
    rows = [np.array([[i, 1.0, 2.0]], dtype=np.float32) for i in range(24)]
    answers = await asyncio.gather(*(service.infer("model", "", {"input": row}) for row in rows))
    assert [float(outputs["output"][0, 0]) for _, outputs in answers] == [i + 3.0 for i in range(24)]
    text = metrics.render().decode()
    assert 'pipeserve_batch_learned_seconds_per_row{model="model",pipeline="v2",size="1"}' in text
    assert 'pipeserve_batch_size_count{model="model",pipeline="v2"}' in text
