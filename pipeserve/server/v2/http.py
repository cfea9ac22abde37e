"""The v2 REST API over ModelService, as a lean ASGI app (binary tensor bodies do not suit a JSON framework).

Routes (``{v}`` optional, as ``/versions/{v}``): GET /v2/health/live, /v2/health/ready, /v2, /v2/models,
/v2/models/{m}[/versions/{v}], .../ready; POST .../infer; POST /v2/repository/index,
/v2/repository/models/{m}/load|unload; GET /metrics; GET /health/live, /health/ready (pipeserve's own probes).
Errors are ``{"error": message}``; health answers carry JSON bodies (the KServe client parses them).
"""

from __future__ import annotations

import logging
import re
from collections.abc import Awaitable, Callable, MutableMapping
from typing import Any

import orjson

from pipeserve.errors import (
    DeadlineExceeded,
    InvalidInput,
    NotFound,
    NotReady,
    Overloaded,
    PayloadTooLarge,
    PipeserveError,
)
from pipeserve.observability import tracing
from pipeserve.observability.context import accept_request_id, request_id_var
from pipeserve.service.models import ModelService
from pipeserve.v2 import RELEASE_PARAMETER
from pipeserve.v2.rest_codec import (
    HEADER_LENGTH,
    encode_infer_response,
    parse_infer_request,
    parse_json,
)

logger = logging.getLogger("pipeserve.server.v2")

Scope = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[MutableMapping[str, Any]]]
Send = Callable[[MutableMapping[str, Any]], Awaitable[None]]

_MODEL = re.compile(r"^/v2/models/(?P<model>[^/]+)(?:/versions/(?P<version>[^/]+))?(?P<action>/ready|/infer)?$")
_REPO = re.compile(r"^/v2/repository(?:/[^/]+)?/(?:index|models/(?P<model>[^/]+)/(?P<action>load|unload))$")


class _Response(Exception):
    """Raised inside a handler to answer with ``status`` and a JSON ``body`` (errors and redirects alike)."""

    def __init__(self, status: int, body: Any, headers: list[tuple[bytes, bytes]] | None = None) -> None:
        self.status, self.body, self.headers = status, body, headers or []


class V2HttpApp:
    """ASGI app serving the models of one ModelService over the Open Inference Protocol's REST binding."""

    def __init__(
        self,
        service: ModelService,
        *,
        max_body_bytes: int = 64 * 1024 * 1024,
        default_timeout_s: float | None = 60.0,
        metrics_render: Callable[[], bytes] | None = None,
        on_startup: Callable[[], Awaitable[None]] | None = None,
        on_shutdown: Callable[[], Awaitable[None]] | None = None,
    ) -> None:
        self.service = service
        self.max_body_bytes = max_body_bytes
        self.default_timeout_s = default_timeout_s
        self._metrics_render = metrics_render
        self._on_startup = on_startup
        self._on_shutdown = on_shutdown

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "lifespan":
            await self._lifespan(receive, send)
            return
        if scope["type"] != "http":
            return
        try:
            status, body, headers = await self._route(scope, receive)
        except _Response as answer:
            status, body, headers = answer.status, orjson.dumps(answer.body), answer.headers
        except PipeserveError as exc:
            status, payload, headers = _error(exc)
            body = orjson.dumps(payload)
        except Exception:
            logger.exception("v2 request %s %s failed", scope.get("method"), scope.get("path"))
            status, body, headers = 500, orjson.dumps({"error": "internal error (logged on the server)"}), []
        content_type = b"application/json"
        if any(name == b"content-type" for name, _ in headers):
            content_type = next(value for name, value in headers if name == b"content-type")
            headers = [h for h in headers if h[0] != b"content-type"]
        await send(
            {
                "type": "http.response.start",
                "status": status,
                "headers": [(b"content-type", content_type), (b"content-length", str(len(body)).encode()), *headers],
            }
        )
        await send({"type": "http.response.body", "body": body})

    async def _lifespan(self, receive: Receive, send: Send) -> None:
        while True:
            message = await receive()
            if message["type"] == "lifespan.startup":
                try:
                    if self._on_startup is not None:
                        await self._on_startup()
                except Exception as exc:
                    logger.exception("startup failed")
                    await send({"type": "lifespan.startup.failed", "message": str(exc)})
                    return
                await send({"type": "lifespan.startup.complete"})
            elif message["type"] == "lifespan.shutdown":
                if self._on_shutdown is not None:
                    await self._on_shutdown()
                await send({"type": "lifespan.shutdown.complete"})
                return

    async def _route(self, scope: Scope, receive: Receive) -> tuple[int, bytes, list[tuple[bytes, bytes]]]:
        path: str = scope["path"].rstrip("/") or "/"
        method: str = scope["method"]
        if path.startswith("/v2/models/"):
            match = _MODEL.match(path)
            if match is None:
                raise _Response(404, {"error": "Not Found"})
            model, version, action = match["model"], match["version"] or "", match["action"]
            if action == "/infer":
                _allow(method, "POST")
                return await self._infer(scope, receive, model, version)
            _allow(method, "GET")
            if action == "/ready":
                return self._model_ready(model, version)
            return 200, orjson.dumps(self.service.model_metadata(model, version)), []
        if path.startswith("/v2/repository"):
            repo = _REPO.match(path)
            if repo is None:
                raise _Response(404, {"error": "Not Found"})
            _allow(method, "POST")
            body = await _read_body(receive, self.max_body_bytes)
            if repo["action"] is None:
                doc = parse_json(body) if body.strip() else {}
                ready_only = bool(doc.get("ready", False)) if isinstance(doc, dict) else False
                return 200, orjson.dumps(self.service.index(ready_only=ready_only)), []
            if repo["action"] == "load":
                await self.service.load(repo["model"])
            else:
                await self.service.unload(repo["model"])
            return 200, b"", []
        return self._static(path, method)

    def _static(self, path: str, method: str) -> tuple[int, bytes, list[tuple[bytes, bytes]]]:
        if path in ("/v2/health/live", "/health/live"):
            _allow(method, "GET")
            return 200, orjson.dumps({"live": True}), []
        if path in ("/v2/health/ready", "/health/ready"):
            _allow(method, "GET")
            if self.service.is_ready:
                return 200, orjson.dumps({"ready": True}), []
            not_ready = [f"{row['name']}/{row['version']}: {row['state']}" for row in self.service.index()]
            raise _Response(503, {"ready": False, "error": f"not ready ({'; '.join(not_ready)})"})
        if path == "/v2":
            _allow(method, "GET")
            return 200, orjson.dumps(self.service.server_metadata()), []
        if path == "/v2/models":
            _allow(method, "GET")
            return 200, orjson.dumps({"models": sorted(self.service.repository.models)}), []
        if path == "/metrics" and self._metrics_render is not None:
            _allow(method, "GET")
            return 200, self._metrics_render(), [(b"content-type", b"text/plain; version=0.0.4")]
        raise _Response(404, {"error": "Not Found"})

    def _model_ready(self, model: str, version: str) -> tuple[int, bytes, list[tuple[bytes, bytes]]]:
        entry = self.service.entry(model, version)
        if entry.state != "READY":
            raise _Response(400, {"error": f"model {model!r} version {entry.version} is not ready: {entry.reason}"})
        return 200, orjson.dumps({"name": entry.name, "ready": True}), []

    async def _infer(
        self, scope: Scope, receive: Receive, model: str, version: str
    ) -> tuple[int, bytes, list[tuple[bytes, bytes]]]:
        headers = dict(scope["headers"])
        body = await _read_body(receive, self.max_body_bytes)
        header_length = headers.get(HEADER_LENGTH.encode())
        request = parse_infer_request(body, header_length.decode() if header_length is not None else None)
        timeout_s = _timeout(headers, request.parameters, self.default_timeout_s)
        carrier = {"traceparent": headers[b"traceparent"].decode("latin-1")} if b"traceparent" in headers else {}
        token = request_id_var.set(accept_request_id(request.request_id))  # the caller's job id, on spans and logs
        try:
            with tracing.span(f"v2 infer {model}", kind="server", carrier=carrier):
                entry, outputs = await self.service.infer(model, version, request.inputs, timeout_s=timeout_s)
        finally:
            request_id_var.reset(token)
        payload, json_size = encode_infer_response(
            entry.name, entry.version, request, outputs, {RELEASE_PARAMETER: entry.release or ""}
        )
        if json_size is None:
            return 200, payload, []
        return (
            200,
            payload,
            [(b"content-type", b"application/octet-stream"), (HEADER_LENGTH.encode(), str(json_size).encode())],
        )


