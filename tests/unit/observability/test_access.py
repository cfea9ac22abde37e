"""AccessLog: one line per request, JSON or text, flushed at once or in the background."""

from __future__ import annotations

import asyncio
import io
import json
import re

from pipeserve.observability.access import AccessLog
from pipeserve.observability.logging import ACCESS_LOGGER

TIMESTAMP = re.compile(r"^\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{3}Z$")


def lines(out: io.BytesIO) -> list[str]:
    return out.getvalue().decode().splitlines()


def test_json_line_per_request():
    out = io.BytesIO()
    log = AccessLog(out)

    log.write("POST", "/predict", 200, 0.0123456, "req-1")
    log.write("GET", "/health", 503, 0.5, "req-2")

    first, second = (json.loads(line) for line in lines(out))
    assert first["request_id"] == "req-1"
    assert first["status"] == 200
    assert first["latency_ms"] == 12.346
    assert first["method"] == "POST"
    assert first["path"] == "/predict"
    assert first["msg"] == "POST /predict 200"
    assert first["logger"] == ACCESS_LOGGER
    assert first["level"] == "info"
    assert TIMESTAMP.match(first["ts"])
    assert (second["request_id"], second["status"], second["latency_ms"]) == ("req-2", 503, 500.0)


def test_json_extra_fields_become_keys():
    out = io.BytesIO()

    AccessLog(out).write("POST", "/predict", 200, 0.001, "r", extra={"batch_size": 4, "model": "iris"})

    entry = json.loads(lines(out)[0])
    assert entry["batch_size"] == 4
    assert entry["model"] == "iris"


def test_json_escapes_hostile_values():
    out = io.BytesIO()

    AccessLog(out).write("GET", '/x"\n{"status": 500}', 404, 0.0, 'id"\n')

    assert len(lines(out)) == 1
    entry = json.loads(lines(out)[0])
    assert entry["status"] == 404
    assert entry["path"] == '/x"\n{"status": 500}'


def test_text_line():
    out = io.BytesIO()
    log = AccessLog(out, fmt="text")

    log.write("GET", "/health", 200, 0.0012, "abc", extra={"model": "iris"})

    (line,) = lines(out)
    stamp, rest = line.split(" ", 1)
    assert TIMESTAMP.match(stamp)
    assert rest == f"INFO    {ACCESS_LOGGER}: GET /health 200 1.20ms [abc] model=iris"


async def test_background_flush_buffers_until_the_interval():
    out = io.BytesIO()
    log = AccessLog(out, flush_interval_s=0.05)
    await log.start()
    try:
        log.write("GET", "/a", 200, 0.001, "r1")
        log.write("GET", "/b", 200, 0.001, "r2")
        assert out.getvalue() == b""

        for _ in range(100):
            await asyncio.sleep(0.01)
            if out.getvalue():
                break
        assert [json.loads(line)["path"] for line in lines(out)] == ["/a", "/b"]
    finally:
        await log.stop()


async def test_stop_writes_what_is_buffered():
    out = io.BytesIO()
    log = AccessLog(out, flush_interval_s=60)
    await log.start()
    for i in range(3):
        log.write("GET", f"/{i}", 200, 0.001, f"r{i}")
    assert out.getvalue() == b""

    await log.stop()

    assert [json.loads(line)["request_id"] for line in lines(out)] == ["r0", "r1", "r2"]


async def test_a_full_buffer_is_flushed_at_once():
    out = io.BytesIO()
    log = AccessLog(out, flush_interval_s=60, max_buffer_bytes=1)
    await log.start()
    try:
        log.write("GET", "/now", 200, 0.001, "r")

        assert json.loads(lines(out)[0])["path"] == "/now"
    finally:
        await log.stop()


def test_a_closed_stream_does_not_break_serving():
    out = io.BytesIO()
    out.close()
    log = AccessLog(out)

    log.write("GET", "/health", 200, 0.001, "r")
    log.write("GET", "/health", 200, 0.001, "r")
