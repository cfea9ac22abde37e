"""Several v2 endpoints behind one ``RemoteInference``: balancing, retries, probing, and the release check.

An endpoint is *up* once it is ready and, for every model the pipeline calls, reports the release fingerprint
this preprocessing server was built for. Requests go to the up endpoint with the fewest calls in flight; one
that fails in a way another endpoint could fix (refused, reset, not ready, wrong release) is taken out and the
request retried on another, within its deadline. A background probe brings endpoints back once they are
ready again with the right release. No endpoint up -> ``NotReady`` naming each endpoint's reason.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import logging
import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Literal

from pipeserve.config import GrpcEngine
from pipeserve.errors import DeadlineExceeded, NotReady, Overloaded
from pipeserve.observability import tracing
from pipeserve.pipeline.context import request_deadline
from pipeserve.remote.clients import EndpointDown, ModelInfo, V2Client, create_client, parse_endpoint
from pipeserve.types import Signature, TensorDict
from pipeserve.v2 import RELEASE_PARAMETER

logger = logging.getLogger(__name__)

ReleaseCheck = Literal["fingerprint", "golden"]


class ReleaseMismatch(EndpointDown):
    """An endpoint serves another release of a model than this server was built for."""


@dataclass(eq=False)
class Endpoint:
    url: str
    up: bool = False
    reason: str = "not probed yet"
    in_flight: int = 0
    changed_at: float = 0.0
    grpc_engine: GrpcEngine = "native"
    _client: V2Client | None = None

    @property
    def client(self) -> V2Client:
        """Created on first use, inside the event loop (gRPC channels bind to the loop they are made in)."""
        if self._client is None:
            self._client = create_client(self.url, grpc_engine=self.grpc_engine)
        return self._client


class RemoteModels:
    """The ``RemoteInference`` of a preprocessing server: its inference endpoints and the release they must serve.

    ``release_check``: ``fingerprint`` (default) requires every model's metadata and every response to carry
    ``expected_release``; ``golden`` accepts servers that report no fingerprint (MLServer, Triton) and relies on
    the golden check that the preprocessing server runs across the split at warm-up.
    """

    def __init__(
        self,
        urls: Sequence[str],
        *,
        expected_release: str | None = None,
        release_check: ReleaseCheck = "fingerprint",
        call_timeout_s: float = 30.0,
        probe_interval_s: float = 0.5,
        start_timeout_s: float = 60.0,
        grpc_engine: GrpcEngine = "native",
    ) -> None:
        if not urls:
            raise ValueError("at least one inference endpoint is needed")
        for url in urls:
            parse_endpoint(url)  # a malformed URL fails at startup, not on the first request
        self.endpoints = [Endpoint(url, grpc_engine=grpc_engine) for url in urls]
        self.expected_release = expected_release
        self.release_check = release_check
        self.call_timeout_s = call_timeout_s
        self.probe_interval_s = probe_interval_s
        self.start_timeout_s = start_timeout_s
        self._models: dict[tuple[str, str], Signature] = {}
        self._turn = itertools.count()
        self._prober: asyncio.Task[None] | None = None
        self._wake = asyncio.Event()

    # -- lifecycle ---------------------------------------------------------------------------------------------

    async def start(self, release: str | None = None) -> None:
        """Probe every endpoint once and keep probing the ones that are down; ``release``: what they must serve."""
        if release is not None:
            self.expected_release = release
        await asyncio.gather(*(self._probe(endpoint) for endpoint in self.endpoints))
        self._prober = asyncio.create_task(self._probe_forever(), name="pipeserve-endpoint-probe")

    async def stop(self) -> None:
        if self._prober is not None:
            self._prober.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._prober
        await asyncio.gather(
            *(e.client.close() for e in self.endpoints if e._client is not None), return_exceptions=True
        )

    def unavailable_reason(self) -> str | None:
        """None while some endpoint is up; else why none is (each endpoint's reason)."""
        if any(endpoint.up for endpoint in self.endpoints):
            return None
        return "no inference endpoint is available: " + "; ".join(f"{e.url}: {e.reason}" for e in self.endpoints)

    def describe(self) -> dict[str, Any]:
        return {
            "endpoints": [{"url": e.url, "up": e.up, "reason": None if e.up else e.reason} for e in self.endpoints],
            "release_check": self.release_check,
            "expected_release": self.expected_release,
        }

    # -- RemoteInference ---------------------------------------------------------------------------------------

    async def signature(self, model: str, version: str) -> Signature:
        """The model's signature from the first up endpoint; waits up to ``start_timeout_s`` for one."""
        self._models.setdefault((model, version), Signature((), ()))
        deadline = time.monotonic() + self.start_timeout_s
        while True:
            for endpoint in self._up():
                try:
                    info = await endpoint.client.model_info(model, version, self.call_timeout_s)
                    self._check_release(endpoint, model, version, info.parameters)
                except EndpointDown as exc:
                    self._down(endpoint, str(exc))
                    continue
                self._models[(model, version)] = info.signature
                return info.signature
            if time.monotonic() > deadline:
                raise NotReady(self.unavailable_reason() or "no inference endpoint answered")
            self._wake.set()
            await asyncio.sleep(self.probe_interval_s)

    async def infer(self, model: str, version: str, inputs: TensorDict, outputs: list[str] | None) -> TensorDict:
        """Run on the least busy up endpoint; on a retryable failure take it out and try the next, in time."""
        deadline = request_deadline.get()
        tried: set[int] = set()
        overloaded: Overloaded | None = None
        while True:
            endpoint = self._pick(tried)
            if endpoint is None:
                if overloaded is not None:
                    raise overloaded
                raise NotReady(self.unavailable_reason() or "every inference endpoint failed this request")
            tried.add(id(endpoint))
            timeout_s = self.call_timeout_s
            if deadline is not None:
                timeout_s = min(timeout_s, deadline - time.monotonic())
                if timeout_s <= 0:
                    raise DeadlineExceeded("the request's deadline passed before the inference server answered")
            endpoint.in_flight += 1
            try:
                attributes = {"pipeserve.endpoint": endpoint.url, "pipeserve.model": model}
                with tracing.span(f"v2 infer {model}", kind="client", attributes=attributes):
                    tensors, parameters = await endpoint.client.infer(model, version, inputs, outputs, timeout_s)
                self._check_release(endpoint, model, version, parameters)
                return tensors
            except EndpointDown as exc:
                self._down(endpoint, str(exc))
            except Overloaded as exc:
                overloaded = exc
            finally:
                endpoint.in_flight -= 1

    # -- endpoints ---------------------------------------------------------------------------------------------

    def _up(self) -> list[Endpoint]:
        return [endpoint for endpoint in self.endpoints if endpoint.up]

    def _pick(self, tried: set[int]) -> Endpoint | None:
        candidates = [e for e in self.endpoints if e.up and id(e) not in tried]
        if not candidates:
            return None
        if len(candidates) == 1:
            return candidates[0]
        fewest = min(e.in_flight for e in candidates)
        least = [e for e in candidates if e.in_flight == fewest]
        return least[next(self._turn) % len(least)]

    def _down(self, endpoint: Endpoint, reason: str) -> None:
        if endpoint.up:
            logger.warning("Inference endpoint %s taken out: %s", endpoint.url, reason)
        endpoint.up, endpoint.reason, endpoint.changed_at = False, reason, time.monotonic()
        self._wake.set()

    def _check_release(self, endpoint: Endpoint, model: str, version: str, parameters: dict[str, Any]) -> None:
        if self.release_check != "fingerprint" or self.expected_release is None:
            return
        got = parameters.get(RELEASE_PARAMETER)
        if got != self.expected_release:
            shown = got if got else "none (not a pipeserve inference server of this spec?)"
            raise ReleaseMismatch(
                f"release mismatch: model {model!r} version {version or 'latest'} on {endpoint.url} is from release "
                f"{shown}, but this preprocessing server was built for release {self.expected_release}"
            )

    async def _probe(self, endpoint: Endpoint) -> None:
        """Bring ``endpoint`` up if it is ready and serves the expected release of every model we call."""
        try:
            if not await endpoint.client.ready(min(self.call_timeout_s, 5.0)):
                raise EndpointDown("the server says it is not ready")
            for model, version in list(self._models):
                info: ModelInfo = await endpoint.client.model_info(model, version, min(self.call_timeout_s, 5.0))
                self._check_release(endpoint, model, version, info.parameters)
        except (EndpointDown, DeadlineExceeded) as exc:
            self._down(endpoint, str(exc))
            return
        except Exception as exc:  # noqa: BLE001 - any failure keeps it out; the probe loop must live on
            self._down(endpoint, f"probe failed: {type(exc).__name__}: {exc}")
            return
        if not endpoint.up:
            logger.info("Inference endpoint %s is up", endpoint.url)
        endpoint.up, endpoint.reason, endpoint.changed_at = True, "", time.monotonic()

    async def _probe_forever(self) -> None:
        while True:
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(self.probe_interval_s):
                    await self._wake.wait()
            self._wake.clear()
            down = [endpoint for endpoint in self.endpoints if not endpoint.up]
            if down:
                await asyncio.gather(*(self._probe(endpoint) for endpoint in down))
