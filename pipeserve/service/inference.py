"""InferenceService: the one API every transport (REST, gRPC, queue, offline) calls."""

from __future__ import annotations

import asyncio
import base64
import contextlib
import enum
import logging
import time
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

import numpy as np

from pipeserve.errors import GoldenCheckFailed, InvalidInput, NotFound, NotReady
from pipeserve.pipeline.codec import decode_data, squeeze_single
from pipeserve.pipeline.executor import Pipeline
from pipeserve.pipeline.graph import DEFAULT_ENDPOINT
from pipeserve.pipeline.loader import LoadedSpec
from pipeserve.pipeline.release import check_golden, fingerprint, golden_prediction
from pipeserve.pipeline.remote import RemoteInference
from pipeserve.pipeline.steps.tensor import lookup_labels
from pipeserve.service.limits import Admission

if TYPE_CHECKING:
    from pipeserve.observability.metrics import Metrics

logger = logging.getLogger(__name__)


class ServiceState(enum.Enum):
    CREATED = "created"
    LOADING = "loading"
    WARMING = "warming"
    READY = "ready"
    FAILED = "failed"
    STOPPED = "stopped"


class InferenceService:
    """Loads a pipeline, warms it up, checks the golden output, and answers predictions.

    Example:
        >>> service = InferenceService(load_spec("examples/iris"))   # doctest: +SKIP
        >>> await service.start()                                    # doctest: +SKIP
        >>> await service.predict_label([[5.1, 3.5, 1.4, 0.2]])      # doctest: +SKIP
        'setosa'
    """

    def __init__(
        self,
        loaded: LoadedSpec,
        *,
        metrics: Metrics | None = None,
        warmup_runs: int = 5,
        worker_threads: int | None = None,
        max_in_flight: int = 256,
        remote: RemoteInference | None = None,
        node_remotes: Mapping[str, RemoteInference] | None = None,
    ) -> None:
        self.loaded = loaded
        self.spec = loaded.spec
        self.metrics = metrics
        #: Model nodes served by v2 inference servers (the preprocessing server of the split), or None: in-process.
        self.remote = remote
        #: Every endpoint pool this service calls (the split's, and a gateway's one per remote node), once each.
        self.remotes: list[RemoteInference] = list(
            {id(r): r for r in [remote, *(node_remotes or {}).values()] if r is not None}.values()
        )
        self.pipeline = Pipeline.compile(
            loaded, worker_threads=worker_threads, remote=remote, node_remotes=node_remotes
        )
        self._warmup_runs = warmup_runs
        self._admission = Admission(max_in_flight)
        self._connecting: asyncio.Task[None] | None = None
        self.state = ServiceState.CREATED
        self._reason = "not started"
        self.fingerprint: str | None = None
        self.golden_summary: str | None = None
        self._sample: Any = None
        self._label_text = self._labels_or_none()
        self._batched = self.spec.input.kind != "json"
        if metrics is not None:
            self._bind_metrics(metrics)

    # -- lifecycle -------------------------------------------------------------------------------------------------

    @property
    def is_ready(self) -> bool:
        """Warmed up with a passing golden check, and (split) some inference endpoint serves our release."""
        return self.state is ServiceState.READY and self._unavailable() is None

    @property
    def reason(self) -> str:
        """Why the service is in its state; when ready but no inference endpoint can serve, why not."""
        if self.state is ServiceState.READY:
            return self._unavailable() or self._reason
        return self._reason

    @reason.setter
    def reason(self, value: str) -> None:
        self._reason = value

    def _unavailable(self) -> str | None:
        reasons = [reason for remote in self.remotes if (reason := remote.unavailable_reason()) is not None]
        return "; ".join(reasons) if reasons else None

    async def start(self) -> None:
        """Load the nodes, warm up on the sample and run the golden check.

        A node that cannot load raises (``SpecError``): the server must not start. A golden mismatch does not
        raise: the service stays up but not ready, and every prediction answers ``NotReady`` with the reason.
        """
        self._set_state(ServiceState.LOADING, "loading nodes")
        started = time.perf_counter()
        self.fingerprint = await asyncio.to_thread(fingerprint, self.loaded)
        for remote in self.remotes:
            await remote.start(self.fingerprint)
        try:
            await self.pipeline.start()
        except NotReady as exc:  # no inference endpoint serves our release yet: stay up, say why, keep trying
            self._set_state(ServiceState.LOADING, f"waiting for an inference endpoint: {exc}")
            logger.warning("Pipeline %s is not ready: %s", self.spec.name, self.reason)
            self._connecting = asyncio.create_task(self._connect_then_finish(started), name="pipeserve-connect")
            return
        await self._finish_start(started)

    async def _connect_then_finish(self, started: float) -> None:
        """Retry reaching the remote models until it works (each try waits up to the pool's start timeout)."""
        while True:
            try:
                await self.pipeline.connect_remotes()
            except NotReady as exc:
                self._set_state(ServiceState.LOADING, f"waiting for an inference endpoint: {exc}")
                logger.warning("Pipeline %s is not ready: %s", self.spec.name, self.reason)
                continue
            except Exception as exc:  # e.g. the remote model's signature does not fit its neighbour
                self._set_state(ServiceState.FAILED, f"cannot use the remote models: {exc}")
                logger.exception("Pipeline %s is NOT ready: %s", self.spec.name, self.reason)
                return
            break
        await self._finish_start(started)

    async def _finish_start(self, started: float) -> None:
        self._sample = await asyncio.to_thread(self._read_sample)
        self._set_state(ServiceState.WARMING, "warming up")
        try:
            await self._warm_up_and_check()
        except GoldenCheckFailed as exc:
            self._set_state(ServiceState.FAILED, f"golden check failed: {exc}")
            logger.error("Pipeline %s is NOT ready: %s", self.spec.name, self.reason)
            return
        except Exception as exc:  # a sample that cannot run is a broken release: refuse it, loudly
            self._set_state(ServiceState.FAILED, f"the sample input failed during warm-up: {exc}")
            logger.exception("Pipeline %s is NOT ready: %s", self.spec.name, self.reason)
            return
        self._set_state(ServiceState.READY, "ready")
        logger.info(
            "Pipeline %s ready in %.2fs (fingerprint %s; golden: %s)",
            self.spec.name,
            time.perf_counter() - started,
            self.fingerprint,
            self.golden_summary,
        )

    async def stop(self, grace_s: float = 5.0) -> None:
        """Stop answering, finish queued work within ``grace_s``, release models."""
        self._set_state(ServiceState.STOPPED, "shutting down")
        if self._connecting is not None:
            self._connecting.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._connecting
        await self.pipeline.stop(grace_s)
        for remote in self.remotes:
            await remote.stop()

    def _set_state(self, state: ServiceState, reason: str) -> None:
        self.state, self._reason = state, reason
        if self.metrics is not None:
            self.metrics.ready.labels(pipeline=self.spec.name).set(1 if state is ServiceState.READY else 0)

    async def _warm_up_and_check(self) -> None:
        if self._sample is None:
            self.golden_summary = "no sample input configured"
            return
        for _ in range(self._warmup_runs):
            for endpoint in self.pipeline.endpoints:  # every endpoint: every model warms up and is timed
                await self._run(self._sample, endpoint)
        await self.pipeline.finish_warm_up()
        value = await self._run(self._sample)
        prediction = self._encode(value)
        label = self._label_of(value) if self._label_text is not None or _is_text(value) else None
        self.golden_summary = await asyncio.to_thread(check_golden, self.loaded, prediction, label)

    def _read_sample(self) -> Any:
        sample = self.spec.sample
        if sample is None:
            return None
        if sample.file is not None:
            return self.loaded.resolve(sample.file).read_bytes()
        return sample.data

    # -- predictions ---------------------------------------------------------------------------------------------

    async def predict(
        self,
        data: Any,
        endpoint: str = DEFAULT_ENDPOINT,
        params: Mapping[str, Any] | None = None,
        *,
        timeout_s: float | None = None,
    ) -> Any:
        """The output of ``endpoint`` (``predict``: the pipeline's) for one request's ``data``, ready for JSON.

        ``timeout_s`` is the request's deadline: work still queued when it passes never runs, and the caller
        gets ``DeadlineExceeded``.

        Raises:
            InvalidInput, NotReady, NotFound (no such endpoint), Overloaded, NodeFailed, DeadlineExceeded.
        """
        if self.state is not ServiceState.READY:
            raise NotReady(self.reason)
        return self._encode(await self._run(data, endpoint, params, timeout_s))

    @property
    def endpoints(self) -> dict[str, str]:
        """Endpoint name -> the node whose output it answers."""
        return self.pipeline.endpoints

    @property
    def in_flight(self) -> int:
        """Predictions started and not yet answered."""
        return self._admission.in_flight

    async def predict_label(self, data: Any, *, timeout_s: float | None = None) -> Any:
        """The label(s) of the pipeline's output: class names for scores or class ids, text as it is."""
        if self.state is not ServiceState.READY:
            raise NotReady(self.reason)
        return self._label_of(await self._run(data, timeout_s=timeout_s))

    def check_input(self, data: Any) -> None:
        """Check ``data`` as ``predict`` would before running anything (shape, types, base64), so that a job with
        bad input is refused when it is submitted rather than failing later.

        Raises:
            InvalidInput: saying what was wrong and what is expected.
        """
        decode_data(self.spec.input, data)

    @property
    def has_batching(self) -> bool:
        """Some model of this pipeline queues requests into batches."""
        return any(model.queued for model in self.pipeline.models)

    async def _run(
        self,
        data: Any,
        endpoint: str = DEFAULT_ENDPOINT,
        params: Mapping[str, Any] | None = None,
        timeout_s: float | None = None,
    ) -> Any:
        async def work() -> Any:
            return await self.pipeline.run(decode_data(self.spec.input, data), endpoint=endpoint, params=params)

        return await self._admission.run(work, timeout_s, what="the request")

    def _encode(self, value: Any) -> Any:
        return squeeze_single(value) if self._batched else value

    def _label_of(self, value: Any) -> Any:
        if isinstance(value, dict):
            raise InvalidInput(
                "this pipeline's output has several parts, so it has no single label", expected="POST /predict"
            )
        if _is_text(value):
            return squeeze_single(list(value)) if self._batched else value
        if self._label_text is None:
            raise NotFound(f"pipeline {self.spec.name!r} has no labels; add pipeline.labels to its spec")
        array = np.asarray(value)
        if array.dtype.kind in "iu":
            ids = array.reshape(-1)
        elif array.dtype.kind == "f" and array.ndim >= 1:
            ids = np.atleast_2d(array).argmax(axis=-1)
        else:
            raise InvalidInput(
                f"the pipeline output ({array.dtype}, shape {array.shape}) is not class scores",
                expected="POST /predict",
            )
        labels = lookup_labels(self._label_text, ids)
        return labels[0] if self._batched and len(labels) == 1 else labels

    # -- facts -----------------------------------------------------------------------------------------------------

    @property
    def sample(self) -> Any:
        """The sample request's ``data`` (bytes for a file sample)."""
        if self.spec.sample is None:
            raise NotFound(f"pipeline {self.spec.name!r} has no sample input; add pipeline.sample to its spec")
        return self._sample if self._sample is not None else self._read_sample()

    def labels(self) -> dict[int, str]:
        """Class id -> name, as the seed's ``GET /label`` answered."""
        if self._label_text is None:
            raise NotFound(f"pipeline {self.spec.name!r} has no labels; add pipeline.labels to its spec")
        return dict(enumerate(self._label_text))

    def metadata(self) -> dict[str, Any]:
        """The seed's metadata fields (data/prediction type, structure, sample) plus nodes and release facts."""
        spec_in = self.spec.input
        golden = golden_prediction(self.loaded)
        models = self.pipeline.models
        first_model = models[0].runtime.signature if models and models[0].runtime.is_loaded else None
        last_model = models[-1].runtime.signature if models and models[-1].runtime.is_loaded else None
        data_type = {"image": "str (base64-encoded image)", "json": "json"}.get(spec_in.kind, spec_in.dtype)
        shape = spec_in.shape or (list(first_model.inputs[0].shape or []) if first_model else None)
        out_shape = np.asarray(golden).shape if golden is not None and not _is_text(golden) else None
        return {
            "name": self.spec.name,
            "version": self.spec.version,
            "description": self.spec.description,
            "fingerprint": self.fingerprint,
            "state": self.state.value,
            "data_type": data_type,
            "data_structure": _structure(shape) if spec_in.kind == "tensor" else spec_in.kind,
            "data_sample": self._sample_for_metadata(),
            "prediction_type": (last_model.outputs[0].dtype if last_model else "json"),
            "prediction_structure": _structure([1, *out_shape]) if out_shape is not None else None,
            "prediction_sample": golden,
            "labels": len(self._label_text) if self._label_text is not None else None,
            "endpoints": self.pipeline.endpoints,
            "nodes": self.pipeline.describe(),
            "execution": self.pipeline.execution_plan(),
            "golden_check": self.golden_summary,
            "inference": self._describe_remotes(),
        }

    def _describe_remotes(self) -> Any:
        if not self.remotes:
            return "in-process"
        if self.remote is not None and len(self.remotes) == 1:
            return self.remote.describe()
        return {"nodes": {node.name: node.remote.describe() for node in self.pipeline.remotes}}

    def _sample_for_metadata(self) -> Any:
        if self.spec.sample is None:
            return None
        if self.spec.sample.data is not None:
            return self.spec.sample.data
        raw = self._sample if isinstance(self._sample, bytes) else b""
        if len(raw) <= 4096:
            return base64.b64encode(raw).decode()
        return f"<{len(raw)}-byte {self.spec.sample.file}, base64-encoded; GET /predict/test runs it>"

    def _labels_or_none(self) -> tuple[str, ...] | None:
        return self.loaded.labels

    def _bind_metrics(self, metrics: Metrics) -> None:
        name = self.spec.name
        latency = {n: metrics.node_latency.labels(pipeline=name, node=n) for n in self.pipeline.nodes}
        errors = {n: metrics.node_errors.labels(pipeline=name, node=n) for n in self.pipeline.nodes}

        def observe(node: str, seconds: float, failed: bool) -> None:
            latency[node].observe(seconds)
            if failed:
                errors[node].inc()

        self.pipeline.observer = observe
        for model in self.pipeline.models:
            model.on_batch = metrics.batch_observer(name, model.name)


def _is_text(value: Any) -> bool:
    if isinstance(value, str):
        return True
    if isinstance(value, list) and value and all(isinstance(v, str) for v in value):
        return True
    return isinstance(value, np.ndarray) and value.dtype.kind in "UO" and all(isinstance(v, str) for v in value.flat)


def _structure(shape: Any) -> str | None:
    if shape is None:
        return None
    return "(" + ",".join(str(d) for d in shape) + ")"
