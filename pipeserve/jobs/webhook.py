"""Webhooks: POST a finished job to its callback URL, retrying what may succeed later."""

from __future__ import annotations

import asyncio
import logging
import random
from typing import Any

from pipeserve.jobs.model import JobRecord

logger = logging.getLogger(__name__)

#: Answers worth another try: the receiver is overloaded, restarting or timed out.
RETRYABLE_STATUS = frozenset({408, 425, 429, 500, 502, 503, 504})
JOB_ID_HEADER = "X-Pipeserve-Job-Id"


class WebhookSender:
    """Sends a job's final record (the ``GET /jobs/{id}`` body) to its callback URL.

    Connection errors, timeouts and 408/425/429/5xx answers are retried with exponential backoff and jitter, up to
    ``attempts`` sends; any other answer is final (a 4xx will not change by resending). The ``X-Pipeserve-Job-Id``
    header lets receivers drop the rare duplicate (delivery is at least once: a worker can die after sending and
    before recording that it sent).

    Example:
        >>> sender = WebhookSender(attempts=5)
        >>> await sender.start()                                        # doctest: +SKIP
        >>> await sender.send("http://hooks.example/jobs", record)       # doctest: +SKIP
    """

    def __init__(self, *, attempts: int = 5, timeout_s: float = 10.0, backoff_s: float = 0.5) -> None:
        if attempts < 1:
            raise ValueError(f"attempts must be >= 1, got {attempts}")
        self.attempts = attempts
        self.timeout_s = timeout_s
        self.backoff_s = backoff_s
        self._client: Any = None

    async def start(self) -> None:
        import httpx

        self._client = httpx.AsyncClient(timeout=self.timeout_s, follow_redirects=False)

    async def stop(self) -> None:
        if self._client is not None:
            await self._client.aclose()
            self._client = None

    async def send(self, url: str, record: JobRecord) -> bool:
        """POST ``record`` to ``url``; ``True`` once a 2xx answered, ``False`` when it gave up (logged)."""
        import httpx

        if self._client is None:
            await self.start()
        body = record.to_json()
        headers = {"content-type": "application/json", JOB_ID_HEADER: record.id}
        problem = ""
        for attempt in range(1, self.attempts + 1):
            try:
                response = await self._client.post(url, content=body, headers=headers)
            except httpx.HTTPError as exc:
                problem = f"{type(exc).__name__}: {exc}"
            else:
                if response.is_success:
                    return True
                problem = f"HTTP {response.status_code}"
                if response.status_code not in RETRYABLE_STATUS:
                    break
            if attempt < self.attempts:
                delay = self.backoff_s * 2 ** (attempt - 1)
                await asyncio.sleep(delay * (0.5 + random.random()))
        logger.error("Webhook for job %s to %s gave up after %d tries: %s", record.id, url, attempt, problem)
        return False
