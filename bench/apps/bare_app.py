"""The floor of HTTP overhead: a bare ASGI callable under uvicorn, no framework, the same work inline.

Run: BENCH_MODEL=iris uvicorn bench.apps.bare_app:app
"""

from __future__ import annotations

from typing import Any

import orjson

from bench.apps.common import Predictor, read_body, respond

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
    body = await read_body(receive)
    if scope["path"] == "/health":
        await respond(send, b'{"health":"ok"}')
    else:
        await respond(send, orjson.dumps({"prediction": _state["predictor"].label(orjson.loads(body)["data"])}))
