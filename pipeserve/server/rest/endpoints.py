"""The prediction endpoints on a lean ASGI path: read the body, call the service, encode. No framework."""

from __future__ import annotations

import base64
from collections.abc import Awaitable, Callable, MutableMapping
from typing import Any

import numpy as np
import orjson

from pipeserve.errors import InvalidInput, PayloadTooLarge
from pipeserve.server.rest.errors import Headers

Receive = Callable[[], Awaitable[dict[str, Any]]]
JSON_BODY_EXPECTED = 'a JSON object {"data": ...}'


class ClientDisconnected(Exception):
    """The client went away before sending its whole body."""


async def read_body(scope: MutableMapping[str, Any], receive: Receive, limit: int) -> bytes:
    """The request body, refusing more than ``limit`` bytes (by Content-Length up front, else as it arrives)."""
    for key, value in scope["headers"]:
        if key == b"content-length":
            try:
                declared = int(value)
            except ValueError:
                raise InvalidInput("Content-Length is not a number", expected="a byte count") from None
            if declared > limit:
                raise PayloadTooLarge(declared, limit)
            break
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
    return document["data"]


def _fallback(value: Any) -> Any:
    if isinstance(value, np.ndarray | np.generic):
        return value.tolist()
    if isinstance(value, bytes):
        return base64.b64encode(value).decode()
    raise TypeError(f"cannot encode {type(value).__name__} as JSON")


def dump_json(value: Any) -> bytes:
    """Encode a response, NumPy arrays included."""
    return orjson.dumps(value, default=_fallback, option=orjson.OPT_SERIALIZE_NUMPY | orjson.OPT_NON_STR_KEYS)


PredictFn = Callable[[Any], Awaitable[Any]]


class PredictEndpoint:
    """``POST`` a ``{"data": ...}`` body, answer ``{"prediction": ...}``."""

    methods = frozenset({"POST"})

    def __init__(self, predict: PredictFn, max_body_bytes: int) -> None:
        self._predict = predict
        self._limit = max_body_bytes

    async def __call__(self, scope: MutableMapping[str, Any], receive: Receive) -> tuple[int, bytes, Headers]:
        body = await read_body(scope, receive, self._limit)
        result = await self._predict(parse_data(body))
        return 200, dump_json({"prediction": result}), []


class StaticEndpoint:
    """A constant JSON answer (``GET /health``)."""

    methods = frozenset({"GET"})

    def __init__(self, body: Any) -> None:
        self._body = dump_json(body)

    async def __call__(self, scope: MutableMapping[str, Any], receive: Receive) -> tuple[int, bytes, Headers]:
        return 200, self._body, []
