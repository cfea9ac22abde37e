"""The floor of a batching HTTP server: a bare ASGI callable under uvicorn with the simplest greedy batcher.

Each request is read and preprocessed inline (as in bare_app), queued with a future, and one task runs whatever
is queued (up to BENCH_MAX_BATCH rows, default 2) after letting the requests that are ready preprocess first. No
deadlines, no disconnect handling, no metrics, no log line, no error handling: what a batching server costs per
request when it does nothing else. ``GET /stats`` answers the engine's seconds and the images and batches it ran; with
BENCH_BATCH_LOG set, each batch's size is appended to that file (as the peers do in the batching bench).

Run: BENCH_MODEL=imagenet uvicorn bench.apps.bare_batch_app:app
"""

from __future__ import annotations

import asyncio
import os
import time
from typing import Any

import numpy as np
import orjson

from bench.apps.common import Predictor, preprocess_image, read_body, record_batch, respond

MAX_BATCH = int(os.environ.get("BENCH_MAX_BATCH", "2"))
_queue: list[tuple[np.ndarray[Any, Any], asyncio.Future[str]]] = []
_state: dict[str, Any] = {"engine_s": 0.0, "images": 0, "batches": 0}


async def _runner(predictor: Predictor, wake: asyncio.Event) -> None:
    while True:
        while not _queue:
            await wake.wait()
            wake.clear()
        await asyncio.sleep(0)  # the requests that are ready preprocess and join first
        batch = _queue[:MAX_BATCH]
        del _queue[:MAX_BATCH]
        started = time.thread_time()
        logits = predictor.session.run(None, {predictor.input_name: np.concatenate([x for x, _ in batch])})[0]
        _state["engine_s"] += time.thread_time() - started
        _state["images"] += len(batch)
        _state["batches"] += 1
        record_batch(len(batch))  # only with BENCH_BATCH_LOG set (the batching bench's mean batch size)
        for (_, future), row in zip(batch, logits, strict=True):
            exp = np.exp(row - row.max())
            future.set_result(predictor.labels[int((exp / exp.sum()).argmax())])


async def app(scope: dict[str, Any], receive: Any, send: Any) -> None:
    if scope["type"] == "lifespan":
        while True:
            message = await receive()
            if message["type"] == "lifespan.startup":
                wake = asyncio.Event()
                _state["wake"] = wake
                _state["runner"] = asyncio.create_task(_runner(Predictor(), wake))
                await send({"type": "lifespan.startup.complete"})
            else:
                _state["runner"].cancel()
                await send({"type": "lifespan.shutdown.complete"})
                return
    if scope["type"] != "http":
        return
    if scope["path"] == "/health":
        await respond(send, b'{"health":"ok"}')
        return
    if scope["path"] == "/stats":
        await respond(send, orjson.dumps({key: _state[key] for key in ("engine_s", "images", "batches")}))
        return
    x = preprocess_image(orjson.loads(await read_body(receive))["data"])
    future: asyncio.Future[str] = asyncio.get_running_loop().create_future()
    _queue.append((x, future))
    _state["wake"].set()
    await respond(send, orjson.dumps({"prediction": await future}))
