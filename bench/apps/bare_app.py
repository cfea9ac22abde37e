"""The floor of HTTP overhead: a bare ASGI callable under uvicorn, no framework, the same work inline.

Run: BENCH_MODEL=iris uvicorn bench.apps.bare_app:app
"""

from __future__ import annotations

from typing import Any

import orjson

from bench.apps.common import Predictor

_state: dict[str, Predictor] = {}


async def app(scope: dict[str, Any], receive: Any, send: Any) -> None:
    if scope["type"] == "lifespan":
        while True:
            message = await receive()
            if message["type"] == "lifespan.startup":
                _state["predictor"] = Predictor()
                await send({"type": "lifespan.startup.complete"})
            else:
                await send({"type": "lifespan.shutdown.complete"})
                return
    if scope["type"] != "http":
        return
    chunks = []
    while True:
        message = await receive()
        chunks.append(message.get("body", b""))
        if not message.get("more_body"):
            break
    if scope["path"] == "/health":
        body = b'{"health":"ok"}'
    else:
        body = orjson.dumps({"prediction": _state["predictor"].label(orjson.loads(b"".join(chunks))["data"])})
    await send(
        {
            "type": "http.response.start",
            "status": 200,
            "headers": [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode())],
        }
    )
    await send({"type": "http.response.body", "body": body})