def _allow(method: str, allowed: str) -> None:
    if method != allowed:
        raise _Response(
            405, {"error": f"method {method} is not allowed here; use {allowed}"}, [(b"allow", allowed.encode())]
        )


async def _read_body(receive: Receive, limit: int) -> bytes:
    chunks: list[bytes] = []
    size = 0
    while True:
        message = await receive()
        if message["type"] == "http.disconnect":
            raise InvalidInput("the client disconnected before sending the whole body")
        chunk = message.get("body", b"")
        size += len(chunk)
        if size > limit:
            raise PayloadTooLarge(None, limit)
        chunks.append(chunk)
        if not message.get("more_body", False):
            return b"".join(chunks) if len(chunks) != 1 else chunks[0]


def _timeout(headers: dict[bytes, bytes], parameters: dict[str, Any], default_s: float | None) -> float | None:
    """``X-Request-Timeout-Ms``, else Triton's ``timeout`` parameter (microseconds), else the server default."""
    raw = headers.get(b"x-request-timeout-ms")
    if raw is not None:
        try:
            value = float(raw)
        except ValueError:
            raise InvalidInput(
                f"X-Request-Timeout-Ms is {raw.decode(errors='replace')!r}", expected="milliseconds"
            ) from None
        if value <= 0:
            raise InvalidInput(f"X-Request-Timeout-Ms is {value}", expected="a positive number of milliseconds")
        return value / 1000
    given = parameters.get("timeout")
    if isinstance(given, int) and not isinstance(given, bool) and given > 0:
        return given / 1e6
    return default_s


def _error(exc: PipeserveError) -> tuple[int, dict[str, Any], list[tuple[bytes, bytes]]]:
    if isinstance(exc, PayloadTooLarge):
        return 413, {"error": str(exc)}, []
    if isinstance(exc, InvalidInput):
        return 400, {"error": str(exc)}, []
    if isinstance(exc, NotFound):
        return 404, {"error": str(exc)}, []
    if isinstance(exc, Overloaded):
        return 503, {"error": str(exc)}, [(b"retry-after", str(max(1, round(exc.retry_after_s))).encode())]
    if isinstance(exc, NotReady):  # no Retry-After: clients (HttpClient) read 503 + Retry-After as overload
        return 503, {"error": str(exc)}, []
    if isinstance(exc, DeadlineExceeded):
        return 504, {"error": str(exc)}, []
    return 500, {"error": str(exc)}, []
