"""The prediction endpoints on a lean ASGI path: read the body, call the service, encode. No framework."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncGenerator, Awaitable, Callable, Coroutine, MutableMapping
from typing import Any
from urllib.parse import parse_qsl

import orjson
from starlette.datastructures import Headers as StarletteHeaders
from starlette.datastructures import UploadFile
from starlette.formparsers import MultiPartException, MultiPartParser

from pipeserve.errors import InvalidInput, PayloadTooLarge
from pipeserve.pipeline.codec import dump_json
from pipeserve.pipeline.context import request_annotations
from pipeserve.pipeline.graph import DEFAULT_ENDPOINT
from pipeserve.server.rest.errors import Headers
from pipeserve.service import InferenceService

Receive = Callable[[], Awaitable[dict[str, Any]]]
JSON_BODY_EXPECTED = 'a JSON object {"data": ...}'


class ClientDisconnected(Exception):
    """The client went away before its answer was ready."""


async def read_body(
    scope: MutableMapping[str, Any], receive: Receive, limit: int, content_length: bytes | None = None
) -> bytes:
    """The request body, refusing more than ``limit`` bytes (by Content-Length up front, else as it arrives)."""
    if content_length is None:
        content_length = next((value for key, value in scope["headers"] if key == b"content-length"), None)
    if content_length is not None:
        try:
            declared = int(content_length)
        except ValueError:
            raise InvalidInput("Content-Length is not a number", expected="a byte count") from None
        if declared > limit:
            raise PayloadTooLarge(declared, limit)
    chunks: list[bytes] = []
    size = 0
    while True:
        message = await receive()
        if message["type"] == "http.disconnect":
            raise ClientDisconnected
        chunk = message.get("body", b"")
        if chunk:
            size += len(chunk)
            if size > limit:
                raise PayloadTooLarge(None, limit)
            chunks.append(chunk)
        if not message.get("more_body", False):
            break
    return chunks[0] if len(chunks) == 1 else b"".join(chunks)


def parse_data(body: bytes) -> Any:
    """The ``data`` of a JSON body ``{"data": ...}``.

    Raises:
        InvalidInput: the body is empty, not JSON, not an object, or has no ``data``.
    """
    return parse_document(body)["data"]


def parse_document(body: bytes) -> dict[str, Any]:
    """A JSON body ``{"data": ..., ...}`` as a dict (``data`` checked present); errors as ``parse_data``."""
    if not body:
        raise InvalidInput("the request body is empty", expected=JSON_BODY_EXPECTED)
    try:
        document = orjson.loads(body)
    except orjson.JSONDecodeError as exc:
        hint = " (NaN and Infinity are not JSON)" if b"NaN" in body or b"Infinity" in body else ""
        raise InvalidInput(f"the body is not valid JSON: {exc}{hint}", expected=JSON_BODY_EXPECTED) from None
    if not isinstance(document, dict):
        raise InvalidInput(f"the body is a JSON {type(document).__name__}, not an object", expected=JSON_BODY_EXPECTED)
    if "data" not in document:
        keys = ", ".join(sorted(document)) or "none"
        raise InvalidInput(f"the body has no 'data' field (fields: {keys})", expected=JSON_BODY_EXPECTED)
    return document


TIMEOUT_HEADER = b"x-request-timeout-ms"


class PredictEndpoint:
    """``POST`` a ``{"data": ...}`` body (or, for image pipelines, a multipart upload), answer ``{"prediction": ...}``.

    Query parameters reach the pipeline's steps (``?k=5`` for ``top_k``). ``X-Request-Timeout-Ms`` sets the
    request's deadline (default: the server's ``request_timeout_s``). With ``watch_disconnects``, a client that
    goes away cancels its request, which a batcher then drops before it runs.
    """

    methods = frozenset({"POST"})

    def __init__(
        self,
        service: InferenceService,
        *,
        endpoint: str = DEFAULT_ENDPOINT,
        label: bool = False,
        max_body_bytes: int,
        default_timeout_s: float | None,
        watch_disconnects: bool = False,
    ) -> None:
        self._service = service
        self._endpoint = endpoint
        self._label = label
        self._limit = max_body_bytes
        self._default_timeout_s = default_timeout_s
        self._watch = watch_disconnects
        self._accepts_uploads = service.spec.input.kind == "image"

    async def __call__(self, scope: MutableMapping[str, Any], receive: Receive) -> tuple[int, bytes, Headers]:
        content_length = content_type = timeout = None
        for key, value in scope["headers"]:
            if key == b"content-length":
                content_length = value
            elif key == b"content-type":
                content_type = value
            elif key == TIMEOUT_HEADER:
                timeout = value
        body = await read_body(scope, receive, self._limit, content_length)
        if content_type is not None and content_type.startswith(b"multipart/form-data"):
            if not self._accepts_uploads:
                raise InvalidInput("this pipeline does not take file uploads", expected=JSON_BODY_EXPECTED)
            data, _ = await parse_upload(scope, body)
        else:
            data = parse_data(body)
        timeout_s = _timeout_s(timeout) if timeout is not None else self._default_timeout_s
        query = scope.get("query_string")
        if self._label:
            work = self._service.predict_label(data, timeout_s=timeout_s)
        else:
            params = dict(parse_qsl(query.decode("latin-1"))) if query else None
            work = self._service.predict(data, self._endpoint, params, timeout_s=timeout_s)
        result = await (_unless_disconnected(work, receive) if self._watch else work)
        annotations = request_annotations.get()
        if annotations and annotations.get("skipped"):  # optional nodes that failed: answered without them
            return 200, dump_json({"prediction": result, "skipped": annotations["skipped"]}), []
        return 200, dump_json({"prediction": result}), []


async def parse_upload(scope: MutableMapping[str, Any], body: bytes) -> tuple[bytes, dict[str, str]]:
    """A multipart upload's file (the ``image`` field, else the first file) and its text fields.

    Raises:
        InvalidInput: the body is malformed or holds no file.
    """

    async def stream() -> AsyncGenerator[bytes, None]:
        yield body

    try:
        form = await MultiPartParser(StarletteHeaders(scope=scope), stream(), max_files=4, max_fields=16).parse()
    except MultiPartException as exc:
        raise InvalidInput(f"the multipart body is malformed: {exc.message}", expected=UPLOAD_EXPECTED) from None
    try:
        upload = form.get("image")
        if upload is None:
            upload = next((value for _, value in form.multi_items() if isinstance(value, UploadFile)), None)
        if not isinstance(upload, UploadFile):
            fields = ", ".join(form.keys()) or "none"
            raise InvalidInput(
                f"the upload has no file in an 'image' field (fields: {fields})", expected=UPLOAD_EXPECTED
            )
        texts = {key: value for key, value in form.multi_items() if isinstance(value, str)}
        return await upload.read(), texts
    finally:
        await form.close()


UPLOAD_EXPECTED = "a multipart/form-data upload with the image file in an 'image' field (curl -F image=@cat.jpg)"


def _timeout_s(raw: bytes) -> float:
    try:
        milliseconds = float(raw)
    except ValueError:
        milliseconds = float("nan")
    if not 0 < milliseconds <= 3_600_000:
        raise InvalidInput(f"X-Request-Timeout-Ms is {raw.decode('latin-1')!r}", expected="milliseconds, 1 to 3600000")
    return milliseconds / 1000.0


#: A request still waiting this long starts watching for its client going away. Watching every request
#: from the start costs a task each (10-20% of a small model's throughput, measured); one that answers
#: sooner would almost always have run before a disconnect could be noticed anyway.
WATCH_AFTER_S = 0.05


async def _unless_disconnected(work: Coroutine[Any, Any, Any], receive: Receive) -> Any:
    """Await ``work``; if the client disconnects meanwhile, cancel it (a queued request is then dropped)."""
    task = asyncio.current_task()
    assert task is not None  # always inside a request task
    loop = asyncio.get_running_loop()
    state: dict[str, Any] = {"gone": False, "watcher": None}

    async def watch() -> None:
        while (await receive())["type"] != "http.disconnect":
            pass
        state["gone"] = True
        task.cancel()

    def start() -> None:
        state["watcher"] = loop.create_task(watch())

    timer = loop.call_later(WATCH_AFTER_S, start)
    try:
        return await work
    except asyncio.CancelledError:
        if state["gone"]:
            task.uncancel()
            raise ClientDisconnected from None
        raise
    finally:
        timer.cancel()
        if state["watcher"] is not None:
            state["watcher"].cancel()


class StaticEndpoint:
    """A constant JSON answer (``GET /health``)."""

    methods = frozenset({"GET"})

    def __init__(self, body: Any) -> None:
        self._body = dump_json(body)

    async def __call__(self, scope: MutableMapping[str, Any], receive: Receive) -> tuple[int, bytes, Headers]:
        return 200, self._body, []
