"""OpenTelemetry: one trace per request across the gateway and the node services, exported to a real OTLP
receiver (an HTTP server in the test that decodes the protobuf export requests), the job id on every span."""

from __future__ import annotations

import shutil
import threading
import time
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import httpx
import pytest
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest

from tests.e2e.conftest import free_port, run_up

pytestmark = pytest.mark.e2e


class Receiver:
    """The OTLP/HTTP traces endpoint (POST /v1/traces), keeping every span with its service name."""

    def __init__(self) -> None:
        self.spans: list[dict[str, Any]] = []
        receiver = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                body = self.rfile.read(int(self.headers["Content-Length"]))
                export = ExportTraceServiceRequest.FromString(body)
                for resource in export.resource_spans:
                    service = next(
                        a.value.string_value for a in resource.resource.attributes if a.key == "service.name"
                    )
                    for scope in resource.scope_spans:
                        for span in scope.spans:
                            attributes = {a.key: a.value.string_value for a in span.attributes}
                            receiver.spans.append(
                                {"service": service, "name": span.name, "trace": span.trace_id.hex(), **attributes}
                            )
                self.send_response(200)
                self.send_header("Content-Type", "application/x-protobuf")
                self.end_headers()

            def log_message(self, *args: Any) -> None:
                return None

        self.server = ThreadingHTTPServer(("127.0.0.1", free_port()), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()


@pytest.fixture
def receiver() -> Iterator[Receiver]:
    found = Receiver()
    yield found
    found.server.shutdown()
    found.server.server_close()


def test_one_trace_follows_a_request_through_the_gateway_and_the_node_services(
    iris_ensemble_dir: Path, tmp_path: Path, receiver: Receiver
) -> None:
    spec = tmp_path / "ensemble"
    shutil.copytree(iris_ensemble_dir, spec)
    text = (spec / "pipeline.yaml").read_text()
    text = text.replace("grpc://127.0.0.1:50061", f"grpc://127.0.0.1:{free_port()}")
    text = text.replace("grpc://127.0.0.1:50062", f"grpc://127.0.0.1:{free_port()}")
    (spec / "pipeline.yaml").write_text(text)
    gateway_port = free_port()
    env = {"OTEL_EXPORTER_OTLP_ENDPOINT": receiver.url, "OTEL_BSP_SCHEDULE_DELAY": "100"}
    args = [str(spec), "--pattern", "microservices", "--prep-port", str(gateway_port)]
    with run_up(args, log_path=tmp_path / "up.log", env=env):
        response = httpx.post(
            f"http://127.0.0.1:{gateway_port}/predict",
            json={"data": [[5.1, 3.5, 1.4, 0.2]]},
            headers={"X-Request-ID": "trace-me-1"},
        )
        assert response.status_code == 200
        deadline = time.monotonic() + 15
        while True:
            mine = [s for s in receiver.spans if s.get("pipeserve.request_id") == "trace-me-1"]
            services = {s["service"] for s in mine}
            if len(services) == 3 and {"node average", "v2 infer logreg"} <= {s["name"] for s in mine}:
                break
            assert time.monotonic() < deadline, (services, [s["name"] for s in mine])
            time.sleep(0.2)
    names = [(s["service"], s["name"]) for s in mine]
    gateway = "pipeserve iris_ensemble"
    assert (gateway, "POST /predict") in names
    for node in ("svc", "logreg", "average"):
        assert (gateway, f"node {node}") in names
    assert sum(1 for s in mine if s["name"] == "v2 infer svc") == 2  # the gateway's call and the service's answer
    assert len({s["trace"] for s in mine}) == 1  # one trace across three processes
    request_spans = [s for s in receiver.spans if s["name"] == "POST /predict"]
    assert all(s.get("pipeserve.request_id") for s in receiver.spans if s["trace"] == mine[0]["trace"])
    assert len(request_spans) >= 1
