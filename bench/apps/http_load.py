"""A closed-loop HTTP/1.1 load generator that measures a server's steady state: N connections, each sending the
next request as soon as the last answer is in; only the answers that arrive within a window count, after a
warm-up and before the drain.

    python -m bench.apps.http_load --serve URL BODY.json     (then lines "CONCURRENCY WINDOW_S" on stdin)

Prints JSON {"rps", "p50_ms", "p99_ms", "errors", "answered"} per measurement; req/s and latencies count the
200 answers only.

Why not wrk: wrk counts the answers received within its duration and drops the requests in flight when it ends.
At concurrency 32 those are up to 32 requests, much of whose work a server has done; a batching server holds more
of them half-done (preprocessed, waiting for their batch) than one that runs each request start to finish, so a
3 s wrk slice undercounts it by a few percent against the in-process loop, which counts every image it finishes.
Counting the answers within a window in the middle of a continuous load has no such edge: the window's ends cut
the requests in progress the same way for every server.
"""

from __future__ import annotations

import asyncio
import json
import sys
from typing import Any
from urllib.parse import urlsplit

WARM_S = 0.75


class Load:
    def __init__(self, url: str, body: bytes) -> None:
        parts = urlsplit(url)
        self.host = parts.hostname or "127.0.0.1"
        self.port = parts.port or 80
        path = parts.path or "/"
        if parts.query:
            path += "?" + parts.query
        self.request = (
            f"POST {path} HTTP/1.1\r\nHost: {self.host}:{self.port}\r\nContent-Type: application/json\r\n"
            f"Content-Length: {len(body)}\r\n\r\n"
        ).encode() + body

    async def measure(self, concurrency: int, window_s: float) -> dict[str, Any]:
        loop = asyncio.get_running_loop()
        started = loop.time()
        window = (started + WARM_S, started + WARM_S + window_s)
        answered: list[tuple[float, float]] = []  # (when the answer arrived, latency)
        errors = 0

        async def connection() -> None:
            nonlocal errors
            reader, writer = await asyncio.open_connection(self.host, self.port)
            try:
                while loop.time() < window[1]:
                    sent = loop.time()
                    writer.write(self.request)
                    status = await _read_answer(reader)
                    now = loop.time()
                    if status != 200:  # an error answer (a peer's 503 when it sheds load) is not a served request
                        errors += 1
                        continue
                    answered.append((now, now - sent))
            finally:
                writer.close()

        await asyncio.gather(*(connection() for _ in range(concurrency)))
        inside = [latency for at, latency in answered if window[0] <= at < window[1]]
        ordered = sorted(inside) or [float("nan")]
        return {
            "rps": len(inside) / window_s,
            "p50_ms": ordered[len(ordered) // 2] * 1000,
            "p99_ms": ordered[min(len(ordered) - 1, int(len(ordered) * 0.99))] * 1000,
            "errors": errors,
            "answered": len(answered),
        }


async def _read_answer(reader: asyncio.StreamReader) -> int:
    """Read one HTTP/1.1 response (Content-Length or chunked); its status code."""
    head = await reader.readuntil(b"\r\n\r\n")
    lines = head.decode("latin-1").split("\r\n")
    status = int(lines[0].split()[1])
    headers = {key.strip().lower(): value.strip() for key, _, value in (line.partition(":") for line in lines[1:])}
    if headers.get("transfer-encoding", "").lower() == "chunked":
        while True:
            size = int((await reader.readuntil(b"\r\n")).split(b";")[0], 16)
            await reader.readexactly(size + 2)
            if size == 0:
                break
    else:
        await reader.readexactly(int(headers.get("content-length", "0")))
    return status


async def serve(url: str, body_path: str) -> None:
    load = Load(url, open(body_path, "rb").read())  # noqa: ASYNC230, SIM115 - read once, before any load
    loop = asyncio.get_running_loop()
    while line := await loop.run_in_executor(None, sys.stdin.readline):
        concurrency, window = line.split()
        print(json.dumps(await load.measure(int(concurrency), float(window))), flush=True)


if __name__ == "__main__":
    if sys.argv[1] != "--serve":
        raise SystemExit(__doc__)
    asyncio.run(serve(sys.argv[2], sys.argv[3]))
